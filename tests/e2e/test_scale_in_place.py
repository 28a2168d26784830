"""Issue 36, "Scale in place", on a real cluster (outside CI: `make e2e`): with in-process recovery `kubectl scale`
3 -> 2 and then 2 -> 3 stop no survivor. Every surviving pod keeps its uid, its trainer container's restartCount
and its trainer processes (the same PIDs, the agent's children read from /proc), and no survivor reads the
checkpoint volume (no "resumed from checkpoint" line after the scale); the departed pod is gone, the new rank's
pod joins, nothing is charged, and the status records each move as "scaled in place N -> M workers"."""

from __future__ import annotations

import pytest

from ddpjob_operator.naming import TRAINER_CONTAINER, worker_name

from . import cluster
from .scenario import INTERVAL, RESUME_LINE, Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

POLICY = {"maxRestarts": 3, "restartScope": "Pod", "recovery": "InProcess",
          "backoff": {"initialSeconds": 1, "maxSeconds": 10}}


def trainer_pids(namespace: str, pod: str) -> list[int]:
    """The agent's children (its trainer processes; the agent is the container's first process)."""
    out = cluster.kubectl("exec", "-n", namespace, pod, "-c", TRAINER_CONTAINER, "--",
                          "cat", "/proc/1/task/1/children").stdout
    return sorted(int(pid) for pid in out.split())


def survivors_state(t: Training, names: list[str]) -> dict[str, tuple]:
    """Per pod: (uid, restartCount, trainer PIDs, resume lines in its log so far)."""
    t.refresh()
    containers = t.containers()
    logs = {r.name: r.log for r in t.records.values() if r.name in names and r.uid == containers[r.name][0]}
    return {name: (*containers[name], trainer_pids(t.namespace, name), len(RESUME_LINE.findall(logs[name])))
            for name in names}


def test_scale_down_and_up_in_place_keep_every_survivors_trainer_processes(namespace, operator):
    t = Training(namespace, digits_job("scale-in-place", replicas=3, min_replicas=1, max_replicas=3,
                                       max_steps=12000, failure_policy=POLICY)).start()
    t.wait_training()
    g0 = t.generation
    survivors = [worker_name(t.name, i) for i in range(2)]
    before = survivors_state(t, survivors)
    assert all(pids for _, _, pids, _ in before.values()), before

    cluster.scale(namespace, t.name, 2)
    t.wait_running_world(g0 + 1, 2)
    t.wait(lambda: worker_name(t.name, 2) not in t.containers(), "the departed worker's pod removed", 300)
    step = (t.status.get("progress") or {}).get("step") or 0
    t.wait_progress_past(step + INTERVAL)  # training goes on at world size 2
    assert survivors_state(t, survivors) == before
    assert t.status["incidents"][-1]["message"] == "scaled in place 3 -> 2 workers"

    cluster.scale(namespace, t.name, 3)
    t.wait_running_world(g0 + 2, 3)
    step = (t.status.get("progress") or {}).get("step") or 0
    t.wait_progress_past(step + INTERVAL)  # training goes on at world size 3, the new rank in it
    assert survivors_state(t, survivors) == before
    assert t.status["incidents"][-1]["message"] == "scaled in place 2 -> 3 workers"
    joined = next(r for r in t.records.values() if r.name == worker_name(t.name, 2) and g0 + 2 in r.generations)
    assert not RESUME_LINE.findall(joined.log), "the new rank read the volume instead of a survivor's state"

    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=0, disruptions=0, generation=g0 + 2)
    assert [i["cause"] for i in t.status["incidents"][-2:]] == ["ScaledInPlace", "ScaledInPlace"]
