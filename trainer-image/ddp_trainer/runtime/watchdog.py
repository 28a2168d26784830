"""A trainer blocked in a collective can neither notice a silent peer nor obey SIGTERM: its main thread
sits in C++ (Gloo, NCCL) where Python's signal handlers never run. This watchdog thread covers both.

- Asked to stop (SIGTERM/SIGINT, seen through `signal.set_wakeup_fd`, which the C-level handler writes
  whatever the main thread is doing) while no step finishes within `stop_grace_s` (at least 3 of the
  recent step times): the trainer is blocked; it exits 128 + the signal at once instead of waiting
  out the agent's kill timeout, its message saying so.
- A peer that went silent with its sockets open (a frozen process, a node that lost power or its
  network) is meant to fail the next collective after the steady timeout (`CollectiveTimeout`); when no
  step has finished for twice that plus a margin although the steady timeout is in force, the collective
  did not time out by itself: the trainer exits 1 with a "Timed out" message, a peer failure to the
  launcher (which then waits in place for the next generation, restartScope Pod).

Both write the message where torchrun's `@record` would (TORCHELASTIC_ERROR_FILE), so it reaches the
pod's termination message. Nothing here touches the replica: the rescue checkpoint is the other
survivors' (whose collectives did fail) or the last periodic one.
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

SILENT_MARGIN_S = 10.0
STOP_GRACE_S = 5.0


class StallWatchdog:
    def __init__(self, steady_s: Callable[[], float], *, stop_grace_s: float = STOP_GRACE_S,
                 silent_s: float | None = None, exit: Callable[[int], None] = os._exit,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`steady_s()`: the collective timeout in force now, 0 while it is relaxed (start-up, saves);
        `silent_s`: overrides 2 x steady + SILENT_MARGIN_S."""
        self.steady_s, self.stop_grace_s, self.silent_s = steady_s, stop_grace_s, silent_s
        self._exit, self._clock = exit, clock
        self._last_step = clock()
        self._durations: deque[float] = deque(maxlen=20)
        self._stop_at: float | None = None
        self._signum = signal.SIGTERM
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
        self._last_step = now

    def _grace(self) -> float:
        recent = statistics.median(self._durations) if self._durations else 0.0
        return max(self.stop_grace_s, 3 * recent)

    def check(self, now: float) -> tuple[int, str] | None:
        """The exit to take now, if any (pure: the thread calls it twice a second)."""
        since = now - self._last_step
        if self._stop_at is not None and self._last_step <= self._stop_at and now - self._stop_at >= self._grace():
            name = signal.Signals(self._signum).name
            return 128 + self._signum, (f"stopped by {name} while blocked for {since:.0f} s in a collective or "
                                        f"the step (no step finished within {self._grace():.0f} s of the signal)")
        steady = self.steady_s()
        limit = self.silent_s if self.silent_s is not None else 2 * steady + SILENT_MARGIN_S
        if steady > 0 and since >= limit:
            return 1, (f"Timed out: no training step finished in {since:.0f} s although collectives time out "
                       f"after {steady:.0f} s: a peer went silent (frozen, or its node lost)")
        return None

    def _run(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self._read_fd], [], [], 0.5)
            if ready:
                for byte in os.read(self._read_fd, 64):
                    if byte in (signal.SIGTERM, signal.SIGINT) and self._stop_at is None:
                        self._stop_at, self._signum = self._clock(), byte
            if self._closed.is_set():
                return
            verdict = self.check(self._clock())
            if verdict is not None:
                self._fail(*verdict)
                return

    def _fail(self, code: int, message: str) -> None:
        log.error("exiting with code %d: %s", code, message)
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            try:
                with open(path, "w") as file:  # what torchrun's @record writes for an exception
                    json.dump({"message": {"message": f"TrainerStalled: {message}",
                                           "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))}}},
                              file)
            except OSError:
                pass
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._exit(code)

    def close(self) -> None:
        self._closed.set()
        if self._previous_fd is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_fd)
            self._previous_fd = None
        self._thread.join(timeout=2)
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
