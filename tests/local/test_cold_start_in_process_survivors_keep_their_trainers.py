"""`ddpjob run --local --cold-start` with `failurePolicy.recovery: InProcess` (issue 29), as pods run it: a
SIGKILLed worker, then a gracefully deleted one (SIGTERM, an eviction). The survivors' trainer processes train on
(same PIDs), the replacements get the state by broadcast (no checkpoint read), and rank 0's step lines run from 1 to
the last step in order: no step lost or trained twice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpjob_operator import validation
from ddpjob_operator.local.processes import marked_pids
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import COLD_CPU_NODE, DELETE, KILL, FaultInjection, RunOptions

from .harness import TimelineView
from .test_semantics import MAX_STEPS, STEP_LINE, spec

pytestmark = pytest.mark.slow


def _children(pid: int) -> set[int]:
    found = set()
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.update(int(child) for child in children.read_text().split())
        except OSError:
            pass  # ended meanwhile
    return found


class TrainerRecordingRunner(LocalRunner):
    """At every pass: each running pod's root process (its agent) and the trainer processes it started."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trainers: dict[tuple[str, int], set[int]] = {}

    def reconcile(self):
        decision = super().reconcile()
        for name, w in self.workers.items():
            if w.process.started and w.process.poll(self.clock()) is None:
                self.trainers.setdefault((name, w.process.pid), set()).update(_children(w.process.pid))
        return decision


def run_to_the_end(runner: TrainerRecordingRunner, workers: str) -> tuple[dict[str, str], str]:
    """Run to Succeeded or Failed, leaving no process behind: the worker logs (`<workers>*.log`), and the run
    described for a failed assertion."""
    try:
        runner.run()
    finally:
        assert marked_pids(runner.run_marker) == [], "the run left processes behind"
    logs = {path.name: path.read_text(errors="replace") for path in runner.log_dir.glob(f"{workers}*.log")}
    described = f"events {runner.view.events}\ntrainers {runner.trainers}\n" + "\n".join(
        f"--- {name}\n{text[-3000:]}" for name, text in logs.items())
    return logs, described


def test_survivors_keep_their_trainer_processes_through_a_kill_and_a_graceful_stop(tmp_path):
    job = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                "metadata": {"name": "inproc"},
                                "spec": spec(failurePolicy={"restartScope": "Pod", "recovery": "InProcess"})})
    # The graceful stop is due long after the kill's step: the in-process recovery holds training until it is done.
    faults = (FaultInjection(index=1, at_step=20, kind=KILL), FaultInjection(index=0, at_step=100, kind=DELETE))
    runner = TrainerRecordingRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob", cold_start=COLD_CPU_NODE,
                                                    faults=faults), TimelineView(timeout=240))
    logs, described = run_to_the_end(runner, "inproc-worker-")
    assert runner.status.phase == "Succeeded", described
    faults = [e.split(" (")[0] for _, e in runner.view.events if e.startswith("fault injection:")]
    assert faults == ["fault injection: killed inproc-worker-1",
                      "fault injection: deleted inproc-worker-0 gracefully"], described
    # Four pods: both workers, worker 1's replacement (the kill), worker 0's (the deletion). Each agent started one
    # trainer for its whole life: the survivors' trainers were never restarted.
    assert sorted(name for name, _ in runner.trainers) == ["inproc-worker-0"] * 2 + ["inproc-worker-1"] * 2, described
    assert all(len(pids) == 1 for pids in runner.trainers.values()), described
    text = "\n".join(logs.values())
    assert text.count("recovered in process: generation") == 2, described  # one survivor per incident
    assert text.count("by broadcast step=") == 2 and "resumed from checkpoint" not in text, described
    # Each incident: the survivors' step when it struck is the step the replacement received.
    failed_at = {int(s) for s in re.findall(r"at step (\d+): a peer (?:failed|stopped)", text)}
    assert {int(s) for s in re.findall(r"by broadcast step=(\d+)", text)} == failed_at, described
    # Rank 0 (worker 0's pods) logged every step once, in order, to the last: none trained twice. A step line
    # missing is an incident's own: its optimizer step was taken, the collective after it failed.
    steps = [int(s) for s in STEP_LINE.findall(logs["inproc-worker-0.log"])]
    assert steps == sorted(set(steps)) and steps[-1] == MAX_STEPS, described
    assert set(range(1, MAX_STEPS + 1)) - set(steps) <= failed_at, described
    # The status tells each recovery as on a cluster (decisions/recovery.py, from rank 0's progress.json), and the
    # summary says it.
    recovered = [i.recovery for i in runner.status.incidents if i.recovery is not None]
    assert [(r.path, r.first_step_time is not None, r.seconds is not None) for r in recovered] == \
        [("InProcess", True, True)] * 2, runner.status.incidents
    assert sum(line.startswith("recovery from ") and ": InProcess" in line for line in runner.summary().lines()) == 2
