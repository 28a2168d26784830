"""Issue 31 item 1: `status.progress`, `status.stepTimes` and the stall clock follow whichever pod holds each
rank, promoted spares included, through any number of promotions and operator restarts; a job turns
Succeeded with its final step in the same status write.

Seen on a real cluster: a survivor's trainer (rank 0 of the generation before) reports once more as it
stops, after the operator carried its pod into the next generation, so its report was taken for the new
generation's rank 0; its new trainer then reported as rank 1, which kept the claim alive, and the promoted
spare, the real rank 0, was never heard: the job's progress froze at the promotion while training went on.

First the tracker alone (the pure rules), then the real operator on the API emulator with pod-bound tokens."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import aiohttp
import pytest

from ddpjob_operator import naming, progress

from .conftest import FAST, eventually
from tests.kube_emulator import DDPJOBS
from .test_decisions import T0
from .test_scenarios import NS, nodes, operator, reconciled_past, started  # noqa: F401
from .test_spares import AUDIENCE, PROGRESS, rank, serving, warm_job

# ---------------------------------------------------------------- the tracker

JOB = "job-uid"


def record(tracker: progress.ProgressTracker, index: int, served: int, seconds: float, **body: Any) -> None:
    """A report from the pod of worker `index`, which the operator says serves generation `served`."""
    report = progress.parse_report(json.dumps(body).encode())
    worker = progress.Worker(JOB, index, served)
    tracker.record(JOB, ("ns", "job"), index, progress.attributed_generation(worker, report), report,
                   T0 + timedelta(seconds=seconds))


def seen(tracker: progress.ProgressTracker, seconds: float):
    return tracker.observation(JOB, T0 + timedelta(seconds=seconds))


@pytest.mark.parametrize("names_its_generation", [True, False], ids=["the stale report names generation 0",
                                                                     "an old client names none"])
def test_rank_0_moves_to_a_promoted_spare_after_the_survivors_last_report(names_its_generation):
    tracker = progress.ProgressTracker(write_seconds=0.0)
    record(tracker, 0, 0, 0, step=100, rank=0, loss=1.0)
    record(tracker, 1, 0, 0, step=100, rank=1)
    # Worker 1 is killed; the spare takes its place in generation 1 and the survivor (worker 0) is carried
    # there. The survivor's old trainer reports once more as it stops: rank 0 of generation 0.
    stale = {"generation": 0} if names_its_generation else {}
    record(tracker, 0, 1, 1, step=101, rank=0, loss=1.0, **stale)
    # Generation 1 forms: the spare (index 1) is rank 0 now, the survivor's new trainer rank 1.
    record(tracker, 0, 1, 5, step=95, rank=1, generation=1, step_seconds=0.2)
    for i, step in enumerate(range(96, 140, 4)):
        record(tracker, 1, 1, 6 + i, step=step, rank=0, loss=0.5, generation=1, step_seconds=0.25)
        record(tracker, 0, 1, 6 + i, step=step, rank=1, generation=1, step_seconds=0.2)
    now = seen(tracker, 20)
    assert (now.generation, now.step, now.loss) == (1, 136, 0.5)  # the spare's values, as rank 0
    assert {(t.index, t.generation) for t in now.timings} == {(0, 1), (1, 1)}
    assert {(r.index, r.generation, r.step) for r in now.ranks} == {(0, 1, 136), (1, 1, 136)}


def test_a_report_can_only_lower_the_generation_it_counts_for():
    worker = progress.Worker(JOB, 0, 3)
    assert progress.attributed_generation(worker, progress.Report(step=1)) == 3
    assert progress.attributed_generation(worker, progress.Report(step=1, generation=2)) == 2
    assert progress.attributed_generation(worker, progress.Report(step=1, generation=9)) == 3  # never raised


def test_a_rank_0_claim_lapses_when_its_pod_stops_saying_rank_0_even_while_it_reports():
    tracker = progress.ProgressTracker(write_seconds=0.0)
    record(tracker, 0, 2, 0, step=10, rank=0, loss=1.0)  # first claim in generation 2
    record(tracker, 1, 2, 1, step=11, rank=0, loss=9.0)  # another pod says rank 0: only a claim, not taken
    assert seen(tracker, 1).loss == 1.0
    # Worker 0 keeps reporting with no rank (an old client): it keeps the claim only while it says rank 0.
    later = progress.RANK0_CLAIM_SECONDS + 2
    record(tracker, 0, 2, later - 1, step=12)
    record(tracker, 1, 2, later, step=13, rank=0, loss=0.4)
    assert seen(tracker, later).loss == 0.4


def test_every_workers_step_time_is_published_not_only_rank_0s():
    tracker = progress.ProgressTracker(write_seconds=0.0)
    record(tracker, 0, 0, 0, step=10, rank=0, step_seconds=0.1)
    assert seen(tracker, 0) is not None
    record(tracker, 1, 0, 1, step=10, rank=1, step_seconds=0.3)
    assert {t.index for t in seen(tracker, 1).timings} == {0, 1}


def test_a_finished_worker_publishes_the_last_report_at_once():
    tracker = progress.ProgressTracker(write_seconds=60.0)
    record(tracker, 0, 0, 0, step=10, rank=0, total_steps=100)
    assert seen(tracker, 0).step == 10
    record(tracker, 0, 0, 1, step=100, rank=0, total_steps=100)
    assert seen(tracker, 2).step == 10  # within the write bound
    assert tracker.observation(JOB, T0 + timedelta(seconds=2), final=True).step == 100


# ---------------------------------------------------------------- the real operator

FOLLOW = {**PROGRESS, "progress_write_seconds": 0.2, "cannot_start_seconds": 30.0}
LOADED = 30.0  # s: a wait's bound on a loaded CI machine (each passes in well under a second idle)


class Trainers:
    """The job's pods reporting to the operator's endpoint as their trainers do, each with its own pod-bound
    token: rank, rendezvous generation and own step time in every report."""

    def __init__(self, harness, operator, session: aiohttp.ClientSession, job: str):
        self.harness, self.session, self.job = harness, session, job
        self.url = (f"http://127.0.0.1:{operator.controller.progress_server.port}/v1/namespaces/{NS}/ddpjobs/"
                    f"{job}/progress")

    async def report(self, pod: str, step: int, rank_: int, generation: int | None, **extra: Any) -> None:
        """One report, accepted (204). Sent again while the operator answers 403 (a new operator whose pod
        index is not filled yet), as the trainer's next report or heartbeat would be."""
        body = {"step": step, "total_steps": 1000, "rank": rank_, "step_seconds": 0.2, **extra}
        if generation is not None:
            body["generation"] = generation
        token = self.harness.cluster.issue_token(NS, pod, (AUDIENCE,))

        async def post() -> int:
            async with self.session.post(self.url, json=body, headers={"Authorization": f"Bearer {token}"}) as answer:
                assert answer.status in (204, 403), (pod, answer.status, await answer.text())
                return answer.status == 204
        await eventually(post, what=f"{pod}'s report of step {step} accepted")

    async def generation(self, holders: dict[int, str], generation: int, steps: range) -> None:
        """Each rank's pod reports these steps (rank i in pod holders[i]); waits for the status to show the
        last one and every rank's step time in this generation."""
        for step in steps:
            for rank_, pod in sorted(holders.items()):
                await self.report(pod, step, rank_, generation, loss=1.0 / (1 + step))
        await eventually(lambda: (self.harness.status(self.job).get("progress") or {}).get("step") == steps[-1],
                         LOADED, f"status.progress at step {steps[-1]} in generation {generation}")
        await eventually(lambda: {r["index"] for r in (self.harness.status(self.job).get("stepTimes") or {})
                                  .get("ranks", ())} == set(range(len(holders)))
                         and self.harness.status(self.job)["stepTimes"]["generation"] == generation,
                         LOADED, f"every rank's step time in generation {generation}")


