"""Warm spares (failurePolicy.spares, issue 25): the pure rules, then the real operator on the API double.

A spare is a pod that imported torch and waits outside every rendezvous. When an incident replaces a
worker in place, a ready spare takes the lost rank's place in the next generation (the status names it as
the rank's pod), no worker pod is created for that rank, and the pool is refilled. A spare lost while idle
is replaced without an incident."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

import aiohttp
import pytest

from ddpjob_operator import decisions as d, job_manifests, naming, observations
from ddpjob_operator.decisions.spares import REASON_SPARE_ABANDONED, REASON_SPARE_JOINED
from ddpjob_operator.validation import InvalidJob, parse_spec

from .conftest import eventually, passes
from .test_decisions import T0, UID, failed, job, of, running_status, spec, w
from .test_scenarios import (NO_BACKOFF, NS, PODS, assert_outcome, creations, deletions,  # noqa: F401
                             dies_after_the_charge, nodes, operator, reconciled_past, started, uids)

OPTIONS = d.Options(incident_settle_seconds=0)
SPARES = {"maxRestarts": 3, "spares": 1, "backoff": {"initialSeconds": 0, "maxSeconds": 1}}


def spare(slot: int, phase: str = "Running", **kw) -> d.WorkerObservation:
    kw.setdefault("ready", phase == "Running")
    return d.WorkerObservation(index=-1, name=naming.spare_name("j", slot), generation=0, phase=phase,
                               uid=f"spare-{slot}", **kw)


def decide(view, observed, options=OPTIONS):
    return d.decide(view, observed, options)


def with_spares(*spares, workers=(), now=T0, progress=None):
    return d.Observed(workers=tuple(workers), store=d.StoreObservation("Running", ready=True), now=now,
                      spares=tuple(spares), progress=progress)


# ---------------------------------------------------------------- the pool

def test_the_pool_is_filled_by_slot_and_a_repeated_pass_asks_for_the_same_names():
    s = spec(failurePolicy={"spares": 2})
    first = decide(job(s, running_status()), with_spares(workers=(w(0), w(1))))
    assert of(first, d.CreateSpare) == [d.CreateSpare(0, 0), d.CreateSpare(1, 0)]
    # Not seen yet: the same two names again (409 AlreadyExists means done), never a third.
    again = decide(job(s, first.status), with_spares(workers=(w(0), w(1))))
    assert of(again, d.CreateSpare) == [d.CreateSpare(0, 0), d.CreateSpare(1, 0)]
    full = decide(job(s, again.status), with_spares(spare(0), spare(1, "Pending"), workers=(w(0), w(1))))
    assert not of(full, d.CreateSpare) and full.status.ready_spares == 1
    assert [(x.pod, x.ready) for x in full.status.spares] == [("j-spare-0", True), ("j-spare-1", False)]


def test_an_idle_spare_that_dies_is_replaced_without_an_incident():
    s = spec(failurePolicy={"spares": 1})
    out = decide(job(s, running_status()), with_spares(spare(0, "Failed", exit_code=137), workers=(w(0), w(1))))
    assert of(out, d.DeleteWorker) == [d.DeleteWorker("j-spare-0", d.REASON_SPARE_EXITED, force=True)]
    assert of(out, d.CreateSpare) == [d.CreateSpare(1, 0)]  # slot 0's name is still held by the dead pod
    assert out.status.restarts == 0 and out.status.disruptions == 0 and not out.status.incidents


def test_no_spares_without_a_channel_and_none_left_once_the_job_ends():
    s = spec(failurePolicy={"spares": 1})
    off = decide(job(s, running_status()), with_spares(workers=(w(0), w(1))), d.Options(spares_enabled=False))
    assert not of(off, d.CreateSpare)
    done = decide(job(s, running_status()), with_spares(spare(0), workers=(w(0, "Succeeded"), w(1, "Succeeded"))))
    assert done.status.phase == "Succeeded"
    assert d.DeleteWorker("j-spare-0", d.REASON_SPARE_SURPLUS) in of(done, d.DeleteWorker)


def test_spares_need_restart_scope_pod():
    with pytest.raises(InvalidJob, match="failurePolicy.spares needs restartScope: Pod"):
        parse_spec({"replicas": 2, "image": "t:1", "entrypoint": "ddp_trainer",
                    "failurePolicy": {"spares": 1, "restartScope": "All"}})


# ---------------------------------------------------------------- taking a lost rank's place

def test_a_ready_spare_takes_the_lost_ranks_place_and_the_pool_is_refilled():
    s = spec(failurePolicy=SPARES)
    out = decide(job(s, running_status()), with_spares(spare(0), workers=(w(0), failed(1, 137))))
    st = out.status
    assert st.restarts == 1 and st.generation == 1
    assert (st.ranks[1].pod, st.ranks[1].uid, st.ranks[1].generation) == ("j-spare-0", "spare-0", 1)
    assert (st.ranks[0].uid, st.ranks[0].generation) == (w(0).uid, 1)  # the survivor, in place
    assert not of(out, d.CreateWorker)  # no pod for rank 1: the spare is its pod
    assert of(out, d.CreateSpare) == [d.CreateSpare(1, 1)]
    assert any(e.reason == d.REASON_SPARE_TAKES_OVER and "j-spare-0" in e.message for e in of(out, d.Event))
    # Next pass: the failed pod is gone, the spare is rank 1's worker; nothing is created for rank 1.
    later = decide(job(s, st), with_spares(spare(0), spare(1, "Pending"), workers=(w(0),), now=T0 + timedelta(seconds=1)))
    assert not of(later, d.CreateWorker) and later.status.phase == "Running"
    assert [(r.pod, r.phase) for r in later.status.ranks] == [("j-worker-0", "Running"), ("j-spare-0", "Running")]
    assert [x.pod for x in later.status.spares] == ["j-spare-1"] and later.status.restarts == 1


def test_a_spare_that_is_not_ready_does_not_take_over():
    s = spec(failurePolicy=SPARES)
    out = decide(job(s, running_status()), with_spares(spare(0, "Pending"), workers=(w(0), failed(1, 137))))
    assert out.status.ranks[1].pod == "j-worker-1" and out.status.ranks[1].uid is None
    later = decide(job(s, out.status), with_spares(spare(0, "Pending"), workers=(w(0),)))
    assert of(later, d.CreateWorker) == [d.CreateWorker(1, 1, 1)]


def seen_spare(ready: str | None) -> d.WorkerObservation:
    """A spare's pod as the operator observes it: Running, its Ready condition `ready` (None: none yet)."""
    pod = job_manifests.spare_pod(naming.JobRef("j", "ns", UID), spec(failurePolicy=SPARES), serial=0, generation=0)
    pod["metadata"]["uid"] = "spare-0"
    pod["status"] = {"phase": "Running", "conditions": [] if ready is None else [{"type": "Ready", "status": ready}],
                     "containerStatuses": [{"name": naming.TRAINER_CONTAINER,
                                            "state": {"running": {"startedAt": d.rfc3339(T0)}}}]}
    observed = observations.observe([observations.summarize_pod(pod)], T0)
    assert [x.name for x in observed.spares] == ["j-spare-0"] and observed.spares[0].phase == "Running"
    return observed.spares[0]


