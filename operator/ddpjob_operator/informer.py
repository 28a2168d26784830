"""The operator's own informers: what the controller knows of its DDPJobs and of every pod it owns, from
one LIST and then a WATCH per kind and namespace, as client-go's reflector does.

Why not kopf's watching: kopf runs a task, a readiness toggle and a handler call per listed object and
checks every toggle on each change, so its start-up listing grows faster than the objects a cluster holds
(70 s for 3,000 Pending pods on a 2-core machine, each carrying the worker's program in its command), and
it says nothing of when a listing is complete, so a job submitted during a restart waited behind the
resync of every job listed before it (docs/benchmarks.md). Here one paginated LIST (pods: the API
server's label selector, only the operator's own) is handed object by object to a `View`, which keeps
what it needs (pods: the compact `observations.PodSummary`, the bodies dropped page by page), and a WATCH
resumes from the list's resourceVersion.

The API server's watch semantics, as the informer relies on them:
- a WATCH from the list's resourceVersion sends every change after it, in order; BOOKMARK events
  (asked for with allowWatchBookmarks) carry only a newer resourceVersion to resume from;
- the server ends a watch after its timeoutSeconds: the informer watches again from the last version seen;
- a version too old to resume from (compacted) is answered 410 Gone, as an HTTP status or as an ERROR
  event whose object is a Status with code 410; a LIST's expired continue token is a 410 too: the
  informer lists again from scratch, and the view swaps in the complete listing in one step (objects
  missing from it are gone);
- a dropped connection or a refused call is retried with a growing backoff, from the last version seen.

`synced` is set once every watched namespace has been listed completely: before that nothing may act on
what the views hold (a job whose pods are not yet listed would be taken as having lost them, a job
submitted meanwhile would wait behind the others), so the controller's work queue holds every pass until
both informers are synced.

Imports kube, naming and observations; no kopf.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterator, Mapping, Protocol

from . import kube, naming, observations

logger = logging.getLogger("ddpjob_operator")

PodKey = tuple[str, str]  # (namespace, pod name)
IndexKey = tuple[str, str]  # (namespace, uid of the job that controls the pod)
# Only the operator's own pods, selected by the API server.
POD_SELECTOR = f"{naming.LABEL_MANAGED_BY}={naming.MANAGED_BY},{naming.LABEL_JOB_UID}"
PAGE_SIZE = 500  # objects a LIST page holds: a page's bodies (a pod's with the worker's program) go in turn
WATCH_SECONDS = 300  # the server ends a watch after this (timeoutSeconds); the informer resumes it
BACKOFF_SECONDS = (0.5, 30.0)  # the first retry after a failure, and the longest
SHORTEST_WATCH_SECONDS = 1.0  # a watch that ended sooner is retried after the backoff, not at once


class View(Protocol):
    """What an informer feeds: a listing object by object, then its end; then every watch event. The
    namespaces of one informer are listed concurrently: a view keeps each namespace's listing apart."""

    def begin_listing(self, namespace: str | None) -> None: ...

    def listed(self, namespace: str | None, obj: dict[str, Any]) -> None:
        """One object of the listing of `namespace` begun (None: of every namespace)."""

    def end_listing(self, namespace: str | None, first: bool) -> None:
        """The listing begun is complete: it replaces what was known of `namespace` (None: every one).
        `first`: nothing was known before."""

    def watched(self, event_type: str, obj: dict[str, Any]) -> None:
        """ADDED, MODIFIED or DELETED."""


class Gone(Exception):
    """410: the resourceVersion (or the continue token) is too old; list again."""


