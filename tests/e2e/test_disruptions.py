"""Disruptions, against the failure-semantics contract (docs/operator.md, "What users can rely on"):
an eviction through the Eviction API, a graceful `kubectl delete pod`, a node gone silent and preemption
by a higher-priority pod. Each is one uncharged incident: 0 restarts, 1 disruption, one new generation
that resumes at the same world size from the newest checkpoint, then Succeeded."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from ddpjob_operator.naming import LABEL_GENERATION

from . import cluster
from .scenario import (NODE_LOSS_COUNTED_WITHIN, NODE_LOSS_RECOVERED_WITHIN, Training, digits_job,
                       spread_over_nodes)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def _disrupted_then_recovers(t: Training, *, before: int, g0: int, world: int = 2, checkpointed: bool = True) -> None:
    t.wait_running_world(g0 + 1, world)
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=0, disruptions=1, generation=g0 + 1)
    if checkpointed:
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


def test_a_silent_node_is_one_uncharged_disruption_and_the_survivors_stay(faults, namespace, operator):
    """node-down: the node goes silent (its processes frozen, their sockets open). Only the node
    controller's verdict ends the incident: one disruption, nothing charged, the lost worker replaced
    while the node is still down, the survivor on another node kept in place (restartScope Pod)."""
    nodes = cluster.schedulable_nodes()
    schedulable = [n["metadata"]["name"] for n in nodes]
    # The acting operator's node must stay up (a standby replica's node may go down: it does not act), and
    # the fault command refuses a control-plane node.
    acting = cluster.acting_operator_pod()
    operator_nodes = {p["spec"].get("nodeName") for p in cluster.operator_pods() if p["metadata"]["name"] == acting}
    candidates = [n["metadata"]["name"] for n in nodes
                  if n["metadata"]["name"] not in operator_nodes and not cluster.is_control_plane(n)]
    if len(schedulable) < 2 or not candidates:
        pytest.skip(f"node loss needs 2 schedulable nodes, one of them a worker node without the operator "
                    f"(schedulable: {schedulable}, operator on {sorted(operator_nodes)})")
    target = candidates[0]
    name = "node-loss"
    # One worker on `target` (preferred), the other elsewhere (spread_over_nodes); only workers tolerate
    # `target`'s taint, so the rendezvous store (storeTemplate: no tolerations) is elsewhere too.
    # failurePolicy.nodeLossTimeoutSeconds (default 5) makes the taint manager evict the lost pod 5 s
    # after the node is declared unreachable instead of Kubernetes' 300 s.
    template = {
        "tolerations": [{"key": NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [target]}]}}]}},
        "podSpec": spread_over_nodes(name),
    }
    failure_policy = {"maxRestarts": 3, "restartScope": "Pod", "backoff": {"initialSeconds": 1, "maxSeconds": 10}}
    manifest = digits_job(name, template=template, failure_policy=failure_policy,
                          rendezvous={"storeTemplate": {"tolerations": []}})
    if not cluster.SHARED_CHECKPOINTS:
        # A ReadWriteOnce claim (kind's local-path) would pin both workers to its node: without storage
        # every node mounts, the job keeps no checkpoints, and its resume is not asserted.
        del manifest["spec"]["checkpoint"]
    cluster.kubectl("taint", "nodes", target, f"{NODE_TAINT}={namespace}:NoSchedule", "--overwrite")
    try:
        t = Training(namespace, manifest).start()
        before = t.wait_training()
        g0, disruptions = t.generation, t.status.get("disruptions", 0)
        placement = t.nodes_of_workers()
        lost = sorted(pod for pod, node in placement.items() if node == target)
        survivors = {pod: state for pod, state in t.containers().items() if placement.get(pod, target) != target}
        assert len(lost) == 1 and survivors, f"want one worker on {target}, the other elsewhere: {placement}"
        store = cluster.store_pod(namespace, t.name)
        assert store is not None and store["spec"].get("nodeName") != target, "the store must not be on the lost node"

        with cluster.node_down(target) as up:
            fault_at, fault_wall = time.monotonic(), time.time()

            def left() -> float:
                return max(fault_at + NODE_LOSS_COUNTED_WITHIN - time.monotonic(), 1)

            # Nothing resets the survivor's connections: its collectives time out and it waits in place.
            # The node controller's verdict and the taint manager's eviction are what the operator acts on:
            # one disruption, the lost pod force-deleted (its kubelet never confirms), the next generation.
            t.wait(lambda: t.status.get("disruptions", 0) > disruptions and t.generation > g0,
                   "the node loss counted as a disruption in a new generation", left(), interval=1)
            t.wait(lambda: not any(p["spec"].get("nodeName") == target and
                                   int(p["metadata"]["labels"][LABEL_GENERATION]) == g0 for p in t.pods),
                   f"the lost pod {lost} force-deleted while {target} is down", left(), interval=1)
            t.wait(lambda: t.latest_step(g0 + 1) > 0, f"training in generation {g0 + 1} while {target} is down",
                   max(fault_at + NODE_LOSS_RECOVERED_WITHIN - time.monotonic(), 1), interval=1)
            continued = time.monotonic() - fault_at
            declared_at = cluster.node_unready_since(target)
            assert declared_at is not None, f"{target} is down but its Ready condition is still True"
            print(f"silent node: verdict after {declared_at - fault_wall:.0f} s, training continued after "
                  f"{continued:.0f} s (deadline {NODE_LOSS_RECOVERED_WITHIN} s)")

            after = t.containers()
            assert {pod: after.get(pod) for pod in survivors} == survivors, (
                f"a survivor's pod was replaced or its container restarted: before {survivors}, after {after}")
            carried = {r["pod"]: r.get("generation") for r in t.status.get("ranks", [])}
            assert all(carried.get(pod) == g0 + 1 for pod in survivors), t.status.get("ranks")
            assert (t.status.get("restarts", 0), t.status.get("disruptions", 0)) == (0, disruptions + 1), t.describe()
            up()

        _disrupted_then_recovers(t, before=before, g0=g0, checkpointed=cluster.SHARED_CHECKPOINTS)
    finally:
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