@pytest.mark.parametrize("ready", [None, "False", "True"])
def test_a_running_spare_counts_and_takes_a_place_only_once_its_pod_is_ready(ready):
    """Its container started, but its launcher has not marked itself ready (its imports still run, or it
    cannot reach the operator's assignment route: a NetworkPolicy, a CA it cannot verify), so its readiness
    probe fails: it is not in readySpares, and a lost rank gets a worker pod, not this spare. Not replaced
    either: it is the pool, still warming. Ready: counted, and it takes the place."""
    s, cold = spec(failurePolicy=SPARES), seen_spare(ready)
    ok = ready == "True"
    pool = decide(job(s, running_status()), with_spares(cold, workers=(w(0), w(1))))
    assert pool.status.ready_spares == int(ok)
    assert [(x.pod, x.phase, x.ready) for x in pool.status.spares] == [("j-spare-0", "Running", ok)]
    assert not of(pool, d.CreateSpare) and not of(pool, d.DeleteWorker)
    out = decide(job(s, pool.status), with_spares(cold, workers=(w(0), failed(1, 137))))
    assert out.status.restarts == 1 and out.status.generation == 1
    taken = ("j-spare-0", "spare-0") if ok else ("j-worker-1", None)
    assert (out.status.ranks[1].pod, out.status.ranks[1].uid) == taken
    assert any(e.reason == d.REASON_SPARE_TAKES_OVER for e in of(out, d.Event)) == ok
    # Next pass, the failed pod gone: the rank's own pod is created unless the spare took the place.
    later = decide(job(s, out.status), with_spares(cold, workers=(w(0),), now=T0 + timedelta(seconds=1)))
    assert of(later, d.CreateWorker) == ([] if ok else [d.CreateWorker(1, 1, 1)])


def test_a_promoted_spare_that_fails_is_an_incident_and_its_rank_gets_a_worker_again():
    s = spec(failurePolicy=SPARES)
    took = decide(job(s, running_status()), with_spares(spare(0), workers=(w(0), failed(1, 137)))).status
    st = decide(job(s, took), with_spares(spare(0), spare(1), workers=(w(0),))).status
    out = decide(job(s, st), with_spares(spare(0, "Failed", exit_code=137, finished_at=T0 + timedelta(seconds=60)),
                                         spare(1), workers=(w(0),), now=T0 + timedelta(seconds=60)))
    assert out.status.restarts == 2 and out.status.generation == 2
    assert out.status.incidents[-1].ranks == [1]
    # The spare that was ready takes rank 1's place this time; the dead one is removed as a failed worker.
    assert out.status.ranks[1].pod == "j-spare-1"
    assert d.DeleteWorker("j-spare-0", d.REASON_REPLACE, force=True) in of(out, d.DeleteWorker)
    again = decide(job(s, out.status), with_spares(spare(1), workers=(w(0),), now=T0 + timedelta(seconds=61)))
    assert again.status.restarts == 2 and not of(again, d.CreateWorker)  # charged once


