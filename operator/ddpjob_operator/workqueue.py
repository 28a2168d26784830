"""The controller's work queue: which job's pass runs next, as controller-runtime's queue decides it.

Every trigger of a job (its own event, an event of one of its pods, a timer, a resync, a new leader)
asks for one more pass over that job; the queue holds a job once however often it is asked (the
events of a burst fold into one pass), runs one pass per job at a time and at most `concurrency`
passes at once. A job triggered during its pass runs once more after `settle_seconds`, so one
extra pass covers a burst of the events its own pass caused.

Unlike a plain FIFO, a job the operator has not yet acted on in its current spec (a new job, a
changed spec: `urgent(key)`) goes ahead of every job that is only being resynced: after a restart
the new leader resyncs every job, and a job submitted meanwhile must not wait behind all of them. Nor
beside them: while an urgent pass runs (for up to `urgent_alone_seconds`), no resync starts, since on one
event loop a pass's every API call waits its turn with every pass running beside it.

`hold()` starts no pass until `release()`: the controller holds the queue until its informers have
listed every job and pod, so no pass acts on a half-listed cluster and the urgent jobs are known.

Pure asyncio: no kopf, no Kubernetes. Imports nothing of the operator.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

Key = TypeVar("Key", bound=Hashable)
# How long an urgent pass runs without resyncs started beside it. One process, one core: a new job's pass
# awaits its API calls in turn with every pass running beside it, and 31 resyncs (each parsing a spec,
# deciding, writing a status) made it take 8 s instead of a fraction of one (docs/benchmarks.md). Bounded,
# so that an urgent pass stuck on a slow API server holds the resyncs back for a few seconds at most.
URGENT_ALONE_SECONDS = 5.0
logger = logging.getLogger(__name__)


class WorkQueue(Generic[Key]):
    def __init__(self, work: Callable[[Key], Awaitable[None]], *, concurrency: int, settle_seconds: float,
                 urgent: Callable[[Key], bool] = lambda key: False,
                 urgent_alone_seconds: float = URGENT_ALONE_SECONDS) -> None:
        self._work, self._concurrency, self._settle, self._urgent = work, concurrency, settle_seconds, urgent
        self._alone = urgent_alone_seconds
        self._urgent_running: dict[Key, float] = {}  # urgent passes under way -> when they started
        self._wake: asyncio.TimerHandle | None = None  # dispatch again when the urgent passes' time alone ends
        self._queues: tuple[deque[Key], deque[Key]] = (deque(), deque())  # urgent first, then the rest
        self._waiting: dict[Key, bool] = {}  # queued keys -> queued as urgent (a key's older entry is stale)
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._again: set[Key] = set()  # triggered during their pass
        self._settling: dict[Key, asyncio.TimerHandle] = {}  # to be queued once their burst settled
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}  # key -> (due, handle)
        self._held = False

    # ------------------------------------------------------------ holding

    def hold(self) -> None:
        """Start no pass until `release()`: what a pass reads is not complete yet (the pods not yet
        listed). Triggers are still taken and folded, and the order kept."""
        self._held = True

    def release(self) -> None:
        self._held = False
        self._dispatch()

    # ------------------------------------------------------------ asking for passes

    def add(self, key: Key, settle: float = 0.0) -> None:
        """One more pass over `key`, folded into one already asked for and not yet started. `settle`:
        queue it only after that many seconds, folding in what more comes meanwhile (a burst)."""
        if key in self._running:
            self._again.add(key)
        elif key in self._settling:
            return
        elif settle > 0 and key not in self._waiting:
            self._settling[key] = asyncio.get_running_loop().call_later(settle, self._settled, key)
        else:
            self._enqueue(key)

    def add_after(self, key: Key, delay: float) -> None:
        """A pass in `delay` seconds; the earliest of a key's timers wins."""
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        current = self._timers.get(key)
        if current is not None and current[0] <= due:
            return
        if current is not None:
            current[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def forget(self, key: Key) -> None:
        """The key's timer is dropped (its job is gone); a pass already asked for finds nothing to do."""
        current = self._timers.pop(key, None)
        if current is not None:
            current[1].cancel()

    # ------------------------------------------------------------ state

    def idle(self) -> bool:
        """No pass running, queued or settling (timers aside)."""
        return not (self._running or self._waiting or self._settling)

    def running(self) -> frozenset[Key]:
        return frozenset(self._running)

    def __len__(self) -> int:
        """Keys with a pass queued, running or settling (a key is in one of them at most)."""
        return len(self._waiting) + len(self._running) + len(self._settling)

    # ------------------------------------------------------------ stopping

    def clear(self) -> None:
        """Drop everything asked for, cancel the timers and the passes under way (a fenced leader)."""
        for handle in [*self._settling.values(), *(handle for _, handle in self._timers.values())]:
            handle.cancel()
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        self._settling.clear()
        self._timers.clear()
        self._waiting.clear()
        self._again.clear()
        for queue in self._queues:
            queue.clear()
        for task in self._running.values():
            task.cancel()

    async def stop(self) -> None:
        self.clear()
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    # ------------------------------------------------------------ inside

    def _enqueue(self, key: Key) -> None:
        urgent = self._urgent(key)
        queued = self._waiting.get(key)
        if queued is None or (urgent and not queued):
            self._waiting[key] = urgent
            self._queues[0 if urgent else 1].append(key)
        self._dispatch()

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _next(self) -> tuple[Key, bool] | None:
        """The next key and whether it is urgent; a resync waits while an urgent pass runs alone."""
        for urgent, queue in zip((True, False), self._queues):
            if not urgent and queue and self._urgent_alone():
                return None
            while queue:
                key = queue.popleft()
                if self._waiting.get(key) is urgent:  # else a stale entry: promoted, or already run
                    del self._waiting[key]
                    return key, urgent
        return None

    def _urgent_alone(self) -> bool:
        """An urgent pass is running and still within its time alone (then a wake-up is set for its end)."""
        if not self._urgent_running:
            return False
        loop = asyncio.get_running_loop()
        ends = min(self._urgent_running.values()) + self._alone
        if ends <= loop.time():
            return False
        if self._wake is None or self._wake.when() > ends:
            if self._wake is not None:
                self._wake.cancel()
            self._wake = loop.call_at(ends, self._woken)
        return True

    def _woken(self) -> None:
        self._wake = None
        self._dispatch()

    def _dispatch(self) -> None:
        while not self._held and len(self._running) < self._concurrency:
            found = self._next()
            if found is None:
                return
            key, urgent = found
            loop = asyncio.get_running_loop()
            task = loop.create_task(self._work(key))
            self._running[key] = task
            if urgent:
                self._urgent_running[key] = loop.time()
            task.add_done_callback(functools.partial(self._done, key))

    def _done(self, key: Key, task: asyncio.Task[None]) -> None:
        # A done callback, not a `finally` in the pass: a pass cancelled before it started (a fenced
        # leader clears the queue in the instant it was dispatched) never runs its own code.
        if self._running.get(key) is task:
            del self._running[key]
            self._urgent_running.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a pass over %s raised", key, exc_info=task.exception())
        if key in self._again:
            self._again.discard(key)
            self._settling[key] = asyncio.get_running_loop().call_later(self._settle, self._settled, key)
        self._dispatch()

    def _settled(self, key: Key) -> None:
        del self._settling[key]
        self._enqueue(key)
