"""What the ranks measure together (`Job.mean`, `Job.step_seconds`): small collectives every rank calls, each wait
timed as a wait (runtime/timing.py), so that a rank does not look slow for waiting on the others."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .distributed import JobEnv
from .timing import StepTimer


def mean_over_ranks(value: float | torch.Tensor, env: JobEnv, device: torch.device, timer: StepTimer) -> float:
    """The mean of a per-rank value over all ranks (a collective: every rank must call it)."""
    t = torch.as_tensor(value, dtype=torch.float64, device=device).detach().clone().reshape(1)
    if dist.is_initialized() and env.world_size > 1:
        with timer.waiting():
            dist.all_reduce(t)
        t /= env.world_size
    return float(t.item())


def step_seconds_by_pod(env: JobEnv, device: torch.device, timer: StepTimer) -> tuple[float | None, dict[int, float]]:
    """Every rank (one small all_gather): this pod's own time per step since the last call (the slowest of its
    local ranks) and every pod's, by replica index (DDPJOB_REPLICA_INDEX, else torchrun's group rank)."""
    own = timer.take()
    pod = env.replica_index if env.replica_index is not None else env.group_rank
    mine = torch.tensor([-1.0 if own is None else own, float(pod)], dtype=torch.float64, device=device)
    rows = [mine]
    if dist.is_initialized() and env.world_size > 1:
        rows = [torch.empty_like(mine) for _ in range(env.world_size)]
        with timer.waiting():
            dist.all_gather(rows, mine)
    pods: dict[int, float] = {}
    for row in torch.stack(rows).tolist():
        seconds, index = row[0], int(row[1])
        if seconds >= 0:
            pods[index] = max(pods.get(index, 0.0), seconds)
    return pods.get(pod), pods
