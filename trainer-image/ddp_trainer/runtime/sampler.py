"""A DistributedSampler that can resume mid-epoch at any world size.

Each epoch has one global permutation (seeded by seed + epoch, identical on every rank). Training
consumes it as a prefix: rank r takes remaining[r::world], so after every rank has taken k samples
the union consumed is exactly remaining[:k * world]. The checkpoint therefore only needs the number
of global samples consumed in the epoch; a restarted job at any world size re-shards the rest.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


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
        self.consumed = 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Select the epoch's permutation and skip the `consumed` global samples already trained on."""
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"consumed must be in [0, {self.num_samples}], got {consumed}")
        self.epoch, self.consumed = epoch, consumed

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
