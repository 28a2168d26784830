"""Disruptions, against the failure-semantics contract (docs/operator.md, "What users can rely on"):
an eviction through the Eviction API, a graceful `kubectl delete pod`, a lost node and preemption by
a higher-priority pod. Each is one uncharged incident: 0 restarts, 1 disruption, one new generation
that resumes at the same world size from the newest checkpoint, then Succeeded."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from ddpjob_operator.builders import LABEL_GENERATION

from . import cluster
from .scenario import Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def _disrupted_then_recovers(t: Training, *, before: int, g0: int, world: int = 2) -> None:
    t.wait_running_world(g0 + 1, world)
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=0, disruptions=1, generation=g0 + 1)
    t.assert_resumed(g0 + 1, world=world, not_before=before)


def test_eviction_api_is_an_uncharged_disruption(namespace, operator):
    t = Training(namespace, digits_job("evicted")).start()
    before = t.wait_training()
    g0 = t.generation

    cluster.evict(namespace, t.pod(1)["metadata"]["name"])

    _disrupted_then_recovers(t, before=before, g0=g0)


def test_graceful_pod_delete_is_an_uncharged_disruption(namespace, operator):
    t = Training(namespace, digits_job("deleted")).start()
    before = t.wait_training()
    g0 = t.generation

    cluster.delete_pod(namespace, t.pod(1)["metadata"]["name"])  # the pod's own grace period: SIGTERM first

    _disrupted_then_recovers(t, before=before, g0=g0)


# ---------------------------------------------------------------- node loss

NODE_TAINT = "ddpjob-e2e/node-down"


def test_node_loss_is_one_uncharged_disruption(faults, namespace, operator):
    schedulable = [n["metadata"]["name"] for n in cluster.schedulable_nodes()]
    # The acting operator's node must stay up (a standby replica's node may go down: it does not act).
    acting = cluster.acting_operator_pod()
    operator_nodes = {p["spec"].get("nodeName") for p in cluster.operator_pods() if p["metadata"]["name"] == acting}
    candidates = [n for n in schedulable if n not in operator_nodes]
    if len(schedulable) < 2 or not candidates:
        pytest.skip(f"node loss needs 2 schedulable worker nodes, one of them without the operator "
                    f"(schedulable: {schedulable}, operator on {sorted(operator_nodes)})")
    target = candidates[0]
    # Workers prefer `target` and tolerate its taint; the rendezvous store (storeTemplate: no
    # tolerations of its own) cannot land there, so losing the node loses workers only.
    # failurePolicy.nodeLossTimeoutSeconds (default 5) makes the taint manager evict the lost pods 5 s
    # after the node is declared unreachable instead of Kubernetes' 300 s.
    template = {
        "tolerations": [{"key": NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [target]}]}}]}},
    }
    failure_policy = {"maxRestarts": 3, "restartScope": "Pod", "backoff": {"initialSeconds": 1, "maxSeconds": 10}}
    cluster.kubectl("taint", "nodes", target, f"{NODE_TAINT}={namespace}:NoSchedule", "--overwrite")
    down = False
    try:
        t = Training(namespace, digits_job("node-loss", template=template, failure_policy=failure_policy,
                                           rendezvous={"storeTemplate": {"tolerations": []}})).start()
        before = t.wait_training()
        g0 = t.generation
        lost = sorted(name for name, node in t.nodes_of_workers().items() if node == target)
        if not lost:
            pytest.skip(f"no worker was scheduled onto {target} (placement: {t.nodes_of_workers()})")
        store = cluster.store_pod(namespace, t.name)
        assert store is not None and store["spec"].get("nodeName") != target, "the store must not be on the lost node"

        cluster.fault("node-down", target)
        down = True
        fault_at = time.time()

        # Nothing resets the survivors' connections: their collectives time out (trainer
        # --dist-steady-timeout, 30 s) and they exit with a rescue checkpoint. The node controller declares
        # the node lost after its node-monitor-grace-period (40-50 s by default), the taint manager evicts
        # the pods 5 s later; the operator counts one disruption (nothing charged) and force-deletes them
        # although their kubelet never answers.
        t.wait(lambda: t.status.get("disruptions", 0) >= 1 and t.generation > g0,
               "the node loss to be counted as a disruption in a new generation", timeout=400)
        t.wait(lambda: not any(p["spec"].get("nodeName") == target and
                               int(p["metadata"]["labels"][LABEL_GENERATION]) == g0 for p in t.pods),
               f"the lost pods {lost} to be force-deleted while {target} is down", timeout=400)
        t.wait(lambda: t.latest_step(t.generation) > 0, "training to continue in the new generation",
               timeout=300, interval=1)
        continued_at = time.time()
        declared_at = cluster.node_unready_since(target)
        assert declared_at is not None, f"{target} is down but its Ready condition is still True"
        # Our part: from the node controller's verdict to the next training step. The rest, fault ->
        # verdict, is the cluster's node-monitor-grace-period. Issue 10's goal is under 60 s in all on a
        # cluster with the default grace; both are printed for the record.
        print(f"node loss: verdict after {declared_at - fault_at:.0f} s, training continued "
              f"{continued_at - fault_at:.0f} s after the fault")
        assert continued_at - declared_at <= 30, (
            f"training continued {continued_at - declared_at:.0f} s after {target} was declared lost (want <= 30): "
            f"{t.describe()}")

        cluster.fault("node-up", target)
        down = False
        cluster.kubectl("wait", "node", target, "--for=condition=Ready", "--timeout=300s", timeout=330)

        _disrupted_then_recovers(t, before=before, g0=g0)
    finally:
        if down:
            cluster.fault("node-up", target, check=False)
        cluster.kubectl("taint", "nodes", target, f"{NODE_TAINT}-", check=False)


# ---------------------------------------------------------------- preemption


@pytest.fixture
def priority_classes(kube) -> Iterator[tuple[str, str]]:
    """A low class for the workers (below every default pod, so only workers are preempted) and a
    high one for the preemptor; cluster-scoped, removed afterwards."""
    suffix = uuid.uuid4().hex[:8]
    low, high = f"ddpjob-e2e-low-{suffix}", f"ddpjob-e2e-high-{suffix}"
    for name, value in ((low, -100), (high, 1000000)):
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "globalDefault": False, "description": "ddpjob e2e preemption test"}
        created = cluster.kubectl("create", "-f", "-", stdin=json.dumps(body), check=False)
        if created.returncode != 0:
            cluster.kubectl("delete", "priorityclass", low, high, "--ignore-not-found", check=False)
            pytest.skip(f"cannot create PriorityClass {name}: {created.stderr.strip()}")
    yield low, high
    cluster.kubectl("delete", "priorityclass", low, high, "--ignore-not-found", check=False)


def test_preemption_by_a_higher_priority_pod_is_an_uncharged_disruption(priority_classes, namespace, operator):
    low, high = priority_classes
    worker_cpu = 1000
    # The store would take the workers' class: the high one keeps it out of the victims.
    t = Training(namespace, digits_job("preempted", template={"priorityClassName": low},
                                       resources={"cpu": f"{worker_cpu}m", "memory": "1Gi"},
                                       rendezvous={"storeTemplate": {"priorityClassName": high}})).start()
    before = t.wait_training()
    g0 = t.generation
    node_name = t.pod(1)["spec"]["nodeName"]
    node = next(n for n in cluster.nodes() if n["metadata"]["name"] == node_name)
    allocatable = cluster.cpu_millis(node["status"].get("allocatable", {}).get("cpu"))
    free = allocatable - cluster.requested_cpu_millis(node_name)
    # Fits only once one worker (the lowest priority on the node) is gone: more than is free, less
    # than free plus one worker's request, with room for small miscounts either way.
    wanted = free + worker_cpu // 2
    if allocatable <= 0 or wanted > allocatable:
        pytest.skip(f"cannot size a preemptor for node {node_name} (allocatable cpu {allocatable}m, free {free}m)")
    preemptor = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "preemptor"},
        "spec": {"priorityClassName": high, "nodeSelector": {"kubernetes.io/hostname": node_name},
                 "terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                 "containers": [{"name": "hold", "image": t.manifest["spec"]["image"],
                                 "imagePullPolicy": "IfNotPresent",
                                 "command": ["python", "-c", "import time; time.sleep(86400)"],
                                 "resources": {"requests": {"cpu": f"{wanted}m", "memory": "64Mi"}}}]},
    }

    cluster.apply(preemptor, namespace)
    t.wait(lambda: t.status.get("disruptions", 0) >= 1, f"a worker on {node_name} to be preempted", timeout=300)
    # The preemptor took the worker's room; it leaves so that the replacement fits again.
    cluster.delete_pod(namespace, "preemptor", grace=0)

    _disrupted_then_recovers(t, before=before, g0=g0)