def test_a_promoted_spare_that_vanished_before_it_was_seen_frees_its_rank():
    s = spec(failurePolicy=SPARES)
    took = decide(job(s, running_status()), with_spares(spare(0), workers=(w(0), failed(1, 137)))).status
    out = decide(job(s, took), with_spares(workers=(w(0),)))
    assert out.status.ranks[1].pod == "j-worker-1" and of(out, d.CreateWorker) == [d.CreateWorker(1, 1, 1)]


# ---------------------------------------------------------------- a promoted spare that never takes its place

BOUND = d.Options(incident_settle_seconds=0, cannot_start_seconds=60)
REPORTED = {"step": 40, "updatedTime": d.rfc3339(T0 - timedelta(seconds=5))}  # the trainer reports progress


def promoted(progress=REPORTED, replicas=2):
    """The pass that gives spare 0 the place of worker 1 (killed) in generation 1, at T0."""
    s = spec(replicas=replicas, failurePolicy=SPARES)
    st = running_status(progress=progress) if progress else running_status()
    others = [w(i) for i in range(2, replicas)]
    if replicas > 2:  # worker 2 was killed with worker 1: it gets a pod, no spare is left for it
        others = [failed(2, 137)]
    out = decide(job(s, st), with_spares(spare(0), workers=(w(0), failed(1, 137), *others)), BOUND)
    assert out.status.ranks[1].pod == "j-spare-0" and out.status.generation == 1
    return s, out.status


def reports(*ranks: tuple[int, int], generation: int = 1) -> d.ProgressObservation:
    """What the operator's tracker holds: each rank's newest report (index, generation)."""
    return d.ProgressObservation(generation=generation, step=41, last_advance=T0, updated_at=T0,
                                 ranks=tuple(d.RankReport(i, g, 41, T0) for i, g in ranks))


def taking_over(status):
    return next((c.status, c.reason) for c in status.conditions if c.type == "SpareTakingOver")


def later(s, st, seconds, progress=None, workers=None):
    workers = (w(0),) if workers is None else workers
    return decide(job(s, st), with_spares(spare(0), spare(1, "Pending"), workers=workers,
                                          now=T0 + timedelta(seconds=seconds), progress=progress), BOUND)


def test_the_promotion_starts_the_spares_clock_when_the_trainer_reports_progress():
    _, st = promoted()
    assert taking_over(st) == ("True", d.REASON_SPARE_TAKES_OVER)
    # A trainer that reports nothing: nothing could tell a spare that trains from one that hangs.
    _, quiet = promoted(progress=None)
    assert not [c for c in quiet.conditions if c.type == "SpareTakingOver"]


@pytest.mark.parametrize("progress, seconds, outcome", [
    pytest.param(None, 59, "waits", id="nothing reported yet, before the bound"),
    pytest.param(None, 60, "released", id="nothing reported at the bound"),
    pytest.param(reports((0, 0), (1, 0), generation=0), 60, "released", id="only the killed worker's reports"),
    # A survivor's reports are attributed to the generation it was carried into, whether or not its
    # trainer runs there: only the spare's own report says it took its place.
    pytest.param(reports((0, 1), (1, 0)), 60, "released", id="the survivor's reports, not the spare's"),
    pytest.param(reports((0, 1), (1, 1)), 600, "joined", id="the spare's own report in its generation"),
    pytest.param(reports((1, 2), generation=2), 600, "joined", id="a report from a later generation"),
    pytest.param(reports(generation=1), 600, "joined", id="a local run: the job's reports in its generation"),
    pytest.param(reports(generation=0), 60, "released", id="a local run: the job's reports still from before"),
])
def test_a_promoted_spare_has_a_bounded_time_to_take_its_place(progress, seconds, outcome):
    s, st = promoted()
    out = later(s, st, seconds, progress)
    if outcome == "waits":
        assert taking_over(out.status) == ("True", d.REASON_SPARE_TAKES_OVER)
        assert not of(out, d.DeleteWorker) and not of(out, d.CreateWorker)
        assert out.requeue_after == pytest.approx(60 - seconds)  # woken at the bound
    elif outcome == "joined":
        assert taking_over(out.status) == ("False", REASON_SPARE_JOINED)
        assert not of(out, d.DeleteWorker) and not of(out, d.CreateWorker)
        assert out.status.ranks[1].pod == "j-spare-0"
    else:
        assert taking_over(out.status) == ("False", REASON_SPARE_ABANDONED)
        assert of(out, d.DeleteWorker) == [d.DeleteWorker("j-spare-0", REASON_SPARE_ABANDONED, force=True)]
        # Rank 1 gets a worker pod in the same generation (the survivor waits for that one), replaced again.
        assert of(out, d.CreateWorker) == [d.CreateWorker(1, 1, 2)]
        rank = out.status.ranks[1]
        assert (rank.pod, rank.uid, rank.restarts, rank.last_reason) == ("j-worker-1", None, 2, REASON_SPARE_ABANDONED)
        assert "j-spare-0" in rank.last_message
        # Part of the incident that promoted it: nothing charged, no new incident, no new generation.
        assert (out.status.restarts, out.status.disruptions, out.status.generation) == (1, 0, 1)
        assert [(i.generation, i.ranks) for i in out.status.incidents] == [(0, [1])]
        assert (out.status.ranks[0].uid, out.status.ranks[0].generation) == (w(0).uid, 1)  # the survivor stays
        assert out.status.phase == "Restarting"
        assert any(e.reason == REASON_SPARE_ABANDONED and e.type == "Warning" for e in of(out, d.Event))
        # The released spare is neither the rank's worker nor an idle spare again; the pool keeps spare 1.
        assert [x.pod for x in out.status.spares] == ["j-spare-1"] and not of(out, d.CreateSpare)


