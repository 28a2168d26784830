"""What a local run is asked for beyond the manifest: where its state lives, faults to inject, spec changes
to make, pods to hold Pending, and how its workers start (`ddpjob run --local`'s flags, RunOptions)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Where the local "volumes" and logs live, relative to the working directory.
STATE_DIR = Path(".ddpjob")
# A fault or spec change due at a training step waits for the trainer's progress reports; a trainer that
# has reported nothing this long after the start is said (once) to never trigger it.
NO_PROGRESS_WARNING_SECONDS = 60.0


# What a FaultInjection does.
KILL = "kill"  # SIGKILL worker `index`'s whole process tree (a crashed node, an OOM-killed container)
DELETE = "delete"  # graceful deletion behind the runner's back, like `kubectl delete pod`: SIGTERM to the
#                    worker (torchrun forwards it, the trainer checkpoints), SIGKILL after the grace period,
#                    and the pod is gone once it exited
KILL_STORE = "kill-store"  # SIGKILL the rendezvous store process (`index` is ignored)
FAULT_KINDS = (KILL, DELETE, KILL_STORE)

# RunOptions.cold_start: every worker and spare starts as its pod's container does, on a node without a GPU
# (the agent forks its trainers) or with one (each trainer is a new interpreter: no fork after CUDA).
COLD_CPU_NODE = "cpu-node"
COLD_GPU_NODE = "gpu-node"
COLD_STARTS = (COLD_CPU_NODE, COLD_GPU_NODE)


@dataclass(frozen=True)
class FaultInjection:
    """A fault, once, at a time or a training step (`kind`: KILL, DELETE or KILL_STORE).

    Faults due in the same pass strike in the same instant: every process tree they kill is frozen
    (SIGSTOP) before any of them is killed, so no agent sees one peer die before the other."""

    index: int = 0
    after_seconds: float | None = None  # since the run started
    at_step: int | None = None  # once the trainer's progress.json reports this step
    kind: str = KILL

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"FaultInjection.kind must be one of {', '.join(FAULT_KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class SpecChange:
    """A spec update during the run, like `kubectl scale ddpjob/<name> --replicas=N` (`replicas`) or
    `kubectl patch ... runPolicy.suspend` (`suspend`): validated as the API server would, then seen
    by the next reconcile with a new metadata.generation. Changes apply one after the other, each
    once its moment has come: every condition given holds. `at_step` and `world_size`: the trainer's
    progress.json reports at least this step, this world size; `after_seconds`: since the run
    started; `in_phase`: the job is in this phase and none of its worker pods remain."""

    replicas: int | None = None
    suspend: bool | None = None
    at_step: int | None = None
    world_size: int | None = None
    after_seconds: float | None = None
    in_phase: str | None = None


@dataclass(frozen=True)
class Unschedulable:
    """Pods of worker `index`, from its `from_creation`-th creation on (1: every one; 2: every
    replacement), stay Pending with no process for `seconds` (None: for ever), as a pod that no
    node can take (resources no node has) waits for the scheduler."""

    index: int
    from_creation: int = 2
    seconds: float | None = None


@dataclass(frozen=True)
class RunOptions:
    checkpoint_dir: Path | None = None  # None: STATE_DIR/<name>/checkpoints, emptied unless resume
    resume: bool = False
    print_logs: bool = False
    faults: tuple[FaultInjection, ...] = ()
    changes: tuple[SpecChange, ...] = ()
    unschedulable: tuple[Unschedulable, ...] = ()
    state_dir: Path = STATE_DIR
    # A job with a checkpoint interval whose workers all ran this long without a progress report is warned of
    # (decisions/warnings.py: the HF/Lightning callback or job.report missing).
    unreported_warning_seconds: float = NO_PROGRESS_WARNING_SECONDS
    # None: workers are forks of the run's zygote. COLD_CPU_NODE / COLD_GPU_NODE: each worker and spare is a new
    # interpreter started with the pod's argv and env, nothing preloaded (docs/local.md, "Cold start").
    cold_start: str | None = None

    def __post_init__(self) -> None:
        if self.cold_start is not None and self.cold_start not in COLD_STARTS:
            raise ValueError(f"RunOptions.cold_start must be None or one of {', '.join(COLD_STARTS)}, "
                             f"got {self.cold_start!r}")
