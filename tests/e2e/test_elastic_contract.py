"""Membership changes, against the failure-semantics contract (docs/operator.md, "What users can rely
on"): `kubectl scale` through the scale subresource (elastic and static jobs), suspend and resume,
and training that finishes while a replacement is still Pending. None of them but the last (a
SIGKILLed worker) is a restart or a disruption; each starts a new generation."""

from __future__ import annotations

import pytest

from ddpjob_operator.naming import LABEL_GENERATION, LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_ROLE, ROLE_WORKER

from . import cluster
from .scenario import INTERVAL, Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

# Scaling restarts every worker with recovery Restart; in place with InProcess: test_scale_in_place.py.
RESTART = {"maxRestarts": 3, "restartScope": "Pod", "recovery": "Restart",
           "backoff": {"initialSeconds": 1, "maxSeconds": 10}}


def test_elastic_scale_up_and_down_each_restart_every_worker_gracefully_in_a_new_generation(namespace, operator):
    """docs/operator.md's table: `kubectl scale` up or down within minReplicas..maxReplicas is no restart
    and no disruption, a new generation (every agent must agree on --nnodes=minReplicas:replicas), all
    workers stopped gracefully (SIGTERM -> checkpoint) and restarted at the new size."""
    t = Training(namespace, digits_job("scale-elastic", replicas=2, min_replicas=1, max_replicas=3,
                                       max_steps=12000, failure_policy=RESTART)).start()
    before_up = t.wait_training()
    g0 = t.generation

    cluster.scale(namespace, t.name, 3)
    t.wait_running_world(g0 + 1, 3)
    up = t.assert_resumed(g0 + 1, world=3, not_before=before_up)

    t.wait(lambda: t.latest_step(g0 + 1) >= up.step + 3 * INTERVAL, "training to go on at world size 3",
           timeout=600)
    before_down = t.latest_step(g0 + 1)
    cluster.scale(namespace, t.name, 1)
    t.wait_running_world(g0 + 2, 1)

    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=0, disruptions=0, generation=g0 + 2)
    t.assert_resumed(g0 + 2, world=1, not_before=before_down)


def test_scaling_a_static_job_changes_its_node_range_in_a_new_generation(namespace, operator):
    # No minReplicas/maxReplicas: both follow replicas, so 2 -> 3 changes the node range 2:2 -> 3:3.
    t = Training(namespace, digits_job("scale-static", replicas=2, min_replicas=None, max_replicas=None,
                                       max_steps=8000, failure_policy=RESTART)).start()
    before = t.wait_training()
    g0 = t.generation

    cluster.scale(namespace, t.name, 3)

    t.wait_running_world(g0 + 1, 3)
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=0, disruptions=0, generation=g0 + 1)
    t.assert_resumed(g0 + 1, world=3, not_before=before)


def test_suspend_then_resume_continues_from_the_checkpoint(namespace, operator):
    t = Training(namespace, digits_job("suspend")).start()
    before = t.wait_training()
    g0 = t.generation

    cluster.set_suspend(namespace, t.name, True)
    t.wait(lambda: t.status.get("phase") == "Suspended" and not t.pods and cluster.store_pod(namespace, t.name) is None,
           "phase Suspended with every worker and the store gone", timeout=300)
    claims = [c["metadata"]["name"] for c in cluster.get_json("persistentvolumeclaims", "-n", namespace)["items"]]
    assert f"{t.name}-checkpoints" in claims, f"suspend must keep the checkpoint claim: {claims}"
    assert t.generation == g0 + 1, f"suspend starts a new generation: {t.describe()}"

    cluster.set_suspend(namespace, t.name, False)

    t.wait_running_world(g0 + 1, 2)
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=0, disruptions=0, generation=g0 + 1)
    t.assert_resumed(g0 + 1, world=2, not_before=before)


def _blocker(namespace: str, job_name: str, index: int, old_generation: int, node: dict, image: str) -> dict:
    """A tiny pod pinned to `node` whose required anti-affinity (symmetric: it also repels incoming
    pods) keeps every later generation's worker `index` of the job off that node."""
    hostname = node["metadata"].get("labels", {}).get("kubernetes.io/hostname", node["metadata"]["name"])
    match = [{"key": LABEL_JOB_NAME, "operator": "In", "values": [job_name]},
             {"key": LABEL_ROLE, "operator": "In", "values": [ROLE_WORKER]},
             {"key": LABEL_REPLICA_INDEX, "operator": "In", "values": [str(index)]},
             {"key": LABEL_GENERATION, "operator": "NotIn", "values": [str(old_generation)]}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"block-{node['metadata']['name']}"[:63].rstrip("-."), "namespace": namespace},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": hostname}, "terminationGracePeriodSeconds": 0,
                 "restartPolicy": "Never",
                 "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                     {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchExpressions": match}}]}},
                 "containers": [{"name": "hold", "image": image, "imagePullPolicy": "IfNotPresent",
                                 "command": ["python", "-c", "import time; time.sleep(86400)"],
                                 "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}}}]},
    }


def test_training_finishes_while_a_replacement_is_still_pending(faults, namespace, operator):
    t = Training(namespace, digits_job("finish-pending", replicas=3, min_replicas=1, max_replicas=3)).start()
    before = t.wait_training()
    g0 = t.generation

    # Worker 2 of any later generation can be scheduled nowhere; workers 0 and 1 anywhere.
    blockers = [_blocker(namespace, t.name, 2, g0, node, t.manifest["spec"]["image"])
                for node in cluster.schedulable_nodes()]
    for blocker in blockers:
        cluster.apply(blocker, namespace)

    def blockers_running() -> bool:
        phases = {p["metadata"]["name"]: p["status"].get("phase") for p in cluster.get_json("pods", "-n", namespace)["items"]}
        return all(phases.get(b["metadata"]["name"]) == "Running" for b in blockers)

    # The setup is part of the scenario: a cluster where it cannot hold fails the test, it does not skip.
    cluster.wait_for(blockers_running, "a blocker pod running on every schedulable node (to keep worker 2's "
                     "replacement Pending)", timeout=180)

    cluster.fault("kill", f"{namespace}/{t.pod(2)['metadata']['name']}")

    t.wait(lambda: any(r.generation == g0 + 1 and r.index == 2 for r in t.records.values()),
           "the replacement of worker 2", timeout=600)
    t.wait_running_world(g0 + 1, 2)
    t.wait_terminal()

    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=g0 + 1)
    t.assert_resumed(g0 + 1, world=2, not_before=before)
    replacement = [r for r in t.records.values() if r.generation == g0 + 1 and r.index == 2]
    assert replacement and not any(r.ever_scheduled for r in replacement), (
        f"worker 2's replacement was scheduled after all: {[(r.name, r.states[-3:]) for r in replacement]}")
