"""Create and update as the API server judges them: admission, the structural schema, validation,
conditional writes, the status and scale subresources."""

from __future__ import annotations

import copy
import random
import time
import uuid
from typing import Any

import jsonpatch
from kmock._internal import rendering

from ddpjob_operator import model
from ddpjob_operator.validation import InvalidJob, parse_spec

from .resources import PODS, DDPJOBS, NOT_READY_TAINT, UNREACHABLE_TAINT, GENERATE_NAME_ALPHABET, MODIFIED_ELSEWHERE
from .rules import (rfc3339, merge_patch, qualified, api_error, not_found, conflict, bad_request, tolerates, prune,
                    apply_defaults, schema_path)


class Writes:
    """Create, update, admission and the subresources (part of Cluster)."""


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
            created = await self.commit(key, obj, "ADDED")
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
                stored = await self.commit(key, None, "DELETED")  # the last finalizer is gone
            else:
                stored = await self.commit(key, new, "MODIFIED")
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

