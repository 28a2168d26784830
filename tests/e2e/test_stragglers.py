"""Issue 22 on a real cluster: a rank slowed 3x (the trainer's --fault-slow-rank) is named a straggler, with its
pod and its node, in the Straggler condition, a Warning Event and the SLOWEST column of `kubectl get ddpj -o
wide`; with failurePolicy.stragglers Replace its pod is moved as an uncharged disruption. A worker that fails on
one node (the trainer's --fault-node, with NODE_NAME from the downward API) twice marks that node avoided, and
the replacement gets required node anti-affinity against it. Needs the chart's progress endpoint (on by
default). Skipped without a cluster (`make kind-up kind-load helm-install e2e`)."""

from __future__ import annotations

import pytest

from . import cluster
from .scenario import FAULT_AT, Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
# Steps of a few tens of milliseconds on kind's CPUs: a 3x slowdown stands well above scheduling noise.
SLOW_WORKLOAD = ["--workload", "synthetic", "--workload-option", "hidden=1024", "--workload-option", "samples=65536"]
WINDOW = 60


def _slow_pod(t: Training) -> dict:
    """The pod whose trainer runs global rank 1 (the rendezvous decides which): its fault line says so."""
    t.refresh()
    for record in t.records.values():
        if "fault injection: rank 1: working 3x as long per step" in record.log:
            return cluster.get_json("pod", record.name, "-n", t.namespace)
    raise AssertionError(f"no pod says it is the slowed rank 1: {t.describe()}")


def test_a_slowed_rank_is_named_with_its_pod_and_node(namespace, operator):
    t = Training(namespace, digits_job(
        "straggler", trainer_args=[*SLOW_WORKLOAD, "--fault-slow-rank", "1", "--fault-slow-factor", "3",
                                   "--fault-every-generation"],
        failure_policy={"maxRestarts": 0, "stragglerWindowSeconds": WINDOW})).start()
    t.wait(lambda: (c := cluster.condition_of(t.job, "Straggler")) and c["status"] == "True", "the Straggler condition",
           600 + 3 * WINDOW)
    pod = _slow_pod(t)
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    message = cluster.condition_of(t.job, "Straggler")["message"]
    assert f"(pod {name}, node {node})" in message, message
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "reason=Straggler")["items"]
    assert any(e["type"] == "Warning" and f"node {node}" in e["message"] for e in events), events
    wide = cluster.kubectl("get", "ddpj", "straggler", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert "SLOWEST" in wide[0].split(), wide
    index = name.rsplit("-", 1)[1]
    assert f" {index} (" in wide[1], wide  # e.g. "1 (2.95x)"
    status = t.status
    assert status["restarts"] == 0 and status["disruptions"] == 0 and status["phase"] == "Running", status


def test_replace_moves_the_straggler_without_a_charge(namespace, operator):
    t = Training(namespace, digits_job(
        "replace", trainer_args=[*SLOW_WORKLOAD, "--fault-slow-rank", "1", "--fault-slow-factor", "3"],
        failure_policy={"maxRestarts": 0, "stragglers": "Replace", "stragglerWindowSeconds": WINDOW,
                        "backoff": {"initialSeconds": 1, "maxSeconds": 10}})).start()
    t.wait(lambda: t.status.get("disruptions") == 1, "the straggler's replacement", 600 + 3 * WINDOW)
    incident = t.status["incidents"][-1]
    assert (incident["cause"], incident["reason"], incident["charged"]) == ("Disruption", "StragglerReplaced", False)
    # Generation 1 trains without the slowdown (the fault is for generation 0) and the job ends well.
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=0, disruptions=1, generation=1)


def test_a_node_that_keeps_failing_is_avoided(namespace, operator):
    nodes = [n["metadata"]["name"] for n in cluster.schedulable_nodes()]
    if len(nodes) < 2:
        pytest.skip(f"needs two schedulable nodes, the cluster has {nodes}")
    manifest = digits_job(
        "badnode", trainer_args=["--fault-at-step", str(FAULT_AT), "--fault-exit-code", "137",
                                 "--fault-every-generation", "--fault-node", nodes[0]],
        failure_policy={"maxRestarts": 6, "backoff": {"initialSeconds": 1, "maxSeconds": 10}})
    # NODE_NAME from the downward API: the fault strikes every worker on nodes[0], whatever its rank.
    manifest["spec"].setdefault("env", []).append(
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    t = Training(namespace, manifest).start()
    t.wait_terminal()
    status = t.status
    failures = [f for f in status.get("nodeFailures", []) if f["node"] == nodes[0]]
    if len(failures) < 2:
        pytest.skip(f"the scheduler placed fewer than two workers on {nodes[0]} ({failures}): nothing to avoid")
    assert [a["node"] for a in status.get("avoidedNodes", [])] == [nodes[0]], status
    later = [p for p in cluster.job_pods(namespace, "badnode")
             if p["metadata"]["creationTimestamp"] >= status["avoidedNodes"][0]["since"]]
    for pod in later:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert any(e["operator"] == "NotIn" and nodes[0] in e["values"]
                   for term in terms["nodeSelectorTerms"] for e in term["matchExpressions"]), pod["spec"]
        assert pod["spec"].get("nodeName") != nodes[0]
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "reason=NodeAvoided")["items"]
    assert any(nodes[0] in e["message"] for e in events), events
