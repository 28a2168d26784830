"""The actuator: every API write of a reconcile pass. It carries out the decision layer's actions (pods
deleted, then the job's shared objects, store, workers and spares created, the job deleted, Events
posted) and writes statuses, and it remembers what the API server made of its creations: which job's
shared objects exist, which generations the server judged (dryRun=All) before the first creation, and
which creations it refused (the decision layer gets those as `CreateRejected`).

It decides nothing: what to create or delete comes from `decisions.decide()`, the objects from
job_manifests. Imports decisions, job_manifests, kube, model, naming, server_fields, the job cache (the statuses it
wrote) and side_tasks; never kopf, the reconciler or the controller.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any, Awaitable, Callable, Iterable, Mapping

from . import decisions, job_manifests, kube, model, naming, server_fields
from .job_cache import JobKey, WrittenStatuses
from .metrics import Metrics
from .side_tasks import SideTasks

logger = logging.getLogger("ddpjob_operator")

# Creation failures the operator reports through the job instead of retrying at once: bad request,
# admission (webhooks, pod security, quota), a name owned by someone else, validation, throttling,
# and 404: an API the cluster does not serve (a gang scheduler's PodGroup without its CRD).
REFUSED_STATUSES = frozenset({400, 403, 404, 409, 422, 429})


class Actuator:
    def __init__(self, api: kube.Kube, written: WrittenStatuses, metrics: Metrics, side_tasks: SideTasks, *,
                 progress_endpoint: job_manifests.ProgressEndpoint | None, on_refused: Callable[[JobKey], None],
                 clock: Callable[[], datetime]):
        self.api, self.written, self.metrics, self.side_tasks = api, written, metrics, side_tasks
        # A refusal is dated when the server answered, not when the pass began: under load a pass's judging
        # takes a while, and a retry backed off from the pass's start came sooner than the backoff.
        self.clock = clock
        self.progress_endpoint = progress_endpoint  # what workers report to (None: no progress endpoint)
        self.on_refused = on_refused  # a creation was refused: the job's next pass decides on it
        self.shared_ready: set[str] = set()  # job uids whose Services / claim exist
        # Generations whose objects the API server judged (dryRun=All) before any was created, per job uid.
        self.judged: dict[str, set[int]] = {}
        # Creations the API server refused, per job uid and object name, until one succeeds.
        self.rejected: dict[str, dict[str, decisions.CreateRejected]] = {}

    # ------------------------------------------------------------ what it remembers

    def refusals(self, uid: str) -> tuple[decisions.CreateRejected, ...]:
        return tuple(self.rejected.get(uid, {}).values())

    def retry_refused(self, uid: str) -> None:
        """The user changed the spec: creations refused before are tried again."""
        self.rejected.pop(uid, None)

    def forget(self, uid: str) -> None:
        self.shared_ready.discard(uid)
        self.judged.pop(uid, None)
        self.rejected.pop(uid, None)

    def forget_all(self) -> None:
        """A new leader: another replica may have created or been refused anything since."""
        self.shared_ready.clear()
        self.judged.clear()
        self.rejected.clear()

    # ------------------------------------------------------------ status and events

    async def write_status(self, job: naming.JobRef, old: model.DDPJobStatus, new: model.DDPJobStatus,
                           patch: dict[str, Any]) -> bool:
        """Merge-patch the status from `old` (what the server holds) to `new`; False when the job is gone."""
        if not await self.api.patch_status(job.namespace, job.name, patch):
            return False
        self.written[job.uid] = new
        self._count(old, new)
        return True

    def post_event(self, job: naming.JobRef, event: decisions.Event, now: datetime) -> None:
        """Logged, and posted beside the pass: Events are best effort and must not slow it down."""
        async def post() -> None:
            try:
                await self.api.post_event({"name": job.name, "namespace": job.namespace, "uid": job.uid},
                                          event.type, event.reason, event.message, decisions.rfc3339(now))
            except kube.RETRYABLE_ERRORS as exc:
                logger.info("could not post event %s for %s/%s: %s", event.reason, job.namespace, job.name, exc)
        (logger.warning if event.type == "Warning" else logger.info)(
            "%s/%s %s: %s", job.namespace, job.name, event.reason, event.message)
        self.side_tasks.spawn(post(), f"posting event {event.reason} for {job.namespace}/{job.name}")

    def _count(self, old: model.DDPJobStatus, new: model.DDPJobStatus) -> None:
        if new.restarts > old.restarts:
            self.metrics.restarts.inc(new.restarts - old.restarts)
        if new.disruptions > old.disruptions:
            self.metrics.disruptions.inc(new.disruptions - old.disruptions)
        # An incident is the same one while its recovery is filled in: known by its generation and start.
        known = {(i.generation, i.time, i.reason) for i in old.incidents}
        stalls = [i for i in new.incidents
                  if i.reason == decisions.REASON_STALLED and (i.generation, i.time, i.reason) not in known]
        if stalls:
            self.metrics.stalls.inc(len(stalls))
        self.metrics.recovered(decisions.recovered(old, new))  # once per incident: `old` is what the server held

    # ------------------------------------------------------------ actions

    async def execute(self, view: decisions.JobView, actions: tuple[decisions.Action, ...], now: datetime,
                      pod_uids: Mapping[str, str]) -> None:
        job = naming.JobRef(view.name, view.namespace, view.uid)
        spec = view.spec
        # Deletes first: a replacement may reuse the name of a pod removed in the same pass. Each
        # names the uid this pass observed, so a stale view never deletes that replacement.
        await _all(self.api.delete(kube.PODS, job.namespace, name, grace_seconds=0 if a.force else None,
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
                    (not creates_store or await self._create(job, job_manifests.store_pod(job, spec), now)):
                worker_pods, spare_pods = self._pods(job, spec, workers, spares)
                await _all(self._create(job, m, now) for m in worker_pods)
                await _all(self._create(job, m, now) for m in spare_pods)
        if any(isinstance(a, decisions.DeleteJob) for a in actions):
            await self.api.delete(kube.DDPJOBS, job.namespace, job.name)
        # Events after the pod calls: they are informational and must not queue ahead of them.
        for event in (a for a in actions if isinstance(a, decisions.Event)):
            self.post_event(job, event, now)

    def _pods(self, job: naming.JobRef, spec: model.DDPJobSpec, workers: list[decisions.CreateWorker],
              spares: list[decisions.CreateSpare]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The worker pods and the spare pods these actions create."""
        return ([job_manifests.worker_pod(job, spec, index=a.index, generation=a.generation, attempt=a.attempt,
                                          progress=self.progress_endpoint, avoid_nodes=a.avoid_nodes) for a in workers],
                [job_manifests.spare_pod(job, spec, serial=a.slot, generation=a.generation,
                                         progress=self.progress_endpoint) for a in spares])

    async def _judged(self, job: naming.JobRef, spec: model.DDPJobSpec, workers: list[decisions.CreateWorker],
                      spares: list[decisions.CreateSpare], creates_store: bool, now: datetime) -> bool:
        """The API server judges (dryRun=All) every object of a new job, and each new generation's pods, before
        the first is created: a refusal fails the job (rejected) with nothing half-created. False when refused."""
        generation = max((a.generation for a in [*workers, *spares]), default=-1)
        if generation in self.judged.get(job.uid, ()):
            return True
        manifests = [] if job.uid in self.shared_ready else job_manifests.shared_manifests(job, spec)
        if creates_store:
            manifests.append(job_manifests.store_pod(job, spec))
        worker_pods, spare_pods = self._pods(job, spec, workers, spares)
        manifests += worker_pods + spare_pods
        judged = await asyncio.gather(*(self._create(job, m, now, dry_run=True) for m in manifests))
        if all(judged):
            self.judged.setdefault(job.uid, set()).add(generation)
        return all(judged)

    async def _ensure_shared(self, job: naming.JobRef, spec: model.DDPJobSpec, now: datetime) -> bool:
        if job.uid in self.shared_ready:
            return True
        created = await asyncio.gather(*(self._create(job, m, now) for m in job_manifests.shared_manifests(job, spec)))
        if all(created):
            self.shared_ready.add(job.uid)
        return all(created)

    async def _create(self, job: naming.JobRef, manifest: dict[str, Any], now: datetime, *,
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
                (manifest["metadata"].get("labels") or {}).get(naming.LABEL_ROLE) == naming.ROLE_STORE))
            message = f"{exc.message} (from DDPJob field {field})" if field else exc.message  # kept when shortened
            refused[name] = decisions.CreateRejected(manifest["kind"], name, exc.status, exc.reason, message,
                                                     max(now, self.clock()), not_owned=isinstance(exc, kube.NotOwned))
            self.rejected[job.uid] = refused
            self.on_refused((job.namespace, job.name))  # decide on it now, not at the next event
            return False
        refused.pop(name, None)
        return True


async def _all(calls: Iterable[Awaitable[Any]]) -> None:
    """Run API calls concurrently; raise the first failure after all have finished."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]


def _pod_name(job: naming.JobRef, action: decisions.DeleteWorker | decisions.DeleteStore) -> str:
    return action.name if isinstance(action, decisions.DeleteWorker) else naming.store_pod_name(job.name)
