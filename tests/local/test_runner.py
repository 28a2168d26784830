"""The runner loop with an injected clock (deadline, backoff) and SIGTERM, on real but cheap processes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ddpjob_operator import validation
from ddpjob_operator.local.processes import marked_pids
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import RunOptions

from ..support import wait_for
from .harness import Run, TimelineView, job_dir, kill_tagged, manifest, script, write_manifest

pytestmark = pytest.mark.slow  # torchrun agents start (a few seconds), no training

SLEEPER = """
import signal, sys, time
def stop(signum, frame):
    print(f"got signal {signum}, saving", flush=True)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(600)
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def runner_for(tmp_path: Path, clock: FakeClock, **spec) -> tuple[LocalRunner, TimelineView]:
    job = validation.parse_job(manifest("unit", replicas=1, minReplicas=1, args=[], **spec))
    view = TimelineView(timeout=600)
    runner = LocalRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob"), view, clock=clock)
    runner._prepare_dirs()
    return runner, view


def test_active_deadline_fails_the_job_and_stops_its_processes(tmp_path):
    clock = FakeClock()
    entry = script(tmp_path, "sleeper.py", SLEEPER)
    runner, view = runner_for(tmp_path, clock, entrypoint=str(entry),
                              runPolicy={"activeDeadlineSeconds": 30})
    try:
        assert runner.reconcile().actions and runner.status.phase == "Pending"
        decision = runner.reconcile()
        assert runner.status.phase == "Running" and set(runner.workers) == {"unit-worker-0"}
        assert decision.requeue_after == pytest.approx(30)
        clock.advance(29)
        runner.reconcile()
        assert runner.status.phase == "Running"
        clock.advance(1)
        runner.reconcile()
        assert runner.status.phase == "Failed" and "activeDeadlineSeconds=30" in runner.status.message
        assert view.first_event("DeadlineExceeded")
    finally:
        runner.stop_all()
    assert marked_pids(runner.run_marker) == []


def test_backoff_delays_the_replacement_by_the_injected_clock(tmp_path):
    clock = FakeClock()
    entry = script(tmp_path, "fails.py", "import sys\nsys.exit(1)\n")
    runner, view = runner_for(tmp_path, clock, entrypoint=str(entry), failurePolicy={
        "maxRestarts": 3, "retryableExitCodes": [1], "backoff": {"initialSeconds": 20, "maxSeconds": 60}})
    try:
        runner.reconcile()
        first = runner.workers["unit-worker-0"].process
        wait_for(lambda: first.poll(clock()) is not None, "the first attempt to fail", 60)
        decision = runner.reconcile()
        assert runner.status.restarts == 1 and runner.status.phase == "Restarting"
        assert decision.requeue_after == pytest.approx(20)
        clock.advance(19)
        runner.reconcile()
        assert runner.workers["unit-worker-0"].process is first, "replaced before the backoff passed"
        clock.advance(1)
        runner.reconcile()  # the failed pod goes and its replacement comes in the same pass
        replacement = runner.workers["unit-worker-0"]
        assert replacement.process is not first and replacement.attempt == 1
    finally:
        runner.stop_all()
    assert marked_pids(runner.run_marker) == []


def test_sigterm_stops_every_worker_gracefully_and_leaves_nothing(tmp_path):
    entry = script(tmp_path, "sleeper.py", SLEEPER)
    doc = manifest("term", replicas=2, entrypoint=str(entry), args=[])
    path = write_manifest(tmp_path, doc)
    run = Run(tmp_path, str(path))
    try:
        logs = job_dir(tmp_path, "term") / "logs"
        worker_logs = [logs / f"term-worker-{i}.log" for i in range(2)]
        wait_for(lambda: all(log.exists() and "ready" in log.read_text() for log in worker_logs),
                 "both workers to run", 120)
        run.proc.terminate()
        code, out = run.wait(timeout=60)
        assert code == 130, out
        assert "SIGTERM: stopping every worker gracefully" in out and "job term: Interrupted" in out
        for log in worker_logs:  # torchrun forwarded the SIGTERM to the trainer, which could save
            assert "got signal 15, saving" in log.read_text()
        assert run.leftovers() == []
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        kill_tagged(run.tag)
