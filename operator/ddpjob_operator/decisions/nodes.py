"""Bad-node memory: a node where this job's workers failed twice with an infrastructure-looking cause within
`failurePolicy.avoidNodeSeconds` is recorded in `status.avoidedNodes` (at most 8, each expiring after that
long), and the job's new workers get required node anti-affinity against it (`CreateWorker.avoid_nodes`,
job_manifests.worker_pod), so a replacement does not land on the machine that keeps failing and spend the
restart budget there. A straggler replaced (decisions/stragglers.py) marks its node at once: the point of
replacing it is to move it off that node.

Infrastructure-looking (`infra_cause`): killed by a signal (not SIGTERM: a deletion; not the OOM killer: the
job's own memory), a node-local NCCL error (system, internal, unhandled CUDA error), an Xid or ECC message,
the node lost (the taint manager's eviction), or a straggler replaced there. Never: a user error (exit
1-127 that failurePolicy does not list as retryable), a failure caused by a peer (connection reset, timed
out, remote process exited: the peer's node is to blame, not this one), an eviction or preemption.

A failure that follows the job from node to node is the job's: a node is marked only while it has more such
failures than any other node (so a trainer that crashes with a signal wherever it runs never gets every node of
a small cluster avoided and its replacements unschedulable); for a replaced straggler, more replaced stragglers
than any other node (a slowness that moves with the rank is not the node's).

Pure: the evidence lives in `status.nodeFailures` (the newest 16, each keyed by its pod's uid so a failed pod
seen in many passes counts once), the clock comes in with the observation.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

from .. import model
from .accounting import classify_exit, peer_failed
from .common import Plan, parse_time, rfc3339
from .types import NODE_LOST_REASONS, PERMANENT, REASON_NODE_AVOIDED, CreateWorker, WorkerObservation

MAX_NODE_FAILURES = 16
MAX_AVOIDED_NODES = 8
XID_TEXT = re.compile(r"\bXid\b", re.IGNORECASE)
ECC_TEXT = re.compile(r"\bECC\b|uncorrectable (?:ECC|memory) error|cudaErrorECCUncorrectable", re.IGNORECASE)
# NCCL's words for a failure on this node (its own system, driver or GPU), unlike a peer's.
NCCL_LOCAL_TEXT = re.compile(r"ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
                             r"NCCL error.*unhandled (?:system|cuda) error", re.IGNORECASE)
SIGTERM_EXIT = 143


def infra_cause(w: WorkerObservation, policy: model.FailurePolicy) -> str | None:
    """Why this exit blames its node, or None."""
    if not w.node:
        return None
    if w.reason in NODE_LOST_REASONS or w.reason == "NodeLost":
        return "NodeLost"
    if w.disruption or w.phase != "Failed":
        return None  # evicted, preempted, deleted: the node did nothing wrong
    message = w.message or ""
    if XID_TEXT.search(message):
        return "XidError"
    if ECC_TEXT.search(message):
        return "ECCError"
    if classify_exit(w.exit_code, w.reason, w.disruption, policy, w.message) == PERMANENT:
        return None  # the user's own error never marks a node
    if NCCL_LOCAL_TEXT.search(message):
        return "NCCLError"
    if peer_failed(message):
        return None  # its collective failed because a peer did
    if w.exit_code is not None and w.exit_code >= 128 and w.exit_code != SIGTERM_EXIT and w.reason != "OOMKilled":
        return "Signal"
    return None


def failure_key(w: WorkerObservation) -> str:
    """The pod's uid; without one (a fake in tests), its name and attempt: one failure counted once."""
    return w.uid or f"{w.name}/{w.attempt}"[-64:]


def record(plan: Plan, spec: model.DDPJobSpec, node: str, reason: str, pod_uid: str | None, *,
           at_once: bool = False) -> None:
    """One failure on `node`; marks the node avoided once it has enough within the window.

    `at_once`: this one is enough (a straggler replaced there: its replacement must not land on the same slow
    node). It still follows the job when failures of its kind (`reason`) are as many on another node: a
    slowness that moves with the rank, not with the node, does not get node after node avoided."""
    status, seconds = plan.status, spec.failure_policy.avoid_node_seconds
    if seconds <= 0:
        return
    if pod_uid is not None and any(f.pod_uid == pod_uid for f in status.node_failures):
        return
    status.node_failures = (status.node_failures + [model.NodeFailure(
        node=node, time=rfc3339(plan.now), reason=reason, pod_uid=pod_uid)])[-MAX_NODE_FAILURES:]
    if any(a.node == node for a in status.avoided_nodes):
        return
    evidence = [f for f in status.node_failures if not at_once or f.reason == reason]
    here = [f for f in evidence if f.node == node]
    if len(here) < (1 if at_once else plan.options.node_failures_to_avoid):
        return
    elsewhere = max(Counter(f.node for f in evidence if f.node != node).values(), default=0)
    if len(here) <= elsewhere:
        return  # failing as often on another node: it follows the job, not this node
    until = plan.now + timedelta(seconds=seconds)
    why = ", ".join(f"{f.reason} at {f.time}" for f in here)
    status.avoided_nodes = sorted(status.avoided_nodes + [model.AvoidedNode(
        node=node, reason=f"{len(here)} infrastructure-looking failure{'s' if len(here) > 1 else ''}: {why}"[:1024],
        since=rfc3339(plan.now), until=rfc3339(until))], key=lambda a: a.since)[-MAX_AVOIDED_NODES:]
    plan.wake_at(until)
    what = (f"this job's worker there was replaced ({why})" if at_once else
            f"{len(here)} of this job's workers failed there with an infrastructure-looking cause within {seconds}s "
            f"({why})")
    plan.event("Warning", REASON_NODE_AVOIDED,
               f"node {node}: {what}; new workers avoid it until {rfc3339(until)}. Consider taking it out "
               f"of service: kubectl cordon {node} (or kubectl taint nodes {node} ddpjob.dev/suspect=true:NoSchedule)")


def record_node_failures(plan: Plan, spec: model.DDPJobSpec) -> None:
    """Expire old evidence and marks, then record the infrastructure-looking failures observed now."""
    status, seconds = plan.status, spec.failure_policy.avoid_node_seconds
    if seconds <= 0:
        status.node_failures, status.avoided_nodes = [], []
        return
    horizon = plan.now - timedelta(seconds=seconds)
    status.node_failures = [f for f in status.node_failures if (parse_time(f.time) or plan.now) > horizon]
    kept = []
    for a in status.avoided_nodes:
        until = parse_time(a.until)
        if until is not None and until <= plan.now:
            continue
        kept.append(a)
        if until is not None:
            plan.wake_at(until)
    status.avoided_nodes = kept
    for w in plan.observed.workers:
        cause = infra_cause(w, spec.failure_policy)
        if cause is not None and w.node:
            record(plan, spec, w.node, cause, failure_key(w))


def avoid_nodes(plan: Plan) -> None:
    """Every worker created in this pass keeps off the avoided nodes."""
    avoided = tuple(sorted(a.node for a in plan.status.avoided_nodes))
    if not avoided:
        return
    plan.actions = [CreateWorker(a.index, a.generation, a.attempt, avoid_nodes=avoided)
                    if isinstance(a, CreateWorker) else a for a in plan.actions]
