"""Each rank's own time per step, apart from the time it waited for the others in collectives.

DDP runs at the speed of its slowest rank, so every rank's step takes the same wall time; what tells a
straggler apart is how much of it was its own work (data, forward, backward, optimizer) and how much it
spent waiting for its peers. `StepTimer` measures

    own = wall time between two step boundaries - time waited in collectives in between

- boundaries: `Job.should_stop()`, which every script calls once per step on every rank;
- waits: the stop agreement's all_reduce, `Job.mean()` and checkpoint saves (timed by `Job`), anything a
  script wraps in `job.step_timer.waiting()`, and DDP's gradient all_reduce: `watch(ddp_model)` notes when
  the step's *last* gradient was accumulated here (a post-accumulate-grad hook per parameter) and when
  backward returned (an autograd callback queued behind DDP's own); the time between is the wait at the end
  of backward (earlier buckets overlap the backward and cost no wait).

On CUDA the CPU runs ahead of the GPU, so CPU clocks would time kernel launches: there, `own` is the GPU's
time from the step boundary to the last gradient ready (two CUDA events per step on the current
stream, read at the next log interval, after the device was synchronised anyway), which leaves out the
NCCL wait, queued later on that stream.

Cost: a clock read per step and per parameter (a hook call), no device sync, no collective per step; the
trainer's all_gather of the window's own times runs at log intervals (bench/straggler_detection.py).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

import torch


class StepTimer:
    def __init__(self, device: torch.device | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.cuda = device is not None and device.type == "cuda"
        self._mark: float | None = None  # the current step's start
        self._waited = 0.0  # in collectives, since the mark
        self._ready: float | None = None  # DDP: the last gradient accumulated here (this step)
        self._done: float | None = None  # DDP: backward returned (its all_reduce completed)
        self._queued = False
        self._sum, self._steps = 0.0, 0  # own time since the last take()
        self._events: list[tuple[Any, Any]] = []  # CUDA: (boundary, last gradient ready) per step
        self._start_event: Any = None
        self._ready_event: Any = None

    # ---- step boundaries and waits -------------------------------------------------------------

    def boundary(self) -> None:
        """The end of one step and the start of the next (every rank, once per step)."""
        now = self.clock()
        if self._mark is not None:
            ddp_wait = max(0.0, self._done - self._ready) if self._ready is not None and self._done is not None \
                else 0.0
            self._sum += max(0.0, now - self._mark - self._waited - ddp_wait)
            self._steps += 1
        if self.cuda:
            if self._start_event is not None and self._ready_event is not None:
                self._events.append((self._start_event, self._ready_event))
                del self._events[:-1024]  # bounded if nobody takes them
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
            self._ready_event = None
        self._mark, self._waited, self._ready, self._done = now, 0.0, None, None

    def own_so_far(self) -> float:
        """This step's own time until now (CPU clocks)."""
        if self._mark is None:
            return 0.0
        ddp_wait = max(0.0, self._done - self._ready) if self._ready is not None and self._done is not None else 0.0
        return max(0.0, self.clock() - self._mark - self._waited - ddp_wait)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Time spent in here is waiting for the other ranks, not this rank's own work."""
        start = self.clock()
        try:
            yield
        finally:
            self._waited += self.clock() - start

    def take(self) -> float | None:
        """Mean own seconds per step since the last call (None: no whole step yet); resets the window."""
        if self.cuda:
            times = [start.elapsed_time(ready) / 1000.0 for start, ready in self._events
                     if start.query() and ready.query()]
            self._events.clear()
            self._sum, self._steps = 0.0, 0
            return sum(times) / len(times) if times else None
        if not self._steps:
            return None
        mean = self._sum / self._steps
        self._sum, self._steps = 0.0, 0
        return mean

    # ---- DDP -----------------------------------------------------------------------------------

    def watch(self, ddp_model: torch.nn.Module) -> None:
        """Time the wait at the end of backward (DDP's gradient all_reduce): a hook on each parameter notes
        when its gradient was accumulated here (the last one: this rank's backward is done), and a callback
        queued behind DDP's own end-of-backward work notes when backward returns. DDP's built-in all_reduce is
        untouched (no communication hook: a user's own hook, and the numerics, stay as they are)."""
        engine = torch.autograd.Variable._execution_engine

        def ended() -> None:
            self._done = self.clock()
            self._queued = False

        def relay() -> None:
            # Callbacks run in the order queued, and ones queued while they run come last: queued from here,
            # `ended` runs after DDP's finalize (queued when its last bucket was ready), i.e. after the wait.
            engine.queue_callback(ended)

        def ready(_param: torch.Tensor) -> None:
            self._ready = self.clock()
            if self.cuda:
                self._ready_event = torch.cuda.Event(enable_timing=True)
                self._ready_event.record()
            if not self._queued:
                self._queued = True
                engine.queue_callback(relay)

        for param in ddp_model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(ready)
