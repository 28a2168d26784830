"""Warm spares (failurePolicy.spares, issue 25): the pure rules, then the real operator on the API double.

A spare is a pod that imported torch and waits outside every rendezvous. When an incident replaces a
worker in place, a ready spare takes the lost rank's place in the next generation (the status names it as
the rank's pod), no worker pod is created for that rank, and the pool is refilled. A spare lost while idle
is replaced without an incident."""

from __future__ import annotations

from datetime import timedelta

import aiohttp
import pytest

from ddpjob_operator import builders, decisions as d
from ddpjob_operator.validation import InvalidJob, parse_spec

from .conftest import eventually
from .test_decisions import T0, failed, job, of, running_status, seen, spec, w
from .test_scenarios import NO_BACKOFF, assert_outcome, creations, nodes, operator, started, uids  # noqa: F401

OPTIONS = d.Options(incident_settle_seconds=0)
SPARES = {"maxRestarts": 3, "spares": 1, "backoff": {"initialSeconds": 0, "maxSeconds": 1}}


def spare(slot: int, phase: str = "Running", **kw) -> d.WorkerObservation:
    kw.setdefault("ready", phase == "Running")
    return d.WorkerObservation(index=-1, name=builders.spare_name("j", slot), generation=0, phase=phase,
                               uid=f"spare-{slot}", **kw)


def decide(view, observed, options=OPTIONS):
    return d.decide(view, observed, options)


def with_spares(*spares, workers=(), now=T0):
    return d.Observed(workers=tuple(workers), store=d.StoreObservation("Running", ready=True), now=now,
                      spares=tuple(spares))


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


# ---------------------------------------------------------------- the real operator

PROGRESS = {"progress_url": "http://ddpjob-progress.ddpjob-system.svc:8090", "bind_address": "127.0.0.1"}
AUDIENCE = "progress.elastic.ddp.dev"


@pytest.mark.settings(**PROGRESS)
async def test_a_spare_takes_a_killed_workers_place_on_the_cluster(harness, operator, nodes):
    await operator.in_operator(operator.controller.progress_server.start(0, "127.0.0.1"))
    await started(harness, nodes, "warm", replicas=2, failurePolicy=SPARES)
    await eventually(lambda: "warm-spare-0" in harness.pods("warm", builders.ROLE_SPARE), what="the spare")
    await nodes.start("warm-spare-0")
    await eventually(lambda: harness.status("warm").get("readySpares") == 1, what="a ready spare")
    before = uids(harness, "warm")
    spare_uid = harness.pods("warm", builders.ROLE_SPARE)["warm-spare-0"]["metadata"]["uid"]
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
                         "rdzvId": builders.rendezvous_id(harness.job("warm")["metadata"]["uid"], 1)}
    # The pool is refilled; no worker pod is created for rank 1; the survivor kept its pod.
    await eventually(lambda: "warm-spare-1" in harness.pods("warm", builders.ROLE_SPARE), what="a new spare")
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
    await eventually(lambda: "idle-spare-0" in harness.pods("idle", builders.ROLE_SPARE), what="the spare")
    await nodes.start("idle-spare-0")
    await nodes.exit("idle-spare-0", 137)
    await eventually(lambda: "idle-spare-1" in harness.pods("idle", builders.ROLE_SPARE), what="its replacement")
    await eventually(lambda: "idle-spare-0" not in harness.pods("idle", builders.ROLE_SPARE), what="the dead one gone")
    status = harness.status("idle")
    assert status["restarts"] == 0 and status["disruptions"] == 0 and not status.get("incidents")
    assert status["phase"] == "Running"
