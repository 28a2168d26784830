"""A worker's trainer log through the API server, followed across the rank's replacement pods."""

from __future__ import annotations

from typing import Any, Iterator

from .. import kube, naming, object_names
from .errors import ApiError, InvalidArgument, LogsUnavailable, checked_name
from .job import TERMINAL_PHASES, Job
from .transport import Transport
from .waits import changes, read


def checked_rank(rank: Any) -> int:
    """A worker's replica index is a whole number (an int, not a bool, a float or a string of digits): it goes
    into the pod's name, and so into a URL."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise InvalidArgument(f"rank {rank!r} is a {type(rank).__name__}, not a whole number. Fix: pass the "
                              f"worker's replica index as an int (status.ranks[].index: 0, 1, ...)")
    return rank


def checked_tail_lines(tail_lines: Any) -> int | None:
    if tail_lines is not None and (isinstance(tail_lines, bool) or not isinstance(tail_lines, int) or tail_lines < 0):
        raise InvalidArgument(f"tail_lines {tail_lines!r} is not a whole number >= 0. Fix: pass how many of the "
                              f"last lines to show as an int, or None for the whole log")
    return tail_lines


def worker_pod(transport: Transport, namespace: str, name: str, rank: int) -> str:
    """The pod of worker `rank` (status.ranks[].index, `<job>-worker-<rank>`), checked against the spec."""
    job = read(transport, namespace, name)
    replicas = (job.raw.get("spec") or {}).get("replicas", 1)
    top = max(replicas, (job.raw.get("spec") or {}).get("maxReplicas") or replicas)
    if not 0 <= rank < top:
        raise LogsUnavailable(f"ddpjob {job.namespace}/{name} has no rank {rank}. Fix: pick a rank in 0..{top - 1}")
    ranked = next((r.pod for r in job.status.ranks if r.index == rank), None)
    return _rank_pod(job, ranked) if ranked else naming.worker_name(name, rank)


def lines(transport: Transport, namespace: str, name: str, rank: int, *, follow: bool, tail_lines: int | None,
          previous: bool) -> Iterator[str]:
    """The trainer log lines of one worker pod; `follow`: until the job ends, moving on to a replacement pod
    when this rank's pod is replaced."""
    pod = worker_pod(transport, namespace, name, rank)
    while True:
        uid = _pod_uid(transport, namespace, pod) if follow else None
        params = {"container": naming.TRAINER_CONTAINER, "follow": "true" if follow else None,
                  "tailLines": tail_lines, "previous": "true" if previous else None}
        try:
            with transport.open("GET", kube.PODS.path(namespace, pod, "log"), params=params,
                                timeout=None if follow else transport.request_timeout,
                                what=f"logs of {pod}") as stream:
                for raw in stream:
                    yield raw.decode(errors="replace").rstrip("\n")
        except ApiError as exc:
            if exc.status == 404:
                raise LogsUnavailable(f"pod {pod} (rank {rank} of ddpjob {namespace}/{name}) does not exist (404). "
                                      f"Fix: wait until the job runs (`ddpjob status {name}`)") from None
            if exc.status == 400:
                raise LogsUnavailable(f"pod {pod} (rank {rank} of ddpjob {namespace}/{name}) has no log yet: "
                                      f"{exc.message}. Fix: wait until it runs (`ddpjob status {name}`)") from None
            raise
        if not follow:
            return
        # This pod's container ended: stop with the job, or go on with the rank's replacement pod.
        replacement = _next_pod(transport, namespace, name, rank, uid)
        if replacement is None:
            return
        pod, tail_lines = replacement, None


def _pod_uid(transport: Transport, namespace: str, pod: str) -> str | None:
    try:
        return transport.call("GET", kube.PODS.path(namespace, pod))["metadata"]["uid"]
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _next_pod(transport: Transport, namespace: str, name: str, rank: int, old_uid: str | None) -> str | None:
    """After a followed log ended: None once the job ended, else the rank's next pod once it runs."""
    for job in changes(transport, namespace, name, None):
        if job.phase in TERMINAL_PHASES:
            return None
        current = next((r for r in job.status.ranks if r.index == rank), None)
        if current is not None and current.phase in ("Running", "Succeeded", "Failed"):
            pod = _rank_pod(job, current.pod)
            uid = current.uid or _pod_uid(transport, namespace, pod)
            if uid is not None and uid != old_uid:
                return pod
    return None


def _rank_pod(job: Job, pod: str) -> str:
    """A rank's pod as the job's status names it, checked before it goes into a URL (the status is data)."""
    return checked_name(pod, object_names.POD_NAME, f"ddpjob {job.namespace}/{job.name} status.ranks[].pod")
