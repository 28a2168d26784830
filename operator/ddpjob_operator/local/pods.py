"""What stands for the cluster's pods in a local run: a process tree per worker pod, spare and store, and the
records of what they did (exits, resumes). The observer reads them, the actuator starts and stops them."""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .logs import LogTail
from .processes import LocalProcess

NAMESPACE = "local"  # the namespace a local job's names and files carry
LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class ExitRecord:
    """A worker pod's process ended: what the decision layer was shown (code, termination message)."""

    at: datetime
    pod: str
    index: int
    generation: int
    attempt: int
    exit_code: int
    message: str | None
    deleted: bool  # its deletion had been asked for (by the decision layer or a DELETE fault) before it ended


@dataclass(frozen=True)
class Resume:
    """The trainer's rank 0 loaded a checkpoint (the bundled trainer's RESUME_LINE)."""

    at: datetime
    pod: str
    generation: int | None  # of the pod that printed it
    step: int
    world_size: int | None


@dataclass
class WorkerProcess:
    index: int
    generation: int
    attempt: int
    process: LocalProcess
    termination_log: Path  # the launcher writes its failure here, like a container's /dev/termination-log
    node_range: str | None = None  # the `--nnodes` its agent was started with, as the pod's label has it
    deleted: bool = False  # asked to go (DeleteWorker): vanishes once its processes are gone
    created_at: datetime | None = None
    # Not scheduled (Unschedulable): no process yet; it starts at `held_until` (None: never).
    held: bool = False
    held_until: datetime | None = None
    exit_recorded: bool = False
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))  # like a pod's: this one, not the next
    assignment_file: Path | None = None  # a warm spare's: where it reads the place it is given
    # A warm spare's readiness mark (contract.SPARE_READY_FILE_ENV): Ready once its launcher wrote it, as
    # the pod's readiness probe has it; `ready_seen` once it did (the mark is never removed).
    ready_file: Path | None = None
    ready_seen: bool = False
    told_generation: int | None = None  # the generation the runner last told it it serves (tell_generations)

    def start(self, now: datetime) -> None:
        """Scheduled: its processes start (a held pod's once its hold ends)."""
        self.held, self.held_until = False, None
        self.termination_log.unlink(missing_ok=True)
        self.process.start(now)


@dataclass
class LocalPods:
    """The run's pods as processes, by pod name, and its store."""

    workers: dict[str, WorkerProcess] = field(default_factory=dict)  # worker pods and spares
    tails: dict[str, LogTail] = field(default_factory=dict)  # each pod's log, this run's part
    creations: dict[int, int] = field(default_factory=dict)  # worker pods created per index
    store: LocalProcess | None = None
    store_port: int = 0
    store_ready: bool = False


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]