def indices(harness, job: str) -> dict[int, str]:
    return {r["index"]: r["pod"] for r in harness.status(job)["ranks"]}


async def promote(harness, nodes, job: str, killed: str, spare: str, generation: int) -> None:  # noqa: F811
    await nodes.exit(killed, 137)
    index = int(killed.rsplit("-", 1)[1])
    await eventually(lambda: rank(harness, job, index)["pod"] == spare and harness.status(job)["generation"]
                     == generation, LOADED, f"{spare} in worker {index}'s place in generation {generation}")


@pytest.mark.settings(**FOLLOW)
async def test_progress_follows_a_promoted_spare_through_two_promotions(harness, operator, nodes):  # noqa: F811
    await serving(operator)
    await warm_job(harness, nodes, "follow")
    async with aiohttp.ClientSession() as session:
        trainers = Trainers(harness, operator, session, "follow")
        await trainers.generation({0: "follow-worker-0", 1: "follow-worker-1"}, 0, range(10, 31, 10))

        # Worker 1 dies; the spare takes its place in generation 1. The survivor's old trainer (rank 0)
        # reports once more as it stops, after its pod was carried into generation 1 (an old client: no
        # generation in the body, so only the claim's end can hand rank 0 over).
        await promote(harness, nodes, "follow", "follow-worker-1", "follow-spare-0", 1)
        promoted_at = time.monotonic()
        await trainers.report("follow-worker-0", 31, 0, None)
        # Generation 1: the spare is rank 0 now, the survivor rank 1.
        await trainers.generation({0: "follow-spare-0", 1: "follow-worker-0"}, 1, range(32, 60, 9))
        assert harness.condition("follow", "SpareTakingOver")["reason"] == "SpareJoined"

        # The refilled spare takes the survivor's place in generation 2; the first spare is carried along.
        await eventually(lambda: "follow-spare-1" in harness.pods("follow", naming.ROLE_SPARE), what="the refill")
        await nodes.start("follow-spare-1")
        await eventually(lambda: harness.status("follow").get("readySpares") == 1, what="the refill ready")
        # A later failure, not one more exit of the first incident (those join it within its settle time).
        await reconciled_past(operator, promoted_at, FAST.incident_settle_seconds + 0.5, "the first incident settled")
        await promote(harness, nodes, "follow", "follow-worker-0", "follow-spare-1", 2)
        await trainers.report("follow-spare-0", 60, 0, 1)  # its trainer of generation 1, stopping
        assert indices(harness, "follow") == {0: "follow-spare-1", 1: "follow-spare-0"}
        await trainers.generation({0: "follow-spare-1", 1: "follow-spare-0"}, 2, range(58, 90, 10))
    status = harness.status("follow")
    assert (status["restarts"], status["phase"]) == (2, "Running")
    assert status["progress"]["loss"] == pytest.approx(1.0 / 89)  # rank 0's values: the second spare's
    assert [(i["charged"], i["ranks"]) for i in status["incidents"]] == [(True, [1]), (True, [0])]


