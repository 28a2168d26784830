"""The actuator alone (actuator.py), against the emulated API server: it carries out the decision layer's
actions in their order (the server judges everything first, shared objects, then the store, then the
workers), turns a refusal into the job's CreateRejected with nothing half-created, writes statuses and
remembers them, and posts Events beside the pass."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import AsyncIterator

import pytest_asyncio

from ddpjob_operator import decisions, kube, model, naming, observations

from .conftest import FAST, NAMESPACE, Harness, eventually
from .controller_rooms import Rooms
from tests.kube_emulator import PODS, api_error

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
# When the server answers: a pass that began at NOW took 0.7 s to get its answers (judging, under load).
ANSWERED = NOW + timedelta(seconds=0.7)
FIRST_PODS = (decisions.CreateStore(), decisions.CreateWorker(0, 0, 0), decisions.CreateWorker(1, 0, 0))


@pytest_asyncio.fixture()
async def rig(harness: Harness) -> AsyncIterator[Rooms]:
    async with Rooms(harness.url, FAST, clock=lambda: ANSWERED) as rooms:
        yield rooms


async def view_of(harness: Harness, name: str) -> decisions.JobView:
    body = await harness.apply(name)
    return observations.job_view(body)


async def test_the_server_judges_every_object_then_shared_store_and_workers_are_created(harness, rig):
    view = await view_of(harness, "fresh")
    await rig.actuator.execute(view, FIRST_PODS, NOW, {})
    judged = [name for plural, name in harness.cluster.dry_runs]
    assert {"fresh-worker-0", "fresh-worker-1", "fresh-rdzv"} <= set(judged)
    assert set(harness.pods("fresh")) == {"fresh-worker-0", "fresh-worker-1"}
    assert set(harness.pods("fresh", naming.ROLE_STORE)) == {"fresh-rdzv"}
    created = harness.cluster.created
    assert created[(NAMESPACE, "fresh-rdzv")] < min(created[(NAMESPACE, "fresh-worker-0")],
                                                     created[(NAMESPACE, "fresh-worker-1")])
    assert rig.actuator.refusals(view.uid) == () and not rig.refused
    # The same generation again (a replacement): judged once already, the shared objects exist.
    dry_runs = len(harness.cluster.dry_runs)
    await rig.actuator.execute(view, (decisions.DeleteWorker("fresh-worker-1", "test"),), NOW,
                               {"fresh-worker-1": harness.pods("fresh")["fresh-worker-1"]["metadata"]["uid"]})
    await harness.finish_terminating("fresh")
    await rig.actuator.execute(view, (decisions.CreateWorker(1, 0, 1),), NOW, {})
    assert len(harness.cluster.dry_runs) == dry_runs
    assert harness.pods("fresh")["fresh-worker-1"]["metadata"]["labels"][naming.LABEL_ATTEMPT] == "1"


async def test_a_refused_pod_is_the_jobs_create_rejected_and_nothing_is_created(harness, rig):
    harness.cluster.admit_pods = lambda pod: (api_error(403, "Forbidden", "exceeded quota: compute", PODS,
                                                        pod["metadata"]["name"])
                                              if pod["metadata"]["name"] == "quota-worker-1" else None)
    view = await view_of(harness, "quota")
    await rig.actuator.execute(view, FIRST_PODS, NOW, {})
    refusals = rig.actuator.refusals(view.uid)
    assert [(r.kind, r.name, r.status) for r in refusals] == [("Pod", "quota-worker-1", 403)]
    # Dated when refused: the job's backoff counts from the refusal, not from the start of a slow pass.
    assert "exceeded quota" in refusals[0].message and refusals[0].at == ANSWERED
    assert rig.refused == [(NAMESPACE, "quota")]  # its next pass decides on it now
    assert not harness.pods("quota") and not harness.pods("quota", naming.ROLE_STORE)
    rig.actuator.retry_refused(view.uid)  # the user changed the spec
    assert rig.actuator.refusals(view.uid) == ()


async def test_a_status_write_is_remembered_and_counted_and_a_gone_job_is_no_error(harness, rig):
    view = await view_of(harness, "counted")
    job = naming.JobRef(view.name, view.namespace, view.uid)
    new = view.status.model_copy(update={"phase": "Running", "restarts": 2})
    patch = kube.merge_patch(view.status.wire(), new.wire())
    assert await rig.actuator.write_status(job, view.status, new, patch)
    assert harness.status("counted")["restarts"] == 2 and harness.status("counted")["phase"] == "Running"
    assert rig.cache.written[view.uid] == new
    assert rig.counted("ddpjob_restarts_total") == 2
    await harness.delete_job("counted")
    assert not await rig.actuator.write_status(job, new, new.model_copy(update={"restarts": 3}), {"restarts": 3})
    assert rig.cache.written[view.uid] == new and rig.counted("ddpjob_restarts_total") == 2


async def test_events_are_posted_beside_the_pass_and_a_deleted_job_goes(harness, rig):
    view = await view_of(harness, "noted")
    await rig.actuator.execute(view, (decisions.Event("Warning", "Tested", "a warning for the test"),
                                      decisions.DeleteJob("done")), NOW, {})
    await eventually(lambda: harness.events("noted"), what="the Event")
    event = harness.events("noted")[0]
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "Tested", "a warning for the test")
    assert event["involvedObject"]["uid"] == view.uid and event["involvedObject"]["kind"] == model.KIND
    await eventually(lambda: harness.job("noted") is None, what="the job deleted")
    await eventually(lambda: len(rig.side_tasks) == 0, what="the side task to end")



async def test_a_stall_is_counted_once_while_its_incident_is_filled_in(harness, rig):
    """The incident's recovery timeline and ranks are written as the operator sees them: the same stall."""
    view = await view_of(harness, "stalled")
    job = naming.JobRef(view.name, view.namespace, view.uid)
    stall = model.Incident(generation=0, time="2026-11-29T12:00:00Z", cause="Retryable",
                           reason=decisions.REASON_STALLED, charged=True, ranks=[1])
    statuses = [view.status, view.status.model_copy(update={"incidents": [stall]}),
                view.status.model_copy(update={"incidents": [stall.model_copy(update={
                    "ranks": [0, 1], "message": "the gang was replaced"})]})]
    for old, new in zip(statuses, statuses[1:]):
        assert await rig.actuator.write_status(job, old, new, kube.merge_patch(old.wire(), new.wire()))
    assert rig.counted("ddpjob_stalls_total") == 1
    later = stall.model_copy(update={"generation": 1, "time": "2026-11-29T12:05:00Z"})
    last = statuses[-1].model_copy(update={"incidents": [*statuses[-1].incidents, later]})
    assert await rig.actuator.write_status(job, statuses[-1], last,
                                           kube.merge_patch(statuses[-1].wire(), last.wire()))
    assert rig.counted("ddpjob_stalls_total") == 2
