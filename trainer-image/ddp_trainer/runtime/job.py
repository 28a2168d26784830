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

In-process recovery (`DDPJOB_INPROCESS=1`, runtime/inprocess.py): `job.carry(state=..., load=..., rewrap=...,
step=...)` once the model is wrapped, and around the steps `except Exception as e: if job.recover(e): <go on
from the progress in memory>`; `resume()` then returns a peer's state where a survivor holds it. A warm spare
(`Job.start(build_first=True)`) returns before it has a place: build the model first, `resume()` takes the place.

A generation that resumed (in process, or from the volume) keeps its recovery timeline in `job.recovery`, which
rank 0's reports carry (`progress.recovery_field`); `job.recovering` is True until its first step is reported.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .checkpoint import CheckpointManager, RescueCheckpoint, raise_fence
from .frameworks import announce as announce_line, resume_message
from .distributed import (CollectiveTimeout, JobEnv, StopRequest, abort_process_groups, barrier,
                          destroy_process_group, init_process_group, select_device)
from . import inprocess
from .contract import GENERATION_ENV, REJOIN_TIMEOUT_ENV, REPLICA_INDEX_ENV
from .distributed import is_peer_failure
from .progress import ProgressReporter, recovery_field, write_result
from .timing import StepTimer
from .watchdog import StallWatchdog

log = logging.getLogger(__name__)
META = "ddpjob"  # key of the runtime's own entry in every checkpoint dict