class PodIndex(Mapping[IndexKey, tuple[observations.PodSummary, ...]]):
    """(namespace, job uid) -> the summaries of the pods that job controls, in the order first seen."""

    def __init__(self) -> None:
        self._jobs: dict[IndexKey, dict[str, observations.PodSummary]] = {}  # by pod name
        self._job_names: dict[IndexKey, str] = {}  # the job's name, from its pods' label (for triggers)
        self._where: dict[PodKey, IndexKey] = {}

    def __getitem__(self, key: IndexKey) -> tuple[observations.PodSummary, ...]:
        return tuple(self._jobs[key].values())

    def __iter__(self) -> Iterator[IndexKey]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def pods(self) -> int:
        """How many pods are indexed."""
        return len(self._where)

    def put(self, pod: PodKey, key: IndexKey | None, job_name: str,
            summary: observations.PodSummary | None) -> dict[IndexKey, str]:
        """The pod as it is now (key None: no job's, or gone); returns the jobs whose pods changed, with
        their names."""
        changed: dict[IndexKey, str] = {}
        old_key = self._where.get(pod)
        if old_key is not None and (old_key != key or summary is None):
            changed[old_key] = self._remove(pod, old_key)
        if key is not None and summary is not None:
            pods = self._jobs.setdefault(key, {})
            if pods.get(pod[1]) != summary:
                pods[pod[1]] = summary
                changed[key] = job_name
            self._where[pod] = key
            self._job_names[key] = job_name
        return changed

    def _remove(self, pod: PodKey, key: IndexKey) -> str:
        del self._where[pod]
        name = self._job_names.get(key, "")
        pods = self._jobs.get(key) or {}
        pods.pop(pod[1], None)
        if not pods:
            self._jobs.pop(key, None)
            self._job_names.pop(key, None)
        return name

    def replace_namespace(self, namespace: str | None, listed: "PodIndex") -> dict[IndexKey, str]:
        """Swap in a complete listing of one namespace (None: of every namespace); returns the jobs whose
        pods differ, with their names."""
        mine = [key for key in self._jobs if namespace is None or key[0] == namespace]
        changed = {key: self._job_names.get(key, "") for key in mine if self._jobs[key] != listed._jobs.get(key)}
        changed.update({key: name for key, name in listed._job_names.items()
                        if self._jobs.get(key) != listed._jobs.get(key)})
        for key in mine:
            for name in self._jobs.pop(key):
                self._where.pop((key[0], name), None)
            self._job_names.pop(key, None)
        self._jobs.update(listed._jobs)
        self._job_names.update(listed._job_names)
        self._where.update(listed._where)
        return changed


def indexed(obj: Mapping[str, Any]) -> tuple[PodKey, IndexKey | None, str, observations.PodSummary | None]:
    """(pod, its job's index key or None, the job's name, its summary or None) for one listed or watched pod."""
    meta = obj.get("metadata") or {}
    namespace, labels = meta.get("namespace") or "", meta.get("labels") or {}
    pod = (namespace, meta.get("name") or "")
    owner = observations.controller_uid(meta)
    if not owner or owner != labels.get(naming.LABEL_JOB_UID):
        return pod, None, "", None
    return pod, (namespace, owner), labels.get(naming.LABEL_JOB_NAME, ""), observations.summarize_pod(obj)


class Backoff:
    """Doubling waits between retries, from `first` up to `longest`; reset after a success."""

    def __init__(self, first: float, longest: float) -> None:
        self.first, self.longest, self.current = first, longest, first

    def next(self) -> float:
        wait, self.current = self.current, min(self.longest, self.current * 2)
        return wait

    def reset(self) -> None:
        self.current = self.first