@pytest.mark.settings(**FOLLOW)
async def test_progress_follows_a_promoted_spare_after_an_operator_restart(harness, operator, nodes):  # noqa: F811
    """A new operator (the acting one's node went silent) holds no report in memory: the promoted spare's
    reports are taken from the status's record of who holds each rank."""
    await serving(operator)
    await warm_job(harness, nodes, "failover")
    async with aiohttp.ClientSession() as session:
        trainers = Trainers(harness, operator, session, "failover")
        await trainers.generation({0: "failover-worker-0", 1: "failover-worker-1"}, 0, range(5, 11, 5))
        await promote(harness, nodes, "failover", "failover-worker-0", "failover-spare-0", 1)
        await trainers.generation({0: "failover-spare-0", 1: "failover-worker-1"}, 1, range(12, 20, 4))
    await operator.stop()
    await operator.start()
    await serving(operator)
    async with aiohttp.ClientSession() as session:
        trainers = Trainers(harness, operator, session, "failover")
        await trainers.report("failover-worker-1", 21, 0, 0)  # a stale report of generation 0: not taken as 1's
        await trainers.generation({0: "failover-spare-0", 1: "failover-worker-1"}, 1, range(22, 40, 8))
    status = harness.status("failover")
    assert (status["restarts"], status["phase"], status["progress"]["step"]) == (1, "Running", 38)


@pytest.mark.settings(**PROGRESS)
async def test_a_job_turns_succeeded_with_its_final_step_in_the_same_status_write(harness, operator, nodes):  # noqa: F811
    """Reports are published at most every 5 s (the default bound); the trainers' last reports come just
    before they exit: the write that says Succeeded carries the final step."""
    await serving(operator)
    await started(harness, nodes, "done", replicas=2)
    async with aiohttp.ClientSession() as session:
        trainers = Trainers(harness, operator, session, "done")
        await trainers.generation({0: "done-worker-0", 1: "done-worker-1"}, 0, range(100, 101))
        for rank_, pod in enumerate(("done-worker-0", "done-worker-1")):
            await trainers.report(pod, 1000, rank_, 0)
    for pod in ("done-worker-0", "done-worker-1"):
        await nodes.exit(pod, 0, reason="Completed")
    await harness.wait_phase("done", "Succeeded")
    jobs = [c.obj for c in harness.cluster.history(DDPJOBS) if c.obj["metadata"]["name"] == "done"]
    first = next(j for j in jobs if (j.get("status") or {}).get("phase") == "Succeeded")
    assert (first["status"]["progress"]["step"], first["status"]["progress"]["percent"]) == (1000, 100)

