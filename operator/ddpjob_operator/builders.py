"""Pure builders: a DDPJob spec -> the torchrun argv, the worker environment and the manifests.

No I/O and no Kubernetes client here. The local runner (`ddpjob run --local`) uses
`store_command`, `worker_command` and `worker_env` for processes; the operator additionally uses
the manifest builders. Everything is deterministic: same inputs, same output.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

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
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "ddpjob-operator"
ROLE_WORKER = "worker"
ROLE_STORE = "store"

TRAINER_CONTAINER = "trainer"
STORE_CONTAINER = "rendezvous-store"
SHM_VOLUME = "dshm"
CHECKPOINT_VOLUME = "checkpoints"
# Default scheduler taint on GPU nodes (NVIDIA device plugin / GKE / EKS convention).
GPU_TOLERATION_EFFECT = "NoSchedule"

# ---------------------------------------------------------------- rendezvous store

# Started as `python -c STORE_PROGRAM <port>`: a standalone c10d TCPStore that outlives every
# worker (no worker hosts it: --rdzv-conf is_host=false). A constant, never built from user input.
STORE_PROGRAM = """\
import signal, sys
from datetime import timedelta
import torch.distributed as dist
port = int(sys.argv[1])
stop = {signal.SIGTERM, signal.SIGINT}
signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # before the server thread starts, so it inherits it
store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                      timeout=timedelta(seconds=60))
print(f"ddpjob rendezvous store listening on port {port}", flush=True)
signal.sigwait(stop)
print("ddpjob rendezvous store stopping", flush=True)
"""


def store_command(port: int, *, python: str = "python") -> list[str]:
    return [python, "-c", STORE_PROGRAM, str(port)]


def store_endpoint(job_name: str, namespace: str, port: int) -> str:
    """In-cluster address of the store Service (stable across worker and store pod restarts)."""
    return f"{store_service_name(job_name)}.{namespace}.svc:{port}"


def rendezvous_id(uid: str, generation: int) -> str:
    # Unique per job *and* generation: never torchrun's default "none", which collides across jobs.
    return f"{uid}-g{generation}"


# ---------------------------------------------------------------- names


def worker_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def store_pod_name(job_name: str) -> str:
    return f"{job_name}-rdzv"


def store_service_name(job_name: str) -> str:
    return f"{job_name}-rdzv"


def headless_service_name(job_name: str) -> str:
    return job_name


def checkpoint_claim_name(job_name: str, spec: model.DDPJobSpec) -> str | None:
    if spec.checkpoint is None:
        return None
    return spec.checkpoint.claim_name or f"{job_name}-checkpoints"


# ---------------------------------------------------------------- torchrun command and env


def torchrun_flags(spec: model.DDPJobSpec, *, endpoint: str, rdzv_id: str) -> list[tuple[str, str]]:
    """(flag, value) pairs, in launch-contract order; also mirrored as PET_* variables."""
    rdzv = spec.rendezvous
    conf = (f"is_host=false,join_timeout={rdzv.join_timeout_seconds},"
            f"last_call_timeout={rdzv.last_call_timeout_seconds},read_timeout={rdzv.read_timeout_seconds}")
    return [
        ("nnodes", f"{spec.min_nodes}:{spec.max_nodes}"),
        ("nproc-per-node", str(spec.nproc_per_node)),
        ("rdzv-backend", rdzv.backend),
        ("rdzv-endpoint", endpoint),
        ("rdzv-id", rdzv_id),
        ("rdzv-conf", conf),
        ("max-restarts", str(spec.failure_policy.max_restarts)),
    ]


def worker_command(spec: model.DDPJobSpec, *, endpoint: str, rdzv_id: str,
                   python: str = "python") -> list[str]:
    """The worker's argv: torchrun flags, then the user's entrypoint and args (never a shell)."""
    argv = [python, "-m", "torch.distributed.run"]
    argv += [f"--{flag}={value}" for flag, value in torchrun_flags(spec, endpoint=endpoint, rdzv_id=rdzv_id)]
    if not spec.entrypoint.endswith(".py"):
        argv.append("-m")
    return argv + [spec.entrypoint, *spec.args]


def worker_env(spec: model.DDPJobSpec, *, job_name: str, namespace: str, index: int, generation: int,
               endpoint: str, rdzv_id: str, checkpoint_dir: str | None = None) -> dict[str, str]:
    """The launch-contract environment (docs/launch-contract.md), without the user's spec.env.

    `checkpoint_dir` overrides the mount path (the local runner uses a host directory).
    """
    env = {
        "DDPJOB_NAME": job_name,
        "DDPJOB_NAMESPACE": namespace,
        "DDPJOB_REPLICA_INDEX": str(index),
        "DDPJOB_GENERATION": str(generation),
    }
    if spec.checkpoint is not None:
        env["DDPJOB_CHECKPOINT_DIR"] = checkpoint_dir or spec.checkpoint.mount_path
        env["DDPJOB_CHECKPOINT_INTERVAL_STEPS"] = str(spec.checkpoint.interval_steps)
        env["DDPJOB_CHECKPOINT_KEEP"] = str(spec.checkpoint.keep)
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # With torchrun's shared TCPStore, a surviving rank-0 agent skips publishing MASTER_ADDR in a
    # re-rendezvous round, so a replacement worker and it wait on each other until read_timeout.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    for flag, value in torchrun_flags(spec, endpoint=endpoint, rdzv_id=rdzv_id):
        env["PET_" + flag.upper().replace("-", "_")] = value
    return env


# ---------------------------------------------------------------- manifests


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


def owner_reference(job: JobRef) -> dict[str, Any]:
    return {"apiVersion": model.API_VERSION, "kind": model.KIND, "name": job.name, "uid": job.uid,
            "controller": True, "blockOwnerDeletion": True}


def job_labels(job: JobRef) -> dict[str, str]:
    return {LABEL_JOB_NAME: job.name, LABEL_JOB_UID: job.uid, LABEL_MANAGED_BY: MANAGED_BY}


def worker_selector(job_name: str) -> dict[str, str]:
    return {LABEL_JOB_NAME: job_name, LABEL_ROLE: ROLE_WORKER}


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _metadata(job: JobRef, name: str, labels: dict[str, str],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "labels": labels,
                            "ownerReferences": [owner_reference(job)]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _resources(spec: model.DDPJobSpec) -> dict[str, Any]:
    amounts: dict[str, str] = {}
    if spec.resources.cpu:
        amounts["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        amounts["memory"] = spec.resources.memory
    if spec.gpus_per_pod:
        amounts[spec.resources.gpu_resource_name] = str(spec.gpus_per_pod)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def worker_pod(job: JobRef, spec: model.DDPJobSpec, *, index: int, generation: int,
               attempt: int = 0) -> dict[str, Any]:
    name = worker_name(job.name, index)
    template = spec.template
    endpoint = store_endpoint(job.name, job.namespace, spec.rendezvous.port)
    rdzv_id = rendezvous_id(job.uid, generation)
    labels = {**(template.labels or {}), **job_labels(job), LABEL_ROLE: ROLE_WORKER,
              LABEL_REPLICA_INDEX: str(index), LABEL_GENERATION: str(generation),
              LABEL_ATTEMPT: str(attempt)}
    contract = worker_env(spec, job_name=job.name, namespace=job.namespace, index=index,
                          generation=generation, endpoint=endpoint, rdzv_id=rdzv_id)
    env = [{"name": k, "value": v} for k, v in contract.items()] + [e.wire() for e in spec.env]

    mounts = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": {
        "medium": "Memory", "sizeLimit": spec.resources.shared_memory}}]
    claim = checkpoint_claim_name(job.name, spec)
    if claim is not None:
        assert spec.checkpoint is not None
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path})
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    mounts += list(template.volume_mounts or [])
    volumes += list(template.volumes or [])

    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": worker_command(spec, endpoint=endpoint, rdzv_id=rdzv_id),
        "env": env,
        "volumeMounts": mounts,
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources

    tolerations = list(template.tolerations or [])
    if spec.resources.gpu:
        tolerations.append({"key": spec.resources.gpu_resource_name, "operator": "Exists",
                            "effect": GPU_TOLERATION_EFFECT})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator replaces pods; torchrun restarts processes in-pod
        "hostname": name,
        "subdomain": headless_service_name(job.name),
        "terminationGracePeriodSeconds": template.termination_grace_period_seconds,
        "containers": [container],
        "volumes": volumes,
    }
    optional = {"nodeSelector": template.node_selector, "affinity": template.affinity,
                "tolerations": tolerations, "serviceAccountName": template.service_account_name,
                "priorityClassName": template.priority_class_name}
    pod_spec.update({k: v for k, v in optional.items() if v})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _metadata(job, name, labels, template.annotations), "spec": pod_spec}


def store_labels(job: JobRef) -> dict[str, str]:
    return {**job_labels(job), LABEL_ROLE: ROLE_STORE}


def store_pod(job: JobRef, spec: model.DDPJobSpec) -> dict[str, Any]:
    port = spec.rendezvous.port
    container = {
        "name": STORE_CONTAINER,
        "image": spec.rendezvous.store_image or spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": store_command(port),
        "ports": [{"name": "rendezvous", "containerPort": port}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
    }
    pod_spec: dict[str, Any] = {
        # Never, not Always: a restarted store has lost its state, so the operator must see the
        # loss (phase Failed / pod gone) and move the job to a fresh rendezvous generation.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
    }
    if spec.template.service_account_name:
        pod_spec["serviceAccountName"] = spec.template.service_account_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _metadata(job, store_pod_name(job.name), store_labels(job)), "spec": pod_spec}


def store_service(job: JobRef, spec: model.DDPJobSpec) -> dict[str, Any]:
    port = spec.rendezvous.port
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(job, store_service_name(job.name), job_labels(job)),
            "spec": {"type": "ClusterIP", "selector": {LABEL_JOB_NAME: job.name, LABEL_ROLE: ROLE_STORE},
                     "ports": [{"name": "rendezvous", "port": port, "targetPort": port}]}}


def headless_service(job: JobRef) -> dict[str, Any]:
    """Gives each worker stable DNS `<job>-worker-<i>.<job>.<ns>.svc`, even before it is Ready."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(job, headless_service_name(job.name), job_labels(job)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": worker_selector(job.name)}}


