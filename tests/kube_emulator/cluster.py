"""The emulated API server: its state, the resources it serves, and its parts put together."""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Any, Callable

import attrs
import kmock
from kmock._internal import rendering
from kmock._internal.k8s import KubernetesError

from ddpjob_operator import crd

from .resources import NODES, POD_GROUPS, LEASES, TOKEN_REVIEWS, HISTORY, Change
from .control_plane import ControlPlane
from .deletion import Deletion
from .routing import RequestRouting
from .store import ObjectStore
from .tokens import TokenReviews
from .writes import Writes


@attrs.define(kw_only=True)
class Cluster(RequestRouting, TokenReviews, Writes, Deletion, ObjectStore, ControlPlane,
              kmock.KubernetesEmulator):
    calls: set[tuple[str, str, str]] = attrs.field(factory=set, init=False)
    call_counts: collections.Counter[tuple[str, str, str]] = attrs.field(factory=collections.Counter, init=False)
    credentials: list[str] = attrs.field(factory=list, init=False)  # Authorization headers seen
    created: dict[tuple[str, str], float] = attrs.field(factory=dict, init=False)  # pod -> perf_counter()
    _in_flight: set[rendering.Request] = attrs.field(factory=set, init=False)
    _creation_waiters: dict[tuple[str, str], list[asyncio.Future[float]]] = attrs.field(factory=dict, init=False)
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _resource_version: int = attrs.field(default=0, init=False)  # the newest one: what a list is consistent with
    _history: dict[Any, collections.deque[Change]] = attrs.field(
        factory=lambda: collections.defaultdict(lambda: collections.deque(maxlen=HISTORY)), init=False)
    _schemas: dict[Any, dict[str, Any]] = attrs.field(factory=dict, init=False)  # CRD openAPIV3Schema
    _scale_paths: dict[Any, dict[str, str]] = attrs.field(factory=dict, init=False)
    _unreachable: set[str] = attrs.field(factory=set, init=False)  # nodes whose kubelet stopped answering
    _gc_wanted: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _gc_task: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    # Faults a test sets. admit_pods: a validating admission step (a webhook, Pod Security, ResourceQuota)
    # run on every pod create after the defaults are applied; what it returns is the answer (403 ...).
    admit_pods: Callable[[dict[str, Any]], KubernetesError | None] | None = attrs.field(default=None, init=False)
    # (plural, name) of every create asked with dryRun=All, in order.
    dry_runs: list[tuple[str, str | None]] = attrs.field(factory=list, init=False)
    # Until this time.monotonic() moment every operator request but its open watches is answered 503,
    # as by an API server that lost etcd or is restarting behind its load balancer.
    unavailable_until: float = attrs.field(default=0.0, init=False)
    # Service-account tokens the emulated API server vouches for (TokenReview): token -> (namespace, service
    # account, pod name, pod uid, audiences). `issue_token` adds one, as the kubelet's TokenRequest would.
    tokens: dict[str, tuple[str, str, str, str, tuple[str, ...]]] = attrs.field(factory=dict, init=False)

    def register_resources(self) -> None:
        definition = crd.build_crd()["spec"]  # the DDPJob as the generated CRD declares it
        names, version = definition["names"], definition["versions"][0]
        resource = kmock.resource(definition["group"], version["name"], names["plural"])
        self.resources[resource] = kmock.ResourceInfo(
            kind=names["kind"], singular=names["singular"], namespaced=definition["scope"] == "Namespaced",
            shortnames=set(names["shortNames"]), categories=set(names["categories"]),
            verbs={"list", "watch", "get", "create", "update", "patch", "delete"},
            subresources=set(version["subresources"]))
        self._schemas[resource] = version["schema"]["openAPIV3Schema"]
        self._scale_paths[resource] = version["subresources"]["scale"]
        for plural, kind, subresources in (("pods", "Pod", {"status", "eviction"}), ("services", "Service", set()),
                                           ("events", "Event", set()),
                                           ("persistentvolumeclaims", "PersistentVolumeClaim", set()),
                                           ("configmaps", "ConfigMap", set())):
            self.resources[kmock.resource("", "v1", plural)] = kmock.ResourceInfo(
                kind=kind, singular=kind.lower(), namespaced=True,
                verbs={"list", "watch", "get", "create", "update", "patch", "delete"}, subresources=subresources)
        self.resources[NODES] = kmock.ResourceInfo(
            kind="Node", singular="node", namespaced=False,
            verbs={"list", "watch", "get", "create", "update", "patch", "delete"}, subresources={"status"})
        # The operators' leader election: a PUT or PATCH naming a stale resourceVersion is a 409 Conflict.
        self.resources[LEASES] = kmock.ResourceInfo(
            kind="Lease", singular="lease", namespaced=True,
            verbs={"list", "watch", "get", "create", "update", "patch", "delete"})
        # TokenReview: create only, cluster-scoped, nothing stored (the progress endpoint's authentication).
        self.resources[TOKEN_REVIEWS] = kmock.ResourceInfo(kind="TokenReview", singular="tokenreview",
                                                           namespaced=False, verbs={"create"})
        # Discoverable like on a real server (kopf waits for them), though the operator never calls them.
        self.resources[kmock.resource("", "v1", "namespaces")] = kmock.ResourceInfo(
            kind="Namespace", singular="namespace", namespaced=False, verbs={"list", "watch", "get"})
        self.resources[kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")] = \
            kmock.ResourceInfo(kind="CustomResourceDefinition", singular="customresourcedefinition",
                               namespaced=False, verbs={"list", "watch", "get"})

    def register_pod_groups(self) -> None:
        """Install the gang schedulers' PodGroup CRDs (Volcano's and scheduler-plugins'); without them a
        create of a PodGroup is a 404, as on a cluster without those schedulers."""
        for resource in POD_GROUPS:
            self.resources[resource] = kmock.ResourceInfo(
                kind="PodGroup", singular="podgroup", namespaced=True,
                verbs={"list", "watch", "get", "create", "update", "patch", "delete"}, subresources={"status"})

    async def __aexit__(self, *exc_info: Any) -> None:
        task, self._gc_task = self._gc_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await super().__aexit__(*exc_info)
        if task is not None and not task.cancelled() and task.done() and task.exception() is not None:
            raise task.exception()  # a bug in the garbage collector must fail the test

    # ------------------------------------------------------------ request handling

