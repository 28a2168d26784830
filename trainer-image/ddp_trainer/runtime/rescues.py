"""`Rescues`: a survivor's rescue checkpoints (runtime/checkpoint/rescue.py) as `Job` and in-process recovery use them:
the synchronous one a script writes before it exits (`Job.rescue`), the one written on a thread while an in-process
survivor moves on, and the wait for them before a final save or the exit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from .checkpoint import CheckpointManager, RescueCheckpoint
from .distributed import JobEnv, barrier
from .watchdog import StallWatchdog

log = logging.getLogger(__name__)
META = "ddpjob"  # key of the runtime's own entry in every checkpoint dict


class JobParts(Protocol):
    """What recovery uses of its `Job` (a protocol, so that these modules do not import job.py)."""

    env: JobEnv
    device: torch.device
    watchdog: StallWatchdog
    checkpoints: CheckpointManager | None

    def should_save(self, step: int) -> bool: ...


class Rescues:
    def __init__(self, job: JobParts) -> None:
        self.job = job
        self._pending: list[RescueCheckpoint] = []  # in-process rescue writes not yet joined

    def meta(self, step: int) -> dict[str, Any]:
        """A rescue checkpoint's `ddpjob` part: where it was trained and by which rank it was saved."""
        env = self.job.env
        return {"step": step, "world_size": env.world_size, "generation": self.job.checkpoints.generation,
                "rescued_by_rank": env.rank}

    def now(self, step: int, state: dict[str, Any]) -> bool:
        """`Job.rescue`: written here and now, by the first survivor that claims the step; True where it wrote."""
        self.job.watchdog.release()  # out of the collective: the watchdog waits for this save before exiting
        if self.job.checkpoints is None:
            return False
        try:
            written = self.job.checkpoints.save_rescue(step, {**state, META: self.meta(step)})
        except OSError as e:  # the original failure matters more than this one
            log.warning("rescue checkpoint of step %d not written: %s", step, e)
            return False
        if written:
            log.warning("rescue checkpoint: rank %d saved step %d after a peer failed", self.job.env.rank, step)
        return written

    def in_background(self, step: int, state: Callable[[], dict[str, Any]]) -> RescueCheckpoint | None:
        """An in-process survivor's rescue checkpoint, written on a thread while it moves on and trains: the move
        waits only for its read of the tensors (before anything changes them), and it commits in the next view's
        generation when that one resumes from its step (`RescueCheckpoint`: the fence)."""
        checkpoints = self.job.checkpoints
        if checkpoints is None:
            return None
        rank = self.job.env.rank

        def done(rescue: RescueCheckpoint) -> None:
            if rescue.written:
                log.warning("rescue checkpoint: rank %d saved step %d after a peer failed (committed in generation "
                            "%d)", rank, step, rescue.generation)

        # A step the writer saves itself (maybe now): this rank's rescue waits to know it was lost (no second copy).
        after_writer = not checkpoints.is_writer and self.job.should_save(step)
        rescue = RescueCheckpoint(checkpoints, step, {**state(), META: self.meta(step)}, done,
                                  after_writer=after_writer).start()
        self._pending.append(rescue)
        return rescue

    def join(self) -> None:
        """Every rescue of this process committed or given up (those not settled commit under their failed
        generation's fence, or not at all)."""
        for rescue in self._pending:
            rescue.stayed()
            rescue.join()
        self._pending.clear()

    def settle_before_final_save(self, step: int, timeline: dict[str, Any] | None) -> None:
        """A final save of the step this generation resumed at in process (no step trained since): a survivor may
        still be writing its rescue of this very step. Every rank knows it (the same timeline), so all wait for
        their own, then rank 0 writes over it."""
        if timeline is not None and timeline["path"] == "InProcess" and timeline["resumed_step"] == step and \
                dist.is_initialized():
            self.join()
            barrier(self.job.device)
