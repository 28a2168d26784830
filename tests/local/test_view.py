"""The live table on a terminal, timestamped state-change lines without one, the log tail parser."""

from __future__ import annotations

import io
import re

from rich.console import Console

from ddpjob_operator.local.logs import LogTail
from ddpjob_operator.local.view import LiveView, PlainView, Snapshot, Summary, WorkerRow, make_view

RUNNING = Snapshot(job="demo", phase="Running", message="2 of 2 workers running", restarts=0, max_restarts=3,
                   elapsed_s=12.0, step=40, loss=0.25, world_size=2, last_checkpoint_step=40,
                   workers=(WorkerRow("demo-worker-0", "Running", step=40, loss=0.25),
                            WorkerRow("demo-worker-1", "Running")))
SUMMARY = Summary(job="demo", phase="Succeeded", message="Succeeded: training finished", elapsed_s=61.0,
                  restarts=1, disruptions=0, worker_restarts={"demo-worker-0": 0, "demo-worker-1": 1},
                  result={"step": 660, "epoch": 30, "eval_loss": 0.1, "eval_accuracy": 0.9722, "world_size": 2},
                  checkpoint_dir="/x/.ddpjob/demo/checkpoints", log_dir="/x/.ddpjob/demo/logs")


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=terminal, width=120, color_system=None), buffer


def test_without_a_terminal_output_is_plain_lines_on_state_changes_only():
    con, buffer = console(terminal=False)
    view = make_view(con)
    assert isinstance(view, PlainView)
    view.update(RUNNING)
    view.update(RUNNING)  # nothing changed: nothing printed
    failed = WorkerRow("demo-worker-1", "Failed", restarts=0, exit_code=137)
    view.update(Snapshot(**{**RUNNING.__dict__, "workers": (RUNNING.workers[0], failed)}))
    view.event("Warning WorkerFailed: worker 1 failed")
    view.close(SUMMARY)
    lines = buffer.getvalue().splitlines()
    assert all(re.match(r"^\d\d:\d\d:\d\d ", line) for line in lines), lines
    assert sum("job demo: Running" in line for line in lines) == 1
    assert sum("demo-worker-1: Running" in line for line in lines) == 1
    assert any("demo-worker-1: Failed exit 137 (restarts 0)" in line for line in lines)
    assert any("progress: step 40 loss 0.2500 world_size 2 last checkpoint step 40" in line for line in lines)
    assert "\x1b[" not in buffer.getvalue(), "no terminal control codes in CI logs"
    assert any("eval_accuracy 97.22%" in line for line in lines)
    assert any("checkpoints: /x/.ddpjob/demo/checkpoints" in line for line in lines)
    assert any("demo-worker-1: 1" in line for line in lines)


def test_on_a_terminal_one_row_per_worker_with_state_restarts_step_and_loss():
    con, buffer = console(terminal=True)
    view = make_view(con)
    assert isinstance(view, LiveView)
    view.update(RUNNING)
    view.log_line("demo-worker-0", "step=40 epoch=1 loss=0.25")
    view.close(SUMMARY)
    out = buffer.getvalue()
    row = next(line for line in out.splitlines() if "demo-worker-0" in line and "Running" in line)
    assert re.search(r"demo-worker-0\s+│\s+Running\s+│\s+0\s+│\s+-\s+│\s+40\s+│\s+0\.2500", row), row
    assert "DDPJob demo  Running" in out and "restarts 0/3" in out
    assert "[demo-worker-0] step=40 epoch=1 loss=0.25" in out
    assert "job demo: Succeeded after 61.0s" in out


def test_log_tail_returns_only_complete_new_lines_and_tracks_the_last_step(tmp_path):
    log = tmp_path / "w.log"
    tail = LogTail(log)
    assert tail.read_new_lines() == []  # not created yet
    log.write_text("hello\nstep=10 epoch=0 loss=1.5000 samples_per_s=3.0\nstep=20 epo")
    assert tail.read_new_lines() == ["hello", "step=10 epoch=0 loss=1.5000 samples_per_s=3.0"]
    assert (tail.step, tail.loss) == (10, 1.5)
    with open(log, "a") as f:
        f.write("ch=0 loss=0.7500 samples_per_s=3.0\n")
    assert tail.read_new_lines() == ["step=20 epoch=0 loss=0.7500 samples_per_s=3.0"]
    assert (tail.step, tail.loss) == (20, 0.75)


def test_the_summary_says_how_each_incident_was_recovered():
    from dataclasses import replace

    from ddpjob_operator import model

    def incident(generation: int, **recovery) -> model.Incident:
        return model.Incident(generation=generation, time="2026-11-29T09:00:00Z", cause="Retryable",
                              reason="WorkerFailed", recovery=model.IncidentRecovery(**recovery))

    summary = replace(SUMMARY, incidents=(
        incident(1, path="InProcess", spare=True, first_step_time="2026-11-29T09:00:01.250Z", seconds=1.25,
                 steps_lost=0),
        incident(2, path="Restart", fallback_reason="generation 3 has 2 ranks, not 3",
                 first_step_time="2026-11-29T09:01:00Z", seconds=6.0, steps_lost=2),
        incident(3, path=""),
        model.Incident(generation=4, time="2026-11-29T09:02:00Z", cause="Permanent", reason="WorkerFailed")))
    lines = summary.lines()
    assert ("recovery from WorkerFailed (generation 1): InProcess, a spare took the place, 1.2 s to the first "
            "step, 0 steps lost") in lines
    assert ("recovery from WorkerFailed (generation 2): Restart (generation 3 has 2 ranks, not 3), 6.0 s to the "
            "first step, 2 steps lost") in lines
    assert "recovery from WorkerFailed (generation 3): not complete" in lines
    assert not any("generation 4" in line for line in lines)  # it ended the job: nothing recovered
