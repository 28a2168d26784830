"""`Job`: everything a torchrun script needs to keep DDPJob's promises, in one object.

    with Job.start() as job:                      # env, device, process group, SIGTERM handler
        state = job.resume()                      # the newest intact checkpoint (all ranks), or None
        for step in range(start, total):
            ...train one step...
            job.report(step=step, total_steps=total, loss=loss)
            if job.should_save(step):
                job.save(step, {...})             # rank 0 writes, atomically
            if job.should_stop():                 # SIGTERM anywhere: every rank, same step
                job.save(step, {...}, final=True)
                return job.stop.exit_code         # 143

In-process recovery (`DDPJOB_INPROCESS=1`; `Job` delegates to runtime/recovery.py): `job.carry(state=...,
load=..., rewrap=..., step=...)` once the model is wrapped, and around the steps `except Exception as e: if
job.recover(e): <go on from the progress in memory>`; `resume()` then returns a peer's state where a survivor holds it.
`Job.start(build_first=True)` returns before the trainer has a place (a warm spare, or any trainer of an in-process
job): build the model first, `resume()` takes the place, so a view it joins waits for the hand-over, not the build.

A generation that resumed (in process, or from the volume) keeps its recovery timeline in `job.recovery`, which
rank 0's reports carry (`progress.recovery_field`); `job.recovering` is True until its first step is reported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from . import inprocess
from .checkpoint import CheckpointManager
from .distributed import (CollectiveTimeout, JobEnv, StopRequest, abort_process_groups, barrier,
                          destroy_process_group, init_process_group, select_device)
from .frameworks import announce as announce_line, resume_message
from .progress import ProgressReporter, write_result
from .rank_measures import mean_over_ranks, step_seconds_by_pod
from .recovery import META, Carried, InProcessRecovery, join_first_group
from .timing import StepTimer
from .views import View
from .watchdog import StallWatchdog

log = logging.getLogger(__name__)


class Job:
    def __init__(self, env: JobEnv | None, device: torch.device, stop: StopRequest, *,
                 checkpoint_dir: str | os.PathLike | None = None, keep: int | None = None,
                 every_steps: int | None = None, async_save: bool = False,
                 reporter: ProgressReporter | None = None, owns_process_group: bool = False,
                 timeouts: CollectiveTimeout | None = None, rendezvous: inprocess.Rendezvous | None = None) -> None:
        """`env` None: no place yet (`Job.start(build_first=True)`; `resume()` takes it)."""
        self.device, self.stop = device, stop
        self.timeouts = timeouts if timeouts is not None else CollectiveTimeout(1800.0)
        # A peer lost, a generation resumed (runtime/recovery.py); `rendezvous`: the in-process job's store.
        self.in_process = InProcessRecovery(self, rendezvous)
        self._storage = (checkpoint_dir, keep, every_steps, async_save, reporter)
        self._env: JobEnv | None = None
        self.checkpoint_dir, self.every_steps = None, 0
        self.checkpoints: CheckpointManager | None = None
        self.reporter: ProgressReporter | None = None
        if env is not None:
            self._bind(env)
        self._owns_pg, self._closed = owns_process_group, False
        # Own time per step, apart from waits in collectives (straggler detection; runtime/timing.py).
        self.step_timer = StepTimer(device)
        # A trainer blocked in a collective obeys SIGTERM within seconds, and a silent peer is noticed where the
        # collective does not time out (runtime/watchdog.py). Work that is not steps: `self.timeouts.relax()` first.
        self.watchdog = StallWatchdog(lambda: self.timeouts.current_s if self.timeouts.steady else 0.0,
                                      abort=lambda: abort_process_groups(self.timeouts.groups))

    def _bind(self, env: JobEnv) -> None:
        """What depends on this process's rank: the checkpoint manager (rank 0 writes) and the reporter."""
        checkpoint_dir, keep, every_steps, async_save, reporter = self._storage
        self._env = env
        directory = checkpoint_dir if checkpoint_dir is not None else env.checkpoint_dir
        self.checkpoint_dir = str(directory) if directory else None
        self.every_steps = env.checkpoint_interval_steps if every_steps is None else every_steps
        if self.checkpoint_dir:  # checks that rank 0 can write there, now rather than at the first save
            # Under <dir>/<namespace>.<name>/ (two jobs on one claim never see each other's steps), fenced by the
            # rendezvous generation of torchrun's run id (the pod's DDPJOB_GENERATION may be stale).
            self.checkpoints = CheckpointManager(self.checkpoint_dir, keep if keep is not None else env.checkpoint_keep,
                                                 is_writer=env.is_main, async_save=async_save,
                                                 job_name=env.job_name or "")
        self.reporter = reporter if reporter is not None else ProgressReporter.from_env(
            checkpoint_dir=self.checkpoint_dir or "", rank=env.rank, local_rank=env.local_rank)

    @property
    def env(self) -> JobEnv:
        if self._env is None:
            raise RuntimeError("job.env: this trainer has no place yet; job.resume() waits for it and joins "
                               "(Job.start(build_first=True): build only what does not depend on the rank before)")
        return self._env

    @env.setter
    def env(self, env: JobEnv) -> None:
        self._env = env

    @property
    def seated(self) -> bool:
        """False only in an in-process trainer started with build_first=True, until `resume()` took its place."""
        return self._env is not None

    @classmethod
    def start(cls, *, device: str = "auto", backend: str = "auto", timeout_s: float = 1800.0,
              steady_timeout_s: float = 0.0, checkpoint_dir: str | os.PathLike | None = None,
              keep: int | None = None, every_steps: int | None = None, async_save: bool = False,
              build_first: bool = False) -> "Job":
        """Read the environment, install the stop handler, pick the device (cuda:LOCAL_RANK or cpu)
        and initialise the process group (unless already initialised). Checkpoint settings default
        to the DDPJOB_CHECKPOINT_* variables. `steady_timeout_s` > 0: the collective timeout after the
        first steps (`CollectiveTimeout`), so a hung peer fails the job's collectives in that time.
        An in-process trainer (DDPJOB_INPROCESS=1) takes its place here (a warm spare waits for it), or with
        `build_first=True` returns at once: build what does not depend on the rank (dataset, model, optimizer),
        then `resume()` takes the place (the view it joins waits for no build) and receives the state."""
        stop = StopRequest()  # first: a SIGTERM during start-up is not lost
        try:
            rendezvous = None
            if inprocess.enabled() and not dist.is_initialized():
                rendezvous, dev, env = join_first_group(device, backend, timeout_s, build_first=build_first)
            else:
                env = JobEnv.from_env()
                dev = select_device(device, env)
            owns = not dist.is_initialized() and rendezvous is None
            if owns:
                init_process_group(env, dev, backend=backend, timeout_s=timeout_s)
            owns = owns or rendezvous is not None
            try:
                job = cls(env, dev, stop, checkpoint_dir=checkpoint_dir, keep=keep, every_steps=every_steps,
                          async_save=async_save, owns_process_group=owns,
                          timeouts=CollectiveTimeout(timeout_s, steady_timeout_s), rendezvous=rendezvous)
                if env is None and not build_first:
                    job._take_place()
                return job
            except BaseException:
                if owns:
                    destroy_process_group()
                raise
        except BaseException:
            stop.close(drain=False)
            raise

    def _take_place(self, into: Callable[[], dict[str, Any]] | None = None) -> None:
        """Its place, its group (`InProcessRecovery.take_place`: `into` prepares the memory), then its rank's parts."""
        self._bind(self.in_process.take_place(into))

    # ---- what recovery keeps (runtime/recovery.py) ---------------------------------------------

    @property
    def rendezvous(self) -> inprocess.Rendezvous | None:
        """In-process recovery: the job's store, through which this trainer forms its groups."""
        return self.in_process.rendezvous

    @property
    def recovery(self) -> dict[str, Any] | None:
        """How this generation resumed (`progress.recovery_field`; None: it did not): rank 0's reports carry it."""
        return self.in_process.timeline

    @property
    def recovering(self) -> bool:
        """This generation resumed and its first step is not reported yet (report it at once: the operator waits)."""
        return self.in_process.recovering

    @property
    def view(self) -> View:
        """Who trains together now (runtime/views.py): `env.rank` is this process's index in it, `env.world_size`
        its size."""
        return self.in_process.view or View.whole(self.env.generation, self.env.world_size)

    @property
    def seat(self) -> int:
        """This process's logical rank (its data shard, the replica index's), whoever else trains."""
        return self.rendezvous.seat.rank if self.rendezvous is not None else self.env.rank

    @property
    def regrouped(self) -> bool:
        """The last should_stop() (or recover() that returned True) moved this process to another view."""
        return self.in_process.regrouped

    @property
    def replicas_agree(self) -> bool:
        """Every rank holds the same replica (after an exchange): DDP need not broadcast (`init_sync=not ...`)."""
        return self.in_process.replicas_agree

    # ---- checkpoints --------------------------------------------------------------------------

    def resume(self, *, announce: bool = True, into: Callable[[], dict[str, Any]] | None = None
               ) -> dict[str, Any] | None:
        """Every rank: the state of the newest checkpoint that verifies (rank 0 chooses, all load the same step), or
        None; `state["ddpjob"]` holds its step and world size. A trainer started with build_first=True takes its place here
        first. `into()`: this process's state as built (`carry(state=...)`): a peer's lands in its tensors."""
        if self._env is None:
            self._take_place(into)
        if (state := self.in_process.from_peer(announce, into)) is not None:  # a survivor's: no volume read
            return state
        if self.checkpoints is None:
            return None
        found = self.checkpoints.load_latest() if self.env.is_main else None
        chosen = [found[0] if found else None]
        if dist.is_initialized():
            dist.broadcast_object_list(chosen, src=0)
        step = chosen[0]
        if step is None:
            if announce and self.env.is_main:
                log.info("no checkpoint found: starting from scratch")
            return None
        state = found[1] if found else self.checkpoints.load(step)
        meta = state.get(META) or {}
        if announce and self.env.is_main:  # shown even where the script configured no logging
            announce_line(resume_message(step, meta.get("world_size", "?"), self.env.world_size))
        reason = self.in_process.restart_reason(meta.get("generation")) if self.env.is_main else ""
        self.in_process.recovered("Restart", reason, step)
        return state

    def should_save(self, step: int) -> bool:
        """A periodic checkpoint is due after `step` (DDPJOB_CHECKPOINT_INTERVAL_STEPS)."""
        return self.checkpoints is not None and self.every_steps > 0 and step % self.every_steps == 0

    def save(self, step: int, state: dict[str, Any], *, final: bool = False) -> None:
        """Rank 0 writes `state` (plus `state["ddpjob"]`); other ranks return. `final=True`: written
        synchronously, then every rank waits at a barrier, so no rank exits before the commit (torchrun
        tears down a node's other trainers as soon as one exits, and rank 0 may be one of them)."""
        self.timeouts.relax()  # the other ranks wait for this write in their next collective
        with self.step_timer.waiting():  # a checkpoint is not training work: rank 0 must not look slow for it
            self._save(step, state, final)

    def _save(self, step: int, state: dict[str, Any], final: bool) -> None:
        if final:
            self.in_process.rescues.settle_before_final_save(step, self.recovery)
        if self.checkpoints is not None and self.env.is_main:
            if final:
                self.checkpoints.wait()
            if self.checkpoints.last_committed_step != step:
                meta = {"step": step, "world_size": self.env.world_size, "generation": self.checkpoints.generation}
                self.checkpoints.save(step, {**state, META: meta}, blocking=final)
        if final and self.checkpoints is not None and dist.is_initialized():
            barrier(self.device)

    def rescue(self, step: int, state: dict[str, Any]) -> bool:
        """After a collective failed because a peer died (`is_peer_failure`), on every surviving rank: save `state`,
        the replica after `step` optimizer steps, so the next generation resumes from it, not an older checkpoint. The
        first survivor to claim the step writes it (True there); no collective (runtime/rescues.py)."""
        return self.in_process.rescues.now(step, state)

    # ---- in-process recovery (DDPJOB_INPROCESS=1, runtime/inprocess.py) ------------------------------

    def carry(self, *, state: Callable[[], dict[str, Any]], load: Callable[[dict[str, Any]], None],
              rewrap: Callable[[], None], step: Callable[[], int], rescue: bool = True,
              release: Callable[[], None] | None = None) -> None:
        """What a survivor keeps in memory across a peer's failure: `state()` the replica (as a checkpoint
        holds it: model, optimizer, scaler, progress), `load(state)` puts a peer's into this process,
        `rewrap()` builds the DDP wrapper again in the new process group (and drops partial gradients),
        `step()` the optimizer steps completed; `rescue`: save the replica as a rescue checkpoint meanwhile;
        `release()` drops the script's references to the failed group (its DDP wrapper: `model = None`) before
        this process leaves it: a Gloo group closes its connections only with its last reference, and a peer
        blocked on this rank (not on the dead one) otherwise waits for its collective timeout.
        Without DDPJOB_INPROCESS=1 nothing happens with them."""
        self.in_process.carried = Carried(state, load, rewrap, step, rescue, release)

    def recover(self, error: BaseException) -> bool:
        """Call it with what a training step raised. True: this process is in the next generation's process
        group with the newest state (a peer's when it was behind), rewrapped; go on from the progress in
        memory (the step that failed is trained again). False: not a peer's failure, in-process recovery is
        off, or it is not possible here (logged with the reason): re-raise, the exit path as before."""
        with self.step_timer.waiting():  # waiting for the next view and the hand-over: no rank's own work
            return self.in_process.recover(error)

    @property
    def last_checkpoint_step(self) -> int | None:
        return self.checkpoints.last_committed_step if self.checkpoints is not None else None

    # ---- stop, progress, collectives ----------------------------------------------------------

    def should_stop(self) -> bool:
        """Call once per step on every rank: True on all of them once any was signalled. In process, the view may
        change here (a joiner comes in at this step boundary): `regrouped` then says so, the model rewrapped."""
        self.in_process.stepped()
        self.timeouts.step()
        self.watchdog.step()
        self.step_timer.boundary()
        with self.step_timer.waiting():  # the stop flag's all_reduce waits for the slowest rank (rank 0: the store)
            stop = self.stop.agreed(regroup=self.in_process.regroup_wanted())
        self.in_process.peer_stopped = stop and not self.stop.requested
        if self.stop.group is not None:
            self.timeouts.add_group(self.stop.group)
        self.in_process.after_agreed(stop)
        return stop

    def report(self, *, step: int, total_steps: int | None = None, loss: float | None = None, **fields: Any) -> None:
        """Non-blocking progress report; call it on every rank (the file is rank 0's, the endpoint gets
        local rank 0 of every pod). Adds world_size and last_checkpoint_step; on rank 0 of a generation that
        resumed, its recovery timeline (`recovery`; a step past the resumed one ends it, if should_stop() did not)."""
        if self.recovery is not None and step > self.recovery["resumed_step"]:
            self.in_process.stepped()
        fields = {**self.in_process.report_fields(self.view), **fields}  # the view's, unless the script says
        fields.setdefault("last_checkpoint_step", self.last_checkpoint_step)
        if "step_seconds" not in fields:  # this rank's own time per step since the last report (no collective)
            fields["step_seconds"] = self.step_timer.take()
        self.reporter.report(step=step, total_steps=total_steps, loss=loss, **fields)

    def result(self, **metrics: Any) -> None:
        """Rank 0 at a successful end: result.json {"status": "completed", "world_size", **metrics} beside
        progress.json, atomically; a trainer still waiting to join this job exits 0 (nothing left to train)."""
        if self.env.is_main and self.checkpoint_dir:
            write_result(self.checkpoint_dir, {"status": "completed", "world_size": self.env.world_size, **metrics})
        self.in_process.finished()

    def mean(self, value: float | torch.Tensor) -> float:
        """The mean of a per-rank value over all ranks (a collective: every rank must call it)."""
        return mean_over_ranks(value, self.env, self.device, self.step_timer)

    def step_seconds(self) -> tuple[float | None, dict[int, float]]:
        """Every rank (one small all_gather, e.g. at each log interval): this pod's own time per step since
        the last call (the slowest of its local ranks) and every pod's, by replica index (DDPJOB_REPLICA_INDEX,
        else torchrun's group rank). Report the first as `step_seconds` (straggler detection)."""
        return step_seconds_by_pod(self.env, self.device, self.step_timer)

    # ---- exit ---------------------------------------------------------------------------------

    def close(self, clean: bool = True) -> None:
        """Every exit path: pending checkpoint write, progress, stop handler, process group."""
        if self._closed:
            return
        self._closed = True
        self.watchdog.close()
        try:
            self.in_process.rescues.join()
            if self.checkpoints is not None:
                self.checkpoints.wait()
        finally:
            try:
                if self.reporter is not None:
                    self.reporter.close()
                self.stop.close(drain=clean)
            finally:
                if self.watchdog.verdict is not None:
                    self.watchdog.exit()  # a silent peer: its verdict, not the aborted collective's error
                if self._owns_pg and not self.in_process.group_wedged:
                    destroy_process_group()

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(clean=exc_type is None)

