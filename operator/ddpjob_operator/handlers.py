"""The controller: the thin composition of the operator's rooms, and its kopf wiring.

Level-based like a controller-runtime manager: every DDPJob event, every event of a pod it owns, a
per-job requeue timer (backoff, deadline, TTL), a periodic resync and a new leader all *trigger* the same
pass over that job, queued in the work queue (workqueue.py: one pass per job at a time, a new or changed
job first). The rooms, each with one job:

- job_cache.py: what the controller last saw of each job and its pods, and the statuses it wrote;
- reconciler.py: one pass (observe, `decisions.decide()`, hand the actions on; a raised pass becomes the
  job's ReconcileError condition, retried with backoff);
- actuator.py: every API write of a pass (creations, deletions, status writes, Events);
- progress_router.py: the progress endpoint, and the label that routes reports to the leader;
- side_tasks.py: work started beside the passes, stopped with the controller;
- informer.py: the DDPJobs and the operator's pods, listed and watched (the pods as the summaries a
  pass reads).

`Controller` itself only starts and stops them, follows the leadership, and turns the informers' job
events and pod changes into triggers. The work queue starts no pass until both informers have listed
everything once, so a restarted operator never acts on a half-listed cluster, and a job submitted meanwhile
goes ahead of the resync of all the others. kopf runs the process (start-up, clean-up, probes, credentials,
signals); it watches nothing, so it stores nothing on the objects and adds no finalizers. Waits are timers.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

import kopf

from . import kube, leader, progress, progress_router
from .actuator import Actuator
from .job_cache import JobCache, JobKey
from .metrics import Metrics
from .informer import POD_SELECTOR, Informer, PodView
from .reconciler import Reconciler
from .settings import Settings
from .side_tasks import SideTasks
from .workqueue import WorkQueue

logger = logging.getLogger("ddpjob_operator")

# How long the pod changes of a job are gathered before its pass.
POD_CHANGES_FOLD_SECONDS = 0.1


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Controller:
    def __init__(self, api: kube.Kube, settings: Settings, metrics: Metrics,
                 clock: Callable[[], datetime] = utcnow, elector: leader.Elector | None = None):
        self.api, self.settings, self.metrics, self.clock = api, settings, metrics, clock
        self.elector = elector  # None: the only replica, always acting
        self.cache = JobCache()
        self.side_tasks = SideTasks()
        # Progress reports (the progress package): kept per job, published into the status at a bounded rate.
        self.progress = progress.ProgressTracker(settings.progress_write_seconds)
        self.actuator = Actuator(api, self.cache.written, metrics, self.side_tasks,
                                 progress_endpoint=progress_router.endpoint(settings), on_refused=self.trigger,
                                 clock=clock)
        self.reconciler = Reconciler(api, self.cache, self.actuator, self.progress, settings, metrics, clock=clock,
                                     leading=self.leading, requeue=self.requeue)
        self.queue: WorkQueue[JobKey] = WorkQueue(
            self.reconciler.run, concurrency=settings.max_concurrent_reconciles,
            settle_seconds=settings.coalesce_seconds, urgent=self.cache.first_in_line)
        self.queue.hold()  # until every pod has been listed once
        self.pod_view = PodView(lambda namespace, job_name: self.pod_changed(namespace, job_name))
        self.cache.pods = self.pod_view.index
        # The informers have a client of their own: their watches hold connections for minutes, and a
        # listing never queues behind a burst of a pass's calls (nor those behind it).
        self.reader = kube.Kube(api.connection, timeout_seconds=settings.request_timeout_seconds,
                                user_agent=api.user_agent)
        self.informers = (Informer(self.reader, kube.DDPJOBS, settings.watch_namespaces, JobView(self)),
                          Informer(self.reader, kube.PODS, settings.watch_namespaces, self.pod_view,
                                   selector=POD_SELECTOR))
        self.router = progress_router.ProgressRouter(
            settings, self.progress, self.cache, metrics,
            progress.TokenReviewer(api.token_review, settings.progress_audience),
            clock=clock, leading=self.leading, requeue=self.requeue, elector=elector, labeler=self.reader)
        self.progress_server = self.router.server
        self._resync: asyncio.TimerHandle | None = None
        metrics.registry.register(progress.TrackerCollector(self.progress, clock))

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self.settings.metrics_port:
            self.metrics.serve(self.settings.metrics_port, self.settings.bind_address)
        self._schedule_resync()
        for informer in self.informers:
            self.side_tasks.spawn(informer.run(), f"the informer of {informer.kind.plural}")
        self.side_tasks.spawn(self._release_once_listed(), "waiting for the first listings")
        self.router.start(self.side_tasks)
        if self.elector is None:
            self.metrics.leader.set(1)
        else:
            self.elector.on_start, self.elector.on_stop = self.started_leading, self.stopped_leading
            self.elector.on_change = lambda holder: self.metrics.leader_changes.inc()
            self.elector.start()

    async def _release_once_listed(self) -> None:
        started = asyncio.get_running_loop().time()
        for informer in self.informers:
            await informer.synced.wait()
        logger.info("listed %d jobs and %d pods in %.1fs", len(self.cache), self.pod_view.index.pods(),
                    asyncio.get_running_loop().time() - started)
        self.queue.release()

    def synced(self) -> bool:
        """Every job and pod listed once: passes may run."""
        return all(informer.synced.is_set() for informer in self.informers)

    def leading(self) -> bool:
        return self.elector is None or self.elector.leading()

    def started_leading(self) -> None:
        """This replica now holds the Lease: forget what it wrote while it last led (another replica
        wrote since), and reconcile every job from what the server holds."""
        self.cache.forget_writes()
        self.actuator.forget_all()
        self.metrics.leader.set(1)
        self.router.leadership_changed()
        for key in self.cache.keys():
            self.trigger(key)

    def stopped_leading(self) -> None:
        """Fenced (its writes already fail): drop the work in hand; the new leader redoes it."""
        self.metrics.leader.set(0)
        self.router.leadership_changed()
        self.queue.clear()

    async def stop(self) -> None:
        if self._resync is not None:
            self._resync.cancel()
        await self.queue.stop()
        await self.side_tasks.stop()
        await self.router.stop()
        if self.elector is not None:
            await self.elector.stop()  # hand the Lease over at once (SIGTERM)
        self.metrics.stop()
        await self.api.close()
        await self.reader.close()

    def _schedule_resync(self) -> None:
        def resync() -> None:
            for key in self.cache.keys():
                self.trigger(key)
            self._schedule_resync()
        self._resync = asyncio.get_running_loop().call_later(self.settings.resync_seconds, resync)

    # ------------------------------------------------------------ triggers

    def job_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta["name"])
        if event_type == "DELETED":
            uid = self.cache.forget(key, body)
            self.actuator.forget(uid)
            self.progress.forget(uid)
            self.reconciler.forget(key)
            self.metrics.job_phase(uid, None)
            self.queue.forget(key)
            return
        seen = self.cache.saw(key, body)
        if seen.new_spec:
            self.actuator.retry_refused(meta.get("uid", ""))  # the user changed the spec: try again
        if seen.needs_pass:
            self.trigger(key)

    def pod_changed(self, namespace: str, job_name: str) -> None:
        """A pass shortly after: the pods of a gang change together (a failed collective ends every rank
        within milliseconds), and one pass should see them all, not decide on the first alone."""
        self.trigger((namespace, job_name), settle=POD_CHANGES_FOLD_SECONDS)

    def trigger(self, key: JobKey, settle: float = 0.0) -> None:
        if not self.leading():
            return  # a standby keeps its view of the jobs warm, and acts once it leads
        self.queue.add(key, settle)

    def requeue(self, key: JobKey, delay: float) -> None:
        self.queue.add_after(key, delay)


class JobView:
    """The job informer's view: each listed or watched DDPJob is an event of the controller's; a job
    missing from a listing that replaces an older one (after a 410 Gone) was deleted meanwhile."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self._seen: dict[str | None, set[JobKey]] = {}  # per namespace: they are listed concurrently

    def begin_listing(self, namespace: str | None) -> None:
        self._seen[namespace] = set()

    def listed(self, namespace: str | None, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self._seen[namespace].add((meta.get("namespace") or "default", meta.get("name") or ""))
        self.controller.job_event("ADDED", obj)

    def end_listing(self, namespace: str | None, first: bool) -> None:
        seen, cache = self._seen.pop(namespace), self.controller.cache
        for key in list(cache.keys()):
            if (namespace is None or key[0] == namespace) and key not in seen:
                self.controller.job_event("DELETED", cache.get(key) or {"metadata": {"namespace": key[0], "name": key[1]}})

    def watched(self, event_type: str, obj: dict[str, Any]) -> None:
        self.controller.job_event(event_type, obj)


def build_registry(controller: Controller, connection: kube.Connection) -> kopf.OperatorRegistry:
    """A fresh registry per operator instance (no module globals: tests run several)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection.for_kopf()

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(**_: Any) -> None:
        controller.start()

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        await controller.stop()

    @kopf.on.probe(id="jobs", registry=registry)
    def jobs_probe(**_: Any) -> int:
        return len(controller.cache)

    return registry
