"""Issue 36, "Scale in place", on the API tier: the real operator against the API emulator, with in-process
recovery. `kubectl scale` 3 -> 2 and 2 -> 3 stop no survivor (same pod, same uid, never a deletion mark), move
the job to a new generation without a charge, and the progress endpoint's `generation` route tells each
survivor's agent that generation and its node range (a scale down starts no pod whose agent would publish it);
a departing pod whose trainers exited (no seat in the smaller generation) is removed. The test plays the
scheduler and kubelets (test_scenarios.Nodes) and the pods' agents (their tokens)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from ddpjob_operator import naming
from ddpjob_operator.decisions.scaling import REASON_SCALED_IN_PLACE

from .conftest import eventually, passes
from .test_scenarios import assert_outcome, creations, deletions, nodes, operator, started, uids  # noqa: F401
from .test_spares import AUDIENCE, PROGRESS, serving

pytestmark = pytest.mark.timeout(60)

IN_PROCESS = {"recovery": "InProcess"}


class Agents:
    """The job's pods asking the operator's `generation` route, each with its own pod-bound token."""

    def __init__(self, harness, operator, session: aiohttp.ClientSession):
        self.harness, self.session = harness, session
        self.base = f"http://127.0.0.1:{operator.controller.progress_server.port}/v1/namespaces/team-a/ddpjobs"

    async def generation(self, job: str, pod: str | None, audience: str = AUDIENCE) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.harness.cluster.issue_token('team-a', pod, (audience,))}"} \
            if pod else {}
        async with self.session.get(f"{self.base}/{job}/generation", headers=headers) as response:
            return response.status, (await response.json() if response.status == 200 else None)

    async def told(self, job: str, pod: str, generation: int) -> dict[str, Any]:
        async def answer():
            status, given = await self.generation(job, pod)
            return given if status == 200 and given["generation"] == generation else None
        return await eventually(answer, what=f"{pod} told generation {generation}")


async def in_process_job(harness, operator, nodes, name: str, replicas: int) -> tuple[str, dict[str, str]]:
    """The progress endpoint serving, the job running with in-process recovery: its uid and its pods' uids."""
    await serving(operator)
    await started(harness, nodes, name, replicas=replicas, minReplicas=1, maxReplicas=4, failurePolicy=IN_PROCESS)
    return harness.job(name)["metadata"]["uid"], uids(harness, name)


def scaled_events(harness, job: str) -> list[str]:
    return [e["message"] for e in harness.events(job) if e["reason"] == REASON_SCALED_IN_PLACE]


@pytest.mark.settings(**PROGRESS)
async def test_scale_down_in_place_keeps_the_survivors_and_tells_their_agents(harness, operator, nodes):
    uid, before = await in_process_job(harness, operator, nodes, "down", 3)
    async with aiohttp.ClientSession() as session:
        agents = Agents(harness, operator, session)
        assert await agents.generation("down", "down-worker-0") == (200, {
            "generation": 0, "nnodes": "1:3", "rdzvId": naming.rendezvous_id(uid, 0)})
        code, body = await harness.scale("down", 2)
        assert code == 200, body
        for pod in ("down-worker-0", "down-worker-1"):
            assert await agents.told("down", pod, 1) == {"generation": 1, "nnodes": "1:2",
                                                           "rdzvId": naming.rendezvous_id(uid, 1)}
        assert await agents.generation("down", "down-worker-2") == (204, None)  # departing: no seat in it
        assert (await agents.generation("down", None))[0] == 401
        assert (await agents.generation("down", "down-worker-0", audience="https://kubernetes.default.svc"))[0] == 401
    assert "down-worker-2" in harness.pods("down")  # kept while its trainers may still be in the old group
    await nodes.exit("down-worker-2", 0)  # its trainers had no seat in generation 1 and exited 0
    await eventually(lambda: "down-worker-2" not in harness.pods("down"), what="the departed pod removed")
    await passes(operator)  # nothing more happens
    assert deletions(harness, "down-worker-2") == [0]  # force: it had exited, nothing to stop
    assert uids(harness, "down") == {p: before[p] for p in ("down-worker-0", "down-worker-1")}
    assert deletions(harness, "down-worker-0") == [] and deletions(harness, "down-worker-1") == []
    status = assert_outcome(harness, "down", phase="Running", reason="Running", restarts=0, disruptions=0,
                            generation=1, incident=(REASON_SCALED_IN_PLACE, False, [2]))
    assert status["incidents"][-1]["message"] == "scaled in place 3 -> 2 workers"
    assert [(r["index"], r["uid"], r["generation"]) for r in status["ranks"]] == \
        [(0, before["down-worker-0"], 1), (1, before["down-worker-1"], 1)]
    assert len(scaled_events(harness, "down")) == 1
    assert scaled_events(harness, "down")[0].startswith("scaled in place 3 -> 2 workers in rendezvous generation 1")
    assert creations(harness, "down") == {"down-worker-0": 1, "down-worker-1": 1, "down-worker-2": 1, "down-rdzv": 1}


@pytest.mark.settings(**PROGRESS)
async def test_scale_up_in_place_adds_the_new_rank_and_keeps_the_survivors(harness, operator, nodes):
    uid, before = await in_process_job(harness, operator, nodes, "up", 2)
    code, body = await harness.scale("up", 3)
    assert code == 200, body
    new = await eventually(lambda: harness.pods("up").get("up-worker-2"), what="the new rank's pod")
    labels = new["metadata"]["labels"]
    assert (labels[naming.LABEL_GENERATION], labels[naming.LABEL_NNODES]) == ("1", "1-3")
    async with aiohttp.ClientSession() as session:
        agents = Agents(harness, operator, session)
        for pod in ("up-worker-0", "up-worker-1"):
            assert await agents.told("up", pod, 1) == {"generation": 1, "nnodes": "1:3",
                                                         "rdzvId": naming.rendezvous_id(uid, 1)}
    await nodes.start("up-worker-2")
    await harness.wait_phase("up", "Running")
    await passes(operator)  # nothing more happens
    after = uids(harness, "up")
    assert {p: after[p] for p in before} == before
    assert deletions(harness, "up-worker-0") == [] and deletions(harness, "up-worker-1") == []
    status = assert_outcome(harness, "up", phase="Running", reason="Running", restarts=0, disruptions=0,
                            generation=1, incident=(REASON_SCALED_IN_PLACE, False, [2]))
    assert status["incidents"][-1]["message"] == "scaled in place 2 -> 3 workers"
    assert [(r["index"], r["generation"]) for r in status["ranks"]] == [(0, 1), (1, 1), (2, 1)]
    assert len(scaled_events(harness, "up")) == 1
    assert creations(harness, "up") == {"up-worker-0": 1, "up-worker-1": 1, "up-worker-2": 1, "up-rdzv": 1}
