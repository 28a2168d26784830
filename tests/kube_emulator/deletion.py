"""Deletion as the API server and the controllers do it: graceful pod deletion, preconditions,
finalizers, deletecollection, the Eviction subresource, disruption conditions, background GC."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from kmock._internal import rendering
from kmock._internal.k8s import KubernetesError

from .resources import PODS, EVICTION_API
from .rules import utcnow, rfc3339, api_error, not_found, conflict, bad_request, set_condition


class Deletion:
    """Delete, evict and the garbage collector (part of Cluster)."""

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
        listed = await self.serve_list(request)
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
                    current = await self.commit(key, current, "MODIFIED")
                    if grace == 0 and not pending_finalizers:
                        return True, await self.commit(key, None, "DELETED")
                    return False, current
                if old_grace or pending_finalizers:
                    return False, current  # graceful deletion (or finalizers) pending: nothing to do
                return True, await self.commit(key, None, "DELETED")
            if grace is not None:
                # Graceful deletion: the pod stays, Terminating, until its kubelet has stopped it and
                # deletes it with grace 0. Even grace 0 stores the deletion mark before removing it.
                meta.update(deletionTimestamp=rfc3339(utcnow() + datetime.timedelta(seconds=grace)),
                            deletionGracePeriodSeconds=grace)
                if meta.get("generation"):
                    meta["generation"] += 1
                current = await self.commit(key, current, "MODIFIED")
                if grace == 0 and not pending_finalizers:
                    return True, await self.commit(key, None, "DELETED")
                return False, current
            if pending_finalizers:  # deleted once its finalizers are removed
                meta.update(deletionTimestamp=rfc3339(), deletionGracePeriodSeconds=0)
                if meta.get("generation"):
                    meta["generation"] += 1
                return False, await self.commit(key, current, "MODIFIED")
            return True, await self.commit(key, None, "DELETED")

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
                await self.commit(key, pod, "MODIFIED")
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
                        await self.commit(key, current, "MODIFIED")
            elif not meta.get("deletionTimestamp"):
                try:
                    await self._delete(key, {"propagationPolicy": "Background",
                                             "preconditions": {"uid": meta.get("uid")}})
                except KubernetesError:
                    pass  # gone, or replaced by a new object of that name, meanwhile

