"""`InProcessRecovery`: what a `Job` does when a peer is lost, and how a generation that resumed reports it.

With `DDPJOB_INPROCESS=1` (runtime/inprocess.py) a survivor leaves the failed group, forms the next view with the
other survivors at once (runtime/membership.py, runtime/regroup.py), takes part in the state exchange and hands its
rescue checkpoint (runtime/rescues.py) to the new view's fence; a replacement (or a warm spare, once placed) is
placed in a view and receives the state from a peer; at a step boundary every member moves to a view that takes
joiners in (`regroup_wanted`, `after_agreed`). Either way, and after a resume from the volume, the
generation keeps its recovery timeline (`progress.recovery_field`), which rank 0's reports carry until the first
step ends it. `Job` owns one of these and delegates to it: this module never imports job.py.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from . import inprocess, layout
from .checkpoint import RescueCheckpoint, raise_fence
from .contract import GENERATION_ENV, REJOIN_TIMEOUT_ENV, REPLICA_INDEX_ENV
from .distributed import CollectiveTimeout, JobEnv, StopRequest, is_peer_failure, select_device
from .frameworks import announce as announce_line
from .membership import view_name
from .progress import ProgressReporter, recovery_field
from .rescues import META, JobParts, Rescues
from .regroup import ViewKeeper
from .views import View

log = logging.getLogger(__name__)


# Steps on the long collective timeout after a regroup: warm processes (a joiner built its trainer before it was
# placed) are regular again at once, and a peer that goes silent meanwhile is caught by the steady one after these.
CALM_STEPS_AFTER_REGROUP = 2


class _JobParts(JobParts, Protocol):
    """What recovery uses of its `Job` besides what its rescues do."""

    stop: StopRequest
    timeouts: CollectiveTimeout
    reporter: ProgressReporter | None


@dataclasses.dataclass(frozen=True)
class Carried:
    """What a survivor keeps in memory across a peer's failure (`Job.carry`)."""

    state: Callable[[], dict[str, Any]]
    load: Callable[[dict[str, Any]], None]
    rewrap: Callable[[], None]
    step: Callable[[], int]
    rescue: bool
    release: Callable[[], None] | None = None


