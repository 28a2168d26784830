"""The object store: one resourceVersion counter, the history watches resume from, list, watch and get,
and the test's direct access and inspection API."""

from __future__ import annotations

import asyncio
import collections
import copy
from typing import Any, AsyncIterator

import kmock
from kmock._internal import rendering

from .resources import Change
from .rules import (merge_patch, not_found, parse_label_selector, labels_match, parse_field_selector, fields_match,
                    apply_defaults)


class ObjectStore:
    """Storage, list, watch and get; the test's direct access (part of Cluster)."""

    # ------------------------------------------------------------ storage

    def _current(self, key: tuple[Any, str | None, str]) -> dict[str, Any] | None:
        """A private copy of the stored object, None if there is none."""
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    async def commit(self, key: tuple[Any, str | None, str], obj: dict[str, Any] | None,
                      type_: str) -> dict[str, Any]:
        """Store a new state of `key` (None: remove it) and tell its watchers. Hold the lock (`store` takes it)."""
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

    async def serve_list(self, request: rendering.Request) -> dict[str, Any]:
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
            await self.commit(key, merge_patch(current, patch), "MODIFIED")

    async def remove(self, key: tuple[Any, str | None, str]) -> None:
        """Remove a stored object at once, past every API rule."""
        async with self._lock:
            if self._current(key) is not None:
                await self.commit(key, None, "DELETED")

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

    async def store(self, key: tuple[Any, str | None, str], obj: dict[str, Any], type_: str = "ADDED") -> None:
        """Store `obj` exactly as given, past every API rule (a test's or bench's seed), and tell the watchers."""
        async with self._lock:
            await self.commit(key, obj, type_)

    # ------------------------------------------------------------ inspection (the test's side)

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion: what a list now is consistent with."""
        return self._resource_version

    def history(self, resource: Any) -> list[Change]:
        """The resource's changes a watch can still resume from, oldest first."""
        return list(self._history[resource])

    def compact(self, resource: Any, keep: int) -> None:
        """An etcd compaction: only the resource's newest `keep` changes stay, and no more than `keep` are kept
        from now on; a watch resuming from before them is 410 Gone."""
        self._history[resource] = collections.deque(self._history[resource], maxlen=keep)

    def in_flight(self) -> list[rendering.Request]:
        """The requests being served now (open watches, and any call a test holds)."""
        return list(self._in_flight)