class Job:
    def __init__(self, env: JobEnv | None, device: torch.device, stop: StopRequest, *,
                 checkpoint_dir: str | os.PathLike | None = None, keep: int | None = None,
                 every_steps: int | None = None, async_save: bool = False,
                 reporter: ProgressReporter | None = None, owns_process_group: bool = False,
                 timeouts: CollectiveTimeout | None = None, rendezvous: inprocess.Rendezvous | None = None) -> None:
        """`env` None: a warm spare without a place yet (`Job.start(build_first=True)`; `resume()` takes it)."""
        self.device, self.stop = device, stop
        self.rendezvous = rendezvous  # in-process recovery: this trainer forms its groups through the job's store
        self._carried: _Carried | None = None
        self._group_wedged = False  # the old group could not be left: never touch it again
        self._rescues: list[RescueCheckpoint] = []  # in-process survivors' rescue writes not yet joined
        self._peer_stopped = False  # the last agreed stop was a peer's signal, not this rank's
        self.timeouts = timeouts if timeouts is not None else CollectiveTimeout(1800.0)
        # How this generation came back from the incident before it (None: it did not resume), and when its
        # process group was complete: rank 0's reports carry it (progress.recovery_field).
        self.recovery: dict[str, Any] | None = None
        self._group_time = time.time()
        # Every rank's state is the same replica (an in-process exchange just made it so): a DDP wrapper built now
        # need not broadcast rank 0's parameters (`init_sync=not job.replicas_agree`, a cost that grows with the model).
        self.replicas_agree = False
        self._storage = (checkpoint_dir, keep, every_steps, async_save, reporter)
        self._env: JobEnv | None = None
        self.checkpoint_dir: str | None = None
        self.every_steps = 0
        self.checkpoints: CheckpointManager | None = None
        self.reporter: ProgressReporter | None = None
        if env is not None:
            self._bind(env)
        self._owns_pg = owns_process_group
        self._closed = False
        # Own time per step, apart from waits in collectives (straggler detection; runtime/timing.py).
        self.step_timer = StepTimer(device)
        # A trainer blocked in a collective still obeys SIGTERM within seconds, and a silent peer is
        # noticed even where the collective itself does not time out (runtime/watchdog.py). Work that is
        # not steps (an evaluation) relaxes the timeouts first: `self.timeouts.relax()`.
        self.watchdog = StallWatchdog(lambda: self.timeouts.steady_s if self.timeouts.steady else 0.0,
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
            raise RuntimeError("job.env: this warm spare has no place yet; job.resume() waits for it and joins "
                               "(Job.start(build_first=True): build only what does not depend on the rank before)")
        return self._env

    @env.setter
    def env(self, env: JobEnv) -> None:
        self._env = env

    @property
    def seated(self) -> bool:
        """False only in a warm spare started with build_first=True, until `resume()` took its place."""
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
        A warm spare's trainer (DDPJOB_INPROCESS=1, started by its agent before it has a place) waits here for
        its place, or with `build_first=True` returns at once: build what does not depend on the rank (the
        dataset, the model, the optimizer), then `resume()` waits for the place, joins and receives the state;
        `job.env` is known from then on."""
        stop = StopRequest()  # first: a SIGTERM during start-up is not lost
        try:
            rendezvous = None
            if inprocess.enabled() and not dist.is_initialized():
                # Before any group exists: a Gloo group that exists when torch._dynamo is first imported (DDP
                # imports it) is never released (torch 2.13), so a survivor leaving it would keep its
                # connections open and the peers blocked on it waiting for their collective timeout.
                import torch._dynamo  # noqa: F401
                rendezvous, generation = inprocess.Rendezvous.from_env(os.environ, backend)
                seat = rendezvous.seat
                dev = select_device(device, JobEnv(rank=0, local_rank=seat.local_rank, world_size=1))
                env = None if rendezvous.place_key else _join_in_process(rendezvous, generation, dev, timeout_s)
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

    def _take_place(self) -> None:
        """A warm spare: wait for the place its agent is given (runtime/inprocess.py), then join that
        generation's group. A stop signal meanwhile (the spare's pod deleted) ends the process with 128+N."""
        rdzv = self.rendezvous
        announce_line("spare: trainer ready, waiting for its place")
        generation = rdzv.wait_place(lambda: self.stop.requested)
        if generation is None:
            raise SystemExit(self.stop.exit_code)
        placed = time.monotonic()
        generation, world = rdzv.join_newest(generation, self.device, self.timeouts.long_s)
        self._group_time = time.time()
        _publish_environ(rdzv, generation, world)
        self._bind(JobEnv.from_env())
        log.warning("spare: took the place of rank %d of %d in generation %d (%.2f s to form the group)",
                    rdzv.seat.rank, world, generation, time.monotonic() - placed)

    # ---- checkpoints --------------------------------------------------------------------------

    def resume(self, *, announce: bool = True, into: Callable[[], dict[str, Any]] | None = None
               ) -> dict[str, Any] | None:
        """Every rank: the state of the newest checkpoint that verifies (rank 0 chooses, all load
        the same step), or None. Its `state["ddpjob"]` holds the step and the world size it was saved at.
        A warm spare started with build_first=True takes its place here first. `into()`: this process's state as
        built (as `carry(state=...)` gives it): a peer's state is received into its tensors where they match."""
        if self._env is None:
            self._take_place()
        if self.rendezvous is not None and dist.is_initialized():  # a survivor may hold the state: no volume read
            state = self._from_peer(announce, into)
            if state is not None:
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
        self._recovered("Restart", self._restart_reason(meta.get("generation")) if self.env.is_main else "", step)
        return state

    def _restart_reason(self, saved_in: int | None) -> str:
        """Why this generation resumed from the volume where in-process recovery was asked for ("" where not)."""
        if not inprocess.enabled():
            return ""
        if self.rendezvous is None:
            return "the script formed its own process group: in-process recovery needs Job.start to form it"
        try:
            note = self.rendezvous.fallback_reason(self.env.generation, saved_in)
        except RuntimeError:  # the store: the reason only
            note = None
        return note or (f"no rank of generation {self.env.generation} held the training state in memory (every "
                        f"one started anew): resumed from the volume")

    def _recovered(self, path: str, reason: str, step: int) -> None:
        """This generation resumed: its timeline starts (rank 0's reports carry it from now on)."""
        self.recovery = recovery_field(path, reason=reason, resumed_step=step, rendezvous_time=self._group_time)
        if self.env.is_main and self.reporter is not None:
            self.reporter.recovery = self.recovery

    @property
    def recovering(self) -> bool:
        """This generation resumed and its first step has not been reported yet: a script reports its first
        step at once (the bundled trainer does), so that the operator sees the recovery end without a wait."""
        return self.recovery is not None and self.recovery["first_step_time"] is None

    def _stepped(self) -> None:
        """An optimizer step of this generation finished: the first one ends the recovery's timeline."""
        if self.recovering:
            self.recovery = {**self.recovery, "first_step_time": time.time()}
            if self.env.is_main and self.reporter is not None:
                self.reporter.recovery = self.recovery

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
        if final and self.recovery is not None and self.recovery["path"] == "InProcess" and \
                self.recovery["resumed_step"] == step and dist.is_initialized():
            # No step trained since the in-process resume: a survivor may still be writing its rescue of this very
            # step. Every rank knows it (the same recovery), so all wait for their own, then rank 0 writes over it.
            self._join_rescues()
            barrier(self.device)
        if self.checkpoints is not None and self.env.is_main:
            if final:
                self.checkpoints.wait()
            if self.checkpoints.last_committed_step != step:
                meta = {"step": step, "world_size": self.env.world_size, "generation": self.checkpoints.generation}
                self.checkpoints.save(step, {**state, META: meta}, blocking=final)
        if final and self.checkpoints is not None and dist.is_initialized():
            barrier(self.device)

    def rescue(self, step: int, state: dict[str, Any]) -> bool:
        """After a collective failed because a peer died (`is_peer_failure`), on every surviving rank:
        save `state`, the replica this rank holds after `step` completed optimizer steps, so the next
        generation resumes from it instead of an older periodic checkpoint. The first survivor to claim
        the step writes it; the others, and a worker of a replaced generation, write nothing. No
        collective. Returns True on the rank that wrote it."""
        self.watchdog.release()  # out of the collective: the watchdog waits for this save before exiting
        if self.checkpoints is None:
            return False
        try:
            written = self.checkpoints.save_rescue(step, {**state, META: self._rescue_meta(step)})
        except OSError as e:  # the original failure matters more than this one
            log.warning("rescue checkpoint of step %d not written: %s", step, e)
            return False
        if written:
            log.warning("rescue checkpoint: rank %d saved step %d after a peer failed", self.env.rank, step)
        return written

    def _rescue_meta(self, step: int) -> dict[str, Any]:
        """A rescue checkpoint's `ddpjob` part: where it was trained and by which rank it was saved."""
        return {"step": step, "world_size": self.env.world_size, "generation": self.checkpoints.generation,
                "rescued_by_rank": self.env.rank}

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
        self._carried = _Carried(state, load, rewrap, step, rescue, release)

    def recover(self, error: BaseException) -> bool:
        """Call it with what a training step raised. True: this process is in the next generation's process
        group with the newest state (a peer's when it was behind), rewrapped; go on from the progress in
        memory (the step that failed is trained again). False: not a peer's failure, in-process recovery is
        off, or it is not possible here (logged with the reason): re-raise, the exit path as before."""
        if self.rendezvous is None or not is_peer_failure(error):
            return False
        if self._carried is None:
            return self._fall_back("the script did not call job.carry() (what a survivor keeps in memory)")
        if self.watchdog.verdict is not None:
            return self._fall_back(f"the stall watchdog's verdict ({self.watchdog.verdict[1]}) ends the process")
        started = time.monotonic()
        old = self.env.generation
        self.watchdog.release()
        self.timeouts.relax()  # no silent-peer verdict while this rank waits for the next generation
        carried = self._carried
        log.warning("rank %d at step %d: a peer %s in generation %d (%s); recovering in process", self.env.rank,
                    carried.step(), "stopped" if self._peer_stopped else "failed", old,
                    str(error).splitlines()[0][:200] if str(error) else type(error).__name__)
        self._peer_stopped = False
        rescue = self._rescue_in_background(carried)  # durability, overlapping the hand-over
        self._release(carried, error)
        try:
            generation, source, received, phases = self._rejoin(carried, rescue)
        except inprocess.CannotRecover as e:
            self._join_rescues()  # the exit path: each commits under its failed generation's fence, or not at all
            return self._fall_back(str(e))
        self._recovered("InProcess", "", carried.step())
        log.warning("recovered in process: generation %d -> %d, rank %d of %d, state %s, %.2f s after the failure "
                    "(%s)", old, generation, self.env.rank, self.env.world_size,
                    f"received from rank {source}" if received else "kept", time.monotonic() - started,
                    ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items()))
        return True

    def _release(self, carried: "_Carried", error: BaseException) -> None:
        """Nothing here refers to the failed group once it is left, so that leaving closes its connections and
        the peers blocked on this rank fail at once: the script's wrapper, the stop flag's work in flight, the
        failed collective's frames (their locals)."""
        if carried.release is not None:
            carried.release()
        self.stop.reset()
        traceback.clear_frames(error.__traceback__)
        gc.collect()  # a DDP wrapper's reference cycles

    def _fall_back(self, reason: str) -> bool:
        """In-process recovery is not possible: say why, in the log and in the store for the next generation's
        rank 0 (its timeline's reason). False: the caller re-raises (today's exit path)."""
        log.warning("in-process recovery not possible: %s; leaving the process as before", reason)
        self.rendezvous.note_fallback(self.env.generation, reason)
        return False

    def _rescue_in_background(self, carried: "_Carried") -> RescueCheckpoint | None:
        """The survivor's rescue checkpoint, written on a thread while it rejoins and trains on: `_rejoin` waits
        only for its read of the tensors (before anything changes them), and it commits in the new generation
        when that one resumes from its step (`RescueCheckpoint`: the fence)."""
        if not carried.rescue or self.checkpoints is None:
            return None
        step, rank = carried.step(), self.env.rank

        def done(rescue: RescueCheckpoint) -> None:
            if rescue.written:
                log.warning("rescue checkpoint: rank %d saved step %d after a peer failed (committed in generation "
                            "%d)", rank, step, rescue.generation)

        # A step the writer saves itself (maybe now): this rank's rescue waits to know it was lost (no second copy).
        after_writer = not self.checkpoints.is_writer and self.should_save(step)
        rescue = RescueCheckpoint(self.checkpoints, step, {**carried.state(), META: self._rescue_meta(step)}, done,
                                  after_writer=after_writer).start()
        self._rescues.append(rescue)
        return rescue

    def _join_rescues(self) -> None:
        """Every rescue of this process committed or given up (those not settled commit under their failed
        generation's fence, or not at all)."""
        for rescue in self._rescues:
            rescue.stayed()
            rescue.join()
        self._rescues.clear()

    def _rejoin(self, carried: "_Carried", rescue: RescueCheckpoint | None) -> tuple[int, int | None, bool,
                                                                                 dict[str, float]]:
        """(generation joined, the rank the state came from, whether this rank received it, the seconds of each
        phase: where a recovery's time went, in its log line)"""
        rdzv, generation = self.rendezvous, self.env.generation
        phases = _Phases()
        timeout = float(os.environ.get(REJOIN_TIMEOUT_ENV) or inprocess.REJOIN_TIMEOUT_S)
        while True:
            if not self._group_wedged:
                try:
                    rdzv.leave(self.timeouts.groups)
                except inprocess.CannotRecover:
                    self._group_wedged = True
                    raise
            self.stop.reset()
            try:
                newer = rdzv.wait_newer(generation, timeout, lambda: self.stop.requested)
            except RuntimeError as e:  # DistStoreError: the store is lost too, and its generations with it
                raise inprocess.CannotRecover(f"the job's rendezvous store cannot be read: {e}") from e
            if newer is None:
                raise inprocess.CannotRecover(f"stopped by signal {self.stop.signum} while waiting for the next "
                                              f"generation" if self.stop.requested else
                                              f"no generation newer than {generation} within {timeout:g} s")
            phases.end("next generation")
            try:
                generation, world = rdzv.join_newest(newer, self.device, self.timeouts.long_s,
                                                     world=self.env.world_size)
            except inprocess.CannotRecover:
                raise
            except Exception as e:  # a rank that arrived died before the group formed: the next generation
                if not is_peer_failure(e):
                    raise
                generation = newer
                continue
            joined = time.time()  # the new generation's group is complete
            phases.end("group")
            self._enter(generation, world)
            try:
                received, source, resumed, writer_kept = rdzv.exchange(carried.state, carried.step(), self.device)
            except Exception as e:  # a second failure during the hand-over: the next generation
                if not is_peer_failure(e):
                    raise
                continue
            phases.end("exchange")
            if rescue is not None:
                rescue.joined(generation, resumed, writer_kept)  # a member now: its step's rescue commits in it
                rescue.read.wait()  # the write has read the tensors: from here on they change (load, DDP, steps)
                phases.end("rescue read")
            if received is not None:
                carried.load(received)
                phases.end("load")
            self.replicas_agree = True  # DDP need not broadcast rank 0's parameters again (rewrap)
            carried.rewrap()
            phases.end("DDP")
            self._group_time = joined
            return generation, source, received is not None, phases.seconds

    def _enter(self, generation: int, world: int) -> None:
        """This process is in `generation`'s group now: its environment, checkpoint fence and timeouts say so."""
        self.env = dataclasses.replace(self.env, generation=generation, world_size=world)
        _publish_environ(self.rendezvous, generation, world)
        self.timeouts.restart()
        if self.checkpoints is not None:
            self.checkpoints.generation = generation
            if self.checkpoints.is_writer:  # from now on the failed generation commits nothing
                c = self.checkpoints
                raise_fence(c.root, c.run, generation, (c.marker(step) for step in c.committed_steps()))

    def _from_peer(self, announce: bool, into: Callable[[], dict[str, Any]] | None) -> dict[str, Any] | None:
        """A fresh process of an in-process job (a replacement): the newest state a survivor holds, by
        broadcast, or None when nobody holds one (the volume then)."""
        started = time.monotonic()
        state, source, step, _ = self.rendezvous.exchange(None, -1, self.device, into=into)
        if state is None:
            return None
        self.replicas_agree = True  # every rank of the group holds (or just received) the source's replica
        state[META] = {"step": step, "world_size": self.env.world_size, "peer": source,
                       "generation": self.env.generation, "seconds": time.monotonic() - started}
        if announce and self.env.is_main:
            announce_line(f"resumed from peer rank {source} step={step} by broadcast in "
                          f"{time.monotonic() - started:.2f} s (no checkpoint read)")
        self._recovered("InProcess", "", step)
        return state

    @property
    def last_checkpoint_step(self) -> int | None:
        return self.checkpoints.last_committed_step if self.checkpoints is not None else None

    # ---- stop, progress, collectives ----------------------------------------------------------

    def should_stop(self) -> bool:
        """Call once per step on every rank: True on all of them once any was signalled."""
        self._stepped()
        self.timeouts.step()
        self.watchdog.step()
        self.step_timer.boundary()
        with self.step_timer.waiting():  # the stop flag's all_reduce waits for the slowest rank
            stop = self.stop.agreed()
        self._peer_stopped = stop and not self.stop.requested
        if self.stop.group is not None:
            self.timeouts.add_group(self.stop.group)
        return stop

    def report(self, *, step: int, total_steps: int | None = None, loss: float | None = None, **fields: Any) -> None:
        """Non-blocking progress report; call it on every rank (the file is rank 0's, the endpoint gets
        local rank 0 of every pod). Adds world_size and last_checkpoint_step; on rank 0 of a generation that
        resumed, its recovery timeline (`recovery`; a step past the resumed one ends it, if should_stop() did not)."""
        if self.recovery is not None and step > self.recovery["resumed_step"]:
            self._stepped()
        fields.setdefault("world_size", self.env.world_size)
        fields.setdefault("last_checkpoint_step", self.last_checkpoint_step)
        if "step_seconds" not in fields:  # this rank's own time per step since the last report (no collective)
            fields["step_seconds"] = self.step_timer.take()
        self.reporter.report(step=step, total_steps=total_steps, loss=loss, **fields)

    def result(self, **metrics: Any) -> None:
        """Rank 0 at a successful end: result.json {"status": "completed", "world_size", **metrics}, atomically, in
        the job's own directory (beside progress.json)."""
        if self.env.is_main and self.checkpoint_dir:
            write_result(self.checkpoint_dir, {"status": "completed", "world_size": self.env.world_size, **metrics})

    def mean(self, value: float | torch.Tensor) -> float:
        """The mean of a per-rank value over all ranks (a collective: every rank must call it)."""
        t = torch.as_tensor(value, dtype=torch.float64, device=self.device).detach().clone().reshape(1)
        if dist.is_initialized() and self.env.world_size > 1:
            with self.step_timer.waiting():
                dist.all_reduce(t)
            t /= self.env.world_size
        return float(t.item())

    def step_seconds(self) -> tuple[float | None, dict[int, float]]:
        """Every rank (one small all_gather, e.g. at each log interval): this pod's own time per step since
        the last call (the slowest of its local ranks) and every pod's, by replica index (DDPJOB_REPLICA_INDEX,
        else torchrun's group rank). Report the first as `step_seconds` (straggler detection)."""
        own = self.step_timer.take()
        pod = self.env.replica_index if self.env.replica_index is not None else self.env.group_rank
        mine = torch.tensor([-1.0 if own is None else own, float(pod)], dtype=torch.float64, device=self.device)
        rows = [mine]
        if dist.is_initialized() and self.env.world_size > 1:
            rows = [torch.empty_like(mine) for _ in range(self.env.world_size)]
            with self.step_timer.waiting():
                dist.all_gather(rows, mine)
        pods: dict[int, float] = {}
        for row in torch.stack(rows).tolist():
            seconds, index = row[0], int(row[1])
            if seconds >= 0:
                pods[index] = max(pods.get(index, 0.0), seconds)
        return pods.get(pod), pods

    # ---- exit ---------------------------------------------------------------------------------

    def close(self, clean: bool = True) -> None:
        """Every exit path: pending checkpoint write, progress, stop handler, process group."""
        if self._closed:
            return
        self._closed = True
        self.watchdog.close()
        try:
            self._join_rescues()
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
                if self._owns_pg and not self._group_wedged:
                    destroy_process_group()

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(clean=exc_type is None)


