"""Issue 36, "The status tells it", on the API tier: the real operator against the HTTP API emulator, the
trainers' reports POSTed to its progress endpoint with pod-bound tokens. Worker 2 is killed and no node has room
for its replacement: the survivors train on short in the generation they started in, and the job says so
(Degraded, WORLD below DESIRED, the gauges on /metrics) without a stall or another charge; once the replacement
runs and joins, the job is whole again and the incident's timeline holds the shrink and the join."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from ddpjob_operator import naming

from .conftest import eventually
from .test_progress_follows_every_rank_holder import FOLLOW, LOADED, Trainers
from .test_scenarios import NS, nodes, operator, started  # noqa: F401
from .test_spares import serving

NODES_FULL = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
SHORT = FOLLOW


def degraded(harness, job: str) -> dict[str, Any]:
    return harness.condition(job, "Degraded") or {}


def gauge(operator, metric: str, job: str) -> float | None:
    prefix = f'{metric}{{name="{job}",namespace="{NS}"}} '
    line = next((x for x in operator.controller.metrics.text().splitlines() if x.startswith(prefix)), None)
    return float(line.split()[-1]) if line else None


@pytest.mark.settings(**SHORT)
async def test_the_survivors_train_short_then_whole_and_the_status_tells_each(harness, operator, nodes):  # noqa: F811
    await serving(operator)
    await started(harness, nodes, "short", replicas=3, minReplicas=1,
                  failurePolicy={"maxRestarts": 3, "backoff": {"initialSeconds": 0, "maxSeconds": 1}})
    whole = {"desired_world_size": 3, "world_size": 3, "missing_ranks": []}
    async with aiohttp.ClientSession() as session:
        trainers = Trainers(harness, operator, session, "short")
        await trainers.generation({0: "short-worker-0", 1: "short-worker-1", 2: "short-worker-2"}, 0,
                                  range(20, 31, 10))
        assert degraded(harness, "short") == {}  # whole from the start: no condition at all

        await nodes.exit("short-worker-2", 137)
        await eventually(lambda: harness.status("short").get("generation") == 1, LOADED, "generation 1")
        await eventually(lambda: (harness.pods("short").get("short-worker-2") or {}).get("metadata", {}).get(
            "labels", {}).get(naming.LABEL_GENERATION) == "1", LOADED, "the replacement pod")
        await harness.cluster.unschedulable(NS, "short-worker-2", NODES_FULL)

        # The survivors regroup at once and train on short, reporting generation 0, the one they started in.
        shrunk, short_since = time.time(), time.time()
        shrink = {"path": "InProcess", "kind": "Shrink", "resumed_step": 30, "rendezvous_time": shrunk,
                  "first_step_time": shrunk + 0.2}
        short = {"desired_world_size": 3, "world_size": 2, "missing_ranks": [2], "short_since": short_since}
        # (Each report has a fresh token, and the endpoint reviews few new ones a second: rank 0's are enough.)
        for step in range(31, 36, 2):
            await trainers.report("short-worker-0", step, 0, 0, recovery=shrink, **short)
        await trainers.report("short-worker-1", 35, 1, 0)
        await eventually(lambda: degraded(harness, "short").get("status") == "True" and NODES_FULL in degraded(
            harness, "short").get("message", ""), LOADED, "Degraded with the replacement's reason")
        await eventually(lambda: (harness.status("short").get("progress") or {}).get("step") == 35, LOADED,
                         "the survivors' steps as the job's")
        cond, status = degraded(harness, "short"), harness.status("short")
        assert cond["reason"] == "TrainingShort"
        assert cond["message"].startswith("2 of 3 ranks training; missing rank 2 (worker 2) since ")
        assert "its replacement pod short-worker-2 is Pending: " in cond["message"]
        assert (status["phase"], status["worldSize"], status["desiredWorldSize"]) == ("Running", 2, 3)
        assert harness.job("short")["spec"]["replicas"] == 3  # DESIRED; WORLD (status.worldSize) is below it
        assert (status["restarts"], status["disruptions"]) == (1, 0)
        [incident] = status["incidents"]
        assert [s["kind"] for s in incident["recovery"]["steps"]] == ["Shrink"]
        assert incident["recovery"]["path"] == "InProcess" and incident["recovery"]["seconds"] is not None
        await eventually(lambda: gauge(operator, "ddpjob_ranks_training", "short") == 2, LOADED, "the gauge")
        assert gauge(operator, "ddpjob_ranks_desired", "short") == 3

        # Capacity returns: the replacement runs and joins the survivors live.
        await nodes.start("short-worker-2")
        joined = time.time()
        join = {**shrink, "kind": "Join", "resumed_step": 40, "rendezvous_time": joined, "first_step_time": joined}
        await trainers.report("short-worker-2", 40, 2, 1)
        for step in (40, 41):
            await trainers.report("short-worker-0", step, 0, 0, recovery=join, **whole)
        await eventually(lambda: degraded(harness, "short").get("status") == "False", LOADED, "whole again")
    cond, status = degraded(harness, "short"), harness.status("short")
    assert (cond["reason"], cond["message"]) == ("Whole", "all 3 ranks training")
    assert (status["phase"], status["worldSize"], status["restarts"], status["disruptions"]) == ("Running", 3, 1, 0)
    [incident] = status["incidents"]  # the shrink and the join are steps of the one incident, neither charged
    assert [s["kind"] for s in incident["recovery"]["steps"]] == ["Shrink", "Join"]
    assert [s["worldSize"] for s in incident["recovery"]["steps"]] == [2, 3]
    await eventually(lambda: gauge(operator, "ddpjob_ranks_training", "short") == 3, LOADED, "the gauge whole")