def test_a_released_spare_is_replaced_once_and_charged_never():
    s, st = promoted()
    released = later(s, st, 60).status
    going = dataclasses.replace(spare(0), terminating_since=T0 + timedelta(seconds=61))
    again = decide(job(s, released), with_spares(going, spare(1), workers=(w(0), w(1, "Pending", 1, attempt=2)),
                                                 now=T0 + timedelta(seconds=61)), BOUND)
    assert not of(again, d.CreateWorker) and not of(again, d.DeleteWorker)
    assert (again.status.restarts, again.status.disruptions, len(again.status.incidents)) == (1, 0, 1)
    assert again.status.ranks[1].pod == "j-worker-1" and [x.pod for x in again.status.spares] == ["j-spare-1"]


def test_a_spare_waiting_in_a_rank_past_a_scale_down_is_left_to_the_resize():
    """The job scaled below the spare's rank after the bound passed (the operator was down meanwhile):
    the resize replaces that rank; the bound does not judge it (it looked up a pod the job no longer has)."""
    s, st = promoted()
    smaller = spec(replicas=1, minReplicas=1, failurePolicy=SPARES)
    out = later(smaller, st, 60)
    assert d.DeleteWorker("j-spare-0", REASON_SPARE_ABANDONED, force=True) not in of(out, d.DeleteWorker)
    assert taking_over(out.status) != ("False", REASON_SPARE_ABANDONED)


def test_never_judged_without_progress_reports():
    s, st = promoted(progress=None)
    out = later(s, st, 10_000)
    assert not of(out, d.DeleteWorker) and out.status.ranks[1].pod == "j-spare-0" and out.requeue_after is None


def test_once_seen_training_an_operator_restart_never_releases_it():
    """The reports the operator saw are in its memory only: the condition keeps what they told."""
    s, st = promoted()
    joined = later(s, st, 30, reports((0, 1), (1, 1))).status
    restarted = later(s, joined, 10_000)  # a new operator: no report received yet
    assert not of(restarted, d.DeleteWorker) and restarted.status.ranks[1].pod == "j-spare-0"
    assert taking_over(restarted.status) == ("False", REASON_SPARE_JOINED)


def test_the_clock_waits_for_every_other_rank_to_run():
    """Two workers killed, one spare: worker 2 gets a new pod. Until it runs the group cannot form, whatever
    the spare does; from its start the spare has the whole bound."""
    s, st = promoted(replicas=3)
    assert of(decide(job(s, st), with_spares(spare(0), workers=(w(0),), now=T0 + timedelta(seconds=1)), BOUND),
              d.CreateWorker) == [d.CreateWorker(2, 1, 1)]
    pending = later(s, st, 500, workers=(w(0), w(2, "Pending", 1, attempt=1)))
    assert not of(pending, d.DeleteWorker) and pending.status.ranks[1].pod == "j-spare-0"
    started = T0 + timedelta(seconds=450)
    running = (w(0), w(2, "Running", 1, attempt=1, started_at=started))
    assert later(s, st, 500, workers=running).requeue_after == pytest.approx(10)
    out = later(s, st, 510, workers=running)
    assert of(out, d.DeleteWorker) == [d.DeleteWorker("j-spare-0", REASON_SPARE_ABANDONED, force=True)]
    assert of(out, d.CreateWorker) == [d.CreateWorker(1, 1, 2)] and out.status.restarts == 1


