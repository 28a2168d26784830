"""kmock's Kubernetes emulator, made to act like a Kubernetes v1.36 API server and the parts of
the control plane around it, wherever the operator's failure handling depends on what they do.

kmock keeps objects in memory and serves discovery over HTTP. Every request that reads or changes
objects is served here, with the real server's rules (checked against watch traces recorded on a
real v1.36 cluster: tests/operator/test_emulator.py):

- server metadata on create: uid, resourceVersion (one counter for all objects, like etcd's
  revision), creationTimestamp, generation (pods and custom resources), names from generateName;
  409 AlreadyExists; `metadata.resourceVersion` in a PATCH or PUT makes it conditional (409 Conflict);
- the status subresource: /status writes change only status, main-resource writes never change
  status; `generation` moves when anything but metadata and status changes; the scale subresource;
- the DDPJob CRD's structural schema: unknown fields pruned, `default`s applied (on write and on
  read), the spec validated with the operator's own model (the CRD's rules): 422;
- pods: admission (DefaultTolerationSeconds, terminationGracePeriodSeconds, phase Pending),
  graceful deletion (deletionTimestamp, deletionGracePeriodSeconds, generation + 1; gone only when
  the kubelet confirms, or with grace 0, or when the pod has finished), uid and resourceVersion
  preconditions, finalizers, the Eviction subresource;
- list and watch: label and field selectors, resourceVersion (a watch resumes after it; 410 Gone
  when it is too old), timeoutSeconds;
- deletecollection: a DELETE on a namespace's collection URL deletes every object it selects;
- background garbage collection through ownerReferences (the kube-controller-manager's job);
- the control plane and kubelets as test-side methods: scheduler preemption, the taint manager,
  kubelet node-pressure eviction and graceful node shutdown, a node going down and coming back,
  a pod the scheduler cannot place;
- faults a test sets: a validating admission step for pods (`admit_pods`: Pod Security, quota, a
  webhook), and an API server that answers the operator 503 for a while (`unavailable_until`);
- a record of every (API group, resource, verb) the operator calls.

Not emulated (so a test must not rely on them): PodDisruptionBudgets (every eviction is allowed),
strategic-merge and server-side-apply patches (415), Foreground and Orphan propagation (501),
pod spec immutability, quantities, qosClass, and admission other than DefaultTolerationSeconds
(and what a test puts in `admit_pods`).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import itertools
import random
import re
import time
import uuid
from typing import Any, AsyncIterator, Callable, NamedTuple

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import enums, rendering
from kmock._internal.k8s import KubernetesError

from ddpjob_operator import crd, kube, model
from ddpjob_operator.validation import InvalidJob, parse_spec

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


# ---------------------------------------------------------------- small helpers

def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def rfc3339(moment: datetime.datetime | None = None) -> str:
    """The API's timestamps have whole seconds."""
    return (moment or utcnow()).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386: what a merge patch turns `base` into (null removes a key; lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def qualified(resource: Any) -> str:
    """How error messages name a resource: `pods`, `ddpjobs.elastic.ddp.dev`."""
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def api_error(code: int, reason: str, message: str, resource: Any = None, name: str | None = None) -> KubernetesError:
    details: dict[str, Any] = {}
    if name is not None:
        details["name"] = name
    if resource is not None:
        details.update({"group": resource.group} if resource.group else {})
        details["kind"] = resource.plural
    return KubernetesError(status=code, reason=reason, message=message, details=details or None)


def not_found(resource: Any, name: str) -> KubernetesError:
    return api_error(404, "NotFound", f'{qualified(resource)} "{name}" not found', resource, name)


def conflict(resource: Any, name: str, why: str) -> KubernetesError:
    return api_error(409, "Conflict", f'Operation cannot be fulfilled on {qualified(resource)} "{name}": {why}',
                     resource, name)


def bad_request(message: str) -> KubernetesError:
    return api_error(400, "BadRequest", message)


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: str,
                  reason: str | None = None, message: str | None = None) -> tuple[list[dict[str, Any]], bool]:
    """UpdatePodCondition (k8s.io/kubernetes/pkg/api/v1/pod) on a copy: replace or append the
    condition; its transition time moves only with its status. False when nothing changed."""
    new: dict[str, Any] = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": rfc3339()}
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    conditions = [dict(c) for c in conditions or ()]
    for index, old in enumerate(conditions):
        if old.get("type") == type_:
            if old.get("status") == status:
                new["lastTransitionTime"] = old.get("lastTransitionTime")
            same = all(old.get(k) == new.get(k) for k in ("status", "reason", "message", "lastTransitionTime"))
            conditions[index] = new
            return conditions, not same
    return conditions + [new], True


def tolerates(toleration: dict[str, Any], key: str, effect: str) -> bool:
    """Toleration.ToleratesTaint for a taint without a value."""
    if toleration.get("effect") and toleration["effect"] != effect:
        return False
    if toleration.get("key") and toleration["key"] != key:
        return False
    operator = toleration.get("operator") or "Equal"
    return operator == "Exists" or (operator == "Equal" and not toleration.get("value"))


# ---------------------------------------------------------------- selectors

_REQUIREMENT = re.compile(r"""\s*(?:
      (?P<absent>!)\s*(?P<akey>[\w./-]+)
    | (?P<key>[\w./-]+)\s*(?:
          (?P<op>==|=|!=)\s*(?P<value>[\w.-]*)
        | \s(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)
      )?
    )\s*(?:,|$)""", re.VERBOSE)


def parse_label_selector(text: str | None) -> list[tuple[str, str, frozenset[str]]]:
    """`a=b,c!=d,e,!f,g in (h,i),j notin (k)` -> [(key, operator, values)]; 400 if malformed."""
    requirements, text, pos = [], (text or "").strip(), 0
    while pos < len(text):
        match = _REQUIREMENT.match(text, pos)
        if not match or match.end() == pos:
            raise bad_request(f"unable to parse requirement: found {text[pos:]!r} in label selector {text!r}")
        if match["absent"]:
            requirements.append((match["akey"], "!", frozenset()))
        elif match["setop"]:
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            requirements.append((match["key"], match["setop"], values))
        elif match["op"]:
            requirements.append((match["key"], "!=" if match["op"] == "!=" else "=", frozenset([match["value"]])))
        else:
            requirements.append((match["key"], "exists", frozenset()))
        pos = match.end()
    return requirements