class InProcessRecovery:
    def __init__(self, job: _JobParts, rendezvous: inprocess.Rendezvous | None) -> None:
        self.job = job
        self.rendezvous = rendezvous  # None: this trainer did not form its groups through the job's store
        self.carried: Carried | None = None
        self.group_wedged = False  # the old group could not be left: never touch it again
        self.peer_stopped = False  # the last agreed stop was a peer's signal, not this rank's
        self.rescues = Rescues(job)
        # How this generation came back from the incident before it (None: it did not resume), and when its
        # process group was complete: rank 0's reports carry it (progress.recovery_field).
        self.timeline: dict[str, Any] | None = None
        self._group_time = time.time()
        # Every rank's state is the same replica (an in-process exchange just made it so): a DDP wrapper built now
        # need not broadcast rank 0's parameters (`init_sync=not job.replicas_agree`, a cost that grows with the model).
        self.replicas_agree = False
        self.views = ViewKeeper(rendezvous, self._report_waiting)  # the view this trains in (issue 36)
        self.prepared = layout.Prepared()  # memory touched before arriving: to receive into, for the first step
        self._layout = layout.Publisher(rendezvous.store, rendezvous.uid) if rendezvous is not None else None
        self.regrouped = False  # the last should_stop() (or recover()) moved this process to another view

    @property
    def view(self) -> View | None:
        """The view this process trains in; None: its group was not formed through the job's store."""
        return self.views.view

    def report_fields(self, view: View) -> dict[str, Any]:
        return self.views.fields(view)

    def _report_waiting(self) -> None:
        """Too few ranks left to train: the reports still go out (no group, no step; the last one done)."""
        reporter, carried = self.job.reporter, self.carried
        if reporter is not None and carried is not None and self.view is not None:
            reporter.report(step=carried.step(), **self.views.fields(self.view))

    # ---- the timeline -------------------------------------------------------------------------

    def recovered(self, path: str, reason: str, step: int, kind: str | None = None) -> None:
        """This generation resumed (or its view changed: `kind`): its timeline starts (rank 0's reports carry it)."""
        self._set_timeline(recovery_field(path, reason=reason, resumed_step=step, rendezvous_time=self._group_time,
                                          kind=kind))

    @property
    def recovering(self) -> bool:
        return self.timeline is not None and self.timeline["first_step_time"] is None

    def finished(self) -> None:
        """Rank 0 at the job's successful end: a trainer still waiting to join exits 0 instead of holding the job
        (best effort: with the store lost it waits out its join timeout)."""
        if self.rendezvous is not None and self.job.env.is_main:
            try:
                self.rendezvous.membership.finish()
            except RuntimeError as e:
                log.info("could not tell waiting joiners that the job finished: %s", e)

    def stepped(self) -> None:
        """An optimizer step of this generation finished: the first one ends the recovery's timeline; the first of a
        view (and the first after the store came back empty) has rank 0 publish the state's layout for joiners."""
        if self.recovering:
            self._set_timeline({**self.timeline, "first_step_time": time.time()})
        view = self.view
        if view is not None and self.carried is not None and self.job.env.is_main:
            self._layout.stepped(view, self.carried.state)

    def _set_timeline(self, timeline: dict[str, Any]) -> None:
        self.timeline = timeline
        if self.job.env.is_main and self.job.reporter is not None:
            self.job.reporter.recovery = timeline

    def restart_reason(self, saved_in: int | None) -> str:
        """Why this generation resumed from the volume where in-process recovery was asked for ("" where not)."""
        if not inprocess.enabled():
            return ""
        if self.rendezvous is None:
            return "the script formed its own process group: in-process recovery needs Job.start to form it"
        generation = self.job.env.generation
        try:
            note = self.rendezvous.fallback_reason(generation, saved_in)
        except RuntimeError:  # the store: the reason only
            note = None
        return note or (f"no rank of generation {generation} held the training state in memory (every "
                        f"one started anew): resumed from the volume")

    # ---- a fresh process: a warm spare's place, a replacement's state ---------------------------

    def take_place(self, into: Callable[[], dict[str, Any]] | None = None) -> JobEnv:
        """A fresh trainer that built its state first (`Job.start(build_first=True)`): its place, then that view's
        group; its environment. A warm spare first waits for the place its agent is given (runtime/inprocess.py);
        a replacement arrives only now, so that the view it joins waits for the hand-over alone, not for this
        trainer's build (a 1 GB model's allocation and initialisation), and with the memory for the state it will
        receive touched (`into`: its own state as built; runtime/layout.py). A stop signal meanwhile (the pod
        deleted) ends the process with 128+N."""
        rdzv, stop = self.rendezvous, self.job.stop
        if into is not None:
            self.prepared = layout.prepare(rdzv.store, rdzv.uid, into(), self.job.device)
        spare = rdzv.place_key is not None
        if spare:
            announce_line("spare: trainer ready, waiting for its place")
            generation = rdzv.wait_place(lambda: stop.requested)
            if generation is None:
                raise SystemExit(stop.exit_code)
        else:
            generation = rdzv.started_for
        placed = time.monotonic()
        view = rdzv.join(generation, self.job.device, self.job.timeouts.long_s, lambda: stop.requested)
        self._group_time = time.time()
        publish_environ(rdzv, view)
        if spare:
            log.warning("spare: took the place of rank %d of %d in generation %d (%.2f s to form the group)",
                        rdzv.seat.rank, view.world, view.generation, time.monotonic() - placed)
        return JobEnv.from_env()

    def from_peer(self, announce: bool, into: Callable[[], dict[str, Any]] | None) -> dict[str, Any] | None:
        """A fresh process of an in-process job (a replacement): the newest state a survivor holds, by
        broadcast, or None when nobody holds one (the volume then) or this is no in-process job."""
        prepared, self.prepared = self.prepared, layout.Prepared()
        if self.rendezvous is None or not dist.is_initialized():
            return None
        env, started = self.job.env, time.monotonic()
        state, source, step, _ = self.rendezvous.exchange(None, -1, self.job.device, into=into,
                                                          prepared=prepared.slots)
        prepared.release()  # now, not earlier: the first step's memory comes from the scratch's pages (layout.py)
        if state is None:
            return None
        self.replicas_agree = True  # every rank of the group holds (or just received) the source's replica
        state[META] = {"step": step, "world_size": env.world_size, "peer": source,
                       "generation": env.generation, "seconds": time.monotonic() - started}
        if announce and env.is_main:
            announce_line(f"resumed from peer rank {source} step={step} by broadcast in "
                          f"{time.monotonic() - started:.2f} s (no checkpoint read)")
        self.recovered("InProcess", "", step, kind=self.rendezvous.membership.kind(self.view))
        return state

    # ---- a survivor ---------------------------------------------------------------------------

    def recover(self, error: BaseException) -> bool:
        """`Job.recover`: True once this process is in the next generation's group with the newest state."""
        job = self.job
        if self.rendezvous is None or not is_peer_failure(error):
            return False
        if self.carried is None:
            return self._fall_back("the script did not call job.carry() (what a survivor keeps in memory)")
        if job.watchdog.verdict is not None:
            return self._fall_back(f"the stall watchdog's verdict ({job.watchdog.verdict[1]}) ends the process")
        started, old = time.monotonic(), self.view
        self.views.went_short()
        job.watchdog.release()
        job.timeouts.relax()  # no silent-peer verdict while this rank waits for the next generation
        carried = self.carried
        log.warning("rank %d at step %d: a peer %s in generation %d (%s); recovering in process", job.env.rank,
                    carried.step(), "stopped" if self.peer_stopped else "failed", old.generation,
                    str(error).splitlines()[0][:200] if str(error) else type(error).__name__)
        self.peer_stopped = False
        rescue = self.rescues.in_background(carried.step(), carried.state) if carried.rescue else None  # durability
        phases = _Phases()
        self._release(carried, error)
        phases.end("release")
        try:
            view, source, received = self._rejoin(carried, rescue, phases)
        except inprocess.CannotRecover as e:
            self.rescues.join()  # the exit path: each commits under its failed generation's fence, or not at all
            return self._fall_back(str(e))
        self.recovered("InProcess", "", carried.step(), kind=self.rendezvous.membership.kind(view))
        self._moved(f"recovered in process: generation {old.generation} -> {view.generation}", view, source,
                    received, f"{time.monotonic() - started:.2f} s after the failure", phases)
        return True

    def _moved(self, what: str, view: View, source: int | None, received: bool, took: str, phases: _Phases) -> None:
        self.regrouped = True
        log.warning("%s, rank %d of %d, state %s, %s (%s); training %s", what, self.job.env.rank, view.size,
                    f"received from rank {source}" if received else "kept", took,
                    ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.seconds.items()), view.describe())

    # ---- a step boundary: joiners come in, seats past a smaller world leave ----------------------

    def regroup_wanted(self) -> bool:
        """Rank 0 of a training view, once per step: whether the view changes at this boundary (its successor is
        written in the store before the flag that says so goes out: `StopRequest.agreed(regroup=...)`)."""
        if self.rendezvous is None or self.carried is None or self.view is None or not self.job.env.is_main:
            return False
        return self.views.change_due(self.view) is not None

    def after_agreed(self, stop: bool) -> None:
        """Every member, after the step's agreed flags: where a regroup was agreed (and no stop), leave this view's
        group cleanly, form the successor's, hand the state to the joiners, rewrap; `regrouped` says so."""
        self.regrouped = False
        if stop or not self.job.stop.regroup:
            return
        started, old, carried, phases = time.monotonic(), self.view, self.carried, _Phases()
        try:
            successor = self.views.take_change(old)
            self._release(carried, None)
            phases.end("release")
            if self.rendezvous.seat.rank not in successor.members:  # a smaller world: this seat has no place
                self.rendezvous.leave(self.job.timeouts.groups)
                log.warning("rank %d (seat %d) has no place in view %s (%s): leaving", self.job.env.rank,
                            self.rendezvous.seat.rank, view_name(successor), successor.describe())
                raise SystemExit(0)  # scaled down: the others train on, this pod is removed (docs/operator.md)
            view, source, received = self._rejoin(carried, None, phases, successor)
        except RuntimeError as e:  # CannotRecover, the store lost: the exit path (every member held the state)
            self._fall_back(str(e) if isinstance(e, inprocess.CannotRecover) else
                            f"the job's rendezvous store cannot be read: {e}")
            raise SystemExit(1) from None
        joined = set(view.members) - set(old.members)
        self.recovered("InProcess", "", carried.step(), kind=self.rendezvous.membership.kind(view))
        self._moved(f"regrouped at step {carried.step()}: view {view_name(old)} -> {view_name(view)}"
                    f"{' (joined: ' + ', '.join(map(str, sorted(joined))) + ')' if joined else ''}", view, source,
                    received, f"a pause of {time.monotonic() - started:.2f} s", phases)

    def _release(self, carried: Carried, error: BaseException | None) -> None:
        """Nothing here refers to the group once it is left (`error`: the failure), so that leaving closes its
        connections and the peers blocked on this rank fail at once: the script's wrapper, the stop flag's work in
        flight, the failed collective's frames (their locals)."""
        if carried.release is not None:
            carried.release()
        self.job.stop.reset()
        if error is not None:  # a clean regroup leaves nobody blocked on this rank: no collection (about 1 s)
            traceback.clear_frames(error.__traceback__)
            gc.collect()  # a DDP wrapper's reference cycles

    def _fall_back(self, reason: str) -> bool:
        """In-process recovery is not possible: say why, in the log and in the store for the next generation's
        rank 0 (its timeline's reason). False: the caller re-raises (today's exit path)."""
        log.warning("in-process recovery not possible: %s; leaving the process as before", reason)
        self.rendezvous.note_fallback(self.job.env.generation, reason)
        return False

    def _rejoin(self, carried: Carried, rescue: RescueCheckpoint | None, phases: _Phases,
                successor: View | None = None) -> tuple[View, int | None, bool]:
        """Out of this view's group into `successor`'s (None: the failed view's successor, found in the store):
        (the view joined, the rank the state came from, whether this rank received it); `phases`: where the time
        went, for the log line. A failure on the way: the failure path from there."""
        job, rdzv = self.job, self.rendezvous
        timeout = float(os.environ.get(REJOIN_TIMEOUT_ENV) or inprocess.REJOIN_TIMEOUT_S)
        while True:
            if not self.group_wedged:
                try:
                    rdzv.leave(job.timeouts.groups)
                except inprocess.CannotRecover:
                    self.group_wedged = True
                    raise
            job.stop.reset()
            try:
                view = successor or self.views.after_failure(self.view, timeout, lambda: job.stop.requested)
            except inprocess.CannotRecover:
                raise
            except RuntimeError as e:  # DistStoreError: the store is lost too, and its views with it
                raise inprocess.CannotRecover(f"the job's rendezvous store cannot be read: {e}") from e
            successor = None
            phases.end("next view")
            try:
                rdzv.form(view, job.device, job.timeouts.long_s)  # a failure from here on is this view's
            except Exception as e:  # a member died before the group formed: the failure path again
                if not is_peer_failure(e):
                    raise
                continue
            joined = time.time()  # the new view's group is complete
            phases.end("group")
            self._enter(view)
            try:
                received, source, resumed, writer_kept = rdzv.exchange(carried.state, carried.step(), job.device)
            except Exception as e:  # a second failure during the hand-over: the failure path again
                if not is_peer_failure(e):
                    raise
                continue
            phases.end("exchange")
            if rescue is not None:
                rescue.joined(view.generation, resumed, writer_kept)  # a member now: its step's rescue commits in it
                rescue.read.wait()  # the write has read the tensors: from here on they change (load, DDP, steps)
                phases.end("rescue read")
            if received is not None:
                carried.load(received)
                phases.end("load")
            self.replicas_agree = True  # DDP need not broadcast rank 0's parameters again (rewrap)
            carried.rewrap()
            phases.end("DDP")
            self._group_time = joined
            return view, source, received is not None

    def _enter(self, view: View) -> None:
        """This process is in `view`'s group now: its environment, checkpoint writer and fence, reporter and
        timeouts say so (rank 0 of the view writes checkpoints and progress.json)."""
        job = self.job
        was_main, moved = job.env.is_main, view.generation != job.env.generation
        job.env = dataclasses.replace(job.env, generation=view.generation, world_size=view.size,
                                      rank=view.rank_of(self.rendezvous.seat.rank))
        publish_environ(self.rendezvous, view)
        job.timeouts.restart(after_steps=CALM_STEPS_AFTER_REGROUP)
        self.views.entered(view)
        c = job.checkpoints
        if c is not None:
            c.generation, c.is_writer = view.generation, job.env.is_main
            if c.is_writer and (moved or not was_main):  # from now on the failed view's generation commits nothing
                raise_fence(c.root, c.run, view.generation, (c.marker(step) for step in c.committed_steps()))
        if job.env.is_main != was_main and job.reporter is not None:  # progress.json is the new rank 0's
            reporter = ProgressReporter.from_env(checkpoint_dir=job.checkpoint_dir or "", rank=job.env.rank,
                                                 local_rank=job.env.local_rank)
            reporter.recovery = job.reporter.recovery if job.env.is_main else None
            job.reporter.close()
            job.reporter = reporter


