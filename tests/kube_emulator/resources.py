"""The resources the emulated API server serves, and what its store keeps of each change."""

from __future__ import annotations

from typing import Any, NamedTuple

import kmock

from ddpjob_operator import kube, model


PODS = kmock.resource("", "v1", "pods")
NODES = kmock.resource("", "v1", "nodes")
SERVICES = kmock.resource("", "v1", "services")
CLAIMS = kmock.resource("", "v1", "persistentvolumeclaims")
EVENTS = kmock.resource("", "v1", "events")
DDPJOBS = kmock.resource(model.GROUP, model.VERSION, model.PLURAL)
POD_GROUPS = tuple(kmock.resource(*api_version.split("/"), "podgroups")
                   for api_version, _ in model.GANG_SCHEDULERS.values())
LEASES = kmock.resource("coordination.k8s.io", "v1", "leases")
TOKEN_REVIEWS = kmock.resource("authentication.k8s.io", "v1", "tokenreviews")
OPERATOR_AGENTS = ("kopf/", kube.USER_AGENT)

# Watch events kept per resource so that a watch can resume from a resourceVersion; older ones
# are answered with 410 Gone, as after an etcd compaction.
HISTORY = 10_000

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
# What a healthy kubelet posts for its node: (type, status, reason, message).
HEALTHY_NODE = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)
# The reasons and messages the components write into a pod's DisruptionTarget condition.
EVICTION_API = ("EvictionByEvictionAPI", "Eviction API: evicting")
TAINT_MANAGER = ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
PREEMPTION_MESSAGE = "{scheduler}: preempting to accommodate a higher priority pod"
KUBELET_TERMINATION = {  # pod status reason -> message, for reason TerminationByKubelet
    "Evicted": "The node was low on resource: memory. ",  # node-pressure eviction
    "Terminated": "Pod was terminated in response to imminent node shutdown.",  # graceful node shutdown
}
GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the API server draws suffixes from
MODIFIED_ELSEWHERE = "the object has been modified; please apply your changes to the latest version and try again"


class NodeUnreachable(RuntimeError):
    """A test asked the kubelet of a node that is down to do something: it cannot."""


class Change(NamedTuple):
    """One stored change, as watches see it."""

    rv: int
    type: str  # ADDED, MODIFIED or DELETED
    obj: dict[str, Any]  # the new state (for DELETED: the last one, with the deletion's resourceVersion)
    old: dict[str, Any] | None  # the state before: a selector watch turns changes of membership into ADDED/DELETED