class _Phases:
    """Seconds per named phase, each from the end of the one before (a phase repeated adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.monotonic()

    def end(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now


@dataclasses.dataclass(frozen=True)
class _Carried:
    state: Callable[[], dict[str, Any]]
    load: Callable[[dict[str, Any]], None]
    rewrap: Callable[[], None]
    step: Callable[[], int]
    rescue: bool
    release: Callable[[], None] | None = None


def _join_in_process(rdzv: inprocess.Rendezvous, generation: int, device: torch.device, timeout_s: float) -> JobEnv:
    """Form the first group of an in-process job through the job's store (runtime/inprocess.py)."""
    generation, world = rdzv.join_newest(generation, device, timeout_s)
    _publish_environ(rdzv, generation, world)
    return JobEnv.from_env()


def _publish_environ(rdzv: inprocess.Rendezvous, generation: int, world: int) -> None:
    """What this process is now, where scripts and the runtime read it (torchrun's names)."""
    seat = rdzv.seat
    os.environ.update({"RANK": str(seat.rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(seat.local_rank),
                       "LOCAL_WORLD_SIZE": str(seat.nproc), "GROUP_RANK": str(seat.replica_index),
                       REPLICA_INDEX_ENV: str(seat.replica_index), GENERATION_ENV: str(generation),
                       "TORCHELASTIC_RUN_ID": f"{rdzv.uid}-g{generation}"})