def checkpoint_claim(job: JobRef, spec: model.DDPJobSpec) -> dict[str, Any] | None:
    """The PVC to create from claimTemplate; None when the job uses an existing claim or none."""
    if spec.checkpoint is None or spec.checkpoint.claim_template is None:
        return None
    template = spec.checkpoint.claim_template
    claim_spec: dict[str, Any] = {"accessModes": list(template.access_modes),
                                  "resources": {"requests": {"storage": template.size}}}
    if template.storage_class_name:
        claim_spec["storageClassName"] = template.storage_class_name
    name = checkpoint_claim_name(job.name, spec)
    assert name is not None
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _metadata(job, name, job_labels(job)), "spec": claim_spec}


def shared_manifests(job: JobRef, spec: model.DDPJobSpec) -> list[dict[str, Any]]:
    """Objects that live as long as the job: the two Services and the checkpoint claim."""
    claim = checkpoint_claim(job, spec)
    return [headless_service(job), store_service(job, spec)] + ([claim] if claim else [])


def all_manifests(job: JobRef, spec: model.DDPJobSpec, *, generation: int = 0) -> list[dict[str, Any]]:
    """Everything a fresh job creates, in creation order (for `ddpjob render`)."""
    workers = [worker_pod(job, spec, index=i, generation=generation) for i in range(spec.replicas)]
    return shared_manifests(job, spec) + [store_pod(job, spec)] + workers
