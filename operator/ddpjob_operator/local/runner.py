"""`ddpjob run --local`: the operator's reconcile loop with processes instead of pods.

Level-based like the operator: observe the processes -> `decisions.decide()` -> carry out its
actions -> wait for the next poll or `requeue_after`. Every restart rule (exit codes, scope,
backoff, budget, success policy, deadline) lives in the decisions package, and every command line and
environment comes from builders.py; this module only maps pods onto local processes.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

from .. import builders, decisions, model, validation
from ..agent import contract
from ..validation import FieldError, InvalidJob
from .logs import RESUME_LINE, LogTail, newest_checkpoint, read_report
from .processes import LocalProcess, Zygote, kill_marked, kill_together, marker_for
from .view import Snapshot, Summary, View, WorkerRow

NAMESPACE = "local"
LOCALHOST = "127.0.0.1"
POLL_SECONDS = 0.2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
# What the scheduler says of a pod no node can take (an Unschedulable option's worker).
UNSCHEDULABLE = "Unschedulable"
UNSCHEDULABLE_MESSAGE = "0/1 nodes are available: held Pending by the local run's Unschedulable option"
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


def refuse_links(*paths: Path) -> None:
    """The run's own directories are emptied and written: none may be a symbolic link (one committed in a
    cloned repository would have the run delete and overwrite whatever it points to)."""
    errors = [FieldError(str(p), f"is a symbolic link (to {os.readlink(p)}): the local run empties and writes its "
                                 f"own directories and never does so through a link",
                         f"remove the link (`rm {p}`: what it points to is left alone) and run again, or give "
                         f"--checkpoint-dir DIR for checkpoints kept elsewhere")
              for p in paths if p.is_symlink()]
    if errors:
        raise InvalidJob(errors)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((LOCALHOST, port), timeout=0.2):
            return True
    except OSError:
        return False


def _spare_ready(w: WorkerProcess) -> bool:
    """A worker is Ready while it runs; a spare once its launcher wrote its readiness mark (the probe)."""
    if w.ready_file is None or w.ready_seen:
        return True
    w.ready_seen = w.ready_file.exists()
    return w.ready_seen


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def base_environment(spec: model.DDPJobSpec) -> dict[str, str]:
    """This shell's environment without what torchrun and the operator own, plus the job's env;
    InvalidJob for what cannot run on this machine."""
    env = {k: v for k, v in os.environ.items()
           if k not in model.RESERVED_ENV_NAMES and not k.startswith(model.RESERVED_ENV_PREFIXES)}
    errors = []
    for i, var in enumerate(spec.env):
        if var.value_from is not None:
            errors.append(FieldError(f"spec.env[{i}].valueFrom", "secrets, config maps and pod fields do "
                                     "not exist in a local run", f"give {var.name} a literal `value` for local runs"))
        else:
            env[var.name] = var.value or ""
    if spec.run_policy.suspend:
        errors.append(FieldError("spec.runPolicy.suspend", "a suspended job runs no worker",
                                 "set suspend: false to run it (checkpoints are kept with --resume)"))
    if errors:
        raise InvalidJob(errors)
    return env


class LocalRunner:
    def __init__(self, job: model.DDPJob, options: RunOptions, view: View,
                 clock: Callable[[], datetime] = utc_now, sleep: Callable[[float], None] = time.sleep):
        self.name, self.spec, self.options, self.view = job.metadata.name, job.spec, options, view
        self.clock, self.sleep = clock, sleep
        self.base_env = base_environment(job.spec)
        self.uid = str(uuid.uuid4())
        self.run_id = f"{self.name}-{self.uid[:8]}"
        self.run_marker = marker_for(self.run_id)
        root = options.state_dir / self.name
        refuse_links(options.state_dir, root, root / "logs", *([] if options.checkpoint_dir else [root / "checkpoints"]))
        self.log_dir = (root / "logs").resolve()
        self.checkpoint_dir: Path | None = None
        if job.spec.checkpoint is not None:
            self.checkpoint_dir = (options.checkpoint_dir or root / "checkpoints").resolve()
        self.status = model.DDPJobStatus()
        self.store: LocalProcess | None = None
        # Every worker starts as a fork of it: a new generation imports nothing (bench/recovery.py).
        # It imports torch, whose thread pool its forks keep: give it the trainers' thread count now.
        threads = builders.default_threads(job.spec)
        zygote_env = {**self.base_env, **({builders.THREADS_ENV: str(threads)} if threads is not None else {}),
                      # ...and the entrypoint's own imports (transformers, lightning: seconds a trainer skips)
                      contract.PRELOAD_ENV: json.dumps(builders.entrypoint_args(job.spec))}
        self.zygote = None if options.cold_start else Zygote(
            python=sys.executable, env=zygote_env, marker=marker_for(self.run_id, "zygote"),
            log_path=self.log_dir / "zygote.log")
        if options.cold_start == COLD_GPU_NODE:  # what the agent decides where it sees a GPU
            self.base_env[contract.FORK_TRAINER_ENV] = "0"
        self.store_port = free_port()
        self.store_ready = False
        self.workers: dict[str, WorkerProcess] = {}
        self.tails: dict[str, LogTail] = {}
        self.pending_faults = list(options.faults)
        self.pending_changes = list(options.changes)
        self.metadata_generation = 1  # moves with every spec change, as the API server's does
        self.creations: dict[int, int] = {}  # worker pods created per index
        self.exits: list[ExitRecord] = []
        self.resumes: list[Resume] = []
        self.interrupted = False
        self._warned_no_progress = False
        self._signals: list[int] = []
        self.created_at = clock()
        # Progress as the decision layer sees it (hang detection, status.progress): from progress.json.
        self._progress_stamp: object = None
        self._progress: tuple[int, int, datetime | None] = (-1, -1, None)  # generation, step, last advance
        self._progress_history: collections.deque[tuple[datetime, int]] = collections.deque(maxlen=64)
        self._progress_raw: dict | None = None
        self._progress_at: datetime | None = None
        self._timings = decisions.TimingHistory()  # per worker, from progress.json (straggler detection)

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> str:
        """Run to Succeeded or Failed (or until SIGINT/SIGTERM); returns the final phase."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._prepare_dirs()
            if self.zygote is not None:
                self.zygote.start()  # its imports overlap the store's start
            while True:
                if self._signals:
                    self.interrupted = True
                    self.view.event(f"{signal.Signals(self._signals[0]).name}: stopping every worker "
                                    f"gracefully (they checkpoint); press Ctrl-C again to kill them")
                    break
                decision = self.reconcile()
                if self.status.phase in decisions.TERMINAL_PHASES:
                    break
                wait = POLL_SECONDS if decision.requeue_after is None else min(POLL_SECONDS, decision.requeue_after)
                self.sleep(wait)
        finally:
            try:
                self.stop_all()
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
                self.view.close(self.summary())
        return self.status.phase or "Pending"

    def reconcile(self) -> decisions.Decision:
        """One level-based pass: observe, decide, act, show."""
        now = self.clock()
        # One machine: workers can never land on different nodes (no ReadWriteOnce warning).
        options = decisions.Options(one_node=True, unreported_warning_seconds=self.options.unreported_warning_seconds)
        decision = decisions.decide(self.job_view(), self.observe(now), options)
        self.status = decision.status
        for action in decision.actions:
            self.execute(action, now)
        self._assign_spares()
        self._inject_faults(now)
        self._apply_changes(now)
        self._show(now)
        return decision

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)

    def _prepare_dirs(self) -> None:
        # The default directory is the job's own claim (claimTemplate): a new job starts empty, and so do
        # its logs (the logs of the run whose checkpoints are kept, with --resume or --checkpoint-dir, go on).
        fresh = self.options.checkpoint_dir is None and not self.options.resume
        if fresh and self.log_dir.exists():
            shutil.rmtree(self.log_dir)  # not a link (refuse_links); rmtree removes links inside, not their targets
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.checkpoint_dir is None:
            return
        if fresh and self.checkpoint_dir.exists():
            shutil.rmtree(self.checkpoint_dir)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)

    # ---- observe -----------------------------------------------------------------------------

    def job_view(self) -> decisions.JobView:
        return decisions.JobView(name=self.name, namespace=NAMESPACE, uid=self.uid,
                                 metadata_generation=self.metadata_generation, created_at=self.created_at,
                                 spec=self.spec, status=self.status)

    def observe(self, now: datetime) -> decisions.Observed:
        workers, spares = [], []
        for name, w in list(self.workers.items()):
            if w.held:
                if w.deleted:
                    del self.workers[name]  # a pod that never ran goes at once
                    continue
                if w.held_until is not None and now >= w.held_until:
                    self._start(w, now)  # scheduled at last
            code = w.process.poll(now)
            if code is not None and not w.exit_recorded:
                self._record_exit(name, w, code)
            if w.deleted and code is not None:
                del self.workers[name]  # a deleted pod whose processes are gone no longer exists
                continue
            if w.deleted and now >= w.process.terminating_since + self._grace():
                w.process.kill()  # the grace period is over, as the kubelet would do
            (spares if w.assignment_file is not None else workers).append(self._observation(name, w, code))
        return decisions.Observed(workers=tuple(workers), store=self._store_observation(now), now=now,
                                  progress=self._observe_progress(now), spares=tuple(spares))

    def _observe_progress(self, now: datetime) -> decisions.ProgressObservation | None:
        """The trainer's progress.json as the decision layer's ProgressObservation: a new report (its
        `time` changed) belongs to the generation in use, unless it names an older one (a survivor's trainer
        writing once more as it stops); the clock of hang detection is this runner's. Locally there are no
        per-worker reports (only global rank 0 writes the file)."""
        raw = read_report(self.checkpoint_dir, "progress.json")
        stamp = raw.get("time") if isinstance(raw, dict) else None
        named = raw.get("generation") if isinstance(raw, dict) else None
        left_behind = isinstance(named, int) and not isinstance(named, bool) and named < self.status.generation
        if isinstance(raw, dict) and isinstance(raw.get("step"), int) and stamp != self._progress_stamp \
                and not left_behind \
                and not (isinstance(stamp, (int, float)) and stamp < self.created_at.timestamp()):
            self._progress_stamp = stamp
            generation, step, advanced = self._progress
            if generation != self.status.generation:
                generation, step, advanced = self.status.generation, -1, None
                self._progress_history.clear()
            if raw["step"] > step:
                step, advanced = raw["step"], now
                self._progress_history.append((now, step))
            self._progress = (generation, step, advanced)
            self._progress_raw, self._progress_at = raw, now
            # Rank 0 writes every worker's own step time (gathered at its log interval), by replica index.
            by_worker = raw.get("step_seconds_by_worker")
            if isinstance(by_worker, dict):
                for index, seconds in by_worker.items():
                    if str(index).isdigit() and isinstance(seconds, (int, float)) and not isinstance(seconds, bool) \
                            and 0 <= seconds < 86400:
                        self._timings.add(int(index), generation, raw["step"], float(seconds), now)
        generation, step, advanced = self._progress
        raw = self._progress_raw
        if raw is None or advanced is None:
            return None

        def number(key: str, kind: type) -> object:
            value = raw.get(key)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                (kind is float or isinstance(value, int)) else None
        history = list(self._progress_history)
        rate = None
        if len(history) >= 2 and (history[-1][0] - history[0][0]).total_seconds() > 0:
            rate = (history[-1][1] - history[0][1]) / (history[-1][0] - history[0][0]).total_seconds()
        return decisions.ProgressObservation(
            generation=generation, step=raw["step"], last_advance=advanced, total_steps=number("total_steps", int),
            epoch=number("epoch", int), loss=number("loss", float),
            samples_per_second=number("samples_per_second", float),
            last_checkpoint_step=number("last_checkpoint_step", int), world_size=number("world_size", int),
            steps_per_second=rate, updated_at=self._progress_at, timings=self._timings.snapshot())

    def _record_exit(self, name: str, w: WorkerProcess, code: int) -> None:
        w.exit_recorded = True
        message = _read_text(w.termination_log)
        record = ExitRecord(at=w.process.finished_at or self.clock(), pod=name, index=w.index,
                            generation=w.generation, attempt=w.attempt, exit_code=code, message=message,
                            deleted=w.deleted)
        self.exits.append(record)
        self.view.event(f"{name} (generation {w.generation}, attempt {w.attempt}) exited with code {code}"
                        + (" after its deletion" if w.deleted else "")
                        + (f": {decisions.short_message(message)}" if message else ""))

    def _pod_of(self, index: int) -> str:
        """The pod that serves worker `index` now: its own, or the spare that took its place."""
        rank = next((r for r in self.status.ranks if r.index == index), None)
        return rank.pod if rank is not None else builders.worker_name(self.name, index)

    def _grace(self) -> timedelta:
        return timedelta(seconds=self.spec.template.termination_grace_period_seconds)

    @staticmethod
    def _observation(name: str, w: WorkerProcess, code: int | None) -> decisions.WorkerObservation:
        message = None
        if w.held:
            return decisions.WorkerObservation(
                index=w.index, name=name, uid=w.uid, generation=w.generation, phase="Pending", attempt=w.attempt,
                terminating_since=w.process.terminating_since, node_range=w.node_range,
                unschedulable=decisions.Waiting(UNSCHEDULABLE, UNSCHEDULABLE_MESSAGE, w.created_at))
        if code is None:
            phase, reason = "Running", None
        else:
            phase, reason = ("Succeeded", "Completed") if code == 0 else ("Failed", "Error")
            message = _read_text(w.termination_log)
        return decisions.WorkerObservation(
            index=w.index, name=name, uid=w.uid, generation=w.generation, phase=phase, attempt=w.attempt,
            ready=code is None and _spare_ready(w), exit_code=code, reason=reason, message=message,
            terminating_since=w.process.terminating_since, node_range=w.node_range,
            node=LOCALHOST, started_at=w.process.started_at, finished_at=w.process.finished_at)

    def _store_observation(self, now: datetime) -> decisions.StoreObservation | None:
        if self.store is None:
            return None
        code = self.store.poll(now)
        if code is not None:
            if self.store.terminating_since is not None:
                self.store = None  # deleted and gone
                return None
            return decisions.StoreObservation(phase="Succeeded" if code == 0 else "Failed")
        self.store_ready = self.store_ready or _accepts_connections(self.store_port)
        return decisions.StoreObservation(phase="Running", ready=self.store_ready,
                                          terminating_since=self.store.terminating_since)

    # ---- act ---------------------------------------------------------------------------------

    def execute(self, action: decisions.Action, now: datetime) -> None:
        if isinstance(action, decisions.CreateStore):
            self._create_store(now)
        elif isinstance(action, decisions.DeleteStore):
            self._delete_store(action, now)
        elif isinstance(action, decisions.CreateSpare):
            self._create_spare(action, now)
        elif isinstance(action, decisions.CreateWorker):
            self._create_worker(action, now)
        elif isinstance(action, decisions.DeleteWorker):
            self._delete_worker(action, now)
        elif isinstance(action, decisions.Event):
            self.view.event(f"{action.type} {action.reason}: {action.message}")
        # DeleteJob (TTL) has nothing to do here: a local run ends when the job finishes.

    def _create_store(self, now: datetime) -> None:
        self.store_port = free_port()
        self.store_ready = False
        self.store = LocalProcess(
            name=builders.store_pod_name(self.name), marker=marker_for(self.run_id, "store"),
            argv=builders.store_command(self.store_port, python=sys.executable), env=self.base_env,
            log_path=self.log_dir / f"{builders.store_pod_name(self.name)}.log")
        self.store.start(now)

    def _create_worker(self, action: decisions.CreateWorker, now: datetime) -> None:
        name = builders.worker_name(self.name, action.index)
        if name in self.workers:
            return  # the old pod is still terminating: created once it is gone (next passes)
        endpoint = f"{LOCALHOST}:{self.store_port}"
        rdzv_id = builders.rendezvous_id(self.uid, action.generation)
        termination_log = self.log_dir / f"{name}.termination-log"
        termination_log.unlink(missing_ok=True)  # a message is this attempt's or none
        env = {**self.base_env, **builders.worker_env(
            self.spec, job_name=self.name, namespace=NAMESPACE, index=action.index, generation=action.generation,
            endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST, master_addr=LOCALHOST,
            checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else None),
            contract.TERMINATION_LOG_ENV: str(termination_log)}
        process = LocalProcess(
            name=name, marker=marker_for(self.run_id, name, action.attempt), env=env,
            argv=builders.worker_command(self.spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST,
                                         python=sys.executable),
            log_path=self.log_dir / f"{name}.log", zygote=self.zygote)
        if name not in self.tails:  # logs are appended across runs: read only this run's part
            self.tails[name] = LogTail(process.log_path, offset=_size(process.log_path))
        worker = WorkerProcess(action.index, action.generation, action.attempt, process, termination_log,
                               node_range=builders.node_range(self.spec), created_at=now)
        self.workers[name] = worker
        created = self.creations[action.index] = self.creations.get(action.index, 0) + 1
        hold = next((u for u in self.options.unschedulable
                     if u.index == action.index and created >= u.from_creation), None)
        if hold is None:
            self._start(worker, now)
            return
        worker.held = True
        worker.held_until = None if hold.seconds is None else now + timedelta(seconds=hold.seconds)
        self.view.event(f"{name} (generation {action.generation}) is not scheduled: Pending "
                        + ("for ever" if hold.seconds is None else f"for {hold.seconds:g}s")
                        + " (Unschedulable)")

    def _create_spare(self, action: decisions.CreateSpare, now: datetime) -> None:
        """A warm spare: a worker's launcher that waits for an assignment file (contract.SPARE_ENV)."""
        name = builders.spare_name(self.name, action.slot)
        if name in self.workers:
            return
        endpoint = f"{LOCALHOST}:{self.store_port}"
        rdzv_id = builders.rendezvous_id(self.uid, action.generation)
        termination_log = self.log_dir / f"{name}.termination-log"
        termination_log.unlink(missing_ok=True)
        assignment = self.log_dir / f"{name}.assignment.json"
        assignment.unlink(missing_ok=True)
        ready_file = self.log_dir / f"{name}.ready"  # the pod's own: a new spare of the name starts not Ready
        ready_file.unlink(missing_ok=True)
        env = {**self.base_env, **builders.worker_env(
            self.spec, job_name=self.name, namespace=NAMESPACE, index=-1, generation=action.generation,
            endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST, master_addr=LOCALHOST,
            checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else None),
            contract.TERMINATION_LOG_ENV: str(termination_log), contract.SPARE_ENV: "1",
            contract.ASSIGNMENT_FILE_ENV: str(assignment), contract.SPARE_READY_FILE_ENV: str(ready_file)}
        process = LocalProcess(
            name=name, marker=marker_for(self.run_id, name, 0), env=env,
            argv=builders.worker_command(self.spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST,
                                         python=sys.executable),
            log_path=self.log_dir / f"{name}.log", zygote=self.zygote)
        if name not in self.tails:
            self.tails[name] = LogTail(process.log_path, offset=_size(process.log_path))
        spare = WorkerProcess(-1, action.generation, 0, process, termination_log,
                              node_range=builders.node_range(self.spec), created_at=now, assignment_file=assignment,
                              ready_file=ready_file)
        self.workers[name] = spare
        self._start(spare, now)

    def _assign_spares(self) -> None:
        """Tell each spare the status gave a rank's place which one (written whole: the launcher polls)."""
        ranks = {r.uid: r for r in self.status.ranks if r.uid is not None}
        for name, w in self.workers.items():
            rank = ranks.get(w.uid)
            if w.assignment_file is None or rank is None or rank.pod != name or rank.generation is None \
                    or w.assignment_file.exists():
                continue
            given = {"index": rank.index, "generation": rank.generation, "nnodes": builders.nnodes(self.spec),
                     "rdzvId": builders.rendezvous_id(self.uid, rank.generation)}
            partial = w.assignment_file.with_suffix(".partial")
            partial.write_text(json.dumps(given))
            partial.replace(w.assignment_file)
            self.view.event(f"{name} takes the place of worker {rank.index} in generation {rank.generation}")

    def _start(self, w: WorkerProcess, now: datetime) -> None:
        w.held, w.held_until = False, None
        w.termination_log.unlink(missing_ok=True)
        w.process.start(now)

    def _delete_worker(self, action: decisions.DeleteWorker, now: datetime) -> None:
        """Force kills at once; otherwise SIGTERM, and `observe` drops the pod once it has exited.
        An exited pod is gone at once, so a replacement in the same pass can take its name."""
        w = self.workers.get(action.name)
        if w is None:
            return
        w.deleted = True
        if w.held:
            del self.workers[action.name]  # never ran: nothing to stop
            return
        if action.force:
            w.process.kill()
        if w.process.poll(now) is None:
            w.process.terminate(now)
        else:
            del self.workers[action.name]

    def _delete_store(self, action: decisions.DeleteStore, now: datetime) -> None:
        if self.store is None:
            return
        if action.force:
            self.store.kill()
        if self.store.poll(now) is None:
            self.store.terminate(now)
        else:
            self.store = None

    def _reported_step(self, progress: dict) -> int | None:
        """The newest step the trainer reported: progress.json, or its rank-0 `step=N epoch=E loss=L` log
        lines for a script that prints them without reporting progress."""
        steps = [s for s in (progress.get("step"), *(t.step for t in self.tails.values())) if isinstance(s, int)]
        return max(steps) if steps else None

    def _due(self, at_step: int | None, after_seconds: float | None, progress: dict, now: datetime) -> bool:
        elapsed = (now - self.created_at).total_seconds()
        return (after_seconds is not None and elapsed >= after_seconds) or \
               (at_step is not None and (self._reported_step(progress) or 0) >= at_step)

    def _waiting_on_steps(self) -> list[str]:
        """The faults and spec changes still waiting for a training step, as the command line gives them."""
        return ([f"--kill-at-step {f.at_step}" for f in self.pending_faults if f.at_step is not None]
                + [f"--scale-at-step {c.at_step}" for c in self.pending_changes if c.at_step is not None])

    def _warn_without_progress(self, progress: dict, now: datetime) -> None:
        if self._warned_no_progress or self._reported_step(progress) is not None or not self._waiting_on_steps():
            return
        if (now - self.created_at).total_seconds() >= NO_PROGRESS_WARNING_SECONDS:
            self._warned_no_progress = True
            self.view.event(f"Warning: {', '.join(self._waiting_on_steps())} waits for the trainer to report a step, "
                            f"and it has reported none after {NO_PROGRESS_WARNING_SECONDS:.0f}s: call "
                            f"job.report(step=...) (or use the HF/Lightning callback), print `step=N epoch=E "
                            f"loss=L` lines on rank 0, or use --kill-after SECONDS")

    def _inject_faults(self, now: datetime) -> None:
        """Every fault due now, in the same instant (all trees frozen before any is killed)."""
        progress = read_report(self.checkpoint_dir, "progress.json") or {}
        self._warn_without_progress(progress, now)
        elapsed = (now - self.created_at).total_seconds()
        kills: list[tuple[WorkerProcess, FaultInjection]] = []
        stores: list[LocalProcess] = []
        deletes: list[WorkerProcess] = []
        for fault in list(self.pending_faults):
            if not self._due(fault.at_step, fault.after_seconds, progress, now):
                continue
            if fault.kind == KILL_STORE:
                if self.store is None or self.store.poll(now) is not None or self.store.terminating_since:
                    continue
                stores.append(self.store)
            else:
                target = self.workers.get(self._pod_of(fault.index))
                if target is None or target.deleted or target.held or target.process.poll(now) is not None:
                    continue
                if fault.kind == KILL:
                    kills.append((target, fault))
                else:
                    deletes.append(target)
            self.pending_faults.remove(fault)
        if kills or stores:
            killed = [*((w.process, fault.at_step) for w, fault in kills), *((s, None) for s in stores)]
            kill_together(*(process for process, _ in killed))
            # Read once the trees are gone, not a poll before: the survivors cannot complete a step without the
            # killed rank, so the newest report now is the last step the job completed.
            step = self._reported_step(read_report(self.checkpoint_dir, "progress.json") or {})
            for process, asked in killed:
                at = "before the trainer reported any step" if step is None else f"trainer step {step}"
                if asked is not None and step is not None and step != asked:
                    at += (f" (asked for step {asked}: steps are seen as the trainer reports them, a poll apart; "
                           f"{step} is the newest one reported when the kill struck)")
                self.view.event(f"fault injection: killed {process.name} (SIGKILL to its whole process tree) "
                                f"at {elapsed:.1f}s, {at}")
        for w in deletes:
            w.deleted = True  # the pod object is being deleted: it vanishes once its processes are gone
            w.process.terminate(now)
            step = self._reported_step(progress)
            self.view.event(f"fault injection: deleted {w.process.name} gracefully (SIGTERM, like kubectl "
                            f"delete pod) at {elapsed:.1f}s, "
                            + ("before the trainer reported any step" if step is None else f"trainer step {step}"))

    # ---- spec changes (kubectl scale, suspend) ---------------------------------------------

    def _apply_changes(self, now: datetime) -> None:
        progress = read_report(self.checkpoint_dir, "progress.json") or {}
        elapsed = (now - self.created_at).total_seconds()
        while self.pending_changes:
            change = self.pending_changes[0]
            waiting = [change.at_step is not None and (progress.get("step") or 0) < change.at_step,
                       change.world_size is not None and progress.get("world_size") != change.world_size,
                       change.after_seconds is not None and elapsed < change.after_seconds,
                       change.in_phase is not None and (self.status.phase != change.in_phase or bool(self.workers))]
            if any(waiting):
                return
            self.pending_changes.pop(0)
            what = []
            try:
                if change.replicas is not None:
                    self.scale(change.replicas)
                    what.append(f"replicas={change.replicas}")
                if change.suspend is not None:
                    self.set_suspend(change.suspend)
                    what.append(f"suspend={str(change.suspend).lower()}")
            except InvalidJob as rejected:
                self.view.event(f"spec change rejected (as the API server would): {rejected}")
                continue
            self.view.event(f"spec change: {', '.join(what)} (metadata.generation {self.metadata_generation}) "
                            f"at {(now - self.created_at).total_seconds():.1f}s, trainer step {progress.get('step')}")

    def scale(self, replicas: int) -> None:
        """`kubectl scale ddpjob/<name> --replicas=N`: InvalidJob for what the API server's CEL rules
        reject (outside minReplicas..maxReplicas); minReplicas/maxReplicas left unset keep following
        replicas, as they do in the cluster."""
        self._update_spec({**self.spec.wire(), "replicas": replicas})

    def set_suspend(self, suspend: bool) -> None:
        """`kubectl patch ddpjob/<name> --type=merge -p '{"spec":{"runPolicy":{"suspend":...}}}'`."""
        wire = self.spec.wire()
        self._update_spec({**wire, "runPolicy": {**wire.get("runPolicy", {}), "suspend": suspend}})

    def _update_spec(self, wire: dict) -> None:
        spec = validation.parse_spec(wire)
        if spec != self.spec:
            self.spec = spec
            self.metadata_generation += 1

    # ---- stop --------------------------------------------------------------------------------

    def stop_all(self) -> None:
        """Like deleting the job: SIGTERM every worker (they checkpoint), SIGKILL after the grace
        period or a second Ctrl-C, then the store; nothing of this run survives."""
        signals_seen = len(self._signals)
        now = self.clock()
        for w in self.workers.values():
            if w.process.started and w.process.poll(now) is None:
                w.process.terminate(now)
        deadline = time.monotonic() + self._grace().total_seconds()
        while any(w.process.started and w.process.poll(self.clock()) is None for w in self.workers.values()):
            if time.monotonic() >= deadline or len(self._signals) > max(signals_seen, 1):
                break
            self._show(self.clock())
            time.sleep(POLL_SECONDS)
        if self.store is not None and self.store.poll(self.clock()) is None:
            self.store.terminate(self.clock())
            wait_until = time.monotonic() + 5
            while self.store.poll(self.clock()) is None and time.monotonic() < wait_until:
                time.sleep(0.05)
        kill_marked(self.run_marker)
        for w in self.workers.values():
            w.process.kill()  # reaps the root processes
        if self.store is not None:
            self.store.kill()
        if self.zygote is not None:
            self.zygote.close()
        self._show(self.clock())

    # ---- show --------------------------------------------------------------------------------

    def _show(self, now: datetime) -> None:
        for name, tail in self.tails.items():
            for line in tail.read_new_lines():
                if self.options.print_logs:
                    self.view.log_line(name, line)
                resumed = RESUME_LINE.search(line)
                if resumed:
                    world = int(resumed.group(2)) if resumed.group(2) else None
                    w = self.workers.get(name)
                    self.resumes.append(Resume(at=now, pod=name, generation=w.generation if w else None,
                                               step=int(resumed.group(1)), world_size=world))
                    self.view.event(f"{name}: training resumed from the checkpoint of step {resumed.group(1)}"
                                    + (f" at world size {world}" if world else ""))
        self.view.update(self.snapshot(now))

    def snapshot(self, now: datetime) -> Snapshot:
        progress = read_report(self.checkpoint_dir, "progress.json") or {}
        shown = self.status.progress
        ranks = {r.index: r for r in self.status.ranks}
        rows = []
        for index in sorted(set(ranks) | {w.index for w in self.workers.values() if w.index >= 0}):
            name = self._pod_of(index)
            w, rank, tail = self.workers.get(name), ranks.get(index), self.tails.get(name)
            code = w.process.poll(now) if w else None
            if w is None or w.held:
                state = "Pending"
            elif w.process.terminating_since is not None and code is None:
                state = "Terminating"
            else:
                state = "Running" if code is None else ("Succeeded" if code == 0 else "Failed")
            rows.append(WorkerRow(name=name, state=state, restarts=rank.restarts if rank else 0,
                                  exit_code=code if code is not None else (rank.last_exit_code if rank else None),
                                  step=tail.step if tail else None, loss=tail.loss if tail else None))
        return Snapshot(job=self.name, phase=self.status.phase or "Pending", message=self.status.message or "",
                        restarts=self.status.restarts, max_restarts=self.spec.failure_policy.max_restarts,
                        elapsed_s=(now - self.created_at).total_seconds(), step=progress.get("step"),
                        loss=progress.get("loss"), world_size=progress.get("world_size"),
                        last_checkpoint_step=progress.get("last_checkpoint_step"), workers=tuple(rows),
                        percent=shown.percent if shown else None, eta=shown.eta if shown else None,
                        stalled=_stalled_message(self.status))

    def summary(self) -> Summary:
        phase = self.status.phase or "Pending"
        condition = next((c for c in self.status.conditions if c.type == phase), None)
        message = self.status.message or ""
        if condition is not None and condition.reason != phase:
            message = f"{condition.reason}: {message}"
        newest = newest_checkpoint(self.checkpoint_dir)
        if self.interrupted:
            kept = (f"the workers checkpointed (newest: step {newest[0]}), continue with --resume" if newest is not None
                    else "no checkpoint was written (the trainer saved none), --resume would start over")
            message = f"stopped by {signal.Signals(self._signals[0]).name} while {phase}; {kept}"
            phase = "Interrupted"
        notes = tuple(f"{what} never fired: the trainer reported no step that far (job.report(step=...), the "
                      f"HF/Lightning callback, or rank 0's `step=N epoch=E loss=L` lines)"
                      for what in self._waiting_on_steps())
        # What the trainer's reports said about the script (decisions/warnings.py), again where it is read last.
        notes += tuple(f"Warning {c.reason}: {c.message}" for c in self.status.conditions
                       if c.type in (decisions.CONDITION_WORLD_SIZE_MISMATCH, decisions.CONDITION_NOT_REPORTING)
                       and c.status == "True")
        result = read_report(self.checkpoint_dir, "result.json")
        started = self.created_at.timestamp()
        if result is not None and (self.checkpoint_dir / "result.json").stat().st_mtime < started:
            result = None  # left by an earlier run in a kept directory
        return Summary(job=self.name, phase=phase, message=message,
                       elapsed_s=(self.clock() - self.created_at).total_seconds(),
                       restarts=self.status.restarts, disruptions=self.status.disruptions,
                       worker_restarts={r.pod: r.restarts for r in self.status.ranks}, result=result,
                       progress=self.status.progress,
                       stalls=sum(1 for i in self.status.incidents if i.reason == decisions.REASON_STALLED),
                       checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else None,
                       log_dir=str(self.log_dir), notes=notes,
                       newest_checkpoint=(newest[0], str(newest[1])) if newest is not None else None)


def _stalled_message(status: model.DDPJobStatus) -> str | None:
    """The Stalled condition's message while it is True (hang detection)."""
    condition = next((c for c in status.conditions if c.type == decisions.CONDITION_STALLED), None)
    return condition.message if condition is not None and condition.status == "True" else None