class Informer:
    """Lists and watches `kind` in `namespaces` (empty: every namespace) into `view`."""

    def __init__(self, api: kube.Kube, kind: kube.Kind, namespaces: tuple[str, ...], view: View, *,
                 selector: str = "", page_size: int = PAGE_SIZE, watch_seconds: int = WATCH_SECONDS,
                 backoff: tuple[float, float] = BACKOFF_SECONDS, read_timeout: float | None = None) -> None:
        self.api, self.kind, self.view, self.selector = api, kind, view, selector
        self.namespaces: tuple[str | None, ...] = namespaces or (None,)
        self.page_size, self.watch_seconds, self.backoff = page_size, watch_seconds, backoff
        # A watch that sent nothing, not even a bookmark, for this long is taken as a dead connection.
        self.read_timeout = read_timeout if read_timeout is not None else watch_seconds + 30.0
        self.synced = asyncio.Event()
        self.lists = 0  # complete listings so far (for tests and logs)
        self._listed: set[str | None] = set()

    async def run(self) -> None:
        """Follow every namespace until cancelled."""
        await asyncio.gather(*(self._follow(namespace) for namespace in self.namespaces))

    async def _follow(self, namespace: str | None) -> None:
        backoff = Backoff(*self.backoff)
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list(namespace)
                started = asyncio.get_running_loop().time()
                version = await self._watch(namespace, version)
                if asyncio.get_running_loop().time() - started < SHORTEST_WATCH_SECONDS:
                    await asyncio.sleep(backoff.next())  # a server (or proxy) that ends every watch at once
                else:
                    backoff.reset()
            except Gone:
                logger.debug("%s in %s: resourceVersion %s is too old, listing again", self.kind.plural,
                             namespace or "*", version)
                version = None
            except (*kube.RETRYABLE_ERRORS, ValueError) as exc:  # ValueError: a line that is not JSON
                wait = backoff.next()
                logger.warning("watching %s in %s failed, retrying in %.1fs: %s", self.kind.plural,
                               namespace or "all namespaces", wait, str(exc) or type(exc).__name__)
                await asyncio.sleep(wait)
            except Exception:  # noqa: BLE001 - a bug here must not leave the operator blind: list again
                wait = backoff.next()
                logger.exception("following %s in %s raised; listing again in %.1fs", self.kind.plural,
                                 namespace or "*", wait)
                version = None
                await asyncio.sleep(wait)

    def _params(self, **params: str) -> dict[str, str]:
        return {"labelSelector": self.selector, **params} if self.selector else params

    async def _list(self, namespace: str | None) -> str:
        """One complete (paginated) listing into the view; returns its resourceVersion."""
        params = self._params(limit=str(self.page_size))
        self.view.begin_listing(namespace)
        while True:
            try:
                page = await self.api.list_page(self.kind, namespace, params)
            except kube.ApiError as exc:
                if exc.status == 410:
                    raise Gone() from exc
                raise
            for obj in page.get("items") or ():
                self.view.listed(namespace, obj)
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                break
            params["continue"] = meta["continue"]
            del page
        first = namespace not in self._listed
        self.view.end_listing(namespace, first)
        self.lists += 1
        self._listed.add(namespace)
        if len(self._listed) == len(self.namespaces):
            self.synced.set()
        return str(meta.get("resourceVersion") or "")

    async def _watch(self, namespace: str | None, version: str) -> str:
        """Every change after `version` until the server ends the watch; returns the last version seen."""
        params = self._params(resourceVersion=version, allowWatchBookmarks="true",
                              timeoutSeconds=str(self.watch_seconds))
        try:
            async for event in self.api.watch(self.kind, namespace, params, self.read_timeout):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise kube.ApiError(int(obj.get("code") or 500), obj.get("reason") or "",
                                        obj.get("message") or "an error event in the watch")
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.view.watched(kind, obj)
                # BOOKMARK: only its resourceVersion
        except kube.ApiError as exc:
            if exc.status == 410:
                raise Gone() from exc
            raise
        return version


class PodView:
    """The operator's pods as the summaries a pass reads (`index`); `on_change(namespace, job_name)` for
    each job whose pods changed after the first listing (the first names none: the job events and a new
    leader trigger every job). A pod belongs to the job that controls it (ownerReference, controller:
    true) when the job uid label says the same: a pod someone else made with a job's labels is not indexed."""

    def __init__(self, on_change: Callable[[str, str], None]) -> None:
        self.on_change = on_change
        self.index = PodIndex()
        self._listings: dict[str | None, PodIndex] = {}  # per namespace: they are listed concurrently

    def begin_listing(self, namespace: str | None) -> None:
        self._listings[namespace] = PodIndex()

    def listed(self, namespace: str | None, obj: dict[str, Any]) -> None:
        self._listings[namespace].put(*indexed(obj))

    def end_listing(self, namespace: str | None, first: bool) -> None:
        changed = self.index.replace_namespace(namespace, self._listings.pop(namespace))
        if not first:
            self._report(changed)

    def watched(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            pod, *_ = indexed(obj)
            self._report(self.index.put(pod, None, "", None))
        else:
            self._report(self.index.put(*indexed(obj)))

    def _report(self, changed: dict[IndexKey, str]) -> None:
        for (namespace, _), name in changed.items():
            if name:
                self.on_change(namespace, name)