class _Phases:
    """Seconds per named phase, each from the end of the one before (a phase repeated adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.monotonic()

    def end(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now


def join_first_group(device: str, backend: str, timeout_s: float, *, build_first: bool = False
                     ) -> tuple[inprocess.Rendezvous, torch.device, JobEnv | None]:
    """`Job.start` of an in-process job: its rendezvous, its device, and its environment once the first group
    formed through the job's store (runtime/inprocess.py); None for a warm spare, which has no place yet, and with
    `build_first` (the place is taken by `InProcessRecovery.take_place` once the script built its state)."""
    # Before any group exists: a Gloo group that exists when torch._dynamo is first imported (DDP imports it) is
    # never released (torch 2.13), so a survivor leaving it would keep its connections open and the peers blocked
    # on it waiting for their collective timeout.
    import torch._dynamo  # noqa: F401
    # What torch and its compiler built at import is never garbage, and the collection a survivor runs to release the
    # failed group's wrapper (`_release`) would scan it all: about 1 s of a survivor's recovery on a busy CPU, 40 us
    # with it frozen. The model and its DDP wrapper, built after this, stay collectable.
    gc.freeze()
    rdzv = inprocess.Rendezvous.from_env(os.environ, backend)
    dev = select_device(device, JobEnv(rank=0, local_rank=rdzv.seat.local_rank, world_size=1))
    if rdzv.place_key or build_first:
        return rdzv, dev, None
    view = rdzv.join(rdzv.started_for, dev, timeout_s, lambda: False)
    publish_environ(rdzv, view)
    return rdzv, dev, JobEnv.from_env()


def publish_environ(rdzv: inprocess.Rendezvous, view: View) -> None:
    """What this process is now, where scripts and the runtime read it (torchrun's names: RANK and WORLD_SIZE are
    the view's process group's, the seat is the replica index x processes per node + LOCAL_RANK)."""
    seat = rdzv.seat
    os.environ.update({"RANK": str(view.rank_of(seat.rank)), "WORLD_SIZE": str(view.size),
                       "LOCAL_RANK": str(seat.local_rank), "LOCAL_WORLD_SIZE": str(seat.nproc),
                       "GROUP_RANK": str(seat.replica_index), REPLICA_INDEX_ENV: str(seat.replica_index),
                       GENERATION_ENV: str(view.generation), "TORCHELASTIC_RUN_ID": f"{rdzv.uid}-g{view.generation}"})
