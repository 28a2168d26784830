"""kmock's Kubernetes emulator plus the API-server behaviour the operator tests need.

kmock stores objects and serves list/watch/get/create/patch/delete over HTTP, but leaves out
what a real API server adds. This subclass fills in, and only for the tests' sake (the operator
never relies on kmock quirks):

- server metadata: uid, resourceVersion, creationTimestamp, generation, namespace from the URL,
  names from generateName; pods start in phase Pending;
- the status subresource (a status patch changes only status; a main patch never changes it),
  `metadata.generation` bumps on spec changes, the scale subresource;
- DDPJob validation with the model (the API server runs the same rules from the CRD): 422;
- graceful pod deletion: a running pod gets deletionTimestamp and stays Terminating until the
  kubelet (the test) finishes it; a finished pod, or gracePeriodSeconds=0, goes at once;
- garbage collection of everything a deleted DDPJob owns;
- a record of every (API group, resource, verb) the operator calls.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import time
import uuid
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums, rendering
from kmock._internal.k8s import KubernetesError

from ddpjob_operator import crd, kube, model
from ddpjob_operator.validation import InvalidJob, parse_spec

PODS = kmock.resource("", "v1", "pods")
DDPJOBS = kmock.resource(model.GROUP, model.VERSION, model.PLURAL)
OPERATOR_AGENTS = ("kopf/", kube.USER_AGENT)
VERBS = {enums.action.LIST: "list", enums.action.WATCH: "watch", enums.action.FETCH: "get",
         enums.action.CREATE: "create", enums.action.UPDATE: "patch", enums.action.DELETE: "delete"}


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge: what a merge patch turns `base` into."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


@attrs.define(kw_only=True)
class Cluster(kmock.KubernetesEmulator):
    calls: set[tuple[str, str, str]] = attrs.field(factory=set, init=False)
    credentials: list[str] = attrs.field(factory=list, init=False)  # Authorization headers seen
    created: dict[tuple[str, str], float] = attrs.field(factory=dict, init=False)  # pod -> perf_counter()
    _in_flight: set[rendering.Request] = attrs.field(factory=set, init=False)
    _creation_waiters: dict[tuple[str, str], list[asyncio.Future[float]]] = attrs.field(factory=dict, init=False)
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)

    def register_resources(self) -> None:
        definition = crd.build_crd()["spec"]  # the DDPJob as the generated CRD declares it
        names, version = definition["names"], definition["versions"][0]
        self.resources[kmock.resource(definition["group"], version["name"], names["plural"])] = kmock.ResourceInfo(
            kind=names["kind"], singular=names["singular"], namespaced=definition["scope"] == "Namespaced",
            shortnames=set(names["shortNames"]), categories=set(names["categories"]),
            verbs={"list", "watch", "get", "create", "patch", "delete"}, subresources=set(version["subresources"]))
        for plural, kind in (("pods", "Pod"), ("services", "Service"), ("events", "Event"),
                             ("persistentvolumeclaims", "PersistentVolumeClaim")):
            self.resources[kmock.resource("", "v1", plural)] = kmock.ResourceInfo(
                kind=kind, singular=kind.lower(), namespaced=True,
                verbs={"list", "watch", "get", "create", "patch", "delete"},
                subresources={"status"} if plural == "pods" else set())
        # Discoverable like on a real server (kopf waits for them), though the operator never calls them.
        self.resources[kmock.resource("", "v1", "namespaces")] = kmock.ResourceInfo(
            kind="Namespace", singular="namespace", namespaced=False, verbs={"list", "watch", "get"})
        self.resources[kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")] = \
            kmock.ResourceInfo(kind="CustomResourceDefinition", singular="customresourcedefinition",
                               namespaced=False, verbs={"list", "watch", "get"})

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
        if request.resource is None or not request.resource.plural:
            return await super()._handle(request)  # discovery
        self._record(request)
        try:
            if request.action == enums.action.CREATE:
                self._fill_metadata(request)
            elif request.action == enums.action.UPDATE:
                self._isolate_and_bump(request)
            elif request.action == enums.action.DELETE and request.resource == PODS and request.name:
                return aiohttp.web.json_response(await self._delete_pod(request))
        except KubernetesError as exc:
            return await self._render_error(exc)
        response = await super()._handle(request)
        if request.action == enums.action.DELETE and request.resource == DDPJOBS and response.status < 300:
            await self._collect_garbage()
        return response

    def _record(self, request: rendering.Request) -> None:
        agent = request.headers.get("User-Agent", "")
        if not agent.startswith(OPERATOR_AGENTS) or request.action not in VERBS:
            return
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        self.calls.add((request.resource.group or "", resource, VERBS[request.action]))
        if "Authorization" in request.headers:
            self.credentials.append(request.headers["Authorization"])

    def _fill_metadata(self, request: rendering.Request) -> None:
        meta = request.data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:8]
        if request.namespace:
            meta["namespace"] = request.namespace
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self._versions)),
                    creationTimestamp=now_rfc3339(), generation=1)
        if request.resource == PODS:
            request.data.setdefault("status", {"phase": "Pending"})
            key, moment = (meta.get("namespace"), meta.get("name")), time.perf_counter()
            self.created[key] = moment
            for waiter in self._creation_waiters.pop(key, ()):
                if not waiter.done():
                    waiter.set_result(moment)
        if request.resource == DDPJOBS:
            request.data.pop("status", None)
            self._validate(request.data.get("spec"))

    def _isolate_and_bump(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return  # kmock answers 404
        current = self.objects[key].raw
        patch = request.data
        if request.subresource == "status":
            kept = {"status": patch.get("status")}
        elif request.subresource == "scale":
            kept = {"spec": {"replicas": (patch.get("spec") or {}).get("replicas")}}
        else:
            kept = {k: v for k, v in patch.items() if k != "status" or request.resource != DDPJOBS}
        meta = kept.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._versions))
        if "spec" in kept and request.resource == DDPJOBS:
            merged = deep_merge(current.get("spec") or {}, kept["spec"] or {})
            self._validate(merged)
            if merged != current.get("spec"):
                meta["generation"] = int(current["metadata"].get("generation", 1)) + 1
        patch.clear()
        patch.update(kept)

    @staticmethod
    def _validate(spec: Any) -> None:
        try:
            parse_spec(spec)
        except InvalidJob as exc:
            raise KubernetesError(status=422, reason="Invalid", message=str(exc)) from None

    async def _delete_pod(self, request: rendering.Request) -> dict[str, Any]:
        key = (PODS, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise KubernetesError(status=404, reason="NotFound", message=f"pods {request.name!r} not found")
        pod = self.objects[key].raw
        options = request.data if isinstance(request.data, dict) else {}
        wanted_uid = (options.get("preconditions") or {}).get("uid")
        if wanted_uid and wanted_uid != pod["metadata"].get("uid"):
            raise KubernetesError(status=409, reason="Conflict", message=(
                f"Precondition failed: UID in precondition: {wanted_uid}, "
                f"UID in object meta: {pod['metadata'].get('uid')}"))
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if grace == 0 or finished:
            await self.remove(key)
            return pod
        if not pod["metadata"].get("deletionTimestamp"):
            ends = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=grace)
            await self.write(key, {"metadata": {"deletionTimestamp": ends.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                                "deletionGracePeriodSeconds": grace}})
        return self.objects[key].raw

    async def _collect_garbage(self) -> None:
        live_uids = {obj.raw["metadata"].get("uid") for (res, _, _), obj in self.objects.items()
                     if not obj.deleted}
        for key, obj in list(self.objects.items()):
            if obj.deleted:
                continue
            owners = [o.get("uid") for o in obj.raw["metadata"].get("ownerReferences") or ()]
            if owners and not any(uid in live_uids for uid in owners):
                await self.remove(key)

    # ------------------------------------------------------------ O(1) lookups
    # kmock finds the object of a request by scanning all objects (deleted ones included); with
    # hundreds of pods and events that dominates every call, so answer from the keyed store.

    def _get_resources(self) -> list[Any]:
        return kmock.KubernetesScaffold._get_resources(self)  # declared ones; no scan of objects

    def _stored(self, request: rendering.Request) -> Any:
        namespace = request.namespace or (request.data or {}).get("metadata", {}).get("namespace")
        name = request.name or (request.data or {}).get("metadata", {}).get("name")
        key = (request.resource, namespace, name)
        if key not in self.objects:
            raise KubernetesError(status=404, reason="NotFound", message=f"{name!r} not found")
        return self.objects[key]

    async def _serve_create(self, request: rendering.Request) -> Any:
        return self._stored(request).raw

    async def _serve_update(self, request: rendering.Request) -> Any:
        return self._stored(request).last.raw

    async def _serve_delete(self, request: rendering.Request) -> Any:
        return self._stored(request).last.raw

    async def _serve_fetch(self, request: rendering.Request) -> Any:
        obj = self._stored(request)
        if obj.deleted:
            raise KubernetesError(status=404, reason="NotFound", message=f"{request.name!r} not found")
        return obj.raw

    # ------------------------------------------------------------ direct access (the test's kubelet)

    async def write(self, key: tuple[Any, str, str], patch: dict[str, Any]) -> None:
        async with self._lock:
            patch.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
            self.objects[key].patch(patch)
            await self._buses[key[0]].put({"type": "MODIFIED", "object": self.objects[key].raw})

    async def remove(self, key: tuple[Any, str, str]) -> None:
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                return
            raw = self.objects[key].raw
            self.objects[key].delete()
            await self._buses[key[0]].put({"type": "DELETED", "object": raw})

    def when_created(self, namespace: str, name: str) -> asyncio.Future[float]:
        """Resolves with perf_counter() at the next creation of this pod (for benchmarks)."""
        waiter = asyncio.get_running_loop().create_future()
        self._creation_waiters.setdefault((namespace, name), []).append(waiter)
        return waiter

    def live(self, resource: Any, namespace: str | None = None) -> list[dict[str, Any]]:
        return [obj.raw for (res, ns, _), obj in self.objects.items()
                if res == resource and not obj.deleted and (namespace is None or ns == namespace)]
