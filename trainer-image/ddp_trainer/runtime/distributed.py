"""Process-group setup from the torchrun environment, and the cooperative SIGTERM stop."""

from __future__ import annotations

import datetime
import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import DistConfig


@dataclass(frozen=True)
class DistEnv:
    """What torchrun (and the operator, see docs/launch-contract.md) put into the environment."""

    rank: int
    local_rank: int
    world_size: int
    group_rank: int
    restart_count: int

    @classmethod
    def from_env(cls) -> "DistEnv":
        e = os.environ
        missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in e]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not set: run the trainer under torchrun")
        return cls(rank=int(e["RANK"]), local_rank=int(e["LOCAL_RANK"]), world_size=int(e["WORLD_SIZE"]),
                   group_rank=int(e.get("GROUP_RANK", "0")),
                   restart_count=int(e.get("TORCHELASTIC_RESTART_COUNT", "0")))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def select_device(requested: str, env: DistEnv) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda requested but CUDA is not available")
        torch.cuda.set_device(env.local_rank)  # before init, so NCCL binds the right GPU
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def init_process_group(cfg: DistConfig, env: DistEnv, device: torch.device) -> None:
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=cfg.timeout_s),
                            device_id=device if device.type == "cuda" else None)


def barrier(device: torch.device) -> None:
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class StopSignal:
    """SIGTERM/SIGINT set a local flag; ranks agree on it with one all_reduce per step.

    The all_reduce for step k is started asynchronously at step k and read at step k+1, so it
    overlaps with compute instead of adding a round-trip per step. Every rank calls `agreed()`
    exactly once per optimizer step, hence all ranks see the same answer at the same step.
    """

    def __init__(self, device: torch.device) -> None:
        self.requested = False
        self.signum: int | None = None
        self._device = device
        self._pending: tuple[dist.Work, torch.Tensor] | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, _frame: object) -> None:
        self.requested, self.signum = True, signum

    def agreed(self) -> bool:
        stop = self._collect()
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32, device=self._device)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        return stop

    def _collect(self) -> bool:
        if self._pending is None:
            return False
        work, flag = self._pending
        self._pending = None
        work.wait()
        return bool(flag.item())

    def close(self, drain: bool = True) -> None:
        """Restore handlers; on a clean exit first drain the in-flight all_reduce (a failed peer
        could make that wait block until the collective timeout, so the error path skips it)."""
        try:
            if drain and self._pending is not None and dist.is_initialized():
                self._pending[0].wait()
        finally:
            self._pending = None
            for s, h in self._previous.items():
                signal.signal(s, h)
