"""Kubernetes objects -> the decision layer's inputs (JobView, WorkerObservation, StoreObservation).

The only place that knows how a pod body says "failed with exit code 137, evicted, terminating".
Pure: bodies in, frozen values out.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from pydantic import ValidationError

from . import decisions, model, naming
from .validation import FieldError, InvalidJob, parse_spec

# Pod status reasons set when the node or the control plane, not the program, ended the pod.
DISRUPTION_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "NodeShutdown", "Shutdown", "Terminated",
                                "DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet"})
# Container reasons the kubelet writes when the node, not the program, ended it: a node that comes back
# after losing its containers reports them Failed, exit 137, ContainerStatusUnknown.
CONTAINER_DISRUPTION_REASONS = frozenset({"ContainerStatusUnknown"})


@dataclass(frozen=True, slots=True)
class PodSummary:
    """What the operator needs of one of its pods (kept in kopf's index; cheap to compare).

    Slotted, with its few-valued strings interned: one is kept per pod for the operator's lifetime
    (bench/operator_memory.py)."""

    name: str
    uid: str  # a delete names it as a precondition: never the newer pod that reuses the name
    role: str
    index: int
    generation: int
    attempt: int
    phase: str
    ready: bool
    exit_code: int | None
    reason: str | None
    message: str | None
    disruption: bool
    terminating_since: datetime | None
    node: str | None
    started_at: datetime | None
    finished_at: datetime | None
    waiting: decisions.Waiting | None = None
    node_range: str | None = None
    unschedulable: decisions.Waiting | None = None
    controller_uid: str = ""  # the uid of its controller ownerReference when that is a DDPJob, else ""


def controller_uid(meta: Mapping[str, Any]) -> str:
    """The DDPJob that controls the pod (ownerReference with controller: true), as the Job controller
    decides ownership: labels alone are anyone's to copy onto a pod of their own."""
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") is True and ref.get("kind") == model.KIND \
                and str(ref.get("apiVersion", "")).split("/")[0] == model.GROUP:
            return str(ref.get("uid") or "")
    return ""


def _int_label(labels: Mapping[str, str], key: str) -> int:
    try:
        return int(labels.get(key, "0"))
    except ValueError:
        return 0


def _container_status(status: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for cs in status.get("containerStatuses") or ():
        if cs.get("name") == container:
            return cs
    return {}


def _init_container_problem(status: Mapping[str, Any], meta: Mapping[str, Any]) -> decisions.Waiting | None:
    """An init container waiting on a reason that never clears by itself (a bad image, a missing secret)."""
    for cs in status.get("initContainerStatuses") or ():
        wait = (cs.get("state") or {}).get("waiting") or {}
        if wait.get("reason") in decisions.CANNOT_START_REASONS:
            since = decisions.parse_time(status.get("startTime") or meta.get("creationTimestamp"))
            if since is not None:
                detail = f": {wait['message']}" if wait.get("message") else ""
                return decisions.Waiting(wait["reason"], f"init container {cs.get('name')}{detail}", since)
    return None


def _init_container_failure(status: Mapping[str, Any]) -> str | None:
    """Why a pod failed before its trainer ran: the init container that exited non-zero."""
    for cs in status.get("initContainerStatuses") or ():
        ended = (cs.get("state") or {}).get("terminated") or {}
        if ended.get("exitCode"):
            reason = f" ({ended['reason']})" if ended.get("reason") else ""
            return f"init container {cs.get('name')} exited with code {ended['exitCode']}{reason}"
    return None


def _interned(value: str | None) -> str | None:
    return sys.intern(value) if isinstance(value, str) else value


def summarize_pod(body: Mapping[str, Any]) -> PodSummary:
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    labels = meta.get("labels") or {}
    role = labels.get(naming.LABEL_ROLE, naming.ROLE_WORKER)
    container = naming.STORE_CONTAINER if role == naming.ROLE_STORE else naming.TRAINER_CONTAINER
    container_status = _container_status(status, container)
    state = container_status.get("state") or {}
    terminated = state.get("terminated") or {}
    # lastState holds the previous run's end once a container has been restarted in place.
    last_terminated = (container_status.get("lastState") or {}).get("terminated") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    disruption_condition = conditions.get("DisruptionTarget", {}).get("status") == "True"
    # The control plane's word on why (EvictionByEvictionAPI, PreemptionByScheduler, DeletionByTaintManager, ...).
    disruption_reason = conditions["DisruptionTarget"].get("reason") if disruption_condition else None
    pod_reason = status.get("reason")
    # deletionTimestamp is when the grace period ends: a pod checkpointing on SIGTERM is not
    # "stuck" before then, so the stuck-terminating timeout counts from there.
    terminating_since = decisions.parse_time(meta.get("deletionTimestamp"))
    exit_code = terminated.get("exitCode")
    waiting_state = state.get("waiting") or {}
    waiting = None
    if waiting_state.get("reason"):
        # The kubelet gives no time for the waiting state: count from when it took the pod.
        since = decisions.parse_time(status.get("startTime") or meta.get("creationTimestamp"))
        if since is not None:
            waiting = decisions.Waiting(waiting_state["reason"], waiting_state.get("message"), since)
    init = _init_container_problem(status, meta)
    if init is not None and (waiting is None or waiting.reason == "PodInitializing"):
        waiting = init  # an init container (or native sidecar) that cannot start holds the trainer back
    scheduled = conditions.get("PodScheduled", {})
    unschedulable = None
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        since = decisions.parse_time(scheduled.get("lastTransitionTime") or meta.get("creationTimestamp"))
        if since is not None:
            unschedulable = decisions.Waiting("Unschedulable", scheduled.get("message"), since)
    return PodSummary(
        name=meta.get("name", ""),
        uid=meta.get("uid") or "",
        role=sys.intern(role),
        index=_int_label(labels, naming.LABEL_REPLICA_INDEX),
        generation=_int_label(labels, naming.LABEL_GENERATION),
        attempt=_int_label(labels, naming.LABEL_ATTEMPT),
        phase=sys.intern(status.get("phase") or "Pending"),
        ready=conditions.get("Ready", {}).get("status") == "True",
        exit_code=int(exit_code) if exit_code is not None else None,
        reason=disruption_reason or pod_reason or terminated.get("reason"),
        # The launcher's termination message (or the log tail); else the pod's own (an eviction's).
        message=terminated.get("message") or last_terminated.get("message") or status.get("message")
        or _init_container_failure(status),
        disruption=disruption_condition or pod_reason in DISRUPTION_REASONS
        or terminated.get("reason") in CONTAINER_DISRUPTION_REASONS,
        terminating_since=terminating_since,
        node=_interned(spec.get("nodeName")),
        started_at=decisions.parse_time((state.get("running") or {}).get("startedAt") or terminated.get("startedAt")),
        finished_at=decisions.parse_time(terminated.get("finishedAt")),
        waiting=waiting,
        node_range=_interned(labels.get(naming.LABEL_NNODES)),
        unschedulable=unschedulable,
        controller_uid=controller_uid(meta),
    )


def worker_observation(pod: PodSummary) -> decisions.WorkerObservation:
    return decisions.WorkerObservation(
        index=pod.index, name=pod.name, uid=pod.uid, generation=pod.generation, phase=pod.phase, attempt=pod.attempt,
        ready=pod.ready, exit_code=pod.exit_code, reason=pod.reason, message=pod.message,
        disruption=pod.disruption,
        terminating_since=pod.terminating_since, node=pod.node, started_at=pod.started_at,
        finished_at=pod.finished_at, waiting=pod.waiting, node_range=pod.node_range,
        unschedulable=pod.unschedulable)


def observe(pods: Iterable[PodSummary], now: datetime,
            rejected: tuple[decisions.CreateRejected, ...] = (), job_uid: str | None = None) -> decisions.Observed:
    """`job_uid`: only pods that job controls are observed (never counted, reported or charged otherwise)."""
    workers, spares, store = [], [], None
    for pod in pods:
        if job_uid is not None and pod.controller_uid != job_uid:
            continue
        if pod.role == naming.ROLE_STORE:
            store = decisions.StoreObservation(phase=pod.phase, ready=pod.ready, reason=pod.reason,
                                               terminating_since=pod.terminating_since, waiting=pod.waiting,
                                               unschedulable=pod.unschedulable)
        elif pod.role == naming.ROLE_SPARE:
            spares.append(dataclasses.replace(worker_observation(pod), index=-1))
        else:
            workers.append(worker_observation(pod))
    workers.sort(key=lambda w: (w.index, w.generation))
    return decisions.Observed(workers=tuple(workers), store=store, now=now, rejected=rejected,
                              spares=tuple(sorted(spares, key=lambda s: s.name)))


def parse_status(raw: Any) -> model.DDPJobStatus:
    """The stored status, keeping every valid field.

    Unknown keys (a newer operator's, anyone else's) are ignored and an invalid field is dropped
    alone, as is a bad entry of `conditions` or `ranks`: one odd key must never turn a Succeeded job
    back into a fresh one with a full restart budget. Only what is unreadable is rebuilt from the pods.
    """
    try:
        return model.salvage(model.DDPJobStatus, raw) or model.DDPJobStatus()
    except ValidationError:  # salvage keeps only validated values; never expected
        return model.DDPJobStatus()


ParsedSpec = tuple[model.DDPJobSpec | None, tuple[FieldError, ...]]


def parse_body_spec(body: Mapping[str, Any]) -> ParsedSpec:
    try:
        return parse_spec(body.get("spec")), ()
    except InvalidJob as exc:
        return None, tuple(exc.errors)


def job_view(body: Mapping[str, Any], status: model.DDPJobStatus | None = None,
             parsed: ParsedSpec | None = None) -> decisions.JobView:
    """`status` overrides the body's: the operator's own last write may be newer than the watch.
    `parsed` is the spec already parsed (parsing runs every CEL rule: worth caching)."""
    meta = body.get("metadata") or {}
    spec, errors = parsed if parsed is not None else parse_body_spec(body)
    return decisions.JobView(
        name=meta["name"], namespace=meta.get("namespace") or "default", uid=meta.get("uid") or "",
        metadata_generation=int(meta.get("generation") or 1),
        created_at=decisions.parse_time(meta.get("creationTimestamp")) or datetime.fromtimestamp(0, timezone.utc),
        spec=spec, spec_errors=errors,
        status=status if status is not None else parse_status(body.get("status")),
        deleting=bool(meta.get("deletionTimestamp")),
    )
