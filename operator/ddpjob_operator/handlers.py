"""Thin kopf wiring: watch DDPJobs and their pods, run `decide()`, apply its actions.

Level-based like a controller-runtime work queue (workqueue.py): every DDPJob event, every event
of a pod it owns, a per-job requeue timer (backoff, deadline, TTL) and a periodic resync all
*trigger* the same reconcile of that job; one reconcile per job runs at a time, a trigger during a
run makes it run once more, and a job not yet reconciled in its current spec goes first. Pods are
read from a kopf index, which kopf fills completely before it calls any handler, so a restarted
operator never acts on a half-listed cluster.

Handlers return nothing (kopf would store results in the strict status) and never sleep; waits
are timers. kopf adds no finalizers (no timers, daemons or deletion handlers are registered).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import pickle
import sys
import time
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Iterable, Mapping

import aiohttp
import kopf

from . import builders, decisions, kube, leader, model, progress, server_fields, store
from .metrics import Metrics
from .settings import Settings
from .workqueue import WorkQueue

logger = logging.getLogger("ddpjob_operator")

JobKey = tuple[str, str]  # (namespace, name)
OWNED_PODS = {builders.LABEL_MANAGED_BY: builders.MANAGED_BY, builders.LABEL_JOB_UID: kopf.PRESENT}
RETRYABLE_ERRORS = (kube.ApiError, aiohttp.ClientError, asyncio.TimeoutError)
# Creation failures the operator reports through the job instead of retrying at once: bad request,
# admission (webhooks, pod security, quota), a name owned by someone else, validation, throttling,
# and 404: an API the cluster does not serve (a gang scheduler's PodGroup without its CRD).
REFUSED_STATUSES = frozenset({400, 403, 404, 409, 422, 429})
# Any other exception in one job's reconcile (a bug, a value the code cannot represent) becomes that job's
# condition and Warning Event, and the reconcile is retried with backoff; other jobs are untouched.
CONDITION_RECONCILE_ERROR = "ReconcileError"
REASON_RECONCILE_ERROR = "ReconcileError"
REASON_RECONCILED = "Reconciled"
ERROR_BACKOFF_MAX_SECONDS = 300.0
# The acting replica's pod carries this label; the chart's progress Service selects it, so reports reach
# the leader alone (a readiness only the leader passes would deadlock rolling updates and drains: the
# new pods stand by, never ready, while the old leader holds the Lease).
PROGRESS_LEADER_LABEL = f"{model.GROUP}/progress-leader"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# Never read, and most of a stored job's metadata: `kubectl apply` copies the whole manifest into
# this annotation, the API server adds managedFields. Not kept for every job (bench/operator_memory.py).
_UNREAD_METADATA = ("managedFields",)
_UNREAD_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def _compact(value: Any) -> Any:
    """A deep copy of a JSON value with its keys and short strings interned: thousands of job
    snapshots share one "lastTransitionTime", "True", "Running"... instead of one each."""
    if isinstance(value, Mapping):
        return {sys.intern(k): _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    if isinstance(value, str) and len(value) <= 32:
        return sys.intern(value)
    return value


def _snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    snapshot = {key: _compact(body.get(key) or {}) for key in ("metadata", "spec", "status")}
    meta = snapshot["metadata"]
    for key in _UNREAD_METADATA:
        meta.pop(key, None)
    for key in _UNREAD_ANNOTATIONS:
        (meta.get("annotations") or {}).pop(key, None)
    return snapshot


class WrittenStatuses:
    """job uid -> the status this process last wrote, kept as its compact wire JSON (about 1 KiB,
    against about 9 KiB for the model) and read back with pydantic's JSON parser (exact: the wire
    form round-trips; about 15 us)."""

    def __init__(self) -> None:
        self._wire: dict[str, bytes] = {}

    def __contains__(self, uid: object) -> bool:
        return uid in self._wire

    def __len__(self) -> int:
        return len(self._wire)

    def __getitem__(self, uid: str) -> model.DDPJobStatus:
        return model.DDPJobStatus.model_validate_json(self._wire[uid])

    def __setitem__(self, uid: str, status: model.DDPJobStatus) -> None:
        self._wire[uid] = json.dumps(status.wire(), separators=(",", ":")).encode()

    def get(self, uid: str) -> model.DDPJobStatus | None:
        return self[uid] if uid in self._wire else None

    def pop(self, uid: str, default: None = None) -> model.DDPJobStatus | None:
        raw = self._wire.pop(uid, None)
        return default if raw is None else model.DDPJobStatus.model_validate_json(raw)

    def clear(self) -> None:
        self._wire.clear()


class Controller:
    def __init__(self, api: kube.Kube, settings: Settings, metrics: Metrics,
                 clock: Callable[[], datetime] = utcnow, elector: leader.Elector | None = None):
        self.api, self.settings, self.metrics, self.clock = api, settings, metrics, clock
        self.elector = elector  # None: the only replica, always acting
        self.options = decisions.Options(stuck_terminating_seconds=settings.stuck_terminating_seconds,
                                         cannot_start_seconds=settings.cannot_start_seconds,
                                         incident_settle_seconds=settings.incident_settle_seconds,
                                         silent_peer_settle_seconds=settings.silent_peer_settle_seconds,
                                         unreported_warning_seconds=settings.unreported_warning_seconds,
                                         # A spare learns its assignment from the progress endpoint.
                                         spares_enabled=bool(settings.progress_url))
        self.jobs: dict[JobKey, dict[str, Any]] = {}
        self.pods: Mapping[tuple[str, str], Any] = {}  # kopf's index: (namespace, job uid) -> PodSummary
        self.written = WrittenStatuses()  # job uid -> the status this process last wrote
        self.shared_ready: set[str] = set()  # job uids whose Services / claim exist
        # Generations whose objects the API server judged (dryRun=All) before any was created, per job uid.
        self.judged: dict[str, set[int]] = {}
        # Creations the API server refused, per job uid and object name, until one succeeds.
        self.rejected: dict[str, dict[str, decisions.CreateRejected]] = {}
        self._specs: dict[str, tuple[tuple[str, Any], bytes]] = {}  # uid -> (generation, parsed and pickled)
        self.queue: WorkQueue[JobKey] = WorkQueue(
            self._reconcile_safely, concurrency=settings.max_concurrent_reconciles,
            settle_seconds=settings.coalesce_seconds, urgent=self._first_in_line)
        self._resync: asyncio.TimerHandle | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._failures: dict[JobKey, int] = {}  # consecutive unexpected reconcile errors, for the backoff
        self._routing_wake: asyncio.Event | None = None
        self._routing_labeled: bool | None = None  # what this replica's pod label says (None: unknown)
        # Progress reports (progress.py): kept per job, published into the status at a bounded rate.
        self.progress = progress.ProgressTracker(settings.progress_write_seconds)
        self.progress_endpoint = builders.ProgressEndpoint(settings.progress_url, settings.progress_audience,
                                                           _read_ca(settings.progress_ca_file)) \
            if settings.progress_url else None
        self.progress_server = progress.ProgressServer(
            self.progress, progress.TokenReviewer(api.token_review, settings.progress_audience),
            find_worker=lambda ns, name, who: progress.find_worker_in(self.pods, self.jobs, ns, name, who,
                                                                      builders.ROLE_WORKER),
            assignment=lambda ns, name, who: progress.assignment_in(
                self.pods, self.jobs, ns, name, who,
                lambda body: self._parsed_spec(body["metadata"].get("uid", ""), body)[0]),
            leading=self.leading, accepted=self._progress_reported,
            count=lambda result: metrics.progress_reports.labels(result=result).inc(), clock=clock,
            refused=self._progress_refused)
        metrics.registry.register(progress.TrackerCollector(self.progress, clock))

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self.settings.metrics_port:
            self.metrics.serve(self.settings.metrics_port, self.settings.bind_address)
        self._schedule_resync()
        if self.settings.progress_port:
            self._spawn(self._start_progress())
            if self.settings.progress_leader_label and self.elector is not None:
                self._routing_wake = asyncio.Event()
                self._spawn(self._route_progress())
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
        self.written.clear()
        self.shared_ready.clear()
        self.judged.clear()
        self.rejected.clear()
        self.metrics.leader.set(1)
        if self._routing_wake is not None:
            self._routing_wake.set()
        for key in list(self.jobs):
            self.trigger(key)

    def stopped_leading(self) -> None:
        """Fenced (its writes already fail): drop the work in hand; the new leader redoes it."""
        self.metrics.leader.set(0)
        if self._routing_wake is not None:
            self._routing_wake.set()
        self.queue.clear()

    async def stop(self) -> None:
        if self._resync is not None:
            self._resync.cancel()
        await self.queue.stop()
        pending = list(self._side_tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.progress_server.stop()
        if self.elector is not None:
            if self._routing_labeled is not False and self._routing_wake is not None:
                try:  # reports go to the next leader only
                    await asyncio.wait_for(self._label_own_pod(False), self.settings.lease_retry_period_seconds)
                except (*RETRYABLE_ERRORS, OSError) as exc:
                    log = logger.info if leader.permission_withdrawn(exc) else logger.warning  # an uninstall
                    log("could not remove the progress label from this pod: %s", exc)
            await self.elector.stop()  # hand the Lease over at once (SIGTERM)
        self.metrics.stop()
        await self.api.close()

    async def _start_progress(self) -> None:
        certificate = None
        if self.settings.progress_tls_cert_file:  # HTTPS; a certificate that cannot be loaded is logged
            certificate = progress.ServerCertificate(self.settings.progress_tls_cert_file,
                                                     self.settings.progress_tls_key_file)
        # A negative port (settings' "auto"): one the kernel picks; the bound port is logged.
        await self.progress_server.start(max(self.settings.progress_port, 0), self.settings.bind_address, certificate)
        logger.info("progress endpoint on %s:%d", self.settings.bind_address, self.progress_server.port)

    async def _route_progress(self) -> None:
        """Keep this replica's pod labeled PROGRESS_LEADER_LABEL exactly while it leads (woken by the
        elector's callbacks, retried every Lease retry period). The unfenced Lease client writes it, so a
        fenced replica still removes its label."""
        assert self._routing_wake is not None
        while True:
            want = self.leading()
            if want != self._routing_labeled:
                try:
                    await self._label_own_pod(want)
                except kube.ApiError as exc:
                    if exc.status == 404:
                        logger.error("progress routing: pod %s/%s not found (POD_NAME must name this pod); reports "
                                     "reach every replica", self.settings.lease_namespace, self.settings.identity)
                        return
                    # Refused with the Lease too: an uninstall took the Role (leader.py); alone: a missing rule.
                    uninstall = leader.permission_withdrawn(exc) and self.elector.withdrawn_since is not None
                    (logger.info if uninstall else logger.warning)(
                        "progress routing: could not label pod %s: %s", self.settings.identity, exc)
                except (*RETRYABLE_ERRORS, OSError) as exc:
                    logger.warning("progress routing: could not label pod %s: %s", self.settings.identity, exc)
            try:
                await asyncio.wait_for(self._routing_wake.wait(), self.settings.lease_retry_period_seconds)
            except asyncio.TimeoutError:
                pass
            self._routing_wake.clear()

    async def _label_own_pod(self, leading: bool) -> None:
        assert self.elector is not None
        await self.elector.api.patch_pod_labels(self.settings.lease_namespace, self.settings.identity,
                                                {PROGRESS_LEADER_LABEL: "true" if leading else None})
        self._routing_labeled = leading

    def _schedule_resync(self) -> None:
        def resync() -> None:
            for key in list(self.jobs):
                self.trigger(key)
            self._schedule_resync()
        self._resync = asyncio.get_running_loop().call_later(self.settings.resync_seconds, resync)

    # ------------------------------------------------------------ triggers

    def job_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta["name"])
        if event_type == "DELETED":
            old = self.jobs.pop(key, None)
            uid = (old or _snapshot(body))["metadata"].get("uid", "")
            self.written.pop(uid, None)
            self._specs.pop(uid, None)
            self.shared_ready.discard(uid)
            self.judged.pop(uid, None)
            self.rejected.pop(uid, None)
            self.progress.forget(uid)
            self._failures.pop(key, None)
            self.metrics.job_phase(uid, None)
            self.queue.forget(key)
            return
        snapshot, previous = self._without_parsed_spec(_snapshot(body)), self.jobs.get(key)
        self.jobs[key] = snapshot
        if previous is not None and previous["metadata"].get("generation") != snapshot["metadata"].get("generation"):
            self.rejected.pop(snapshot["metadata"].get("uid", ""), None)  # the user changed the spec: try again
        if previous is None or self._changed_by_others(previous, snapshot):
            self.trigger(key)

    def _changed_by_others(self, previous: dict[str, Any], current: dict[str, Any]) -> bool:
        """False for the echo of our own status write (same spec generation, our status)."""
        old_meta, meta = previous["metadata"], current["metadata"]
        written = self.written.get(meta.get("uid", ""))
        return (old_meta.get("generation") != meta.get("generation")
                or old_meta.get("deletionTimestamp") != meta.get("deletionTimestamp")
                or written is None or written.wire() != current["status"])

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

    def _first_in_line(self, key: JobKey) -> bool:
        """Not yet reconciled in its current spec (a new job, a changed spec): ahead of the resyncs."""
        body = self.jobs.get(key)
        if body is None:
            return False
        generation = body["metadata"].get("generation")
        if (body.get("status") or {}).get("observedGeneration") == generation:
            return False
        written = self.written.get(body["metadata"].get("uid", ""))
        return written is None or written.observed_generation != generation

    async def _reconcile_safely(self, key: JobKey) -> None:
        started = time.perf_counter()
        try:
            await self.reconcile(key)
        except leader.NotLeader:
            return  # fenced mid-reconcile: the leader redoes it
        except RETRYABLE_ERRORS as exc:
            self.metrics.reconcile_errors.inc()
            logger.warning("reconcile of %s/%s failed, retrying in %ss: %s", *key, self.settings.retry_seconds, exc)
            self.requeue(key, self.settings.retry_seconds)
        except Exception as exc:  # noqa: BLE001 - one job's bug must never stop the others
            self.metrics.reconcile_errors.inc()
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = min(ERROR_BACKOFF_MAX_SECONDS, self.settings.retry_seconds * 2 ** min(failures - 1, 16))
            logger.exception("reconcile of %s/%s raised; retrying in %.0fs", *key, delay)
            self.requeue(key, delay)
            try:
                await self._report_error(key, exc)
            except Exception:  # noqa: BLE001 - the API may be what fails: the retry covers it
                logger.exception("could not record the reconcile error of %s/%s", *key)
        else:
            if self._failures.pop(key, None) is not None:
                try:
                    await self._clear_error(key)
                except RETRYABLE_ERRORS as exc:
                    logger.warning("could not clear the reconcile error of %s/%s: %s", *key, exc)
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    async def _report_error(self, key: JobKey, exc: Exception) -> None:
        """The job's ReconcileError condition (True) and a Warning Event, once per distinct message."""
        body = self.jobs.get(key)
        if body is None or not self.leading():
            return
        uid = body["metadata"].get("uid", "")
        now = self.clock()
        message = decisions.short_message(f"the operator failed to reconcile this job and retries with backoff: "
                                          f"{type(exc).__name__}: {exc}") or type(exc).__name__
        stored = self.written.get(uid) or store.parse_status(body.get("status"))
        previous = _condition(stored, CONDITION_RECONCILE_ERROR)
        if previous is not None and previous.status == "True" and previous.message == message:
            return
        status = stored.model_copy(deep=True)
        status.conditions = decisions.set_condition(
            status.conditions, CONDITION_RECONCILE_ERROR, "True", REASON_RECONCILE_ERROR, message, now,
            int(body["metadata"].get("generation") or 1))
        patch = kube.merge_patch(stored.wire(), status.wire())
        job = builders.JobRef(key[1], key[0], uid)
        if patch and await self.api.patch_status(key[0], key[1], patch):
            self.written[uid] = status
        self._post_event(job, decisions.Event("Warning", REASON_RECONCILE_ERROR, message), now)

    async def _clear_error(self, key: JobKey) -> None:
        """A reconcile went through after failing: the ReconcileError condition turns False."""
        body = self.jobs.get(key)
        uid = body["metadata"].get("uid", "") if body is not None else ""
        if body is None:
            return
        stored = self.written.get(uid) or store.parse_status(body.get("status"))
        previous = _condition(stored, CONDITION_RECONCILE_ERROR)
        if previous is None or previous.status != "True":
            return
        status = stored.model_copy(deep=True)
        status.conditions = decisions.set_condition(
            status.conditions, CONDITION_RECONCILE_ERROR, "False", REASON_RECONCILED,
            "the operator reconciles this job again", self.clock(), int(body["metadata"].get("generation") or 1))
        if await self.api.patch_status(key[0], key[1], kube.merge_patch(stored.wire(), status.wire())):
            self.written[uid] = status

    # ------------------------------------------------------------ one reconcile

    async def reconcile(self, key: JobKey) -> None:
        body = self.jobs.get(key)
        if body is None or not self.leading():
            return
        uid = body["metadata"].get("uid", "")
        view = store.job_view(body, self.written.get(uid), self._parsed_spec(uid, body))
        now = self.clock()
        pods = await self._with_mount_failures(key[0], tuple(self.pods.get((key[0], uid), ())), now)
        observed = store.observe(pods, now, tuple(self.rejected.get(uid, {}).values()), job_uid=uid)
        # A worker that finished sent its last report before it exited: published now, so the write that
        # may say Succeeded carries the final step.
        finished = any(w.phase == "Succeeded" for w in observed.workers)
        observed = dataclasses.replace(observed, progress=self.progress.observation(uid, now, final=finished))
        decision = decisions.decide(view, observed, self.options)
        decision = dataclasses.replace(decision, status=self._heartbeat(decision.status, now))
        # Diff against what the server holds: our last write, or the stored status after a restart.
        stored = self.written[uid].wire() if uid in self.written else dict(body.get("status") or {})
        patch = kube.merge_patch(stored, decision.status.wire())
        actions = self.execute(view, decision.actions, observed.now, {p.name: p.uid for p in pods})
        if not patch:
            await actions
        elif decisions.accounting(view.status) != decisions.accounting(decision.status):
            # Charged restarts, generations and rank counters go on record before the pods they
            # account for change, so a crash in between never charges one failure twice.
            try:
                written = await self._write_status(view, decision.status, patch)
            except BaseException:
                actions.close()  # never started: the pass is retried once the status write goes through
                raise
            if not written:
                actions.close()
                return  # the job is gone; its children go with it
            await actions
        else:
            await asyncio.gather(self._write_status(view, decision.status, patch), actions)
        self.metrics.job_phase(uid, decision.status.phase)
        if decision.requeue_after is not None:
            self.requeue(key, decision.requeue_after)

    def _heartbeat(self, status: model.DDPJobStatus, now: datetime) -> model.DDPJobStatus:
        """status.lastReconcileTime, refreshed once it is heartbeat_seconds old (not for finished
        jobs, whose status is final): while no operator acts it grows old, and `kubectl get ddpj`
        shows it."""
        if status.phase in ("Succeeded", "Failed"):
            return status
        last = decisions.parse_time(status.last_reconcile_time)
        if last is not None and (now - last).total_seconds() < self.settings.heartbeat_seconds:
            return status
        return status.model_copy(update={"last_reconcile_time": decisions.rfc3339(now)})

    async def _with_mount_failures(self, namespace: str, pods: tuple[store.PodSummary, ...],
                                   now: datetime) -> tuple[store.PodSummary, ...]:
        """A volume that cannot be mounted leaves its pod in ContainerCreating with no message: only the
        kubelet's FailedMount Event says why. Read it for pods waiting past the cannot-start timeout."""
        out = []
        for pod in pods:
            wait = pod.waiting
            if wait is not None and wait.reason == "ContainerCreating" and \
                    (now - wait.since).total_seconds() >= self.settings.cannot_start_seconds:
                message = await self.api.latest_event_message(namespace, pod.uid, decisions.REASON_FAILED_MOUNT)
                if message:
                    pod = dataclasses.replace(pod, waiting=decisions.Waiting(decisions.REASON_FAILED_MOUNT, message,
                                                                             wait.since))
            out.append(pod)
        return tuple(out)

    async def _write_status(self, view: decisions.JobView, status: model.DDPJobStatus, patch: dict[str, Any]) -> bool:
        if not await self.api.patch_status(view.namespace, view.name, patch):
            return False
        self.written[view.uid] = status
        self._count(view.status, status)
        return True

    def _parsed_spec(self, uid: str, body: dict[str, Any]) -> store.ParsedSpec:
        """The spec only changes with metadata.generation; parse it once per generation (the CEL
        rules cost milliseconds). Kept pickled, a sixth of the model's memory, and unpickling runs no
        validators (tens of microseconds); the job's snapshot then drops its spec (spec None)."""
        key = (uid, body["metadata"].get("generation"))
        cached = self._specs.get(uid)
        if cached is None or cached[0] != key:
            parsed = store.parse_body_spec(body)
            self._specs[uid] = (key, pickle.dumps(parsed, pickle.HIGHEST_PROTOCOL))
            body["spec"] = None
            return parsed
        return pickle.loads(cached[1])  # type: ignore[no-any-return]

    def _without_parsed_spec(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """A snapshot of a generation whose spec is parsed already keeps no copy of it."""
        uid, generation = snapshot["metadata"].get("uid", ""), snapshot["metadata"].get("generation")
        cached = self._specs.get(uid)
        if cached is not None and cached[0] == (uid, generation):
            snapshot["spec"] = None
        return snapshot

    def _count(self, old: model.DDPJobStatus, new: model.DDPJobStatus) -> None:
        if new.restarts > old.restarts:
            self.metrics.restarts.inc(new.restarts - old.restarts)
        if new.disruptions > old.disruptions:
            self.metrics.disruptions.inc(new.disruptions - old.disruptions)
        stalls = [i for i in new.incidents if i.reason == decisions.REASON_STALLED and i not in old.incidents]
        if stalls:
            self.metrics.stalls.inc(len(stalls))

    def _progress_reported(self, namespace: str, name: str, uid: str) -> None:
        """A report was accepted: reconcile the job when its progress may be published (coalesced: the
        earliest timer wins, so a job gets at most one progress write per progress_write_seconds)."""
        due = self.progress.due_in(uid, self.clock())
        if due is not None and self.leading():
            self.requeue((namespace, name), due)

    def _progress_refused(self, namespace: str, name: str) -> None:
        """A report for this job could not be taken (a review budget spent, a failed review): the stall
        clock holds (decisions/progress.py), since the silence is the operator's."""
        body = self.jobs.get((namespace, name))
        if body is not None:
            self.progress.refused(body["metadata"].get("uid", ""), self.clock())

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:  # noqa: BLE001 - e.g. the progress port is taken: say so, keep operating
                logger.exception("background task failed")
        task = asyncio.get_running_loop().create_task(run())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def execute(self, view: decisions.JobView, actions: tuple[decisions.Action, ...], now: datetime,
                      pod_uids: Mapping[str, str]) -> None:
        job = builders.JobRef(view.name, view.namespace, view.uid)
        spec = view.spec
        # Deletes first: a replacement may reuse the name of a pod removed in the same pass. Each
        # names the uid this pass observed, so a stale view never deletes that replacement.
        await self._all(self.api.delete(kube.PODS, job.namespace, name, grace_seconds=0 if a.force else None,
                                        uid=pod_uids.get(name))
                        for a in actions if isinstance(a, (decisions.DeleteWorker, decisions.DeleteStore))
                        for name in [_pod_name(job, a)])
        workers = [a for a in actions if isinstance(a, decisions.CreateWorker)]
        spares = [a for a in actions if isinstance(a, decisions.CreateSpare)]
        creates_store = any(isinstance(a, decisions.CreateStore) for a in actions)
        if workers or creates_store or spares:
            assert spec is not None  # the decision layer only creates for a runnable spec
            # The store before the workers (they dial it); nothing more once a creation was refused.
            if await self._judged(job, spec, workers, spares, creates_store, now) and \
                    await self._ensure_shared(job, spec, now) and \
                    (not creates_store or await self._create(job, builders.store_pod(job, spec), now)):
                await self._all(self._create(job, builders.worker_pod(
                    job, spec, index=a.index, generation=a.generation, attempt=a.attempt,
                    progress=self.progress_endpoint, avoid_nodes=a.avoid_nodes), now) for a in workers)
                await self._all(self._create(job, builders.spare_pod(
                    job, spec, serial=a.slot, generation=a.generation, progress=self.progress_endpoint), now)
                    for a in spares)
        if any(isinstance(a, decisions.DeleteJob) for a in actions):
            await self.api.delete(kube.DDPJOBS, job.namespace, job.name)
        # Events after the pod calls: they are informational and must not queue ahead of them.
        for event in (a for a in actions if isinstance(a, decisions.Event)):
            self._post_event(job, event, now)

    @staticmethod
    async def _all(calls: Iterable[Awaitable[Any]]) -> None:
        """Run API calls concurrently; raise the first failure after all have finished."""
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def _judged(self, job: builders.JobRef, spec: model.DDPJobSpec, workers: list[decisions.CreateWorker],
                      spares: list[decisions.CreateSpare], creates_store: bool, now: datetime) -> bool:
        """The API server judges (dryRun=All) every object of a new job, and each new generation's pods, before
        the first is created: a refusal fails the job (rejected) with nothing half-created. False when refused."""
        generation = max((a.generation for a in [*workers, *spares]), default=-1)
        if generation in self.judged.get(job.uid, ()):
            return True
        manifests = [] if job.uid in self.shared_ready else builders.shared_manifests(job, spec)
        if creates_store:
            manifests.append(builders.store_pod(job, spec))
        manifests += [builders.worker_pod(job, spec, index=a.index, generation=a.generation, attempt=a.attempt,
                                          progress=self.progress_endpoint, avoid_nodes=a.avoid_nodes) for a in workers]
        manifests += [builders.spare_pod(job, spec, serial=a.slot, generation=a.generation,
                                         progress=self.progress_endpoint) for a in spares]
        judged = await asyncio.gather(*(self._create(job, m, now, dry_run=True) for m in manifests))
        if all(judged):
            self.judged.setdefault(job.uid, set()).add(generation)
        return all(judged)

    async def _ensure_shared(self, job: builders.JobRef, spec: model.DDPJobSpec, now: datetime) -> bool:
        if job.uid in self.shared_ready:
            return True
        created = await asyncio.gather(*(self._create(job, m, now) for m in builders.shared_manifests(job, spec)))
        if all(created):
            self.shared_ready.add(job.uid)
        return all(created)

    async def _create(self, job: builders.JobRef, manifest: dict[str, Any], now: datetime, *,
                      dry_run: bool = False) -> bool:
        """Create one object (or have the server judge it: dry_run); False when the API server refused it for a
        reason retrying now cannot fix (admission, validation, quota, a name owned by another object): the
        decision layer gets it, with the DDPJob field the refusal came from."""
        name = manifest["metadata"]["name"]
        refused = self.rejected.get(job.uid, {})
        try:
            await self.api.create(manifest, dry_run=dry_run)
        except kube.ApiError as exc:
            if exc.status not in REFUSED_STATUSES or (exc.status == 409 and not isinstance(exc, kube.NotOwned)):
                raise
            field = server_fields.ddpjob_field(manifest["kind"], exc.message, store_pod=(
                (manifest["metadata"].get("labels") or {}).get(builders.LABEL_ROLE) == builders.ROLE_STORE))
            message = f"{exc.message} (from DDPJob field {field})" if field else exc.message  # kept when shortened
            refused[name] = decisions.CreateRejected(manifest["kind"], name, exc.status, exc.reason, message,
                                                     now, not_owned=isinstance(exc, kube.NotOwned))
            self.rejected[job.uid] = refused
            self.trigger((job.namespace, job.name))  # decide on it now, not at the next event
            return False
        refused.pop(name, None)
        return True

    def _post_event(self, job: builders.JobRef, event: decisions.Event, now: datetime) -> None:
        """Events are best effort and must not slow the reconcile down."""
        async def post() -> None:
            try:
                await self.api.post_event({"name": job.name, "namespace": job.namespace, "uid": job.uid},
                                          event.type, event.reason, event.message, decisions.rfc3339(now))
            except RETRYABLE_ERRORS as exc:
                logger.info("could not post event %s for %s/%s: %s", event.reason, job.namespace, job.name, exc)
        (logger.warning if event.type == "Warning" else logger.info)(
            "%s/%s %s: %s", job.namespace, job.name, event.reason, event.message)
        task = asyncio.get_running_loop().create_task(post())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)


def _read_ca(path: str) -> str:
    """The CA (PEM) workers verify the progress endpoint with; "" without one (or unreadable: said loudly,
    since workers then cannot verify an https endpoint)."""
    if not path:
        return ""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        logger.error("progress endpoint: cannot read the CA %s (workers cannot verify the endpoint): %s", path, exc)
        return ""


def _condition(status: model.DDPJobStatus, type_: str) -> model.Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def _pod_name(job: builders.JobRef, action: decisions.DeleteWorker | decisions.DeleteStore) -> str:
    return action.name if isinstance(action, decisions.DeleteWorker) else builders.store_pod_name(job.name)


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
        return len(controller.jobs)

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
        controller.pods = ddpjob_pods
        controller.job_event(type, body)

    @kopf.on.event("", "v1", "pods", id="pod_event", labels=OWNED_PODS, registry=registry)
    async def pod_event(namespace: str, labels: Mapping[str, str], ddpjob_pods: kopf.Index[Any, Any],
                        **_: Any) -> None:
        controller.pods = ddpjob_pods
        controller.pod_event(namespace, labels)

    return registry
