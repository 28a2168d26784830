"""`ddpjob run --local`: the operator's reconcile loop with processes instead of pods.

Level-based like the operator: observe the processes -> `decisions.decide()` -> carry out its
actions -> wait for the next poll or `requeue_after`. Every restart rule (exit codes, scope,
backoff, budget, success policy, deadline) lives in the decisions package, and every command line and
environment comes from launch.py; this module only maps pods onto local processes.
"""

from __future__ import annotations

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

from .. import decisions, launch, model, naming, validation
from .. import agent
from ..agent import contract
from ..validation import FieldError, InvalidJob
from . import display
from .faults import Schedule
from .logs import RESUME_LINE, JobFiles, LogTail, job_directory_name
from .options import (COLD_GPU_NODE, FaultInjection, RunOptions)
from .paths import (DirectoryLock, NotARegularFile, read_regular, refuse_planted_entries, refuse_unusable_directories,
                    replace_file, user_directory)
from .processes import LocalProcess, Zygote, kill_marked, marker_for
from .progress_file import ProgressFile
from .view import Summary, View

NAMESPACE = "local"
LOCK_FILE = "run.lock"
# SIGHUP: the terminal or ssh session closed. Each stops the run as a deletion does (docs/local.md).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LOCALHOST = "127.0.0.1"
POLL_SECONDS = 0.2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
# What the scheduler says of a pod no node can take (an Unschedulable option's worker).
UNSCHEDULABLE = "Unschedulable"
UNSCHEDULABLE_MESSAGE = "0/1 nodes are available: held Pending by the local run's Unschedulable option"
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
    """A termination message: the launcher's file, or None (absent, or not a regular file of at most 64 KiB)."""
    try:
        data = read_regular(path, limit=1 << 16)
    except (OSError, NotARegularFile):
        return None
    return None if data is None else data.decode(errors="replace")


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
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
        self._root = options.state_dir / self.name
        # The claim: the user's own directory (a link there is their choice) or the run's default one.
        mount = (user_directory(options.checkpoint_dir, "--checkpoint-dir") if options.checkpoint_dir
                 else self._root / "checkpoints")
        # The trainer's own directory on the volume (progress.json, result.json, checkpoints/): the key is
        # the trainer's, so two jobs that share --checkpoint-dir never read each other's files.
        self._job_key = job_directory_name(self.name, NAMESPACE)
        refuse_unusable_directories(options.state_dir, self._root, self._root / "logs", mount, mount / self._job_key,
                                    mount / self._job_key / "checkpoints",
                                    fix="give --checkpoint-dir DIR for checkpoints kept elsewhere")
        self.log_dir = (self._root / "logs").resolve()
        self.checkpoint_dir: Path | None = mount.resolve() if job.spec.checkpoint is not None else None
        self.files = JobFiles(self.checkpoint_dir / self._job_key if self.checkpoint_dir else None, self.view.event)
        self._locks: list[DirectoryLock] = []
        self.status = model.DDPJobStatus()
        self.store: LocalProcess | None = None
        # Every worker starts as a fork of it: a new generation imports nothing (bench/recovery.py).
        # It imports torch, whose thread pool its forks keep: give it the trainers' thread count now.
        threads = launch.default_threads(job.spec)
        zygote_env = {**self.base_env, **({launch.THREADS_ENV: str(threads)} if threads is not None else {}),
                      # ...and the entrypoint's own imports (transformers, lightning: seconds a trainer skips)
                      contract.PRELOAD_ENV: json.dumps(launch.entrypoint_args(job.spec))}
        self.zygote = None if options.cold_start else Zygote(
            python=sys.executable, env=zygote_env, marker=marker_for(self.run_id, "zygote"),
            log_path=self.log_dir / "zygote.log")
        if options.cold_start == COLD_GPU_NODE:  # what the agent decides where it sees a GPU
            self.base_env[contract.FORK_TRAINER_ENV] = "0"
        self.store_port = free_port()
        self.store_ready = False
        self.workers: dict[str, WorkerProcess] = {}
        self.tails: dict[str, LogTail] = {}
        self.metadata_generation = 1  # moves with every spec change, as the API server's does
        self.creations: dict[int, int] = {}  # worker pods created per index
        self.exits: list[ExitRecord] = []
        self.resumes: list[Resume] = []
        self.interrupted = False
        self._signals: list[int] = []
        self.created_at = clock()
        # Progress as the decision layer sees it (hang detection, status.progress, straggler timings): the
        # trainer's progress.json through the operator's own tracker.
        self.progress = ProgressFile(self.files, self.uid, (NAMESPACE, self.name), self.created_at)
        self.schedule = Schedule(options.faults, options.changes, self.created_at, self.view.event)

    @property
    def pending_faults(self) -> list[FaultInjection]:
        """The faults still to strike (the schedule's)."""
        return self.schedule.faults

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> str:
        """Run to Succeeded or Failed (or until SIGINT, SIGTERM or SIGHUP); returns the final phase.
        InvalidJob, before anything starts, when another run holds its directories or something is planted there."""
        self._prepare_dirs()
        # A signal ignored by whoever started the run stays ignored (`nohup ddpjob run ...` outlives its terminal).
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
        try:
            if self.zygote is not None:
                self.zygote.start()  # its imports overlap the store's start
            while True:
                if self._signals:
                    self.interrupted = True
                    self.view.event(f"{self.stopped_by}: stopping every worker "
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
        self.inject_faults(now)
        self.schedule.apply_changes(self, now)
        self._show(now)
        return decision

    def inject_faults(self, now: datetime) -> None:
        """The faults due now (faults.py); a subclass adds its own kinds here (hack/soak.py's pauses)."""
        self.schedule.inject(self, now)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)

    def _prepare_dirs(self) -> None:
        """Takes the run's directories (one run at a time: a second would empty the first's checkpoints and logs),
        then empties what a new job starts without. InvalidJob when another run holds them or a file of the
        run's own is not a regular file."""
        self._root.mkdir(parents=True, exist_ok=True)  # no link on the way (refuse_unusable_directories)
        try:
            self._locks.append(DirectoryLock(self._root, LOCK_FILE, f"the logs and checkpoints of job {self.name} "
                                             "live here", "run from another working directory"))
            if self.options.checkpoint_dir is not None and self.checkpoint_dir is not None:
                # Another working directory's run of this job may share the claim, where its files are this one's.
                self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
                self._locks.append(DirectoryLock(self.checkpoint_dir, f"{self._job_key}.lock", f"job {self.name} "
                                                 "keeps its checkpoints here", "give another --checkpoint-dir"))
        except InvalidJob:
            self._release_locks()
            raise
        # The default directory is the job's own claim (claimTemplate): a new job starts empty, and so do
        # its logs (the logs of the run whose checkpoints are kept, with --resume or --checkpoint-dir, go on).
        fresh = self.options.checkpoint_dir is None and not self.options.resume
        if fresh and self.log_dir.exists():
            shutil.rmtree(self.log_dir)  # not a link (checked); rmtree removes links inside, not their targets
        self.log_dir.mkdir(parents=True, exist_ok=True)
        refuse_planted_entries(self.log_dir)  # a kept log directory: a link there would be appended through
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
                                  progress=self.progress.observe(self.status.generation, now), spares=tuple(spares))

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

    def pod_of(self, index: int) -> str:
        """The pod that serves worker `index` now: its own, or the spare that took its place."""
        rank = next((r for r in self.status.ranks if r.index == index), None)
        return rank.pod if rank is not None else naming.worker_name(self.name, index)

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
            name=naming.store_pod_name(self.name), marker=marker_for(self.run_id, "store"),
            argv=launch.store_command(self.store_port, python=sys.executable), env=self.base_env,
            log_path=self.log_dir / f"{naming.store_pod_name(self.name)}.log")
        self.store.start(now)

    def _create_worker(self, action: decisions.CreateWorker, now: datetime) -> None:
        name = naming.worker_name(self.name, action.index)
        if name in self.workers:
            return  # the old pod is still terminating: created once it is gone (next passes)
        endpoint = f"{LOCALHOST}:{self.store_port}"
        rdzv_id = naming.rendezvous_id(self.uid, action.generation)
        termination_log = self.log_dir / f"{name}.termination-log"
        termination_log.unlink(missing_ok=True)  # a message is this attempt's or none
        env = {**self.base_env, **launch.worker_env(
            self.spec, job_name=self.name, namespace=NAMESPACE, index=action.index, generation=action.generation,
            endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST, master_addr=LOCALHOST,
            checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else None),
            contract.TERMINATION_LOG_ENV: str(termination_log)}
        process = LocalProcess(
            name=name, marker=marker_for(self.run_id, name, action.attempt), env=env,
            argv=launch.worker_command(self.spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST,
                                       python=sys.executable, agent_dir=agent.DIRECTORY),
            log_path=self.log_dir / f"{name}.log", zygote=self.zygote)
        if name not in self.tails:  # logs are appended across runs: read only this run's part
            self.tails[name] = LogTail(process.log_path, offset=_size(process.log_path))
        worker = WorkerProcess(action.index, action.generation, action.attempt, process, termination_log,
                               node_range=naming.node_range(self.spec), created_at=now)
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
        name = naming.spare_name(self.name, action.slot)
        if name in self.workers:
            return
        endpoint = f"{LOCALHOST}:{self.store_port}"
        rdzv_id = naming.rendezvous_id(self.uid, action.generation)
        termination_log = self.log_dir / f"{name}.termination-log"
        termination_log.unlink(missing_ok=True)
        assignment = self.log_dir / f"{name}.assignment.json"
        assignment.unlink(missing_ok=True)
        ready_file = self.log_dir / f"{name}.ready"  # the pod's own: a new spare of the name starts not Ready
        ready_file.unlink(missing_ok=True)
        env = {**self.base_env, **launch.worker_env(
            self.spec, job_name=self.name, namespace=NAMESPACE, index=-1, generation=action.generation,
            endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST, master_addr=LOCALHOST,
            checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else None),
            contract.TERMINATION_LOG_ENV: str(termination_log), contract.SPARE_ENV: "1",
            contract.ASSIGNMENT_FILE_ENV: str(assignment), contract.SPARE_READY_FILE_ENV: str(ready_file)}
        process = LocalProcess(
            name=name, marker=marker_for(self.run_id, name, 0), env=env,
            argv=launch.worker_command(self.spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST,
                                       python=sys.executable, agent_dir=agent.DIRECTORY),
            log_path=self.log_dir / f"{name}.log", zygote=self.zygote)
        if name not in self.tails:
            self.tails[name] = LogTail(process.log_path, offset=_size(process.log_path))
        spare = WorkerProcess(-1, action.generation, 0, process, termination_log,
                              node_range=naming.node_range(self.spec), created_at=now, assignment_file=assignment,
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
            given = {"index": rank.index, "generation": rank.generation, "nnodes": naming.nnodes(self.spec),
                     "rdzvId": naming.rendezvous_id(self.uid, rank.generation)}
            replace_file(w.assignment_file, json.dumps(given).encode())
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

    def reported_step(self, progress: dict) -> int | None:
        """The newest step the trainer reported: progress.json, or its rank-0 `step=N epoch=E loss=L` log
        lines for a script that prints them without reporting progress."""
        steps = [s for s in (progress.get("step"), *(t.step for t in self.tails.values())) if isinstance(s, int)]
        return max(steps) if steps else None

    # ---- spec changes (kubectl scale, suspend) ---------------------------------------------

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
        try:
            self._stop_gracefully()
        finally:  # whatever interrupted the graceful part, nothing of this run survives
            kill_marked(self.run_marker)
            for w in self.workers.values():
                w.process.kill()  # reaps the root processes
            if self.store is not None:
                self.store.kill()
            if self.zygote is not None:
                self.zygote.close()
            self._release_locks()  # nothing of the run is left: its directories are free
            self._show(self.clock())

    def _release_locks(self) -> None:
        for lock in self._locks:
            lock.release()
        self._locks.clear()

    def _stop_gracefully(self) -> None:
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
        self.view.update(display.snapshot(self, now))

    def summary(self) -> Summary:
        return display.summary(self)

    @property
    def stopped_by(self) -> str | None:
        """The signal that stopped the run (SIGINT, SIGTERM, SIGHUP), if one did."""
        return signal.Signals(self._signals[0]).name if self._signals else None