def labels_match(labels: dict[str, str] | None, requirements: list[tuple[str, str, frozenset[str]]]) -> bool:
    labels = labels or {}
    for key, op, values in requirements:
        present, value = key in labels, labels.get(key)
        ok = {"exists": present, "!": not present, "=": present and value in values,
              "!=": not present or value not in values,  # as in Kubernetes: a missing label is "not equal"
              "in": present and value in values, "notin": not present or value not in values}[op]
        if not ok:
            return False
    return True


# The fields a real server lets a field selector use (a few per kind; any other is a 400).
SELECTABLE_FIELDS = {"metadata.name", "metadata.namespace"}
SELECTABLE_POD_FIELDS = {"spec.nodeName", "status.phase", "spec.restartPolicy", "spec.schedulerName"}
SELECTABLE_EVENT_FIELDS = {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                           "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.fieldPath",
                           "reason", "reportingComponent", "source", "type"}


def parse_field_selector(text: str | None, resource: Any) -> list[tuple[str, bool, str]]:
    """`metadata.name=x,status.phase!=Running` -> [(path, equal, value)]."""
    requirements = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        match = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", part)
        if not match:
            raise bad_request(f"invalid selector: {text!r}; can't understand {part!r}")
        path, op, value = match.groups()
        if path not in SELECTABLE_FIELDS and not (resource == PODS and path in SELECTABLE_POD_FIELDS) \
                and not (getattr(resource, "plural", None) == "events" and path in SELECTABLE_EVENT_FIELDS):
            raise bad_request(f'field label not supported: {path}')
        requirements.append((path, op != "!=", value))
    return requirements


def fields_match(obj: dict[str, Any], requirements: list[tuple[str, bool, str]]) -> bool:
    for path, equal, value in requirements:
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if ((node if node is not None else "") == value) != equal:
            return False
    return True


# ---------------------------------------------------------------- structural schemas (CRDs)

def prune(value: Any, schema: dict[str, Any] | None) -> Any:
    """What the API server keeps of a custom resource: fields its schema does not declare go,
    unless the schema preserves unknown fields (apiextensions' pruning algorithm)."""
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        if isinstance(value, dict):  # unknown fields stay; known ones are still pruned inside
            props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
            return {k: prune(v, props[k]) if k in props else prune(v, extra) if isinstance(extra, dict) else v
                    for k, v in value.items()}
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            return [prune(v, schema["items"]) for v in value]
        return value
    if isinstance(value, dict):
        if schema is None:
            return {}
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        return {k: prune(v, props[k] if k in props else extra) for k, v in value.items()
                if k in props or isinstance(extra, dict)}
    if isinstance(value, list):
        return [prune(v, (schema or {}).get("items")) for v in value]
    return value


def apply_defaults(value: Any, schema: dict[str, Any] | None) -> Any:
    """Structural defaulting: an absent field (or a null one that is not nullable) gets its
    schema's `default`, then defaults apply inside it too (apiextensions' defaulting algorithm)."""
    if schema is None:
        return value
    if isinstance(value, dict):
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        out = dict(value)
        for key, prop in props.items():
            if "default" in prop and (key not in out or (out[key] is None and not prop.get("nullable"))):
                out[key] = copy.deepcopy(prop["default"])
        return {k: apply_defaults(v, props[k] if k in props else extra if isinstance(extra, dict) else None)
                for k, v in out.items()}
    if isinstance(value, list):
        return [apply_defaults(v, schema.get("items")) for v in value]
    return value


