"""A DistributedSampler that can resume mid-epoch at any world size.

Each epoch has one global permutation (seeded by seed + epoch, identical on every rank). Training
consumes it as a prefix: rank r takes remaining[r::world], so after every rank has taken k samples
the union consumed is exactly remaining[:k * world]. The checkpoint therefore only needs the number
of global samples consumed in the epoch; a restarted job at any world size re-shards the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from .data import batch_size_of


class ResumeMismatch(ValueError):
    """A checkpoint was written by a run whose data order differs from this one's."""


def check_resume(saved: dict[str, Any], current: dict[str, Any], what: str = "checkpoint") -> None:
    """Refuse to resume when a setting the saved position depends on changed (seed, shuffle, dataset
    length): the position would point into another order, repeating and skipping samples silently."""
    diffs = [f"{k}={saved[k]!r} (this run: {current[k]!r})" for k in sorted(saved)
             if k in current and saved[k] != current[k]]
    if diffs:
        raise ResumeMismatch(f"cannot resume: the {what} was written with {', '.join(diffs)}; its saved "
                             f"position means other samples under this run's settings. Run with the "
                             f"checkpoint's settings, or start from scratch in a new checkpoint directory")


class ResumableDistributedSampler(Sampler[int]):
    def __init__(self, num_samples: int, rank: int, world_size: int, *, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = True) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if num_samples < world_size:
            raise ValueError(f"dataset has {num_samples} samples, fewer than world_size={world_size}")
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch = 0
        self.consumed = 0  # where this epoch's iteration starts (global samples)
        self.position = 0  # global samples trained on in this epoch, moved by advance()

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Select the epoch's permutation and skip the `consumed` global samples already trained on."""
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"consumed must be in [0, {self.num_samples}], got {consumed}")
        self.epoch, self.consumed = epoch, consumed
        self.position = consumed

    def advance(self, batch: Any) -> None:
        """Count one step's samples of this rank (every rank takes the same number): the step's batch
        (a tensor, a dict such as a tokenizer's output, a tuple: its first tensor's first dimension) or
        its size. The DataLoader prefetches ahead of training, so only the loop knows what was trained on."""
        local_samples = batch if isinstance(batch, int) and not isinstance(batch, bool) else batch_size_of(batch)
        self.position += local_samples * self.world_size

    def state_dict(self) -> dict[str, Any]:
        """Where to resume, and what the order depends on (checked by load_state_dict)."""
        return {"epoch": self.epoch, "consumed": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the saved position; ResumeMismatch when this run's order would differ."""
        check_resume({k: state[k] for k in ("seed", "shuffle", "num_samples") if k in state},
                     {"seed": self.seed, "shuffle": self.shuffle, "num_samples": self.num_samples})
        self.set_epoch(int(state["epoch"]), int(state["consumed"]))

    def epoch_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)  # same recipe as torch's DistributedSampler
        return torch.randperm(self.num_samples, generator=g).tolist()

    def _remaining(self) -> list[int]:
        remaining = self.epoch_order()[self.consumed:]
        tail = len(remaining) % self.world_size
        if tail and self.drop_last:
            remaining = remaining[: len(remaining) - tail]  # < world_size samples skipped this epoch
        elif tail:
            pad = self.world_size - tail  # repeat a few so every rank runs the same number of steps
            remaining = remaining + (remaining * (pad // len(remaining) + 1))[:pad]
        return remaining

    def __iter__(self) -> Iterator[int]:
        return iter(self._remaining()[self.rank :: self.world_size])

    def __len__(self) -> int:
        return len(self._remaining()) // self.world_size
