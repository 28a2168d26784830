"""Issue 36 on a real cluster, "a lost rendezvous store is not a lost gang": with recovery InProcess the
rendezvous store pod SIGKILLed (through the fault command) is recreated under its Service while every worker
keeps its pod, its container and its trainer process, and training goes on in the same generation, nothing
charged. Then a worker SIGKILLed: the survivors meet again at the new store (their agents and trainers
reconnected to it) and recover in process, no trainer started again in them."""

from __future__ import annotations

import time

import pytest

from ddpjob_operator.naming import store_pod_name

from . import cluster
from .scenario import GENERATION_LINE, RECOVERED_WITHIN, Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

STORE_LOST_WITHIN = 10  # issue 36's target: a SIGKILLed store costs at most this to the next step


def test_a_killed_store_keeps_every_worker_and_the_survivors_meet_again_at_the_new_one(faults, namespace, operator):
    policy = {"maxRestarts": 3, "restartScope": "Pod", "recovery": "InProcess",
              "backoff": {"initialSeconds": 1, "maxSeconds": 10}}
    t = Training(namespace, digits_job("keep-store", replicas=3, failure_policy=policy)).start()
    before = t.wait_training()
    g0 = t.generation
    workers_before = t.containers()
    trainers_started = {r.name: len(GENERATION_LINE.findall(r.log)) for r in t.current(g0)}
    store = cluster.store_pod(namespace, t.name)
    assert store is not None and store["status"].get("phase") == "Running", t.describe()

    killed_at = time.monotonic()
    cluster.fault("kill", f"{namespace}/{store_pod_name(t.name)}", "--signal", "9")
    t.wait(lambda: t.latest_step(g0) > before, f"a training step of generation {g0} after the store's kill",
           STORE_LOST_WITHIN, interval=0.5)
    print(f"SIGKILLed store to a training step in {time.monotonic() - killed_at:.1f} s (polled every 0.5 s)")

    def fresh_store() -> bool:
        pod = cluster.store_pod(namespace, t.name)
        return pod is not None and pod["metadata"]["uid"] != store["metadata"]["uid"] \
            and pod["status"].get("phase") == "Running"

    t.wait(fresh_store, "a fresh rendezvous store pod, Running", 300, interval=1)
    print(f"SIGKILLed store to its successor Running in {time.monotonic() - killed_at:.1f} s")
    assert t.containers() == workers_before, "every worker keeps its pod and container"
    assert (t.generation, t.status.get("restarts"), t.status.get("disruptions")) == (g0, 0, 0), t.describe()

    # The survivors of a worker's loss meet again at the new store.
    victim = next(r for r in t.current(g0) if r.uid != t.rank0_pod().uid)
    now = t.latest_step(g0)
    killed_at = time.monotonic()
    cluster.fault("kill", f"{namespace}/{victim.name}", "--signal", "9")
    t.wait(lambda: t.latest_step() > now, "a training step after the worker's kill", RECOVERED_WITHIN, interval=1)
    print(f"SIGKILLed worker (after the store's loss) to a training step in {time.monotonic() - killed_at:.1f} s")
    t.wait_terminal()
    after = t.containers()
    for name, started in trainers_started.items():
        if name == victim.name:
            continue
        assert after.get(name) == workers_before[name], (name, workers_before[name], after.get(name))
        log = next(r.log for r in t.current() if r.name == name and r.uid == workers_before[name][0])
        assert len(GENERATION_LINE.findall(log)) == started, f"a trainer started again in {name}"
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=g0 + 1)
    t.assert_final_progress()
