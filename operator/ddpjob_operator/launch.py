"""How a worker is started: the rendezvous store's command, torchrun's flags, the worker's command and its
launch-contract environment (docs/launch-contract.md).

No I/O and no Kubernetes objects: the local runner (`ddpjob run --local`) starts processes with these, and
job_manifests.py puts the same argv and environment into pods. Imports the model, naming and the agent's command.
"""

from __future__ import annotations

import re
from decimal import Decimal

from . import agent, model
from .agent.contract import (ASSIGNMENT_FILE_ENV, GENERATION_FILE_ENV, PROGRESS_CA_ENV, PROGRESS_TOKEN_ENV, PROGRESS_URL_ENV, REJOIN_ENV,
                             INPROCESS_ENV, REJOIN_TIMEOUT_ENV, SPARE_PLACE_ENV, REJOIN_TIMEOUT_SECONDS, SPARE_ENV,
                             SPARE_READY_FILE_ENV, TERMINATION_LOG_ENV, TERMINATION_LOG_PATH)
from .naming import nnodes

# ---------------------------------------------------------------- torchrun command and env

# In a pod, the agent publishes its pod IP (downward API) to the rendezvous, not its DNS name, which
# may not resolve yet for the other workers. Kubernetes expands `$(VAR)` in args and env values.
POD_IP_ENV = "DDPJOB_POD_IP"
POD_IP_REFERENCE = f"$({POD_IP_ENV})"
# torchrun's SIGTERM -> SIGKILL wait for its trainers ends this long before the pod's grace period,
# so trainers finish their SIGTERM checkpoint before the kubelet kills the whole container.
SHUTDOWN_MARGIN_SECONDS = 5
# MASTER_PORT given to static jobs for code outside torchrun's workers (torchrun's own default port;
# the rendezvous store uses spec.rendezvous.port).
STATIC_MASTER_PORT = 29500


def shutdown_timeout_seconds(spec: model.DDPJobSpec) -> int:
    return max(1, spec.template.termination_grace_period_seconds - SHUTDOWN_MARGIN_SECONDS)


def torchrun_flags(spec: model.DDPJobSpec, *, endpoint: str, rdzv_id: str,
                   local_addr: str) -> list[tuple[str, str]]:
    """(flag, value) pairs, in launch-contract order; also mirrored as PET_* variables.

    `local_addr`: the address this agent publishes (POD_IP_REFERENCE in a pod, 127.0.0.1 locally).
    """
    rdzv = spec.rendezvous
    conf = (f"is_host=false,join_timeout={rdzv.join_timeout_seconds},"
            f"last_call_timeout={rdzv.last_call_timeout_seconds},read_timeout={rdzv.read_timeout_seconds},"
            f"keep_alive_interval={rdzv.keep_alive_interval_seconds},"
            f"keep_alive_max_attempt={rdzv.keep_alive_max_attempts}")
    return [
        ("nnodes", nnodes(spec)),
        ("nproc-per-node", str(spec.nproc_per_node)),
        ("rdzv-backend", rdzv.backend),
        ("rdzv-endpoint", endpoint),
        ("rdzv-id", rdzv_id),
        ("rdzv-conf", conf),
        ("local-addr", local_addr),
        # One budget: torchrun never restarts a failed trainer in place behind the status's back; every
        # restart is the operator's, charged once per incident (docs/operator.md, "Failure semantics").
        ("max-restarts", "0"),
        ("shutdown-timeout", str(shutdown_timeout_seconds(spec))),
    ]


# ---------------------------------------------------------------- the agent, by reference (issue 37)

# Every worker and spare runs the agent's files (agent.POD_SOURCES) from the job's agent ConfigMap, mounted
# here read-only (job_manifests.agent_volume): a pod's command names them instead of carrying them (24 KB in each
# pod, each list and watch event of pods). Under the operator's directory, where no template mount may go.
AGENT_DIR = f"{model.OPERATOR_SECRETS_DIR}/agent"


def store_command(port: int, *, python: str = "python", agent_dir: str = AGENT_DIR) -> list[str]:
    """The rendezvous store's argv: the agent's store program (agent/store.py; `agent_dir` as for worker_command), a
    standalone c10d TCPStore that outlives every worker (no worker hosts it: --rdzv-conf is_host=false)."""
    return [*agent.command("store", python=python, directory=agent_dir), str(port)]


def entrypoint_args(spec: model.DDPJobSpec) -> list[str]:
    """What follows torchrun's flags: `-m` for a module, the entrypoint, the user's args."""
    return (["-m"] if not spec.entrypoint.endswith(".py") else []) + [spec.entrypoint, *spec.args]