def test_a_spare_still_waiting_when_another_is_promoted_is_judged_with_it():
    """Worker 1's place goes to spare 0; before it trains, worker 2 dies too and spare 1 takes its place in
    the next generation, spare 0 carried along. The second promotion restarts the clock, for both."""
    s = spec(replicas=3, failurePolicy={**SPARES, "spares": 2})
    first = decide(job(s, running_status(progress=REPORTED)),
                   with_spares(spare(0), spare(1), workers=(w(0), failed(1, 137), w(2))), BOUND).status
    at = T0 + timedelta(seconds=5)
    second = decide(job(s, first), with_spares(spare(0), spare(1), workers=(w(0), failed(2, 137, at=at)), now=at),
                    BOUND).status
    assert [(r.pod, r.generation) for r in second.ranks] == [("j-worker-0", 2), ("j-spare-0", 2), ("j-spare-1", 2)]
    idle = (spare(0), spare(1), spare(2, "Pending"))
    assert not of(decide(job(s, second), with_spares(*idle, workers=(w(0),), now=T0 + timedelta(seconds=64)), BOUND),
                  d.DeleteWorker)
    out = decide(job(s, second), with_spares(*idle, workers=(w(0),), now=T0 + timedelta(seconds=65)), BOUND)
    assert of(out, d.DeleteWorker) == [d.DeleteWorker("j-spare-0", REASON_SPARE_ABANDONED, force=True),
                                       d.DeleteWorker("j-spare-1", REASON_SPARE_ABANDONED, force=True)]
    assert of(out, d.CreateWorker) == [d.CreateWorker(1, 2, 2), d.CreateWorker(2, 2, 2)]
    assert (out.status.restarts, out.status.generation, len(out.status.incidents)) == (2, 2, 2)


def test_a_promoted_spare_that_exits_is_an_incident_even_past_the_bound():
    s, st = promoted()
    dead = spare(0, "Failed", exit_code=137, finished_at=T0 + timedelta(seconds=70))
    out = decide(job(s, st), with_spares(dead, spare(1), workers=(w(0),), now=T0 + timedelta(seconds=70)), BOUND)
    assert out.status.restarts == 2 and out.status.incidents[-1].ranks == [1]
    assert d.DeleteWorker("j-spare-0", d.REASON_REPLACE, force=True) in of(out, d.DeleteWorker)
    assert not [a for a in of(out, d.DeleteWorker) if a.reason == REASON_SPARE_ABANDONED]


# ---------------------------------------------------------------- the real operator

PROGRESS = {"progress_url": "http://ddpjob-progress.ddpjob-system.svc:8090", "bind_address": "127.0.0.1"}
AUDIENCE = "progress.elastic.ddp.dev"


@pytest.mark.settings(**PROGRESS)
async def test_a_spare_takes_a_killed_workers_place_on_the_cluster(harness, operator, nodes):
    await operator.in_operator(operator.controller.progress_server.start(0, "127.0.0.1"))
    await started(harness, nodes, "warm", replicas=2, failurePolicy=SPARES)
    await eventually(lambda: "warm-spare-0" in harness.pods("warm", naming.ROLE_SPARE), what="the spare")
    await nodes.start("warm-spare-0")
    await eventually(lambda: harness.status("warm").get("readySpares") == 1, what="a ready spare")
    before = uids(harness, "warm")
    spare_uid = harness.pods("warm", naming.ROLE_SPARE)["warm-spare-0"]["metadata"]["uid"]
    base = f"http://127.0.0.1:{operator.controller.progress_server.port}/v1/namespaces/team-a/ddpjobs/warm/assignment"
    token = harness.cluster.issue_token("team-a", "warm-spare-0", (AUDIENCE,))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        async with session.get(base) as response:
            assert response.status == 204  # idle: nothing for it yet

        await nodes.exit("warm-worker-1", 137)
        await eventually(lambda: harness.status("warm").get("generation") == 1, what="generation 1")
        rank = harness.status("warm")["ranks"][1]
        assert (rank["pod"], rank["uid"], rank["generation"]) == ("warm-spare-0", spare_uid, 1)

        async def assigned():
            async with session.get(base) as response:
                return await response.json() if response.status == 200 else None
        given = await eventually(assigned, what="the spare's assignment")
        assert given == {"index": 1, "generation": 1, "nnodes": "2:2",
                         "rdzvId": naming.rendezvous_id(harness.job("warm")["metadata"]["uid"], 1)}
    # The pool is refilled; no worker pod is created for rank 1; the survivor kept its pod.
    await eventually(lambda: "warm-spare-1" in harness.pods("warm", naming.ROLE_SPARE), what="a new spare")
    await nodes.start("warm-spare-1")
    await harness.wait_phase("warm", "Running")
    assert uids(harness, "warm") == {"warm-worker-0": before["warm-worker-0"]}
    assert creations(harness, "warm") == {"warm-worker-0": 1, "warm-worker-1": 1, "warm-rdzv": 1, "warm-spare-0": 1,
                                          "warm-spare-1": 1}
    assert_outcome(harness, "warm", phase="Running", reason="Running", restarts=1, disruptions=0, generation=1,
                   incident=("Retryable", True, [1]))