def schema_path(obj: dict[str, Any], path: str) -> Any:
    """A CRD's JSON path like `.spec.replicas`."""
    node: Any = obj
    for part in path.strip(".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


# ---------------------------------------------------------------- the emulator

@attrs.define(kw_only=True)
class Cluster(kmock.KubernetesEmulator):
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

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        # kmock matches each request by scanning its whole request history; keep only the requests
        # still being served (watches), or every call gets slower with every call before it.
        self._in_flight.add(request)
        self._requests[:] = [r for r in self._requests if r in self._in_flight]
        try:
            return await self._serve(request)
        finally:
            self._in_flight.discard(request)

    async def _serve(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None or not resource.plural:
            return await super()._handle(request)  # discovery
        self._record(request)
        if self._unavailable(request):
            return self._failure(api_error(503, "ServiceUnavailable",
                                           "the server is currently unable to handle the request"))
        method, named, sub = request.method, request.name is not None, request.subresource
        try:
            if resource not in self.resources:
                raise api_error(404, "NotFound", "the server could not find the requested resource")
            if sub is not None and sub not in self.resources[resource].subresources:
                raise api_error(404, "NotFound", "the server could not find the requested resource")
            if method == "GET" and request.action == enums.action.WATCH:
                self._matching(request)  # a malformed selector is a 400, before any streaming
                return await super()._handle(request)  # kmock streams what _serve_watch yields
            if method == "GET" and named:
                code, body = 200, await self._get_object(request)
            elif method == "GET":
                code, body = 200, await self._list(request)
            elif method == "POST" and not named and resource == TOKEN_REVIEWS:
                code, body = 201, self._review_token(request)
            elif method == "POST" and not named:
                code, body = 201, await self._create(request)
            elif method == "POST" and named and sub == "eviction":
                code, body = 201, await self._evict(request)
            elif method in ("PATCH", "PUT") and named:
                code, body = 200, await self._update(request)
            elif method == "DELETE" and named:
                code, body = 200, await self._delete_request(request)
            elif method == "DELETE" and sub is None and (request.namespace is not None
                                                          or not self.resources[resource].namespaced):
                code, body = 200, await self._delete_collection(request)
            else:
                raise api_error(405, "MethodNotAllowed",
                                "the server does not allow this method on the requested resource")
        except KubernetesError as exc:
            return self._failure(exc)
        return aiohttp.web.json_response(body, status=code)

    @staticmethod
    def _failure(exc: KubernetesError) -> aiohttp.web.StreamResponse:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": exc.message, "reason": exc.reason}
        if exc.details:
            body["details"] = exc.details
        body["code"] = exc.status
        return aiohttp.web.json_response(body, status=exc.status)

    def _unavailable(self, request: rendering.Request) -> bool:
        return (time.monotonic() < self.unavailable_until and request.action != enums.action.WATCH
                and request.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS))

    def _record(self, request: rendering.Request) -> None:
        agent = request.headers.get("User-Agent", "")
        if not agent.startswith(OPERATOR_AGENTS):
            return
        verb = {enums.action.LIST: "list", enums.action.WATCH: "watch", enums.action.FETCH: "get",
                enums.action.CREATE: "create", enums.action.UPDATE: "patch",
                enums.action.DELETE: "delete"}.get(request.action)  # type: ignore[arg-type]
        if request.method == "PUT" and request.name:
            verb = "update"
        elif request.method == "POST" and request.name:
            verb = "create"  # a subresource such as pods/eviction
        if verb is None:
            return
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        self.calls.add((request.resource.group or "", resource, verb))
        self.call_counts[(request.resource.group or "", resource, verb)] += 1
        if "Authorization" in request.headers:
            self.credentials.append(request.headers["Authorization"])

    def _review_token(self, request: rendering.Request) -> dict[str, Any]:
        """A TokenReview as the API server answers it for a pod-bound projected service-account token:
        authenticated only for one of the token's audiences, with the pod in user.extra."""
        spec = (request.data or {}).get("spec") or {}
        wanted = list(spec.get("audiences") or ["https://kubernetes.default.svc"])
        issued = self.tokens.get(spec.get("token") or "")
        status: dict[str, Any] = {"authenticated": False, "error": "[invalid bearer token, token lookup failed]"}
        if issued is not None:
            namespace, account, pod, uid, audiences = issued
            common = [a for a in wanted if a in audiences]
            if not common:
                status = {"authenticated": False, "error": "[invalid bearer token, token audiences "
                                                           f"{list(audiences)} is invalid for the target audiences "
                                                           f"{wanted}]"}
            elif self.get(PODS, namespace, pod) is None or self.get(PODS, namespace, pod)["metadata"]["uid"] != uid:
                status = {"authenticated": False, "error": f"[pod {pod} bound to the token no longer exists]"}
            else:
                status = {"authenticated": True, "audiences": common, "user": {
                    "username": f"system:serviceaccount:{namespace}:{account}",
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, account)),
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
                    "extra": {"authentication.kubernetes.io/pod-name": [pod],
                              "authentication.kubernetes.io/pod-uid": [uid]}}}
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                "spec": spec, "status": status}

    def issue_token(self, namespace: str, pod: str, audiences: tuple[str, ...], account: str = "default") -> str:
        """A projected service-account token bound to the pod as it exists now (its uid)."""
        token = f"sa-token-{uuid.uuid4().hex}"
        uid = self._pod(namespace, pod)["metadata"]["uid"]
        self.tokens[token] = (namespace, account, pod, uid, tuple(audiences))
        return token

    # ------------------------------------------------------------ storage

    def _current(self, key: tuple[Any, str | None, str]) -> dict[str, Any] | None:
        """A private copy of the stored object, None if there is none."""
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    async def _commit(self, key: tuple[Any, str | None, str], obj: dict[str, Any] | None,
                      type_: str) -> dict[str, Any]:
        """Store a new state of `key` (None: remove it) and tell its watchers. Hold _lock."""
        rv = self._resource_version = next(self._versions)
        old = self.objects[key].raw if key in self.objects and not self.objects[key].deleted else None
        if obj is None:
            assert old is not None
            obj = copy.deepcopy(old)
            obj["metadata"]["resourceVersion"] = str(rv)  # a deletion is a change of its own
            self.objects[key].delete()
        else:
            obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
            if key in self.objects:
                self.objects[key].create(obj)
            else:
                self.objects[key] = obj
        change = Change(rv, type_, obj, old)
        self._history[key[0]].append(change)
        await self._buses[key[0]].put(change)
        if type_ == "DELETED":
            self._wake_gc()
        return obj

    def _present(self, resource: Any, obj: dict[str, Any]) -> dict[str, Any]:
        """Defaults apply on read too: an object stored before a default existed shows it."""
        if resource not in self._schemas:
            return obj
        return apply_defaults(obj, self._schemas[resource])

    # ------------------------------------------------------------ create

    async def _create(self, request: rendering.Request) -> dict[str, Any]:
        if not isinstance(request.data, dict):
            raise bad_request("the body of the request was in an unknown format")
        dry_run = request.params.get("dryRun")
        if dry_run not in (None, "All"):
            raise bad_request(f'Invalid dry run value: "{dry_run}"; only "All" is supported')
        if dry_run:
            self.dry_runs.append((request.resource.plural, (request.data.get("metadata") or {}).get("name")))
        return await self.create(request.resource, request.namespace, request.data, dry_run=dry_run == "All")

    async def create(self, resource: Any, namespace: str | None, body: dict[str, Any], *,
                     dry_run: bool = False) -> dict[str, Any]:
        """Create as a client's POST does (also for the test's side: nodes, pods). A dry run (`dryRun=All`)
        defaults, admits and validates as a create does, and persists nothing."""
        info = self.resources[resource]
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if info.namespaced:
            if namespace and meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request("the namespace of the provided object does not match the namespace sent "
                                  "on the request")
            meta["namespace"] = namespace or meta.get("namespace")
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(GENERATE_NAME_ALPHABET, k=5))
        if not meta.get("name"):
            raise api_error(422, "Invalid", f"{info.kind} is invalid: metadata.name: Required value: "
                                            "name or generateName is required", resource)
        # The server owns these, whatever the client sent.
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "generation"):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=rfc3339())
        if resource == PODS or resource.group:  # the kinds whose strategy tracks generation
            meta["generation"] = 1
        if resource == PODS:
            self._admit_pod(obj)
            refusal = self.admit_pods(copy.deepcopy(obj)) if self.admit_pods is not None else None
            if refusal is not None:
                raise refusal
        if resource in self._schemas:
            obj.pop("status", None)  # a status subresource: created without status
            obj = self._structural(resource, obj)
            self._validate(resource, obj)
        key = (resource, meta.get("namespace") if info.namespaced else None, meta["name"])
        async with self._lock:
            if self._current(key) is not None:
                raise api_error(409, "AlreadyExists", f'{qualified(resource)} "{meta["name"]}" already exists',
                                resource, meta["name"])
            if dry_run:
                return self._present(resource, obj)
            created = await self._commit(key, obj, "ADDED")
        if resource == PODS:
            self._note_creation(key[1], key[2])
        return created

    @staticmethod
    def _admit_pod(pod: dict[str, Any]) -> None:
        spec = pod.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("schedulerName", "default-scheduler")
        # DefaultTolerationSeconds admission: unless the pod says otherwise, the taint manager evicts
        # it 300 s after its node goes not-ready or unreachable.
        tolerations = spec.get("tolerations") or []
        for key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
            if not any(tolerates(t, key, "NoExecute") for t in tolerations):
                tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
        spec["tolerations"] = tolerations
        pod["status"] = {"phase": "Pending"}  # the kubelet writes the rest

    def _note_creation(self, namespace: str, name: str) -> None:
        key, moment = (namespace, name), time.perf_counter()
        self.created[key] = moment
        for waiter in self._creation_waiters.pop(key, ()):
            if not waiter.done():
                waiter.set_result(moment)

    def _structural(self, resource: Any, obj: dict[str, Any]) -> dict[str, Any]:
        """A custom resource as its CRD's structural schema stores it: pruned, then defaulted.
        apiVersion, kind and metadata are the server's, not the schema's."""
        schema = self._schemas[resource]
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        body = apply_defaults(prune(body, schema), schema)
        return {**{k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}, **body}

    @staticmethod
    def _validate(resource: Any, obj: dict[str, Any]) -> None:
        if resource != DDPJOBS:
            return
        try:
            parse_spec(obj.get("spec"))
        except InvalidJob as exc:
            name = obj["metadata"].get("name")
            raise api_error(422, "Invalid", f'{model.KIND}.{model.GROUP} "{name}" is invalid: {exc}',
                            resource, name) from None

    # ------------------------------------------------------------ update (PATCH, PUT; main, status, scale)

    async def _update(self, request: rendering.Request) -> dict[str, Any]:
        resource, sub, name = request.resource, request.subresource, request.name
        if sub not in (None, "status", "scale"):
            raise api_error(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        key = (resource, request.namespace if self.resources[resource].namespaced else None, name)
        async with self._lock:
            current = self._current(key)
            if current is None:
                raise not_found(resource, name)
            current = self._present(resource, current)  # what the client saw, defaults included
            before = self._scale(resource, current) if sub == "scale" else current
            after = self._requested(request, before)
            wanted = (after.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != current["metadata"].get("resourceVersion"):
                raise conflict(resource, name, MODIFIED_ELSEWHERE)
            new = self._next_state(resource, sub, current, after)
            if resource in self._schemas:
                new = self._structural(resource, new)
                if sub != "status" and new.get("spec") != current.get("spec"):
                    self._validate(resource, new)  # unchanged specs pass, as with validation ratcheting
            if self._tracks_generation(resource) and self._content(resource, new) != self._content(resource, current):
                new["metadata"]["generation"] = int(current["metadata"].get("generation") or 0) + 1
            if new == current:  # a no-op write stores nothing and tells no watcher
                stored = current
            elif (current["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers")
                  and current["metadata"].get("deletionGracePeriodSeconds") == 0):
                stored = await self._commit(key, None, "DELETED")  # the last finalizer is gone
            else:
                stored = await self._commit(key, new, "MODIFIED")
        return self._scale(resource, stored) if sub == "scale" else stored

    @staticmethod
    def _requested(request: rendering.Request, base: dict[str, Any]) -> dict[str, Any]:
        """The object the client asks for: a PUT's body, or the patch applied to `base`."""
        data = request.data
        if request.method == "PUT":
            if not isinstance(data, dict):
                raise bad_request("the body of the request was in an unknown format")
            name = (data.get("metadata") or {}).get("name")
            if name and name != request.name:
                raise bad_request(f"the name of the object ({name}) does not match the name on the URL "
                                  f"({request.name})")
            return copy.deepcopy(data)
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type == "application/merge-patch+json" and isinstance(data, dict):
            return merge_patch(base, data)
        if content_type == "application/json-patch+json" and isinstance(data, list):
            try:
                return jsonpatch.apply_patch(base, data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise api_error(422, "Invalid",
                                f"the server rejected our request due to an error in our request: {exc}")
        raise api_error(415, "UnsupportedMediaType",
                        f"the body of the request was in an unknown format - accepted media types include: "
                        f"application/json-patch+json, application/merge-patch+json (the emulator has no "
                        f"strategic merge or apply patches; got {content_type!r})")

    def _next_state(self, resource: Any, sub: str | None, current: dict[str, Any],
                    after: dict[str, Any]) -> dict[str, Any]:
        if sub == "status":  # only status changes through /status
            new = copy.deepcopy(current)
            new.pop("status", None)
            if after.get("status") is not None:
                new["status"] = after["status"]
            return new
        if sub == "scale":
            new = copy.deepcopy(current)
            new.setdefault("spec", {})[self._scale_paths[resource]["specReplicasPath"].split(".")[-1]] = \
                (after.get("spec") or {}).get("replicas")
            return new
        new = copy.deepcopy(after)
        meta, old_meta = new.setdefault("metadata", {}), current["metadata"]
        # The server owns these metadata fields: a write cannot change them.
        for field in ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion",
                      "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
            if field in old_meta:
                meta[field] = old_meta[field]
        if "status" in self.resources[resource].subresources:  # status is the status subresource's
            new.pop("status", None)
            if "status" in current:
                new["status"] = current["status"]
        return new

    @staticmethod
    def _tracks_generation(resource: Any) -> bool:
        return resource == PODS or bool(resource.group)

    @staticmethod
    def _content(resource: Any, obj: dict[str, Any]) -> Any:
        """What `metadata.generation` counts changes of: a pod's spec, a custom resource's all but
        metadata and status."""
        if resource == PODS:
            return obj.get("spec")
        return {k: v for k, v in obj.items() if k not in ("metadata", "status")}

    def _scale(self, resource: Any, obj: dict[str, Any]) -> dict[str, Any]:
        """The autoscaling/v1 Scale that a custom resource's scale subresource shows."""
        paths, meta = self._scale_paths[resource], obj["metadata"]
        status: dict[str, Any] = {"replicas": schema_path(obj, paths["statusReplicasPath"]) or 0}
        selector = schema_path(obj, paths.get("labelSelectorPath", ""))
        if selector:
            status["selector"] = selector
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                             if k in meta},
                "spec": {"replicas": schema_path(obj, paths["specReplicasPath"])}, "status": status}

    # ------------------------------------------------------------ delete

    @staticmethod
    def _delete_options(request: rendering.Request) -> dict[str, Any]:
        options = dict(request.data) if isinstance(request.data, dict) else {}
        if "gracePeriodSeconds" in request.params:  # kubectl and some clients use the query instead
            options.setdefault("gracePeriodSeconds", int(request.params["gracePeriodSeconds"]))
        if "propagationPolicy" in request.params:
            options.setdefault("propagationPolicy", request.params["propagationPolicy"])
        return options

    async def _delete_request(self, request: rendering.Request) -> dict[str, Any]:
        options = self._delete_options(request)
        resource = request.resource
        key = (resource, request.namespace if self.resources[resource].namespaced else None, request.name)
        removed, obj = await self._delete(key, options)
        if removed and resource.group:  # custom resources answer a completed deletion with a Status
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": request.name, "group": resource.group, "kind": resource.plural,
                                "uid": obj["metadata"].get("uid")}}
        return obj  # built-in kinds return the object (pods: ReturnDeletedObject)

    async def _delete_collection(self, request: rendering.Request) -> dict[str, Any]:
        """deletecollection: a DELETE on a namespace's collection URL (what an object's URL becomes when its name
        is empty) deletes every object the selectors match, each as its own DELETE would; the answer is the list
        of them as their deletion left them. On the all-namespaces URL of a namespaced kind it is a 405."""
        listed = await self._list(request)
        options = self._delete_options(request)
        namespaced = self.resources[request.resource].namespaced
        items = []
        for obj in listed["items"]:
            meta = obj["metadata"]
            try:
                items.append((await self._delete((request.resource, meta.get("namespace") if namespaced else None,
                                                  meta["name"]), options))[1])
            except KubernetesError as exc:
                if exc.status != 404:  # gone meanwhile: nothing left to delete
                    raise
        return {**listed, "items": items}

    async def _delete(self, key: tuple[Any, str | None, str], options: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """The generic registry's Delete: (whether the object is gone now, the object)."""
        resource, _, name = key
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        if policy != "Background":
            raise api_error(501, "NotImplemented", f"the emulator implements only Background propagation, not {policy}")
        async with self._lock:
            current = self._current(key)
            if current is None:
                raise not_found(resource, name)
            meta = current["metadata"]
            preconditions = options.get("preconditions") or {}
            if preconditions.get("uid") and preconditions["uid"] != meta.get("uid"):
                raise conflict(resource, name, f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                                               f"UID in object meta: {meta.get('uid')}")
            if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != meta.get("resourceVersion"):
                raise conflict(resource, name, f"Precondition failed: ResourceVersion in precondition: "
                                               f"{preconditions['resourceVersion']}, ResourceVersion in object meta: "
                                               f"{meta.get('resourceVersion')}")
            grace = self._grace_period(resource, current, options)
            pending_finalizers = bool(meta.get("finalizers"))
            if meta.get("deletionTimestamp"):
                old_grace = meta.get("deletionGracePeriodSeconds")
                if old_grace and grace is not None and grace < old_grace:
                    # Only a shorter grace period changes a pending deletion. A v1.36 server counts it from
                    # now (the traces: the kubelet's grace-0 delete moves deletionTimestamp to the present).
                    meta.update(deletionTimestamp=rfc3339(utcnow() + datetime.timedelta(seconds=grace)),
                                deletionGracePeriodSeconds=grace)
                    current = await self._commit(key, current, "MODIFIED")
                    if grace == 0 and not pending_finalizers:
                        return True, await self._commit(key, None, "DELETED")
                    return False, current
                if old_grace or pending_finalizers:
                    return False, current  # graceful deletion (or finalizers) pending: nothing to do
                return True, await self._commit(key, None, "DELETED")
            if grace is not None:
                # Graceful deletion: the pod stays, Terminating, until its kubelet has stopped it and
                # deletes it with grace 0. Even grace 0 stores the deletion mark before removing it.
                meta.update(deletionTimestamp=rfc3339(utcnow() + datetime.timedelta(seconds=grace)),
                            deletionGracePeriodSeconds=grace)
                if meta.get("generation"):
                    meta["generation"] += 1
                current = await self._commit(key, current, "MODIFIED")
                if grace == 0 and not pending_finalizers:
                    return True, await self._commit(key, None, "DELETED")
                return False, current
            if pending_finalizers:  # deleted once its finalizers are removed
                meta.update(deletionTimestamp=rfc3339(), deletionGracePeriodSeconds=0)
                if meta.get("generation"):
                    meta["generation"] += 1
                return False, await self._commit(key, current, "MODIFIED")
            return True, await self._commit(key, None, "DELETED")

    @staticmethod
    def _grace_period(resource: Any, obj: dict[str, Any], options: dict[str, Any]) -> int | None:
        """podStrategy.CheckGracefulDelete: pods only (None: the kind has no graceful deletion)."""
        if resource != PODS:
            return None
        spec, phase = obj.get("spec") or {}, (obj.get("status") or {}).get("phase")
        period = options.get("gracePeriodSeconds")
        if period is None:
            period = spec.get("terminationGracePeriodSeconds") or 0
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            period = 0  # no kubelet runs it, or nothing runs any more: gone at once
        return 1 if period < 0 else int(period)

    # ------------------------------------------------------------ the Eviction subresource

    async def _evict(self, request: rendering.Request) -> dict[str, Any]:
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise bad_request("the body of the request was in an unknown format")
        if (body.get("metadata") or {}).get("name") != request.name:
            raise bad_request("name in URL does not match name in Eviction object")
        await self._disrupt((PODS, request.namespace, request.name), *EVICTION_API, body.get("deleteOptions") or {})
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    async def _disrupt(self, key: tuple[Any, str, str], reason: str, message: str, options: dict[str, Any]) -> None:
        """What the Eviction API, the taint manager and scheduler preemption do to a pod: a
        DisruptionTarget condition (a status write), then a graceful delete (a second write)."""
        async with self._lock:
            pod = self._current(key)
            if pod is None:
                raise not_found(PODS, key[2])
            wanted_uid = (options.get("preconditions") or {}).get("uid")
            if wanted_uid and wanted_uid != pod["metadata"].get("uid"):
                raise conflict(PODS, key[2], f"Precondition failed: UID in precondition: {wanted_uid}, "
                                             f"UID in object meta: {pod['metadata'].get('uid')}")
            status = pod.setdefault("status", {})
            status["conditions"], changed = set_condition(status.get("conditions"), "DisruptionTarget", "True",
                                                          reason, message)
            if changed:
                await self._commit(key, pod, "MODIFIED")
        await self._delete(key, options)

    # ------------------------------------------------------------ garbage collection

    def _wake_gc(self) -> None:
        self._gc_wanted.set()
        task = self._gc_task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            return  # keep the failure for __aexit__ to raise
        if task is None or task.done():
            self._gc_task = asyncio.get_running_loop().create_task(self._gc_loop(), name="garbage collector")

    async def _gc_loop(self) -> None:
        # Like the kube-controller-manager's, the collector works after the deletion, not inside it.
        while self._gc_wanted.is_set():
            self._gc_wanted.clear()
            await asyncio.sleep(0)
            await self._collect_garbage()

    async def _collect_garbage(self) -> None:
        """An object none of whose owners exists any more is deleted (background propagation, so
        its own dependents follow once it is gone); one that lost only some owners loses those
        references."""
        live = {(obj.raw.get("metadata") or {}).get("uid") for obj in self.objects.values() if not obj.deleted}
        for key, obj in list(self.objects.items()):
            if obj.deleted:
                continue
            meta = obj.raw.get("metadata") or {}
            refs = meta.get("ownerReferences") or []
            kept = [ref for ref in refs if ref.get("uid") in live]
            if not refs or len(kept) == len(refs):
                continue
            if kept:
                async with self._lock:
                    current = self._current(key)
                    if current is not None and current["metadata"].get("uid") == meta.get("uid"):
                        current["metadata"]["ownerReferences"] = kept
                        await self._commit(key, current, "MODIFIED")
            elif not meta.get("deletionTimestamp"):
                try:
                    await self._delete(key, {"propagationPolicy": "Background",
                                             "preconditions": {"uid": meta.get("uid")}})
                except KubernetesError:
                    pass  # gone, or replaced by a new object of that name, meanwhile

    # ------------------------------------------------------------ list, watch, get

    def _matching(self, request: rendering.Request) -> Any:
        """The request's selection (namespace, name, labelSelector, fieldSelector) as a predicate."""
        labels = parse_label_selector(request.params.get("labelSelector"))
        fields = parse_field_selector(request.params.get("fieldSelector"), request.resource)
        if request.name:  # a watch on one object's URL
            fields = fields + [("metadata.name", True, request.name)]

        def matches(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            meta = obj.get("metadata") or {}
            return ((request.namespace is None or meta.get("namespace") == request.namespace)
                    and labels_match(meta.get("labels"), labels) and fields_match(obj, fields))
        return matches

    def _live_objects(self, resource: Any) -> list[dict[str, Any]]:
        found = [(key, obj.raw) for key, obj in self.objects.items() if key[0] == resource and not obj.deleted]
        found.sort(key=lambda item: (item[0][1] or "", item[0][2]))  # a real list is in key order
        return [self._present(resource, raw) for _, raw in found]

    async def _list(self, request: rendering.Request) -> dict[str, Any]:
        matches = self._matching(request)
        async with self._lock:
            items = [obj for obj in self._live_objects(request.resource) if matches(obj)]
            version = self._resource_version
        info = self.resources[request.resource]
        api_version = f"{request.resource.group}/{request.resource.version}" if request.resource.group else "v1"
        return {"kind": f"{info.kind}List", "apiVersion": api_version,
                "metadata": {"resourceVersion": str(version)}, "items": items}

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now: a watch may see nothing for a long time
        matches = self._matching(request)
        resource, since = request.resource, request.params.get("resourceVersion")
        bus, expired = self._buses[resource], None
        async with self._lock:
            marker = await bus.mark()
            history = self._history[resource]
            if since not in (None, "", "0"):
                # Resume: every change after that version. Too old (compacted) is 410 Gone.
                if history.maxlen and len(history) == history.maxlen and int(since) < history[0].rv - 1:
                    expired = f"too old resource version: {since} ({history[0].rv - 1})"
                backlog = [c for c in history if c.rv > int(since)]
            else:  # start from now: the current objects as ADDED
                backlog = [Change(self._resource_version, "ADDED", obj, None)
                           for obj in self._live_objects(resource)]
        if expired:
            await bus.unmark(marker)
            yield {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                               "status": "Failure", "message": expired, "reason": "Expired",
                                               "code": 410}}
            return
        timeout = float(request.params["timeoutSeconds"]) if request.params.get("timeoutSeconds") else None
        try:
            async with asyncio.timeout(timeout):  # a watch ends after timeoutSeconds, as on a real server
                for change in backlog:
                    if (event := self._watch_event(change, matches)) is not None:
                        yield event
                async for change in bus.stream(since=marker):
                    if isinstance(change, Change) and (event := self._watch_event(change, matches)) is not None:
                        yield event
        except TimeoutError:
            return
        finally:
            await bus.unmark(marker)

    @staticmethod
    def _watch_event(change: Change, matches: Any) -> dict[str, Any] | None:
        """How a filtered watch sees a change: entering the selection is ADDED, leaving it DELETED."""
        now, before = matches(change.obj), matches(change.old)
        if change.type == "MODIFIED" and now != before:
            return {"type": "ADDED" if now else "DELETED", "object": change.obj}
        if change.type == "DELETED":
            return {"type": "DELETED", "object": change.obj} if now or before else None
        return {"type": change.type, "object": change.obj} if now else None

    async def _get_object(self, request: rendering.Request) -> dict[str, Any]:
        resource = request.resource
        obj = self._current((resource, request.namespace if self.resources[resource].namespaced else None,
                             request.name))
        if obj is None:
            raise not_found(resource, request.name)
        obj = self._present(resource, obj)
        return self._scale(resource, obj) if request.subresource == "scale" else obj

    def _get_resources(self) -> list[Any]:
        return kmock.KubernetesScaffold._get_resources(self)  # the declared ones; no scan of all objects

    # ------------------------------------------------------------ direct access (the test's side)

    async def write(self, key: tuple[Any, str | None, str], patch: dict[str, Any]) -> None:
        """Merge-patch a stored object past every API rule (what the test's kubelet writes)."""
        async with self._lock:
            current = self._current(key)
            if current is None:
                raise KeyError(key)
            await self._commit(key, merge_patch(current, patch), "MODIFIED")

    async def remove(self, key: tuple[Any, str | None, str]) -> None:
        """Remove a stored object at once, past every API rule."""
        async with self._lock:
            if self._current(key) is not None:
                await self._commit(key, None, "DELETED")

    def when_created(self, namespace: str, name: str) -> asyncio.Future[float]:
        """Resolves with perf_counter() at the next creation of this pod (for benchmarks)."""
        waiter = asyncio.get_running_loop().create_future()
        self._creation_waiters.setdefault((namespace, name), []).append(waiter)
        return waiter

    def live(self, resource: Any, namespace: str | None = None) -> list[dict[str, Any]]:
        return [obj.raw for (res, ns, _), obj in self.objects.items()
                if res == resource and not obj.deleted and (namespace is None or ns == namespace)]

    def get(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A copy of the stored object, or None."""
        return self._current((resource, namespace, name))

    # ------------------------------------------------------------ the scheduler and the kubelets

    def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self._current((PODS, namespace, name))
        if pod is None:
            raise not_found(PODS, name)
        return pod

    def _kubelet_of(self, pod: dict[str, Any]) -> str:
        """The node whose kubelet runs this pod; it must be up to do anything."""
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            raise RuntimeError(f"pod {pod['metadata']['name']} is not bound to a node: no kubelet runs it")
        if node in self._unreachable:
            raise NodeUnreachable(f"node {node} is down: its kubelet cannot update pod {pod['metadata']['name']}")
        return node

    async def bind(self, namespace: str, name: str, node: str) -> None:
        """The scheduler binds a pod: spec.nodeName and PodScheduled in one write."""
        async with self._lock:
            pod = self._pod(namespace, name)
            pod["spec"]["nodeName"] = node
            status = pod.setdefault("status", {})
            status["conditions"], _ = set_condition(status.get("conditions"), "PodScheduled", "True")
            await self._commit((PODS, namespace, name), pod, "MODIFIED")

    async def unschedulable(self, namespace: str, name: str, message: str) -> None:
        """The scheduler cannot place the pod: PodScheduled False, reason Unschedulable, its message."""
        async with self._lock:
            pod = self._pod(namespace, name)
            status = pod.setdefault("status", {})
            status["conditions"], changed = set_condition(status.get("conditions"), "PodScheduled", "False",
                                                          "Unschedulable", message)
            if changed:
                await self._commit((PODS, namespace, name), pod, "MODIFIED")

    async def kubelet_start(self, namespace: str, name: str) -> None:
        """The kubelet has started every container of a bound pod and they are ready."""
        async with self._lock:
            pod = self._pod(namespace, name)
            self._kubelet_of(pod)
            status = pod.setdefault("status", {})
            started = rfc3339()
            status.update(phase="Running", hostIP="10.0.0.1", hostIPs=[{"ip": "10.0.0.1"}],
                          podIP="10.244.0.10", podIPs=[{"ip": "10.244.0.10"}],
                          startTime=status.get("startTime") or started)
            for type_ in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
                status["conditions"], _ = set_condition(status.get("conditions"), type_, "True")
            status["containerStatuses"] = [{
                "name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
                "started": True, "state": {"running": {"startedAt": started}}}
                for c in (pod.get("spec") or {}).get("containers") or ()]
            await self._commit((PODS, namespace, name), pod, "MODIFIED")

    @staticmethod
    def _stopped(pod: dict[str, Any], exit_code: int, container_reason: str, message: str | None = None,
                 pod_reason: str | None = None, pod_message: str | None = None) -> dict[str, Any]:
        """The status the kubelet reports once every container has stopped."""
        status = copy.deepcopy(pod.get("status") or {})
        phase = "Succeeded" if exit_code == 0 else "Failed"
        status["phase"] = phase
        if pod_reason:
            status.update(reason=pod_reason, message=pod_message)
        finished = rfc3339()
        for container in status.get("containerStatuses") or ():
            state = container.get("state") or {}
            if "terminated" in state:
                continue
            terminated: dict[str, Any] = {"exitCode": exit_code, "reason": container_reason}
            if message:
                terminated["message"] = message
            terminated.update(startedAt=(state.get("running") or {}).get("startedAt"), finishedAt=finished)
            container.update(state={"terminated": terminated}, ready=False, started=False)
        # The kubelet's ready conditions for a finished pod (kubelet/status/generate.go).
        why = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        for type_ in ("Ready", "ContainersReady"):
            status["conditions"], _ = set_condition(status.get("conditions"), type_, "False", why)
        return status

    async def kubelet_exit(self, namespace: str, name: str, exit_code: int, reason: str = "Error",
                           message: str | None = None) -> None:
        """The pod's containers stopped on their own (restartPolicy Never): the kubelet reports it.
        The pod stays, Succeeded or Failed, until someone deletes it."""
        async with self._lock:
            pod = self._pod(namespace, name)
            self._kubelet_of(pod)
            pod["status"] = self._stopped(pod, exit_code, "Completed" if exit_code == 0 else reason, message)
            await self._commit((PODS, namespace, name), pod, "MODIFIED")

    async def kubelet_finish(self, namespace: str, name: str, exit_code: int = 143,
                             message: str | None = None) -> None:
        """The kubelet completes a graceful deletion: the containers stopped after SIGTERM
        (`exit_code`); it reports the final status, then deletes the pod with grace 0 and its uid
        as a precondition, which removes it (as in the traces)."""
        async with self._lock:
            pod = self._pod(namespace, name)
            if not pod["metadata"].get("deletionTimestamp"):
                raise RuntimeError(f"pod {name} is not being deleted: its kubelet has nothing to finish")
            self._kubelet_of(pod)
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                pod["status"] = self._stopped(pod, exit_code, "Completed" if exit_code == 0 else "Error", message)
                await self._commit((PODS, namespace, name), pod, "MODIFIED")
        await self._delete((PODS, namespace, name), {"gracePeriodSeconds": 0,
                                                     "preconditions": {"uid": pod["metadata"]["uid"]}})

    async def kubelet_terminate(self, namespace: str, name: str, reason: str = "Evicted",
                                message: str | None = None) -> None:
        """The kubelet stops a pod for its node's sake: node-pressure eviction (reason Evicted) or
        graceful node shutdown (reason Terminated). Its status manager sends the DisruptionTarget
        condition (TerminationByKubelet) in the same write as the Failed phase, once the containers
        have stopped (mergePodStatus in kubelet/status). The pod is not deleted."""
        message = message if message is not None else KUBELET_TERMINATION[reason]
        async with self._lock:
            pod = self._pod(namespace, name)
            self._kubelet_of(pod)
            status = self._stopped(pod, 137, "Error", pod_reason=reason, pod_message=message)
            status["conditions"], _ = set_condition(status.get("conditions"), "DisruptionTarget", "True",
                                                    "TerminationByKubelet", message)
            pod["status"] = status
            await self._commit((PODS, namespace, name), pod, "MODIFIED")

    async def preempt(self, namespace: str, name: str) -> None:
        """kube-scheduler preempts the pod for a higher-priority one: condition, then graceful delete."""
        pod = self._pod(namespace, name)
        scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        await self._disrupt((PODS, namespace, name), "PreemptionByScheduler",
                            PREEMPTION_MESSAGE.format(scheduler=scheduler), {})

    async def taint_manager_evict(self, namespace: str, name: str) -> None:
        """The taint manager (node lifecycle controller) evicts a pod that does not tolerate a
        NoExecute taint of its node (any more: tolerationSeconds ran out): condition, then delete."""
        await self._disrupt((PODS, namespace, name), *TAINT_MANAGER, {})

    async def evict(self, namespace: str, name: str, delete_options: dict[str, Any] | None = None) -> None:
        """What a POST to the pod's eviction subresource does."""
        await self._disrupt((PODS, namespace, name), *EVICTION_API, delete_options or {})

    # ------------------------------------------------------------ nodes

    async def add_node(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A node whose kubelet has registered and posts Ready."""
        now = rfc3339()
        conditions = [{"type": t, "status": s, "lastHeartbeatTime": now, "lastTransitionTime": now,
                       "reason": r, "message": m} for t, s, r, m in HEALTHY_NODE]
        return await self.create(NODES, None, {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {}, "status": {"conditions": conditions}})

    async def node_down(self, name: str) -> None:
        """The node stops answering, and the node lifecycle controller notices: every node condition
        goes Unknown, the node's pods are marked not Ready, the node is tainted unreachable
        (NoSchedule and NoExecute). From then on the node's kubelet writes nothing, so graceful
        deletions of its pods hang (Terminating) until someone deletes them with grace 0."""
        key, now = (NODES, None, name), rfc3339()
        async with self._lock:
            node = self._current(key)
            if node is None:
                raise not_found(NODES, name)
            self._unreachable.add(name)
            for condition in node.setdefault("status", {}).setdefault("conditions", []):
                if condition.get("status") != "Unknown":  # the kubelet's last heartbeat stays
                    condition.update(status="Unknown", reason="NodeStatusUnknown",
                                     message="Kubelet stopped posting node status.", lastTransitionTime=now)
            await self._commit(key, node, "MODIFIED")
            # MarkPodsNotReady: only the Ready condition flips (ContainersReady stays, as in the traces).
            for pod_key, obj in list(self.objects.items()):
                if pod_key[0] != PODS or obj.deleted or (obj.raw.get("spec") or {}).get("nodeName") != name:
                    continue
                pod = self._current(pod_key)
                status = pod.setdefault("status", {})
                ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
                if ready is None:
                    continue
                status["conditions"], changed = set_condition(status["conditions"], "Ready", "False",
                                                              ready.get("reason"), ready.get("message"))
                if changed:
                    await self._commit(pod_key, pod, "MODIFIED")
            node = self._current(key)
            spec = node.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or () if t.get("key") != UNREACHABLE_TAINT]
            spec["taints"] = taints + [{"key": UNREACHABLE_TAINT, "effect": effect, "timeAdded": now}
                                               for effect in ("NoSchedule", "NoExecute")]
            await self._commit(key, node, "MODIFIED")

    async def node_up(self, name: str) -> None:
        """The node's kubelet posts status again: the node is Ready and untainted. What the kubelet
        then reports about each pod (still running: kubelet_start; lost: kubelet_exit) is the test's."""
        key, now = (NODES, None, name), rfc3339()
        async with self._lock:
            node = self._current(key)
            if node is None:
                raise not_found(NODES, name)
            healthy = {t: (s, r, m) for t, s, r, m in HEALTHY_NODE}
            for condition in node.setdefault("status", {}).setdefault("conditions", []):
                if condition.get("type") in healthy:
                    status, reason, message = healthy[condition["type"]]
                    condition.update(status=status, reason=reason, message=message,
                                     lastHeartbeatTime=now, lastTransitionTime=now)
            await self._commit(key, node, "MODIFIED")
            node = self._current(key)
            spec = node.setdefault("spec", {})
            spec["taints"] = [t for t in spec.get("taints") or () if t.get("key") != UNREACHABLE_TAINT]
            if not spec["taints"]:
                del spec["taints"]
            await self._commit(key, node, "MODIFIED")
            self._unreachable.discard(name)
