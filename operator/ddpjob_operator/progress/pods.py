"""The operator's pod index lookups behind the endpoint: which worker (job, replica index, generation) a
token's pod is, and what a warm spare is told. A pod is found by name and uid among the pods the job
controls (ownerReference), never by labels alone, which are anyone's to copy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .. import naming
from .auth import Identity
from .reports import Report


@dataclass(frozen=True)
class Worker:
    """The operator's view of the pod a token is bound to, when it is a worker of the job in the URL."""

    uid: str  # the job's
    index: int
    generation: int


def attributed_generation(worker: Worker, report: Report) -> int:
    """The generation a report counts for: the one the operator says its pod serves, or an older one its
    trainer says it runs in (a survivor's trainer of the generation before, reporting once more as it stops).
    The body can only lower it: a pod never speaks for a generation the operator has not given it."""
    return report.attributed_to(worker.generation)


def _own_pod(pods: Mapping[tuple[str, str], Any], body: Mapping[str, Any], namespace: str,
             identity: Identity) -> Any:
    """The identity's pod, by name and uid, among the job's pods (whose controller ownerReference is the
    job: labels alone are anyone's to copy)."""
    uid = (body.get("metadata") or {}).get("uid", "")
    for pod in pods.get((namespace, uid), ()) or ():
        if pod.name == identity.pod_name and pod.uid == identity.pod_uid and uid and pod.controller_uid == uid:
            return pod
    return None


def _rank_of(body: Mapping[str, Any], pod_uid: str) -> Mapping[str, Any] | None:
    """The status rank whose pod this is (a survivor carried along, a spare that took a rank's place)."""
    return next((r for r in (body.get("status") or {}).get("ranks") or () if r.get("uid") == pod_uid), None)


def find_worker_in(pods: Mapping[tuple[str, str], Any], jobs: Mapping[tuple[str, str], Mapping[str, Any]],
                   namespace: str, name: str, identity: Identity, worker_role: str) -> Worker | None:
    """The operator's pod index lookup: the identity's pod among the job's workers, or a spare the status
    names as a rank's pod."""
    body = jobs.get((namespace, name))
    pod = _own_pod(pods, body, namespace, identity) if body is not None else None
    if pod is None:
        return None
    uid = body["metadata"]["uid"]
    if pod.role == worker_role:
        return Worker(uid=uid, index=pod.index, generation=served_generation(body, pod.index, pod.uid, pod.generation))
    rank = _rank_of(body, pod.uid) if pod.role == naming.ROLE_SPARE else None
    if rank is not None and isinstance(rank.get("generation"), int):
        return Worker(uid=uid, index=rank["index"], generation=rank["generation"])
    return None


def assignment_in(pods: Mapping[tuple[str, str], Any], jobs: Mapping[tuple[str, str], Mapping[str, Any]],
                  namespace: str, name: str, identity: Identity,
                  spec_of: Callable[[Mapping[str, Any]], Any]) -> dict[str, Any] | None:
    """What a spare is told: the rank whose place the status gives it, that generation's rendezvous id and
    node range; None while it has none (or is not this job's spare). `spec_of(body)`: the parsed spec."""
    body = jobs.get((namespace, name))
    pod = _own_pod(pods, body, namespace, identity) if body is not None else None
    if pod is None or pod.role != naming.ROLE_SPARE:
        return None
    rank = _rank_of(body, pod.uid)
    if rank is None or not isinstance(rank.get("generation"), int) or rank.get("pod") != pod.name:
        return None
    spec = spec_of(body)
    if spec is None:
        return None
    generation = rank["generation"]
    return {"index": rank["index"], "generation": generation, "nnodes": naming.nnodes(spec),
            "rdzvId": naming.rendezvous_id(body["metadata"]["uid"], generation)}


def generation_in(pods: Mapping[tuple[str, str], Any], jobs: Mapping[tuple[str, str], Mapping[str, Any]],
                  namespace: str, name: str, identity: Identity, worker_role: str,
                  spec_of: Callable[[Mapping[str, Any]], Any]) -> dict[str, Any] | None:
    """What a worker's agent is told (agent.worker.follow_operator): the generation in use, its rendezvous id and
    node range, when the operator carried this worker into it (a scale down starts no pod whose agent would
    publish it). None while the pod does not serve the generation in use, or the status was decided under an
    older spec (the node range is the spec's: that of a generation decided before a new `replicas` is not)."""
    body = jobs.get((namespace, name))
    worker = find_worker_in(pods, jobs, namespace, name, identity, worker_role)
    if body is None or worker is None:
        return None
    status = body.get("status") or {}
    if worker.generation != status.get("generation") or status.get("observedGeneration") is None \
            or status.get("observedGeneration") != body["metadata"].get("generation"):
        return None
    spec = spec_of(body)
    if spec is None:
        return None
    return {"generation": worker.generation, "nnodes": naming.nnodes(spec),
            "rdzvId": naming.rendezvous_id(worker.uid, worker.generation)}


def served_generation(job: Mapping[str, Any], index: int, pod_uid: str, label_generation: int) -> int:
    """A survivor's pod serves the generation the operator carried it into (status.ranks[].uid and
    .generation, the operator's own record), not only the one its label names."""
    for rank in (job.get("status") or {}).get("ranks") or ():
        if rank.get("index") == index and rank.get("uid") == pod_uid and isinstance(rank.get("generation"), int):
            return max(label_generation, rank["generation"])
    return label_generation
