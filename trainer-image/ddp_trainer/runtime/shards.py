"""The micro-batches of each optimizer step, for every seat this process trains (runtime/views.py).

    shards = Shards(len(train_set), seed, shuffle, drop_last, batch_size, grad_accum,
                    job.view.world, job.view.coverage(job.seat))
    for micro_batches in step_batches(train_set, shards, epoch, epoch_samples, ...):   # one optimizer step
        ... each micro-batch's loss / (len(micro_batches) // len(shards.coverage)) * job.view.loss_scale ...
    # after should_stop() with job.regrouped True (or a recover()): build them again for the new view

In a whole view a process trains its own seat's shard. In a short one it also trains the shards of the missing
seats it covers: each seat's micro-batches come from that seat's own sampler (the one an undisturbed run gives
the process in that seat), so the step's global batch and the epoch's sample order do not depend on who is alive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, Dataset

from .data import iter_with_stop_signals_held, worker_init_fn
from .sampler import ResumableDistributedSampler

MicroBatch = tuple[list[int], Any]  # (sample indices, collated batch)


@dataclass(frozen=True)
class Shards:
    """What one epoch's data order depends on, and the seats this process trains in it."""

    length: int  # samples in the training set
    seed: int
    shuffle: bool
    drop_last: bool
    batch_size: int  # per seat and micro-step
    grad_accum: int  # micro-steps per seat and optimizer step
    world: int  # seats (the view's logical world)
    coverage: tuple[int, ...]  # this process's own seat first

    def index_batches(self, epoch: int, consumed: int) -> list[list[list[int]]]:
        """Per covered seat: its remaining micro-batches of the epoch (every seat has as many)."""
        out = []
        for seat in self.coverage:
            sampler = ResumableDistributedSampler(self.length, seat, self.world, seed=self.seed, shuffle=self.shuffle,
                                                  drop_last=self.drop_last)
            sampler.set_epoch(epoch, consumed)
            out.append(list(BatchSampler(sampler, self.batch_size, drop_last=False)))
        return out

    def steps(self, epoch: int, consumed: int) -> list[list[list[int]]]:
        """The index micro-batches of each remaining optimizer step: the covered seats' in coverage order, each
        seat's `grad_accum` (the epoch's last step may have fewer, as many for every seat)."""
        per_seat = self.index_batches(epoch, consumed)
        count = len(per_seat[0])
        return [[batch for batches in per_seat for batch in batches[start:start + self.grad_accum]]
                for start in range(0, count, self.grad_accum)]


def step_batches(dataset: Dataset, shards: Shards, epoch: int, consumed: int, *, collate_fn: Callable | None,
                 num_workers: int, pin_memory: bool) -> Iterator[list[MicroBatch]]:
    """Micro-batches of each remaining optimizer step of the epoch, loaded ahead by one DataLoader."""
    steps = shards.steps(epoch, consumed)
    flat = [batch for step in steps for batch in step]
    loader = DataLoader(dataset, batch_sampler=flat, num_workers=num_workers, collate_fn=collate_fn,
                        pin_memory=pin_memory,
                        worker_init_fn=worker_init_fn() if num_workers else None)  # workers outlive SIGTERM
    # The loader yields in batch_sampler order; its workers start with the stop signals held.
    loaded = iter(iter_with_stop_signals_held(loader) if num_workers else loader)
    for step in steps:
        yield [(indices, next(loaded)) for indices in step]
