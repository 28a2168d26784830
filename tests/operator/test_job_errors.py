"""Issue 23: any exception while reconciling one job becomes that job's condition and Warning Event and is
retried with backoff; it is never an unhandled task and never stops other jobs. The real operator (in this
process's thread) against the emulator, with a builder that raises for one job."""

from __future__ import annotations

import pytest

from ddpjob_operator import job_manifests

from .conftest import eventually, started

pytestmark = pytest.mark.timeout(60)


async def test_an_exception_in_one_jobs_reconcile_is_its_condition_and_event(harness, operator, monkeypatch):
    real_worker_pod = job_manifests.worker_pod
    broken = [True]
    calls: list[str] = []

    def worker_pod(job, *args, **kwargs):
        calls.append(job.name)
        if job.name == "boom" and broken[0]:
            raise OverflowError("cannot convert float infinity to integer")
        return real_worker_pod(job, *args, **kwargs)
    monkeypatch.setattr(job_manifests, "worker_pod", worker_pod)

    await harness.apply("boom")
    cond = await eventually(lambda: (c := harness.condition("boom", "ReconcileError"))
                            and c["status"] == "True" and c, what="the ReconcileError condition")
    assert "OverflowError" in cond["message"] and "cannot convert float infinity" in cond["message"]
    await eventually(lambda: any(e["type"] == "Warning" and e["reason"] == "ReconcileError"
                                 and "OverflowError" in e["message"] for e in harness.events("boom")),
                     what="a Warning ReconcileError event")
    # Other jobs go on: one applied after the failure runs.
    await started(harness, "fine")
    assert harness.condition("fine", "ReconcileError") is None
    # Retried with backoff (not given up, not a hot loop), and the same message is one Event, not one per try.
    await eventually(lambda: calls.count("boom") >= 3, what="retries of the failing job")
    assert sum(e["reason"] == "ReconcileError" for e in harness.events("boom")) == 1
    # Fixed (the operator upgraded): the next retry goes through and the condition turns False.
    broken[0] = False
    await harness.wait_workers("boom", 2)
    await eventually(lambda: harness.condition("boom", "ReconcileError")["status"] == "False",
                     what="ReconcileError=False")
