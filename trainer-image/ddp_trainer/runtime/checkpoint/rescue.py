"""A survivor's rescue checkpoint (`RescueCheckpoint`): after a peer died, any rank that holds the replica at a
step boundary writes it, one writer per step (an exclusive claim file), under the generation fence."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from .fence import newer_generation
from .store import CheckpointStore

log = logging.getLogger(__name__)

# Added to the rescue thread's niceness once it has read the tensors: its write (hash, file) then gives way to
# the hand-over training waits for (a spare's broadcast, a replacement's start on the node, the first steps).
RESCUE_NICENESS = 10


def _yield_cpu() -> None:
    """This thread (Linux: niceness is per thread) gives way to the process's and the node's other work; the
    write may take a little longer itself."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + RESCUE_NICENESS))
    except (OSError, AttributeError):  # no per-thread priority here: the write only competes a little more
        pass


class RescueCheckpoint:
    """A survivor's rescue checkpoint of `step` (any rank; `CheckpointManager.save_rescue` is its synchronous
    form). In-process recovery (`Job.recover`) runs it on a thread while the survivor joins the next generation:
    `read` is set once the state's tensors are serialized (from then on training may change them), and the
    commit waits for nothing but the write.

    The fence. A commit marker carries the generation it is committed in, and nothing commits in a generation
    once a newer one has started on the directory (its writer's fence file, or a marker of it). The rescue
    commits in the generation this process is a member of when its marker is written:
    - before `joined` or after `stayed` (the exit path): the failed generation, as any rescue: nothing once a
      newer generation has started there;
    - once `joined(g, resumed_step)`: this process is a member of generation g (it formed g's group with every
      rank of it), and g resumes from `resumed_step`. If that is `step`, the rescue is g's own starting point,
      written by one of its members: committed in g, it is exactly the checkpoint g itself would write at that
      step, so the fence of g (its replacement rank 0 raised it while the rescue was being written) does not
      withdraw it. Otherwise (g resumed from a later step a peer held) it is not written.
    A trainer left behind in an old generation (partitioned, frozen, not in g's group) never `joined` g, so it
    still commits nothing once g has started. Never either where a later step is committed (checked before and
    after the marker, as the fence is): a rescue only ever adds the newest checkpoint.

    `after_writer`: a step the job's writer (rank 0) saves itself, a periodic one, on another rank. The writer
    may be writing it at this moment (its save in flight when the peer failed). The rescue's own data file keeps
    the two apart whatever happens (`rescue_path`); this only spares a second copy of the step: such a rescue
    claims it once it is known that the writer was lost (`joined` a generation where rank 0 held no state) or on
    the exit path (`stayed`); where the writer lives on, its own save, or its own rescue, commits the step."""

    def __init__(self, manager: CheckpointStore, step: int, state: dict[str, Any],
                 done: Callable[["RescueCheckpoint"], None] | None = None, *, after_writer: bool = False) -> None:
        """`done(self)`: called on the writing thread once it is decided (`written`, `generation`)."""
        self.manager, self.step, self.generation, self.done = manager, step, manager.generation, done
        self.after_writer = after_writer
        self._writer_kept = False
        self.state: dict[str, Any] | None = state
        self.read = threading.Event()  # the state's tensors are read: the caller may change them
        self.written: bool | None = None  # None: not decided yet
        self.error: BaseException | None = None
        self._settled = threading.Condition()
        self._member: tuple[int, int] | None = None  # (generation joined, the step it resumed from)
        self._stayed = False
        self._thread: threading.Thread | None = None

    def start(self) -> "RescueCheckpoint":
        self._thread = threading.Thread(target=self.run, name="ddpjob-rescue", daemon=True)
        self._thread.start()
        return self

    def joined(self, generation: int, resumed_step: int, writer_kept: bool = False) -> None:
        """This process is a member of `generation`, which resumes from `resumed_step`; `writer_kept`: the
        writer of the generation that failed is in it too."""
        with self._settled:
            self._member, self._writer_kept = (generation, resumed_step), writer_kept
            self._settled.notify_all()

    def stayed(self) -> None:
        """This process does not move on (the exit path): unless it `joined` a generation already, commit under
        the failed generation's fence or not at all."""
        with self._settled:
            self._stayed = self._member is None
            self._settled.notify_all()

    def join(self) -> bool:
        """Wait for the write; True if this process committed the step."""
        if self._thread is not None:
            self._thread.join()
        return bool(self.written)

    def run(self) -> None:
        try:
            self.written = self._save()
        except BaseException as e:  # noqa: BLE001 - the rescue must never hide the failure it follows
            self.error, self.written = e, False
            log.warning("rescue checkpoint of step %d not written: %s", self.step, e)
        finally:
            self.state = None
            self.read.set()
        if self.done is not None:
            self.done(self)

    def _claim(self) -> bool:
        """This process writes the step's rescue; False: another survivor does."""
        try:
            os.close(os.open(self.manager.claim(self.step), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        return True

    def _later_committed(self, than: int) -> bool:
        return any(s > than and self.manager.holds(s) for s in self.manager.committed_steps())

    def _save(self) -> bool:
        m, step = self.manager, self.step
        if self._later_committed(step - 1):
            return False
        if self._stayed and (newer := m.newer_generation()) is not None:
            m._fenced(step, newer, "(rescue) not written")
            return False
        m._refuse_links()  # before mkdir: never created, nor written, through a link
        m.dir.mkdir(parents=True, exist_ok=True)
        m._refuse_links()
        if not self.after_writer and not self._claim():
            return False  # another survivor writes this step
        buf = io.BytesIO()
        torch.save(self.state, buf)
        self.state = None
        self.read.set()  # before waiting for anything else: the survivor waits for this only
        _yield_cpu()  # the read was on the critical path, the write is not
        if self.after_writer:
            with self._settled:
                self._settled.wait_for(lambda: self._member is not None or self._stayed)
                writer_kept = self._writer_kept and not self._stayed
            if writer_kept:
                log.info("rescue checkpoint of step %d left to rank 0, which saves that step itself", step)
                return False
            if self._later_committed(step - 1) or not self._claim():
                return False
        if m.is_writer:
            with contextlib.suppress(Exception):  # a failed async write must not stop the rescue
                m.wait()
            if self._later_committed(step - 1):  # that write was of this step (or a later one)
                m.claim(step).unlink(missing_ok=True)
                return False
        size, digest = m._write_data(m.rescue_path(step), buf)
        del buf
        while True:
            with self._settled:
                member, stayed = self._member, self._stayed
            generation = member[0] if member is not None else self.generation
            if member is not None and member[1] != step:
                return self._drop(f"generation {generation} resumed from step {member[1]}")
            newer = newer_generation(m.root, m.run, generation, m._markers())
            if newer is None and not self._later_committed(step):
                m._write_marker(step, size, digest, generation, m.rescue_path(step))
                newer = newer_generation(m.root, m.run, generation, m._markers())
                if newer is None and not self._later_committed(step):
                    m.last_committed_step = step
                    self.generation = generation
                    return True
                m.marker(step).unlink(missing_ok=True)  # withdrawn; the data stays while it may commit later
            if self._later_committed(step):
                return self._drop("a later step is committed")
            if member is not None or stayed:  # fenced where it commits: it never will
                m._fenced(step, newer, "(rescue) not written")
                return self._drop("")
            with self._settled:  # a newer generation started: commit in it once this process is a member
                self._settled.wait_for(lambda: self._member is not None or self._stayed)

    def _drop(self, why: str) -> bool:
        self.manager.rescue_path(self.step).unlink(missing_ok=True)
        self.manager.claim(self.step).unlink(missing_ok=True)  # the step is free again (a later rescue of it)
        if why:
            log.info("rescue checkpoint of step %d not committed: %s", self.step, why)
        return False
