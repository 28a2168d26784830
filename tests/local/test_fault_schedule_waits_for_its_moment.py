"""local/faults.py on a real runner that starts no process: a spec change waits for the step the trainer reports
and is validated as the API server would; a fault at a step never reported stays pending, is warned of once
during the run, and is named in the summary."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ddpjob_operator import validation
from ddpjob_operator.local import display, faults
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import KILL, FaultInjection, RunOptions, SpecChange

from .harness import TimelineView, manifest

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def runner_for(tmp_path: Path, **options) -> LocalRunner:
    job = validation.parse_job(manifest("sched", replicas=1, minReplicas=1, maxReplicas=2, args=[]))
    runner = LocalRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob", **options), TimelineView(timeout=600),
                         clock=lambda: T0)
    runner.files.directory.mkdir(parents=True)  # the job's own directory on the volume, where the trainer reports
    return runner


def report(runner: LocalRunner, step: int) -> None:
    (runner.files.directory / "progress.json").write_text(json.dumps({"step": step, "world_size": 1, "time": 1.0}))


def events(runner: LocalRunner) -> list[str]:
    return [text for _, text in runner.view.events]


def test_a_scale_at_a_step_waits_for_it_and_a_change_the_api_server_refuses_is_said(tmp_path):
    runner = runner_for(tmp_path, changes=(SpecChange(replicas=2, at_step=20), SpecChange(replicas=5)))
    for step in (None, 10):
        if step is not None:
            report(runner, step)
        runner.schedule.apply_changes(runner, T0 + timedelta(seconds=5))
        assert runner.spec.replicas == 1 and runner.metadata_generation == 1 and events(runner) == []
    report(runner, 20)
    runner.schedule.apply_changes(runner, T0 + timedelta(seconds=6))
    assert runner.spec.replicas == 2 and runner.metadata_generation == 2
    said = events(runner)
    assert said[0] == "spec change: replicas=2 (metadata.generation 2) at 6.0s, trainer step 20", said
    assert said[1].startswith("spec change rejected (as the API server would): ") and "replicas" in said[1], said
    assert runner.schedule.changes == [] and runner.spec.replicas == 2  # the refused one is dropped, not retried


def test_a_kill_at_a_step_never_reported_is_warned_of_once_and_named_in_the_summary(tmp_path):
    runner = runner_for(tmp_path, faults=(FaultInjection(index=0, at_step=5, kind=KILL),))
    runner.schedule.inject(runner, T0 + timedelta(seconds=1))
    assert events(runner) == []  # too early to say
    for seconds in (faults.NO_PROGRESS_WARNING_SECONDS, faults.NO_PROGRESS_WARNING_SECONDS + 5):
        runner.schedule.inject(runner, T0 + timedelta(seconds=seconds))
    said = events(runner)
    assert len(said) == 1 and said[0].startswith("Warning: --kill-at-step 5 waits for the trainer to report a step")
    # Due, but worker 0 has no process to kill: the fault waits for one rather than being lost.
    report(runner, 5)
    runner.schedule.inject(runner, T0 + timedelta(seconds=70))
    assert runner.pending_faults == [FaultInjection(index=0, at_step=5, kind=KILL)]
    (runner.files.directory / "progress.json").unlink()
    notes = display.summary(runner).notes
    assert notes and notes[0].startswith("--kill-at-step 5 never fired: the trainer reported no step that far"), notes