def worker_command(spec: model.DDPJobSpec, *, endpoint: str, rdzv_id: str, local_addr: str,
                   python: str = "python", agent_dir: str = AGENT_DIR) -> list[str]:
    """The worker's argv: the launcher (the agent's files in `agent_dir`: the pod's mount of the agent
    ConfigMap, or agent.DIRECTORY in a local run), torchrun flags, then the user's entrypoint and args (never
    a shell)."""
    argv = agent.command("worker", python=python, directory=agent_dir)
    flags = torchrun_flags(spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr=local_addr)
    argv += [f"--{flag}={value}" for flag, value in flags]
    return argv + entrypoint_args(spec)


THREADS_ENV = "OMP_NUM_THREADS"
# A plain number with an optional suffix (`4`, `500m`, `16Gi`): the forms whose amount is read here.
SIMPLE_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")


def default_threads(spec: model.DDPJobSpec) -> int | None:
    """Each trainer's thread count when the user set none in spec.env: the pod's CPU request shared by
    its processes (at least 1). torch otherwise starts a thread per core of the node, and torchrun sets 1
    only for more than one process: a trainer limited to a few CPUs on a large shared node then runs
    many times slower. None without a CPU request (nothing to go by) or when spec.env sets it."""
    if spec.resources.cpu is None or any(e.name == THREADS_ENV for e in spec.env):
        return None
    match = SIMPLE_QUANTITY.match(str(spec.resources.cpu))
    if match is None or match.group(2) not in ("", "m"):
        return None
    cores = Decimal(match.group(1)) / (1000 if match.group(2) == "m" else 1)
    return max(1, int(cores // spec.nproc_per_node))


def worker_env(spec: model.DDPJobSpec, *, job_name: str, namespace: str, index: int, generation: int,
               endpoint: str, rdzv_id: str, local_addr: str, master_addr: str,
               checkpoint_dir: str | None = None) -> dict[str, str]:
    """The launch-contract environment (docs/launch-contract.md), without the user's spec.env.

    `master_addr`: where worker 0 runs (its stable DNS name in a pod, 127.0.0.1 locally); only static
    jobs get it. `checkpoint_dir` overrides the mount path (the local runner uses a host directory).
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
    # restartScope Pod: a survivor's agent joins the next generation in place (contract.REJOIN_ENV).
    env[REJOIN_ENV] = "1" if spec.failure_policy.restart_scope == "Pod" else "0"
    env[REJOIN_TIMEOUT_ENV] = str(REJOIN_TIMEOUT_SECONDS)
    in_process = spec.failure_policy.effective_recovery == "InProcess"
    if in_process:
        env[INPROCESS_ENV] = "1"  # runtime/inprocess.py; otherwise "" (UNSET_WHEN_OFF)
    # A failed or timed-out NCCL collective: torch's watchdog aborts the communicator; with 1 it also ends the
    # process (the launcher then sees the failure), with 2 (CleanUpOnly) the error is raised in the trainer,
    # which then leaves the group and trains on in the next generation (in-process recovery).
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2" if in_process else "1"
    env["PYTHONUNBUFFERED"] = "1"
    threads = default_threads(spec)
    if threads is not None:
        env[THREADS_ENV] = str(threads)
    # With torchrun's shared TCPStore, a surviving rank-0 agent skips publishing MASTER_ADDR in a
    # re-rendezvous round, so a replacement worker and it wait on each other until read_timeout.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if spec.min_nodes == spec.max_nodes:
        # A static gang always has worker 0, so code outside torchrun's worker processes (which get
        # torchrun's own values) can find it. Elastic jobs have no fixed rank 0: they get none.
        env["MASTER_ADDR"] = master_addr
        env["MASTER_PORT"] = str(STATIC_MASTER_PORT)
    for flag, value in torchrun_flags(spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr=local_addr):
        env["PET_" + flag.upper().replace("-", "_")] = value
    # Every DDPJOB_ variable the launcher and trainer read is the operator's, "" (off) where this worker has
    # none: an envFrom without a prefix (a ConfigMap's keys, which validation never sees) could set it
    # otherwise, and an explicit entry wins over envFrom. worker_pod and spare_pod fill in theirs; the local
    # runner overrides these. Not DDPJOB_FORK_TRAINER (the user's to set) nor DDPJOB_ZYGOTE_PRELOAD (read by
    # the local runner's zygote only, whose environment it builds itself).
    for name in UNSET_WHEN_OFF:
        env.setdefault(name, "")
    env[TERMINATION_LOG_ENV] = TERMINATION_LOG_PATH  # the kubelet's path; "" would lose the message
    return env


# What worker_env sets to "" where a worker has none: the launcher and trainer take "" as unset.
UNSET_WHEN_OFF = ("DDPJOB_CHECKPOINT_DIR", "DDPJOB_CHECKPOINT_INTERVAL_STEPS", "DDPJOB_CHECKPOINT_KEEP",
                  SPARE_ENV, ASSIGNMENT_FILE_ENV, SPARE_READY_FILE_ENV, PROGRESS_URL_ENV, PROGRESS_TOKEN_ENV,
                  PROGRESS_CA_ENV, INPROCESS_ENV, SPARE_PLACE_ENV, GENERATION_FILE_ENV)

