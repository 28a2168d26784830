"""Issue 22: bad-node memory. Which exits blame their node (decisions/nodes.py, a table), status.avoidedNodes
after two such failures on one node (bounded, expiring), the required node anti-affinity of the job's new
workers (builders), and the API tier: the real operator against the emulator, the test playing scheduler and
kubelets (worker i on node-i)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ddpjob_operator import decisions, job_manifests, model, naming
from ddpjob_operator.decisions import nodes as bad_nodes

from .conftest import eventually
from .test_scenarios import NO_BACKOFF, nodes, operator, started  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)
T0 = datetime(2026, 11, 22, tzinfo=timezone.utc)
POLICY = model.FailurePolicy()


def failed(code: int | None, message: str | None = None, *, reason: str = "Error", node: str | None = "node-1",
           disruption: bool = False, uid: str = "uid-a", phase: str = "Failed") -> decisions.WorkerObservation:
    return decisions.WorkerObservation(index=1, name="j-worker-1", generation=0, phase=phase, exit_code=code,
                                       reason=reason, message=message, node=node, disruption=disruption, uid=uid,
                                       finished_at=T0)


@pytest.mark.parametrize("what, worker, cause", [
    ("SIGKILL", failed(137, "rank 1 (local rank 0) exited with code 137: killed by SIGKILL"), "Signal"),
    ("SIGSEGV", failed(139), "Signal"),
    ("an Xid in the termination message", failed(1, "NCCL WARN Cuda failure: Xid 79 GPU has fallen off the bus"),
     "XidError"),
    ("an uncorrectable ECC error", failed(1, "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
     "ECCError"),
    ("NCCL's own system error", failed(1, "DistBackendError: NCCL error in: ..., unhandled system error "
                                          "(run with NCCL_DEBUG=INFO for details), ncclSystemError"), "NCCLError"),
    ("the node lost (taint manager)", failed(None, reason="DeletionByTaintManager", disruption=True,
                                             phase="Running"), "NodeLost"),
    ("a user error never", failed(1, "rank 1 exited with code 1: ValueError: bad learning rate"), None),
    ("a peer's failure (its Gloo error) never", failed(1, "RuntimeError: [gloo] Connection reset by peer"), None),
    ("SIGTERM (a deletion) never", failed(143), None),
    ("the OOM killer (the job's memory) never", failed(137, reason="OOMKilled"), None),
    ("an eviction never", failed(143, reason="Evicted", disruption=True), None),
    ("no node, no blame", failed(137, node=None), None),
])
def test_which_failures_blame_the_node(what, worker, cause):
    assert bad_nodes.infra_cause(worker, POLICY) == cause, what


def test_a_listed_permanent_exit_code_never_blames_the_node_even_with_a_signal():
    policy = model.FailurePolicy(permanent_exit_codes=[137])
    assert bad_nodes.infra_cause(failed(137), policy) is None


SPEC = model.DDPJobSpec.model_validate({"replicas": 2, "image": "img", "entrypoint": "ddp_trainer",
                                        "failurePolicy": {"maxRestarts": 5, "avoidNodeSeconds": 600,
                                                          "backoff": {"initialSeconds": 0}}}, strict=False)


def job(spec: model.DDPJobSpec = SPEC, **status) -> decisions.JobView:
    return decisions.JobView(name="j", namespace="ns", uid="u", metadata_generation=1, created_at=T0, spec=spec,
                             status=model.DDPJobStatus(phase="Running", start_time="2026-11-22T00:00:00Z", **status))


def observed(*workers: decisions.WorkerObservation, at: float = 0) -> decisions.Observed:
    return decisions.Observed(workers=workers, store=decisions.StoreObservation(phase="Running", ready=True),
                              now=T0 + timedelta(seconds=at))


def survivor() -> decisions.WorkerObservation:
    return decisions.WorkerObservation(index=0, name="j-worker-0", generation=0, phase="Running", ready=True,
                                       node="node-0", uid="uid-0")


def creations(d: decisions.Decision) -> list[decisions.CreateWorker]:
    return [a for a in d.actions if isinstance(a, decisions.CreateWorker)]


def test_two_failures_on_one_node_avoid_it_with_a_warning_and_anti_affinity():
    first = decisions.decide(job(), observed(survivor(), failed(137, uid="a")))
    assert [f.node for f in first.status.node_failures] == ["node-1"] and first.status.avoided_nodes == []
    assert all(c.avoid_nodes == () for c in creations(first))
    # The same failed pod seen again counts once.
    again = decisions.decide(job(**_carry(first.status)), observed(survivor(), failed(137, uid="a"), at=1))
    assert len(again.status.node_failures) == 1 and again.status.avoided_nodes == []
    second = decisions.decide(job(**_carry(again.status)),
                              observed(survivor(), failed(139, uid="b"), at=30))
    assert [a.node for a in second.status.avoided_nodes] == ["node-1"]
    avoided = second.status.avoided_nodes[0]
    assert avoided.until == "2026-11-22T00:10:30Z" and "Signal" in avoided.reason
    warning = [a for a in second.actions if isinstance(a, decisions.Event) and a.reason == "NodeAvoided"]
    assert len(warning) == 1 and warning[0].type == "Warning" and "kubectl cordon node-1" in warning[0].message
    assert [c.avoid_nodes for c in creations(second)] == [("node-1",)]


def _carry(status: model.DDPJobStatus) -> dict:
    return {"node_failures": status.node_failures, "avoided_nodes": status.avoided_nodes, "ranks": status.ranks,
            "restarts": status.restarts, "generation": status.generation, "incidents": status.incidents}


def test_a_crash_that_follows_the_job_from_node_to_node_marks_no_more_nodes():
    status = job().status
    for n, node in enumerate(("node-1", "node-2", "node-1", "node-2", "node-3")):
        status = decisions.decide(job(**_carry(status)), observed(
            survivor(), failed(139, node=node, uid=f"u{n}"), at=n)).status
        avoided = [a.node for a in status.avoided_nodes]
        # node-1 leads 2:1 when it is marked; node-2 only draws level (the job's crash, not node-2's).
        assert avoided == ([] if n < 2 else ["node-1"]), (n, avoided)


def test_user_errors_never_mark_a_node():
    status = job().status
    for i in range(3):
        d = decisions.decide(job(**_carry(status)), observed(survivor(), failed(1, "ValueError: no", uid=f"u{i}")))
        status = d.status
        assert status.node_failures == [] and status.avoided_nodes == []


def test_marks_expire_and_the_evidence_is_bounded():
    marked = model.AvoidedNode(node="node-1", reason="2 infrastructure-looking failures", since="2026-11-22T00:00:00Z",
                               until="2026-11-22T00:10:00Z")
    old = model.NodeFailure(node="node-7", time="2026-11-21T23:00:00Z", reason="Signal", pod_uid="x")
    before = decisions.decide(job(avoided_nodes=[marked], node_failures=[old]), observed(survivor(), at=599))
    assert [a.node for a in before.status.avoided_nodes] == ["node-1"] and before.status.node_failures == []
    assert before.requeue_after is not None and before.requeue_after <= 1  # wakes up when the mark expires
    after = decisions.decide(job(avoided_nodes=[marked]), observed(survivor(), at=600))
    assert after.status.avoided_nodes == []
    # The evidence keeps the newest 16 failures; the marks the newest 8 (the oldest goes first).
    status = job().status
    for i in range(20):
        status = decisions.decide(job(**_carry(status)), observed(
            survivor(), failed(137, node=f"node-{i}", uid=f"u{i}"), at=i)).status
    assert [f.node for f in status.node_failures] == [f"node-{i}" for i in range(4, 20)]
    marks = [model.AvoidedNode(node=f"old-{i}", reason="r", since=f"2026-11-22T00:00:0{i}Z",
                               until="2026-11-22T01:00:00Z") for i in range(8)]
    status = job(avoided_nodes=marks).status
    for k in (0, 1):
        status = decisions.decide(job(**_carry(status)), observed(
            survivor(), failed(137, node="node-x", uid=f"x{k}"), at=10 + k)).status
    assert [a.node for a in status.avoided_nodes] == [f"old-{i}" for i in range(1, 8)] + ["node-x"]


def test_avoid_node_seconds_zero_turns_it_off():
    spec = SPEC.model_copy(update={"failure_policy": SPEC.failure_policy.model_copy(update={"avoid_node_seconds": 0})})
    status = job(spec).status
    for uid in ("a", "b"):
        status = decisions.decide(job(spec, **_carry(status)), observed(survivor(), failed(137, uid=uid))).status
    assert status.node_failures == [] and status.avoided_nodes == []


def test_builders_add_required_node_anti_affinity_anded_with_the_users():
    ref = naming.JobRef(name="j", namespace="ns", uid="u")
    pod = job_manifests.worker_pod(ref, SPEC, index=1, generation=2, avoid_nodes=("node-b", "node-a"))
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                            "values": ["node-a", "node-b"]}]}]
    assert "affinity" not in job_manifests.worker_pod(ref, SPEC, index=1, generation=2)["spec"]
    users = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}}
    spec = SPEC.model_copy(update={"template": model.PodTemplate.model_validate({"affinity": users}, strict=False)})
    pod = job_manifests.worker_pod(ref, spec, index=1, generation=2, avoid_nodes=("node-a",))
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [len(t["matchExpressions"]) for t in terms] == [2, 2]  # each OR-ed term keeps the user's rule AND ours
    assert all(t["matchExpressions"][1]["values"] == ["node-a"] for t in terms)
    assert len(users["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"]) == 1  # the spec's own dict is untouched


# ---------------------------------------------------------------- API tier: the real operator

def anti_affinity(pod: dict) -> list[str]:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return sorted({v for t in terms for e in t.get("matchExpressions", []) if e["operator"] == "NotIn"
                   for v in e["values"]})


async def _kill_worker_1(harness, nodes, job: str, generation: int) -> None:
    """SIGKILL the worker on node-1 and let the next generation come up."""
    await nodes.exit(f"{job}-worker-1", 137, f"rank 1 (local rank 0) exited with code 137: killed by SIGKILL "
                                             f"[generation {generation}]")
    await nodes.generation_running(job, generation + 1, 2)


async def test_api_two_failures_on_one_node_put_the_replacement_elsewhere_until_it_expires(harness, operator, nodes):
    await started(harness, nodes, "flaky", failurePolicy={"maxRestarts": 5, "avoidNodeSeconds": 8, **NO_BACKOFF})
    await _kill_worker_1(harness, nodes, "flaky", 0)
    assert anti_affinity(harness.pods("flaky")["flaky-worker-1"]) == []  # one failure is not a pattern
    assert [f["node"] for f in harness.status("flaky")["nodeFailures"]] == ["node-1"]
    await _kill_worker_1(harness, nodes, "flaky", 1)
    status = harness.status("flaky")
    assert [a["node"] for a in status["avoidedNodes"]] == ["node-1"] and status["restarts"] == 2
    # The replacement must not land on node-1 again; the survivor on node-0 was never touched.
    assert anti_affinity(harness.pods("flaky")["flaky-worker-1"]) == ["node-1"]
    assert anti_affinity(harness.pods("flaky")["flaky-worker-0"]) == []
    await eventually(lambda: [e for e in harness.events("flaky") if e["reason"] == "NodeAvoided"
                              and e["type"] == "Warning" and "node-1" in e["message"]], what="the NodeAvoided Event")
    # The mark expires (the operator wakes up for it): a later replacement may use node-1 again.
    await eventually(lambda: harness.status("flaky").get("avoidedNodes") in (None, []), 20, "the mark to expire")
    await _kill_worker_1(harness, nodes, "flaky", 2)
    assert anti_affinity(harness.pods("flaky")["flaky-worker-1"]) == []


async def test_api_user_errors_on_one_node_never_mark_it(harness, operator, nodes):
    await started(harness, nodes, "buggy", failurePolicy={"maxRestarts": 5, "retryableExitCodes": [3], **NO_BACKOFF})
    for generation in (0, 1):
        await nodes.exit("buggy-worker-1", 3, f"rank 1 (local rank 0) exited with code 3: ValueError: nope "
                                              f"[generation {generation}]")
        await nodes.generation_running("buggy", generation + 1, 2)
    status = harness.status("buggy")
    assert status["restarts"] == 2 and status.get("avoidedNodes") in (None, [])
    assert status.get("nodeFailures") in (None, [])
    assert anti_affinity(harness.pods("buggy")["buggy-worker-1"]) == []
