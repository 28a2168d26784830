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
- side_tasks.py: work started beside the passes, stopped with the controller.

`Controller` itself only starts and stops them, follows the leadership, and turns kopf's events into
triggers. Pods are read from a kopf index, which kopf fills completely before it calls any handler, so a
restarted operator never acts on a half-listed cluster. Handlers return nothing (kopf would store
results in the strict status) and never sleep; waits are timers. kopf adds no finalizers (no timers,
daemons or deletion handlers are registered).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

import kopf

from . import builders, kube, leader, model, progress, progress_router, store
from .actuator import Actuator
from .job_cache import JobCache, JobKey
from .metrics import Metrics
from .reconciler import Reconciler
from .settings import Settings
from .side_tasks import SideTasks
from .workqueue import WorkQueue

logger = logging.getLogger("ddpjob_operator")

OWNED_PODS = {builders.LABEL_MANAGED_BY: builders.MANAGED_BY, builders.LABEL_JOB_UID: kopf.PRESENT}


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
                                 progress_endpoint=progress_router.endpoint(settings), on_refused=self.trigger)
        self.reconciler = Reconciler(api, self.cache, self.actuator, self.progress, settings, metrics, clock=clock,
                                     leading=self.leading, requeue=self.requeue)
        self.queue: WorkQueue[JobKey] = WorkQueue(
            self.reconciler.run, concurrency=settings.max_concurrent_reconciles,
            settle_seconds=settings.coalesce_seconds, urgent=self.cache.first_in_line)
        self.router = progress_router.ProgressRouter(
            settings, self.progress, self.cache, metrics,
            progress.TokenReviewer(api.token_review, settings.progress_audience),
            clock=clock, leading=self.leading, requeue=self.requeue, elector=elector)
        self.progress_server = self.router.server
        self._resync: asyncio.TimerHandle | None = None
        metrics.registry.register(progress.TrackerCollector(self.progress, clock))

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self.settings.metrics_port:
            self.metrics.serve(self.settings.metrics_port, self.settings.bind_address)
        self._schedule_resync()
        self.router.start(self.side_tasks)
        if self.elector is None:
            self.metrics.leader.set(1)
        else:
            self.elector.on_start, self.elector.on_stop = self.started_leading, self.stopped_leading
            self.elector.on_change = lambda holder: self.metrics.leader_changes.inc()
            self.elector.start()

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

    def pod_event(self, namespace: str, labels: Mapping[str, str]) -> None:
        job_name = labels.get(builders.LABEL_JOB_NAME)
        if job_name:
            self.trigger((namespace, job_name))

    def trigger(self, key: JobKey) -> None:
        if not self.leading():
            return  # a standby keeps its view of the jobs warm, and acts once it leads
        self.queue.add(key)

    def requeue(self, key: JobKey, delay: float) -> None:
        self.queue.add_after(key, delay)


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

    @kopf.index("", "v1", "pods", id="ddpjob_pods", labels=OWNED_PODS, registry=registry)
    def ddpjob_pods(namespace: str, labels: Mapping[str, str], body: kopf.Body,
                    **_: Any) -> dict[tuple[str, str], store.PodSummary]:
        # Keyed by the job that controls the pod (ownerReference, controller: true), never by its labels:
        # a pod someone else made with a job's labels is not that job's worker ({}: not indexed).
        owner = store.controller_uid(body.get("metadata") or {})
        if not owner or owner != labels.get(builders.LABEL_JOB_UID):
            return {}
        return {(namespace, owner): store.summarize_pod(body)}

    @kopf.on.event(model.GROUP, model.VERSION, model.PLURAL, id="ddpjob_event", registry=registry)
    async def ddpjob_event(type: str | None, body: kopf.Body, ddpjob_pods: kopf.Index[Any, Any],
                           **_: Any) -> None:
        controller.cache.pods = ddpjob_pods
        controller.job_event(type, body)

    @kopf.on.event("", "v1", "pods", id="pod_event", labels=OWNED_PODS, registry=registry)
    async def pod_event(namespace: str, labels: Mapping[str, str], ddpjob_pods: kopf.Index[Any, Any],
                        **_: Any) -> None:
        controller.cache.pods = ddpjob_pods
        controller.pod_event(namespace, labels)

    return registry
