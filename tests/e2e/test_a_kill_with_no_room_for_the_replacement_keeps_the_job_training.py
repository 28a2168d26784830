"""Issue 36 on a cluster: a worker killed while no node can take its replacement (every node cordoned) leaves the
survivors training short at once, the job Running and Degraded (TrainingShort, WORLD below DESIRED); once the nodes
are uncordoned the replacement runs and joins live at a step boundary: Degraded False (Whole), no survivor's
container or trainer restarted, one restart charged. Waits on conditions only."""

from __future__ import annotations

import re

import pytest

from . import cluster
from .scenario import Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

NAME = "no-room"
SHORT_STEPS = 50  # steps the survivors must train while the replacement cannot be scheduled


def degraded(t: Training) -> dict:
    return cluster.condition_of(t.job, "Degraded") or {}


def test_a_kill_with_every_node_cordoned_keeps_the_job_training_and_uncordoning_makes_it_whole(
        faults, namespace, operator):
    policy = {"maxRestarts": 3, "restartScope": "Pod", "recovery": "InProcess",
              "backoff": {"initialSeconds": 1, "maxSeconds": 10}}
    t = Training(namespace, digits_job(NAME, replicas=3, failure_policy=policy)).start()
    t.wait_training()
    g0 = t.generation
    survivors_before = t.containers()
    victim = next(r for r in t.current(g0) if r.uid != t.rank0_pod().uid)
    survivors = [name for name in survivors_before if name != victim.name]

    cordoned = [n["metadata"]["name"] for n in cluster.schedulable_nodes()]
    try:
        for node in cordoned:
            cluster.kubectl("cordon", node)
        cluster.fault("kill", f"{namespace}/{victim.name}", "--signal", "9")
        t.wait(lambda: degraded(t).get("reason") == "TrainingShort", "Degraded TrainingShort", 120, interval=1)
        short_from = t.latest_step(g0)
        t.wait(lambda: t.latest_step(g0) >= short_from + SHORT_STEPS,
               f"{SHORT_STEPS} steps trained short while the replacement cannot be scheduled", 300, interval=2)
        status = t.status
        assert status.get("phase") == "Running", t.describe()
        assert (status.get("worldSize"), status.get("desiredWorldSize")) == (2, 3), t.describe()
        assert degraded(t).get("status") == "True", degraded(t)
        assert "Pending" in degraded(t).get("message", ""), degraded(t)  # it says why the rank is missing
        replacement = next((p for p in t.pods if p["metadata"]["name"] == victim.name
                            and p["metadata"]["uid"] != victim.uid), None)
        assert replacement is not None and not replacement["spec"].get("nodeName"), t.describe()
    finally:
        for node in cordoned:
            cluster.kubectl("uncordon", node, check=False)

    t.wait(lambda: degraded(t).get("reason") == "Whole" and degraded(t).get("status") == "False",
           "Degraded False (Whole) once the replacement joined", 600, interval=2)
    t.wait(lambda: t.status.get("worldSize") == 3, "status.worldSize 3 again", 120, interval=2)
    after = t.containers()
    for name in survivors:
        assert after.get(name) == survivors_before[name], (name, survivors_before[name], after.get(name))
        log = next(r.log for r in t.current() if r.name == name and r.uid == survivors_before[name][0])
        assert f"recovered in process: generation {g0} -> {g0}, rank" in log, log[-3000:]
        assert re.search(rf"regrouped at step \d+: view {g0}:\d+ -> \d+:\d+", log), log[-3000:]
    incident = next(i for i in t.status.get("incidents") or [] if i.get("generation") == g0)
    steps = [s.get("kind") for s in (incident.get("recovery") or {}).get("steps") or []]
    assert steps == ["Shrink", "Join"], incident
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=g0 + 1)
