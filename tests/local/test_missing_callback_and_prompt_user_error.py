"""Issue 32 in a real local run (torchrun agents, Gloo): a script that forgets the progress callback is
warned of while it runs, and one rank's own RuntimeError fails the job within 2 s of that rank's exit (no
settle wait for a verdict that cannot change)."""

from __future__ import annotations

import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ddpjob_operator import decisions, validation
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import RunOptions

from .harness import TimelineView
from .test_own_script_guide_and_summary import job as own_script_job

pytestmark = pytest.mark.timeout(240)

# Every rank all-reduces each step; rank 1 raises at step 10 (a bad batch), rank 0 goes on into a collective
# that can never complete.
BAD_BATCH = textwrap.dedent('''
    import time
    import torch
    import torch.distributed as dist
    from ddp_trainer.runtime import Job, exit_process
    with Job.start() as job:
        for step in range(1, 10_000):
            value = torch.ones(1)
            dist.all_reduce(value)
            if step == 10 and dist.get_rank() == 1:
                raise RuntimeError("bad batch at step 10")
            time.sleep(0.01)
    exit_process(0)
''')


class FailedAt(TimelineView):
    """Also keeps the wall-clock moment the job was first shown Failed."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.failed_at: datetime | None = None

    def update(self, snap) -> None:
        if snap.phase == "Failed" and self.failed_at is None:
            self.failed_at = datetime.now(timezone.utc)
        super().update(snap)


@pytest.mark.slow
def test_a_script_without_the_callback_is_warned_of_while_it_runs(tmp_path: Path):
    # Trains 8 s, reports nothing, with checkpoint.intervalSteps set: a kill would restart it from step 0.
    the_job = own_script_job(tmp_path, "forgot", "quiet", steps=8, replicas=2,
                             checkpoint={"claimTemplate": {"size": "1Gi"}, "intervalSteps": 10})
    view = TimelineView(timeout=180)
    runner = LocalRunner(the_job, RunOptions(state_dir=tmp_path / ".ddpjob", unreported_warning_seconds=2), view)
    runner.run()
    assert runner.status.phase == "Succeeded", view.transcript()
    warned = view.first_event(f"Warning {decisions.REASON_NO_PROGRESS_REPORTS}")
    assert warned is not None, view.transcript()
    assert "callback" in warned[1] and "job.report" in warned[1], warned
    assert sum(decisions.REASON_NO_PROGRESS_REPORTS in e for _, e in view.events) == 1, view.transcript()
    found = next(c for c in runner.status.conditions if c.type == decisions.CONDITION_NOT_REPORTING)
    assert found.status == "True" and found.reason == decisions.REASON_NO_PROGRESS_REPORTS
    # ...and said again where it is read last: the summary.
    assert any(line.startswith(f"Warning {decisions.REASON_NO_PROGRESS_REPORTS}: ") for line in view.summary.lines())
    # A local run is one machine: no ReadWriteOnce warning for the manifest's ReadWriteOnce claim.
    assert not view.first_event("ReadWriteOnce"), view.transcript()


@pytest.mark.slow
def test_one_ranks_runtime_error_fails_the_job_within_two_seconds_of_its_exit(tmp_path: Path):
    script = tmp_path / "bad_batch.py"
    script.write_text(BAD_BATCH)
    the_job = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                    "metadata": {"name": "badbatch"}, "spec": {
                                        "replicas": 2, "image": "ghcr.io/ddpjob/ddp-trainer:0.1.0",
                                        "entrypoint": str(script),
                                        "rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 1},
                                        "failurePolicy": {"maxRestarts": 3},
                                        "template": {"terminationGracePeriodSeconds": 5}}})
    view = FailedAt(timeout=180)
    runner = LocalRunner(the_job, RunOptions(state_dir=tmp_path / ".ddpjob"), view)
    runner.run()
    described = view.transcript()
    assert runner.status.phase == "Failed" and runner.status.restarts == 0, described
    failed = next(c for c in runner.status.conditions if c.type == "Failed")
    assert failed.reason == decisions.REASON_PERMANENT_ERROR and "bad batch at step 10" in failed.message, failed
    exit_ = next(e for e in runner.exits if e.index == 1 and e.exit_code == 1)
    assert view.failed_at is not None, described
    took = (view.failed_at - exit_.at).total_seconds()
    assert 0 <= took < 2.0, f"Failed {took:.2f}s after worker 1 exited\n{described}"


# Each rank reports the world size of a framework that trains alone (HF on CPU without use_cpu=True).
ALONE = textwrap.dedent('''
    import time
    from ddp_trainer.runtime import Job, exit_process
    with Job.start() as job:
        for step in range(1, 31):
            job.report(step=step, total_steps=30, loss=1.0, world_size=1)
            time.sleep(0.1)
    exit_process(0)
''')


@pytest.mark.slow
def test_reports_of_a_world_size_of_its_own_are_a_warning_not_progress(tmp_path: Path):
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    the_job = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                    "metadata": {"name": "alone"}, "spec": {
                                        "replicas": 2, "image": "ghcr.io/ddpjob/ddp-trainer:0.1.0",
                                        "entrypoint": str(script),
                                        "rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 1},
                                        "checkpoint": {"claimTemplate": {"size": "1Gi"}, "intervalSteps": 10}}})
    view = TimelineView(timeout=180)
    runner = LocalRunner(the_job, RunOptions(state_dir=tmp_path / ".ddpjob"), view)
    runner.run()
    described = view.transcript()
    assert runner.status.phase == "Succeeded", described
    warned = [e for _, e in view.events if f"Warning {decisions.REASON_WORLD_SIZE_MISMATCH}" in e]
    assert len(warned) == 1 and "use_cpu=True" in warned[0] and "world size 1" in warned[0], described
    found = next(c for c in runner.status.conditions if c.type == decisions.CONDITION_WORLD_SIZE_MISMATCH)
    assert found.status == "True"
    assert runner.status.progress is None  # never taken as the job's progress
