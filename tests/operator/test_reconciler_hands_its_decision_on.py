"""The reconciler alone (reconciler.py), with the real actuator and job cache against the emulated API server
(no kopf, no work queue): a pass observes the job, decides, and hands the status and the actions on; a
standby's pass does nothing; a pass that raises becomes the job's ReconcileError condition and one Warning
Event, retried with a growing backoff, and the next pass that goes through clears the condition."""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator, Iterator, Mapping

import pytest_asyncio

from ddpjob_operator import naming
from ddpjob_operator.job_cache import JobKey
from ddpjob_operator.reconciler import CONDITION_RECONCILE_ERROR, REASON_RECONCILE_ERROR

from .conftest import FAST, NAMESPACE, Harness, eventually
from .controller_rooms import Rooms

SETTINGS = dataclasses.replace(FAST, retry_seconds=1.0)


class BrokenIndex(Mapping[Any, Any]):
    """A pod index whose reads fail, as a bug in one job's pass would."""

    def __getitem__(self, key: Any) -> Any:
        raise ValueError("an index that cannot be read")

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0


@pytest_asyncio.fixture()
async def rig(harness: Harness) -> AsyncIterator[Rooms]:
    async with Rooms(harness.url, SETTINGS) as rooms:
        yield rooms


async def applied(harness: Harness, rig: Rooms, name: str) -> JobKey:
    body = await harness.apply(name)
    key = (NAMESPACE, name)
    rig.cache.saw(key, body)
    return key


async def test_a_pass_writes_the_decided_status_and_creates_the_decided_pods(harness, rig):
    key = await applied(harness, rig, "handed")
    await rig.reconciler.reconcile(key)
    status = harness.status("handed")
    assert status["phase"] == "Pending" and status["observedGeneration"] == 1 and status["lastReconcileTime"]
    assert set(harness.pods("handed")) == {"handed-worker-0", "handed-worker-1"}
    assert set(harness.pods("handed", naming.ROLE_STORE)) == {"handed-rdzv"}
    uid = harness.job("handed")["metadata"]["uid"]
    assert rig.cache.written[uid].wire() == status  # the write is remembered: its echo is no news
    assert rig.cache.saw(key, harness.job("handed")).needs_pass is False


async def test_a_standby_pass_does_nothing(harness, rig):
    key = await applied(harness, rig, "standby")
    rig.leads = False
    await rig.reconciler.run(key)
    assert not harness.status("standby") and not harness.pods("standby") and not rig.requeued


async def test_a_pass_that_raises_is_the_jobs_condition_until_a_pass_goes_through(harness, rig):
    key = await applied(harness, rig, "buggy")
    rig.cache.pods = BrokenIndex()
    for _ in range(3):
        await rig.reconciler.run(key)
    assert [delay for _, delay in rig.requeued] == [1.0, 2.0, 4.0]  # retry_seconds, doubled each time
    condition = harness.condition("buggy", CONDITION_RECONCILE_ERROR)
    assert condition["status"] == "True" and condition["reason"] == REASON_RECONCILE_ERROR
    assert "ValueError: an index that cannot be read" in condition["message"]
    await eventually(lambda: harness.events("buggy"), what="the Warning Event")
    assert rig.counted("ddpjob_reconcile_errors_total") == 3
    # One Event for the three failures: the message did not change.
    assert [(e["type"], e["reason"]) for e in harness.events("buggy")] == [("Warning", REASON_RECONCILE_ERROR)]
    assert not harness.pods("buggy")
    rig.cache.pods = {}
    await rig.reconciler.run(key)
    cleared = harness.condition("buggy", CONDITION_RECONCILE_ERROR)
    assert cleared["status"] == "False" and cleared["reason"] == "Reconciled"
    assert set(harness.pods("buggy")) == {"buggy-worker-0", "buggy-worker-1"}
