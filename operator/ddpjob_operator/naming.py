"""The names every part of the operator agrees on: label keys and roles, container names, the names and
addresses of a job's objects, its selectors and its node range.

Pure and deterministic, for the decision layer as much as the manifests: imports the model only (never the
launch flags, the manifests, the agent's files or anything that does I/O).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from . import model

# ---------------------------------------------------------------- labels (the one place for keys)

LABEL_PREFIX = model.GROUP
LABEL_JOB_NAME = f"{LABEL_PREFIX}/job-name"
LABEL_JOB_UID = f"{LABEL_PREFIX}/job-uid"
LABEL_REPLICA_INDEX = f"{LABEL_PREFIX}/replica-index"
LABEL_GENERATION = f"{LABEL_PREFIX}/generation"
LABEL_ROLE = f"{LABEL_PREFIX}/role"
# Replacement count of the rank when this pod was created: makes failure accounting idempotent.
LABEL_ATTEMPT = f"{LABEL_PREFIX}/attempt"
# The `--nnodes` range ("min-max") the pod's agent was started with: every agent of a generation agrees.
LABEL_NNODES = f"{LABEL_PREFIX}/nnodes"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "ddpjob-operator"
ROLE_WORKER = "worker"
ROLE_STORE = "store"
ROLE_SPARE = "spare"  # a warm standby (failurePolicy.spares): no index until it takes a lost worker's place
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"  # the node's own label: one worker per node, avoided nodes

TRAINER_CONTAINER = model.TRAINER_CONTAINER
STORE_CONTAINER = "rendezvous-store"

# ---------------------------------------------------------------- names and addresses


def store_endpoint(job_name: str, namespace: str, port: int) -> str:
    """In-cluster address of the store Service (stable across worker and store pod restarts)."""
    return f"{store_service_name(job_name)}.{namespace}.svc:{port}"


def rendezvous_id(uid: str, generation: int) -> str:
    # Unique per job *and* generation: never torchrun's default "none", which collides across jobs.
    return f"{uid}-g{generation}"


def worker_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def spare_name(job_name: str, serial: int) -> str:
    return f"{job_name}-spare-{serial}"


def store_pod_name(job_name: str) -> str:
    return f"{job_name}-rdzv"


def store_service_name(job_name: str) -> str:
    return f"{job_name}-rdzv"


def headless_service_name(job_name: str) -> str:
    # Never the bare job name: job `x`'s headless Service would then be job `x-rdzv`'s store Service.
    # Every generated name ends in a suffix no other kind of name of the same kind ends in.
    return f"{job_name}-workers"


def worker_address(job_name: str, namespace: str, index: int) -> str:
    """Stable DNS name of a worker pod through the headless Service."""
    return f"{worker_name(job_name, index)}.{headless_service_name(job_name)}.{namespace}.svc"


def checkpoint_claim_name(job_name: str, spec: model.DDPJobSpec) -> str | None:
    if spec.checkpoint is None:
        return None
    return spec.checkpoint.claim_name or f"{job_name}-checkpoints"


def pod_group_name(job_name: str) -> str:
    return job_name  # its own kind: no other name of the job's is a PodGroup's


# ---------------------------------------------------------------- the node range


def nnodes(spec: model.DDPJobSpec) -> str:
    """`--nnodes` of a generation: minReplicas up to the replicas the operator starts in it. With the
    maximum at the generation's size, a round completes the moment its last worker joins, never
    waiting out lastCallTimeoutSeconds for workers that will not come; a round that cannot reach it
    (a worker the scheduler cannot place) still starts with at least minReplicas after the last call,
    and the late worker joins later. Any other size is a new generation."""
    return f"{spec.min_nodes}:{spec.replicas}"


def node_range(spec: model.DDPJobSpec) -> str:
    """`nnodes` as a label value (`min-max`): every agent of a generation agrees on it."""
    return nnodes(spec).replace(":", "-")


# ---------------------------------------------------------------- a job's identity, labels and selectors


@dataclass(frozen=True)
class JobRef:
    """The identity of a DDPJob object that its children point back to."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def preview(cls, name: str, namespace: str) -> "JobRef":
        """For `ddpjob render`: a stable stand-in uid (the API server assigns the real one)."""
        return cls(name, namespace, str(uuid.uuid5(uuid.NAMESPACE_URL, f"ddpjob:{namespace}/{name}")))


def job_labels(job: JobRef) -> dict[str, str]:
    return {LABEL_JOB_NAME: job.name, LABEL_JOB_UID: job.uid, LABEL_MANAGED_BY: MANAGED_BY}


def worker_selector(job_name: str) -> dict[str, str]:
    return {LABEL_JOB_NAME: job_name, LABEL_ROLE: ROLE_WORKER}


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def store_labels(job: JobRef) -> dict[str, str]:
    return {**job_labels(job), LABEL_ROLE: ROLE_STORE}
