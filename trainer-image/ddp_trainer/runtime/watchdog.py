"""A trainer blocked in a collective can neither notice a silent peer nor obey SIGTERM: its main thread
sits in C++ (Gloo, NCCL) where Python's signal handlers never run. This watchdog thread covers both.

- Asked to stop (SIGTERM/SIGINT, seen through `signal.set_wakeup_fd`, which the C-level handler writes
  whatever the main thread is doing) while no step finishes within `stop_grace_s` (at least 3 of the
  recent step times): the trainer is blocked; it exits 128 + the signal at once instead of waiting
  out the agent's kill timeout, its message saying so.
- A peer that went silent with its sockets open (a frozen process, a node that lost power or its
  network) is meant to fail the next collective after the steady timeout (`CollectiveTimeout`); when no
  step has finished for that timeout plus this rank's own work and a margin (`silent_limit`) although
  the steady timeout is in force, the collective did not time out by itself: the trainer leaves with a
  "Timed out" message, a peer failure to the launcher (which then waits in place for the next
  generation, restartScope Pod). First it aborts the process groups (`abort`): where that fails the
  collective the main thread is blocked in (NCCL), the main thread writes its rescue checkpoint
  (`Job.rescue` calls `release()`) and ends the process with this verdict from `Job.close` (`exit()`).
  Where it cannot (Gloo: torch 2.13's ProcessGroupGloo has no abort, and nothing else unblocks a
  thread inside a Gloo wait), the thread exits the process itself: the rescue checkpoint is then the
  other survivors' (whose collectives did fail) or the last periodic one.

Both write the message where torchrun's `@record` would (TORCHELASTIC_ERROR_FILE), so it reaches the
pod's termination message.

`Job` drives it (`should_stop`: `step()`, `rescue`: `release()`, `close`: `close()` then `exit()`), and so do
the Hugging Face and Lightning callbacks (`runtime.frameworks.StallGuard`), which also call `alive()` for
work that is not a step but shows the main thread is not blocked (an evaluation batch).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import statistics
import threading
import time
from collections import deque
from typing import Callable

log = logging.getLogger(__name__)

# Past the steady timeout and this rank's own work for the step: a collective that does time out by
# itself fails first (its error takes the normal path: rescue checkpoint, peer failure), also when it
# started just before the thread's next look (every 0.5 s); and a few seconds of jitter in a rank's own
# step (a slow data read) are no silent peer.
SILENT_MARGIN_S = 5.0
STOP_GRACE_S = 5.0
# After an abort that can fail the main thread's collective: how long it may take to get out of it
# (into `Job.rescue` or `Job.close`: `release()`), then to write its rescue checkpoint and close. Past
# either the thread exits the process itself.
ABORT_WAIT_S = 5.0
RESCUE_WAIT_S = 120.0


class StallWatchdog:
    def __init__(self, steady_s: Callable[[], float], *, stop_grace_s: float = STOP_GRACE_S,
                 silent_s: float | None = None, abort: Callable[[], bool] | None = None,
                 exit: Callable[[int], None] = os._exit, clock: Callable[[], float] = time.monotonic) -> None:
        """`steady_s()`: the collective timeout in force now, 0 while it is relaxed (start-up, saves);
        `silent_s`: overrides `silent_limit()`; `abort()`: abort the process groups, True when that
        fails the collectives blocked on them (see the module docstring)."""
        self.steady_s, self.stop_grace_s, self.silent_s, self.abort = steady_s, stop_grace_s, silent_s, abort
        self._exit, self._clock = exit, clock
        self._last_step = clock()
        self._last_alive = float("-inf")  # the last `alive()`: never, for a trainer that only has steps
        self._busy = False  # `busy()` until the next step: work that is not a step (a framework's save)
        self._durations: deque[float] = deque(maxlen=20)
        self._steady_durations: deque[float] = deque(maxlen=20)  # of steps under the steady timeout
        self._stop_at: float | None = None
        self._signum = signal.SIGTERM
        self.verdict: tuple[int, str] | None = None  # the silent-peer exit, once decided
        self._released = threading.Event()  # the main thread got out of its collective after the abort
        self._exiting = threading.Lock()  # one exit, whichever thread takes it
        self._closed = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_fd: int | None = None
        if threading.current_thread() is threading.main_thread():
            # Keep Python's own handlers: this only adds a byte per signal to our pipe, written by the
            # C-level handler even while the main thread is inside a collective.
            self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._run, name="ddpjob-stall-watchdog", daemon=True)
        self._thread.start()

    def step(self) -> None:
        """A step finished (called by Job.should_stop on every rank)."""
        now = self._clock()
        self._durations.append(now - self._last_step)
        if self.steady_s() > 0:  # a step of start-up, a save or an evaluation says nothing of the next ones
            self._steady_durations.append(now - self._last_step)
        self._last_step = now
        self._busy = False

    def busy(self) -> None:
        """The main thread starts work that is not a step and may take longer than the stop's grace (a
        framework's synchronous checkpoint save, an evaluation): a stop asked for meanwhile waits for the next
        step and its final checkpoint instead of ending the process in the middle of the save."""
        self._busy = True

    def alive(self) -> None:
        """The main thread finished work that is not a step (an evaluation batch): it is not blocked in a
        collective, so a stop asked for now waits for the next step (its final checkpoint) while such work
        goes on. No step's duration, and no bearing on the silent-peer rule (the timeouts are relaxed
        around such work). Ends `busy()`: the stop's grace counts from here."""
        self._last_alive = self._clock()
        self._busy = False

    def _grace(self) -> float:
        recent = statistics.median(self._durations) if self._durations else 0.0
        return max(self.stop_grace_s, 3 * recent)

    def silent_limit(self, steady: float) -> float:
        """Seconds without a step after which a peer is silent: the collective's own timeout counts from
        when it started, after this rank's own work for the step (at most the longest recent step),
        and SILENT_MARGIN_S more lets it fail by itself first."""
        if self.silent_s is not None:
            return self.silent_s
        return steady + max(self._steady_durations, default=0.0) + SILENT_MARGIN_S

    def check(self, now: float) -> tuple[int, str] | None:
        """The exit to take now, if any (pure: the thread calls it twice a second)."""
        since = now - self._last_step
        if (self._stop_at is not None and not self._busy and self._last_step <= self._stop_at
                and now - max(self._stop_at, self._last_alive) >= self._grace()):
            name = signal.Signals(self._signum).name
            return 128 + self._signum, (f"stopped by {name} while blocked for {since:.0f} s in a collective or "
                                        f"the step (no step finished within {self._grace():.0f} s of the signal)")
        steady = self.steady_s()
        if steady > 0 and since >= self.silent_limit(steady):
            return 1, (f"Timed out: no training step finished in {since:.0f} s although collectives time out "
                       f"after {steady:.0f} s: a peer went silent (frozen, or its node lost)")
        return None

    def stop_requested(self, signum: int = signal.SIGTERM) -> None:
        """A SIGTERM or SIGINT arrived (the thread reads it from the signal pipe): the first one starts the
        stop's grace, now by the injected clock."""
        if self._stop_at is None:
            self._stop_at, self._signum = self._clock(), signum

    def release(self) -> None:
        """The main thread is out of its collective after the abort (it writes its rescue checkpoint now)."""
        self._released.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self._read_fd], [], [], 0.5)
            if ready:
                for byte in os.read(self._read_fd, 64):
                    if byte in (signal.SIGTERM, signal.SIGINT):
                        self.stop_requested(byte)
            if self._closed.is_set():
                return
            verdict = self.check(self._clock())
            if verdict is not None:
                if verdict[0] == 1:
                    self._leave_silent_peer(*verdict)
                self._fail(*verdict)
                return

    def _leave_silent_peer(self, code: int, message: str) -> None:
        """Abort, then give the main thread the chance to save its replica; returns when it did not take it."""
        self.verdict = (code, message)
        try:
            abortable = self.abort is not None and self.abort()
        except Exception as error:  # best effort: the exit does not depend on it
            log.warning("could not abort the process groups: %s", error)
            abortable = False
        if abortable:
            log.error("%s: aborted the process groups; saving the replica before exiting", message)
            if self._released.wait(ABORT_WAIT_S):
                self._closed.wait(RESCUE_WAIT_S)  # Job.close ends the process with exit() meanwhile

    def exit(self) -> None:
        """End the process with the silent-peer verdict (Job.close, once the rescue checkpoint is written):
        the launcher reads it, not whatever the aborted collective raised."""
        assert self.verdict is not None
        self._fail(*self.verdict)

    def _fail(self, code: int, message: str) -> None:
        with self._exiting:  # the main thread and this one may both come here: one message, one exit
            log.error("exiting with code %d: %s", code, message)
            path = os.environ.get("TORCHELASTIC_ERROR_FILE")
            if path:
                try:
                    with open(path, "w") as file:  # what torchrun's @record writes for an exception
                        json.dump({"message": {"message": f"TrainerStalled: {message}", "extraInfo": {
                            "py_callstack": "", "timestamp": str(int(time.time()))}}}, file)
                except OSError:
                    pass
            for handler in logging.getLogger().handlers:
                handler.flush()
            self._exit(code)

    def close(self) -> None:
        """Every exit path of the trainer. After a silent-peer verdict the thread keeps its bound on the
        exit, and the caller ends the process with `exit()`."""
        self._released.set()
        if self._previous_fd is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_fd)
            self._previous_fd = None
        if self.verdict is not None:
            return
        self._closed.set()
        try:  # wake the thread from its select now, not at its next look (every trainer's exit paid up to 0.5 s)
            os.write(self._write_fd, b"\0")
        except OSError:  # the pipe is full: it is awake already
            pass
        self._thread.join(timeout=2)
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