@pytest.mark.settings(**PROGRESS)
async def test_an_idle_spare_lost_on_the_cluster_is_replaced_uncharged(harness, operator, nodes):
    await started(harness, nodes, "idle", replicas=2, failurePolicy=SPARES)
    await eventually(lambda: "idle-spare-0" in harness.pods("idle", naming.ROLE_SPARE), what="the spare")
    await nodes.start("idle-spare-0")
    await nodes.exit("idle-spare-0", 137)
    await eventually(lambda: "idle-spare-1" in harness.pods("idle", naming.ROLE_SPARE), what="its replacement")
    await eventually(lambda: "idle-spare-0" not in harness.pods("idle", naming.ROLE_SPARE), what="the dead one gone")
    status = harness.status("idle")
    assert status["restarts"] == 0 and status["disruptions"] == 0 and not status.get("incidents")
    assert status["phase"] == "Running"


async def runs_not_ready(harness, name: str) -> None:
    """The scheduler binds the spare and its kubelet starts its container, whose readiness probe fails
    (its launcher never marked itself ready: it cannot reach the operator's assignment route)."""
    await harness.cluster.bind(NS, name, "node-3")
    started_at = d.rfc3339(T0)
    await harness.cluster.write((PODS, NS, name), {"status": {
        "phase": "Running", "startTime": started_at,
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
                       {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
                       {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
        "containerStatuses": [{"name": naming.TRAINER_CONTAINER, "ready": False, "started": True,
                               "restartCount": 0, "state": {"running": {"startedAt": started_at}}}]}})


def spares_seen(harness, name: str) -> list[tuple[str, str | None, bool]]:
    return [(x["pod"], x.get("phase"), x.get("ready", False)) for x in harness.status(name).get("spares") or ()]


@pytest.mark.settings(**PROGRESS)
async def test_a_spare_that_runs_but_is_not_ready_is_never_promoted_on_the_cluster(harness, operator, nodes):
    """A spare whose pod runs but is not Ready (its probe fails) is not in readySpares, and a killed
    worker's rank gets a `<job>-worker-<i>` pod in the next generation, the spare left idle; once its
    probe passes it counts."""
    await started(harness, nodes, "cold", replicas=2, failurePolicy=SPARES)
    await eventually(lambda: "cold-spare-0" in harness.pods("cold", naming.ROLE_SPARE), what="the spare")
    await runs_not_ready(harness, "cold-spare-0")
    await eventually(lambda: spares_seen(harness, "cold") == [("cold-spare-0", "Running", False)],
                     what="the spare seen Running, not Ready")
    assert harness.status("cold").get("readySpares", 0) == 0
    spare_uid = harness.pods("cold", naming.ROLE_SPARE)["cold-spare-0"]["metadata"]["uid"]
    survivor = uids(harness, "cold")["cold-worker-0"]

    await nodes.exit("cold-worker-1", 137)
    await eventually(lambda: creations(harness, "cold")["cold-worker-1"] == 2, what="a new pod for worker 1")
    assert rank(harness, "cold", 1)["pod"] == "cold-worker-1" and rank(harness, "cold", 1).get("uid") != spare_uid
    await nodes.start("cold-worker-1")
    await harness.wait_phase("cold", "Running")
    status = harness.status("cold")
    assert status["generation"] == 1 and [r["pod"] for r in status["ranks"]] == ["cold-worker-0", "cold-worker-1"]
    assert uids(harness, "cold")["cold-worker-0"] == survivor  # in place, as without spares
    # The spare is still the idle one it was (never promoted, never replaced), and nothing was created twice.
    assert harness.pods("cold", naming.ROLE_SPARE)["cold-spare-0"]["metadata"]["uid"] == spare_uid
    assert creations(harness, "cold") == {"cold-worker-0": 1, "cold-worker-1": 2, "cold-rdzv": 1, "cold-spare-0": 1}
    assert_outcome(harness, "cold", phase="Running", reason="Running", restarts=1, disruptions=0, generation=1,
                   incident=("Retryable", True, [1]))
    # Its probe passes (its launcher got an answer): ready from now on.
    await harness.cluster.kubelet_start(NS, "cold-spare-0")
    await eventually(lambda: harness.status("cold").get("readySpares") == 1, what="the spare ready")
    assert spares_seen(harness, "cold") == [("cold-spare-0", "Running", True)]


# ---------------------------------------------------------------- the real operator: the endpoint, the bound

class Endpoint:
    """The operator's progress endpoint as the job's pods reach it, each with its own pod-bound token."""

    def __init__(self, harness, operator, session: aiohttp.ClientSession):
        self.harness, self.session = harness, session
        self.base = f"http://127.0.0.1:{operator.controller.progress_server.port}/v1/namespaces/team-a/ddpjobs"

    def token(self, pod: str, audience: str = AUDIENCE) -> str:
        return self.harness.cluster.issue_token("team-a", pod, (audience,))

    async def assignment(self, job: str, pod: str | None, audience: str = AUDIENCE) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token(pod, audience)}"} if pod else {}
        async with self.session.get(f"{self.base}/{job}/assignment", headers=headers) as response:
            return response.status, (await response.json() if response.status == 200 else None)

    async def report(self, job: str, pod: str, step: int) -> int:
        """POST a progress report as `pod`; its status code."""
        async with self.session.post(f"{self.base}/{job}/progress", json={"step": step},
                                     headers={"Authorization": f"Bearer {self.token(pod)}"}) as response:
            return response.status


async def serving(operator) -> None:
    await operator.in_operator(operator.controller.progress_server.start(0, "127.0.0.1"))


async def warm_job(harness, nodes, name: str, **failure_policy: Any) -> None:
    """A job of 2 workers whose one spare runs and is ready."""
    await started(harness, nodes, name, replicas=2, failurePolicy={**SPARES, **failure_policy})
    await eventually(lambda: f"{name}-spare-0" in harness.pods(name, naming.ROLE_SPARE), what="the spare")
    await nodes.start(f"{name}-spare-0")
    await eventually(lambda: harness.status(name).get("readySpares") == 1, what="a ready spare")


async def trained(harness, endpoint: Endpoint, name: str) -> None:
    """Both workers report a step: the job's trainer reports progress (the bound needs that)."""
    for pod in (f"{name}-worker-0", f"{name}-worker-1"):
        assert await endpoint.report(name, pod, 5) == 204
    await eventually(lambda: (harness.status(name).get("progress") or {}).get("updatedTime"),
                     what="the job's progress on record")


def rank(harness, name: str, index: int) -> dict[str, Any]:
    return next(r for r in harness.status(name).get("ranks", []) if r["index"] == index)


@pytest.mark.settings(**PROGRESS)
async def test_the_assignment_route_answers_only_a_promoted_spare_of_its_own_job(harness, operator, nodes):
    await serving(operator)
    await warm_job(harness, nodes, "mine")
    await warm_job(harness, nodes, "theirs")
    await nodes.exit("theirs-worker-1", 137)  # their spare takes worker 1's place in their generation 1
    await eventually(lambda: rank(harness, "theirs", 1)["pod"] == "theirs-spare-0", what="their spare promoted")
    async with aiohttp.ClientSession() as session:
        endpoint = Endpoint(harness, operator, session)
        # The promoted spare, at its own job: its place (so the answers below are not vacuous).
        status, given = await eventually(lambda: _given(endpoint.assignment("theirs", "theirs-spare-0")),
                                         what="their spare's assignment")
        assert given["index"] == 1 and given["generation"] == 1
        # Nothing for anyone else: a worker, another job's (promoted) spare, an idle spare.
        assert await endpoint.assignment("mine", "mine-worker-0") == (204, None)
        assert await endpoint.assignment("mine", "theirs-spare-0") == (204, None)
        assert await endpoint.assignment("mine", "mine-spare-0") == (204, None)
        assert await endpoint.assignment("theirs", "mine-spare-0") == (204, None)
        # No token, or one meant for another audience (the API server's): not authenticated.
        assert (await endpoint.assignment("theirs", None))[0] == 401
        assert (await endpoint.assignment("theirs", "theirs-spare-0", audience="https://kubernetes.default.svc"))[0] \
            == 401
        # A standby replica answers nothing but "retry" (another connection reaches the leader).
        server = operator.controller.progress_server
        leading, server.leading = server.leading, lambda: False
        try:
            assert (await endpoint.assignment("theirs", "theirs-spare-0"))[0] == 503
        finally:
            server.leading = leading
        assert (await endpoint.assignment("theirs", "theirs-spare-0"))[0] == 200


async def _given(asking) -> tuple[int, Any] | None:
    answer = await asking
    return answer if answer[0] == 200 else None


@pytest.mark.settings(**PROGRESS, cannot_start_seconds=2.0)
async def test_a_promoted_spare_that_never_takes_its_place_is_replaced_uncharged(harness, operator, nodes):
    """The spare cannot reach the operator (a NetworkPolicy, a CA it cannot verify) or hangs: it never
    asks for its assignment and never trains. Once the bound passes (DDPJOB_OPERATOR_CANNOT_START_SECONDS)
    its pod is force-deleted and rank 1 gets a worker pod in the same generation: no second charge, no
    second incident, the survivor keeps its pod."""
    await serving(operator)
    await warm_job(harness, nodes, "stuck")
    async with aiohttp.ClientSession() as session:
        await trained(harness, Endpoint(harness, operator, session), "stuck")
    survivor = uids(harness, "stuck")["stuck-worker-0"]
    killed = uids(harness, "stuck")["stuck-worker-1"]
    await nodes.exit("stuck-worker-1", 137)
    replacement = await eventually(lambda: (p := harness.pods("stuck").get("stuck-worker-1")) and
                                   p["metadata"]["uid"] != killed and p, what="a worker pod for rank 1 again")
    labels = replacement["metadata"]["labels"]
    assert (labels[naming.LABEL_GENERATION], labels[naming.LABEL_ATTEMPT]) == ("1", "2")
    assert deletions(harness, "stuck-spare-0") == [0]  # force: it never held anything worth a grace period
    await nodes.start("stuck-worker-1")
    await harness.wait_phase("stuck", "Running")
    await passes(operator)  # nothing more happens
    status = assert_outcome(harness, "stuck", phase="Running", reason="Running", restarts=1, disruptions=0,
                            generation=1, incident=("Retryable", True, [1]))
    assert len(status["incidents"]) == 1
    assert uids(harness, "stuck")["stuck-worker-0"] == survivor and rank(harness, "stuck", 0)["generation"] == 1
    got = rank(harness, "stuck", 1)
    assert (got["pod"], got["restarts"], got["lastReason"]) == ("stuck-worker-1", 2, REASON_SPARE_ABANDONED)
    condition = harness.condition("stuck", "SpareTakingOver")
    assert (condition["status"], condition["reason"]) == ("False", REASON_SPARE_ABANDONED)
    reasons = [e["reason"] for e in harness.events("stuck")]
    assert reasons.index(d.REASON_SPARE_TAKES_OVER) < reasons.index(REASON_SPARE_ABANDONED)
    assert creations(harness, "stuck") == {"stuck-worker-0": 1, "stuck-worker-1": 2, "stuck-rdzv": 1,
                                           "stuck-spare-0": 1, "stuck-spare-1": 1}


@pytest.mark.settings(**PROGRESS, cannot_start_seconds=3.0)
async def test_a_promoted_spare_seen_training_keeps_its_place_past_the_bound(harness, operator, nodes):
    await serving(operator)
    await warm_job(harness, nodes, "joins")
    spare_uid = harness.pods("joins", naming.ROLE_SPARE)["joins-spare-0"]["metadata"]["uid"]
    async with aiohttp.ClientSession() as session:
        endpoint = Endpoint(harness, operator, session)
        await trained(harness, endpoint, "joins")
        await nodes.exit("joins-worker-1", 137)
        await eventually(lambda: rank(harness, "joins", 1)["pod"] == "joins-spare-0", what="the spare promoted")
        promoted_at = time.monotonic()
        # Its launcher fetches the assignment, joins, and its trainer reports its first step there.
        await eventually(lambda: _given(endpoint.assignment("joins", "joins-spare-0")), what="the assignment")
        assert await endpoint.report("joins", "joins-spare-0", 6) == 204
    await eventually(lambda: (harness.condition("joins", "SpareTakingOver") or {}).get("reason") == REASON_SPARE_JOINED,
                     what="the spare seen training")
    await reconciled_past(operator, promoted_at, 3.0 + 1, "the bound passed")
    got = rank(harness, "joins", 1)
    assert (got["pod"], got["uid"], got["generation"]) == ("joins-spare-0", spare_uid, 1)
    assert "joins-worker-1" not in harness.pods("joins")
    assert creations(harness, "joins")["joins-worker-1"] == 1 and harness.status("joins")["restarts"] == 1


@pytest.mark.settings(**PROGRESS)
async def test_operator_killed_right_after_a_promotion_duplicates_and_charges_nothing(harness, operator, nodes):
    """The status write that charges the incident and names the spare as rank 1's pod is stored, then the
    operator is dead (none of that pass's pod calls is sent). The next operator finishes the hand-over from
    the record: the spare gets its place, the failed pod is removed, the pool refilled, each once."""
    await serving(operator)
    await warm_job(harness, nodes, "handover")
    spare_uid = harness.pods("handover", naming.ROLE_SPARE)["handover-spare-0"]["metadata"]["uid"]
    unsent = dies_after_the_charge(operator)
    await nodes.exit("handover-worker-1", 137)
    await eventually(lambda: rank(harness, "handover", 1).get("uid") == spare_uid, what="the promotion on record")
    await eventually(lambda: unsent, what="the dead operator's next call")
    await operator.stop()
    assert harness.status("handover")["restarts"] == 1
    assert "handover-worker-1" in harness.pods("handover")  # never deleted by the dead one
    assert "handover-spare-1" not in harness.pods("handover", naming.ROLE_SPARE)
    await operator.start()
    await serving(operator)
    async with aiohttp.ClientSession() as session:
        endpoint = Endpoint(harness, operator, session)
        _, given = await eventually(lambda: _given(endpoint.assignment("handover", "handover-spare-0")),
                                    what="the spare's assignment from the new operator")
    assert (given["index"], given["generation"]) == (1, 1)
    await eventually(lambda: "handover-worker-1" not in harness.pods("handover"), what="the failed pod removed")
    await eventually(lambda: "handover-spare-1" in harness.pods("handover", naming.ROLE_SPARE), what="the refill")
    await nodes.start("handover-spare-1")
    await harness.wait_phase("handover", "Running")
    await passes(operator)
    assert_outcome(harness, "handover", phase="Running", reason="Running", restarts=1, disruptions=0, generation=1,
                   incident=("Retryable", True, [1]))
    assert rank(harness, "handover", 1)["uid"] == spare_uid
    assert creations(harness, "handover") == {"handover-worker-0": 1, "handover-worker-1": 1, "handover-rdzv": 1,
                                              "handover-spare-0": 1, "handover-spare-1": 1}
