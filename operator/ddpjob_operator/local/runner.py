"""`ddpjob run --local`: the operator's reconcile loop with processes instead of pods.

Level-based like the operator: observe the processes (observer.py) -> `decisions.decide()` -> carry out its
actions (actuator.py) -> wait for the next poll or `requeue_after`. Every restart rule (exit codes, scope,
backoff, budget, success policy, deadline) lives in the decisions package, and every command line and
environment comes from launch.py. This module wires the parts: the run's directories and locks, the loop,
its signals and its end; faults.py strikes faults and spec changes (spec_changes.py), display.py shows it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable

from .. import decisions, launch, model, naming
from ..agent import contract
from ..validation import FieldError, InvalidJob
from . import display
from .actuator import POLL_SECONDS, LocalActuator
from .faults import Schedule
from .logs import JobFiles, LogTail, job_directory_name
from .observer import LocalObserver
from .options import COLD_GPU_NODE, FaultInjection, RunOptions
from .paths import DirectoryLock, refuse_planted_entries, refuse_unusable_directories, user_directory
from .pods import NAMESPACE, ExitRecord, LocalPods, Resume, WorkerProcess
from .processes import LocalProcess, Zygote, marker_for
from .progress_file import ProgressFile
from .spec_changes import JobSpecChanges
from .view import Summary, View

LOCK_FILE = "run.lock"
# SIGHUP: the terminal or ssh session closed. Each stops the run as a deletion does (docs/local.md).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


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
    """The loop that wires a local run's parts: observe (LocalObserver), decide, act (LocalActuator), strike
    what is due (faults.py), show (display.py). It gives itself to faults.py and display.py as a RunView."""

    def __init__(self, job: model.DDPJob, options: RunOptions, view: View,
                 clock: Callable[[], datetime] = utc_now, sleep: Callable[[float], None] = time.sleep):
        self.name, self.options, self.view = job.metadata.name, options, view
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
        self.checkpoint_dir = mount.resolve() if job.spec.checkpoint is not None else None
        self.files = JobFiles(self.checkpoint_dir / self._job_key if self.checkpoint_dir else None, self.view.event)
        self._locks: list[DirectoryLock] = []
        self.status = model.DDPJobStatus()
        self.spec_changes = JobSpecChanges(job.spec)
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
        self.interrupted = False
        self._signals: list[int] = []
        self.created_at = clock()
        self.pods = LocalPods()
        # Progress as the decision layer sees it (hang detection, status.progress, straggler timings): the
        # trainer's progress.json through the operator's own tracker.
        self.progress = ProgressFile(self.files, self.uid, (NAMESPACE, self.name), self.created_at)
        self.observer = LocalObserver(self.pods, self.progress, view, clock)
        self.actuator = LocalActuator(
            self.pods, job_name=self.name, job_uid=self.uid, run_id=self.run_id, base_env=self.base_env,
            log_dir=self.log_dir, checkpoint_dir=self.checkpoint_dir, zygote=self.zygote,
            unschedulable=options.unschedulable, event=view.event, clock=clock)
        self.schedule = Schedule(options.faults, options.changes, self.created_at, self.view.event)

    # ---- what the parts hold, by the names a RunView has ------------------------------------

    @property
    def spec(self) -> model.DDPJobSpec:
        return self.spec_changes.spec

    @property
    def metadata_generation(self) -> int:
        return self.spec_changes.metadata_generation

    @property
    def workers(self) -> dict[str, WorkerProcess]:
        return self.pods.workers

    @property
    def tails(self) -> dict[str, LogTail]:
        return self.pods.tails

    @property
    def store(self) -> LocalProcess | None:
        return self.pods.store

    @property
    def creations(self) -> dict[int, int]:
        """Worker pods created per index."""
        return self.pods.creations

    @property
    def exits(self) -> list[ExitRecord]:
        return self.observer.exits

    @property
    def resumes(self) -> list[Resume]:
        return self.observer.resumes

    @property
    def pending_faults(self) -> list[FaultInjection]:
        """The faults still to strike (the schedule's)."""
        return self.schedule.faults

    def waiting_on_steps(self) -> list[str]:
        return self.schedule.waiting_on_steps()

    def scale(self, replicas: int) -> None:
        """`kubectl scale` (spec_changes.py)."""
        self.spec_changes.scale(replicas)

    def set_suspend(self, suspend: bool) -> None:
        """`kubectl patch` of spec.runPolicy.suspend (spec_changes.py)."""
        self.spec_changes.set_suspend(suspend)

    def pod_of(self, index: int) -> str:
        """The pod that serves worker `index` now: its own, or the spare that took its place."""
        rank = next((r for r in self.status.ranks if r.index == index), None)
        return rank.pod if rank is not None else naming.worker_name(self.name, index)

    def reported_step(self, progress: dict) -> int | None:
        """The newest step the trainer reported: progress.json, or its rank-0 `step=N epoch=E loss=L` log
        lines for a script that prints them without reporting progress."""
        steps = [s for s in (progress.get("step"), *(t.step for t in self.tails.values())) if isinstance(s, int)]
        return max(steps) if steps else None

    @property
    def stopped_by(self) -> str | None:
        """The signal that stopped the run (SIGINT, SIGTERM, SIGHUP), if one did."""
        return signal.Signals(self._signals[0]).name if self._signals else None

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
        decision = decisions.decide(self.job_view(), self.observer.observe(self.status, self._grace(), now), options)
        self.status = decision.status
        for action in decision.actions:
            self.actuator.execute(action, self.spec, now)
        self.actuator.assign_spares(self.status, self.spec)
        self.actuator.tell_generations(self.status, self.spec)
        self.inject_faults(now)
        self.schedule.apply_changes(self, now)
        self._show(now)
        return decision

    def inject_faults(self, now: datetime) -> None:
        """The faults due now (faults.py); a subclass adds its own kinds here (hack/soak.py's pauses)."""
        self.schedule.inject(self, now)

    def job_view(self) -> decisions.JobView:
        return decisions.JobView(name=self.name, namespace=NAMESPACE, uid=self.uid,
                                 metadata_generation=self.metadata_generation, created_at=self.created_at,
                                 spec=self.spec, status=self.status)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)

    def _grace(self) -> timedelta:
        return timedelta(seconds=self.spec.template.termination_grace_period_seconds)

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

    # ---- stop --------------------------------------------------------------------------------

    def stop_all(self) -> None:
        """Like deleting the job: SIGTERM every worker (they checkpoint), SIGKILL after the grace
        period or a second Ctrl-C, then the store; nothing of this run survives."""
        signals_seen = len(self._signals)
        try:
            self.actuator.stop_gracefully(self._grace(), lambda: len(self._signals) > max(signals_seen, 1),
                                          lambda: self._show(self.clock()))
        finally:  # whatever interrupted the graceful part, nothing of this run survives
            self.actuator.kill_all(self.run_marker)
            self._release_locks()  # nothing of the run is left: its directories are free
            self._show(self.clock())

    def _release_locks(self) -> None:
        for lock in self._locks:
            lock.release()
        self._locks.clear()

    # ---- show --------------------------------------------------------------------------------

    def _show(self, now: datetime) -> None:
        self.observer.read_logs(now, self.options.print_logs)
        self.view.update(display.snapshot(self, now))

    def summary(self) -> Summary:
        return display.summary(self)
