"""The reconciler: one pass over one job. It observes (the job cache's snapshot and pods, the progress
reports, the kubelet's FailedMount Events of pods that cannot start), asks `decisions.decide()`, and
hands the new status and the actions on to the actuator, in the order that keeps a crash in between
harmless: a status that charges restarts or moves a generation goes on record before the pods it
accounts for change. The pass the work queue runs (`run`) also turns a pass that raised into the job's
ReconcileError condition and Warning Event, retried with backoff, so one job's bug never stops the others.

Imports decisions, kube (reads, errors), leader (NotLeader), model, naming, observations, the job cache, the actuator
and progress (public names); never kopf or the controller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from datetime import datetime
from typing import Any, Callable

from . import decisions, kube, leader, model, naming, observations, progress
from .actuator import Actuator
from .job_cache import JobCache, JobKey
from .metrics import Metrics
from .settings import Settings

logger = logging.getLogger("ddpjob_operator")

# Any other exception in one job's reconcile (a bug, a value the code cannot represent) becomes that job's
# condition and Warning Event, and the reconcile is retried with backoff; other jobs are untouched.
CONDITION_RECONCILE_ERROR = "ReconcileError"
REASON_RECONCILE_ERROR = "ReconcileError"
REASON_RECONCILED = "Reconciled"
ERROR_BACKOFF_MAX_SECONDS = 300.0


def decision_options(settings: Settings) -> decisions.Options:
    return decisions.Options(stuck_terminating_seconds=settings.stuck_terminating_seconds,
                             cannot_start_seconds=settings.cannot_start_seconds,
                             incident_settle_seconds=settings.incident_settle_seconds,
                             silent_peer_settle_seconds=settings.silent_peer_settle_seconds,
                             unreported_warning_seconds=settings.unreported_warning_seconds,
                             # A spare learns its assignment from the progress endpoint.
                             spares_enabled=bool(settings.progress_url))


class Reconciler:
    def __init__(self, api: kube.Kube, cache: JobCache, actuator: Actuator, tracker: progress.ProgressTracker,
                 settings: Settings, metrics: Metrics, *, clock: Callable[[], datetime],
                 leading: Callable[[], bool], requeue: Callable[[JobKey, float], None]):
        self.api, self.cache, self.actuator, self.tracker = api, cache, actuator, tracker  # api: reads only
        self.settings, self.metrics, self.clock, self.leading, self.requeue = settings, metrics, clock, leading, requeue
        self.options = decision_options(settings)
        self._failures: dict[JobKey, int] = {}  # consecutive unexpected reconcile errors, for the backoff

    def forget(self, key: JobKey) -> None:
        self._failures.pop(key, None)

    # ------------------------------------------------------------ the work queue's pass

    async def run(self, key: JobKey) -> None:
        """One pass, whatever it raises: retried (a fenced replica's pass is the new leader's to redo)."""
        started = time.perf_counter()
        try:
            await self.reconcile(key)
        except leader.NotLeader:
            return  # fenced mid-reconcile: the leader redoes it
        except kube.RETRYABLE_ERRORS as exc:
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
                except kube.RETRYABLE_ERRORS as exc:
                    logger.warning("could not clear the reconcile error of %s/%s: %s", *key, exc)
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    async def _report_error(self, key: JobKey, exc: Exception) -> None:
        """The job's ReconcileError condition (True) and a Warning Event, once per distinct message."""
        body = self.cache.get(key)
        if body is None or not self.leading():
            return
        now = self.clock()
        message = decisions.short_message(f"the operator failed to reconcile this job and retries with backoff: "
                                          f"{type(exc).__name__}: {exc}") or type(exc).__name__
        job = naming.JobRef(key[1], key[0], body["metadata"].get("uid", ""))
        if await self._set_error_condition(job, body, "True", REASON_RECONCILE_ERROR, message, now) is not None:
            self.actuator.post_event(job, decisions.Event("Warning", REASON_RECONCILE_ERROR, message), now)

    async def _clear_error(self, key: JobKey) -> None:
        """A reconcile went through after failing: the ReconcileError condition turns False."""
        body = self.cache.get(key)
        if body is None:
            return
        job = naming.JobRef(key[1], key[0], body["metadata"].get("uid", ""))
        await self._set_error_condition(job, body, "False", REASON_RECONCILED,
                                        "the operator reconciles this job again", self.clock())

    async def _set_error_condition(self, job: naming.JobRef, body: dict[str, Any], value: str, reason: str,
                                   message: str, now: datetime) -> bool | None:
        """Write the ReconcileError condition; None when it says so already (True with this message, or
        not True when it is to be cleared), else whether the write found the job."""
        stored = self.cache.stored_status(body)
        previous = next((c for c in stored.conditions if c.type == CONDITION_RECONCILE_ERROR), None)
        if value == "True" and previous is not None and previous.status == "True" and previous.message == message:
            return None
        if value == "False" and (previous is None or previous.status != "True"):
            return None
        status = stored.model_copy(deep=True)
        status.conditions = decisions.set_condition(status.conditions, CONDITION_RECONCILE_ERROR, value, reason,
                                                    message, now, int(body["metadata"].get("generation") or 1))
        patch = kube.merge_patch(stored.wire(), status.wire())
        return bool(patch) and await self.actuator.write_status(job, stored, status, patch)

    # ------------------------------------------------------------ one reconcile

    async def reconcile(self, key: JobKey) -> None:
        body = self.cache.get(key)
        if body is None or not self.leading():
            return
        uid = body["metadata"].get("uid", "")
        view = observations.job_view(body, self.cache.written.get(uid), self.cache.parsed_spec(uid, body))
        now = self.clock()
        pods = await self._with_mount_failures(key[0], self.cache.pods_of(key[0], uid), now)
        observed = observations.observe(pods, now, self.actuator.refusals(uid), job_uid=uid)
        # A worker that finished sent its last report before it exited: published now, so the write that
        # may say Succeeded carries the final step.
        finished = any(w.phase == "Succeeded" for w in observed.workers)
        observed = dataclasses.replace(observed, progress=self.tracker.observation(uid, now, final=finished))
        decision = decisions.decide(view, observed, self.options)
        decision = dataclasses.replace(decision, status=self._heartbeat(decision.status, now))
        # Diff against what the server holds: our last write, or the stored status after a restart.
        stored = self.cache.written[uid].wire() if uid in self.cache.written else dict(body.get("status") or {})
        patch = kube.merge_patch(stored, decision.status.wire())
        job = naming.JobRef(view.name, view.namespace, view.uid)
        actions = self.actuator.execute(view, decision.actions, observed.now, {p.name: p.uid for p in pods})
        if not patch:
            await actions
        elif decisions.accounting(view.status) != decisions.accounting(decision.status):
            # Charged restarts, generations and rank counters go on record before the pods they
            # account for change, so a crash in between never charges one failure twice.
            try:
                written = await self.actuator.write_status(job, view.status, decision.status, patch)
            except BaseException:
                actions.close()  # never started: the pass is retried once the status write goes through
                raise
            if not written:
                actions.close()
                return  # the job is gone; its children go with it
            await actions
        else:
            await asyncio.gather(self.actuator.write_status(job, view.status, decision.status, patch), actions)
        self.metrics.job_phase(uid, decision.status.phase)
        self.metrics.job_world(uid, view.namespace, view.name, decision.status)
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

    async def _with_mount_failures(self, namespace: str, pods: tuple[observations.PodSummary, ...],
                                   now: datetime) -> tuple[observations.PodSummary, ...]:
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
