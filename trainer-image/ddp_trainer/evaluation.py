"""The bundled trainer's evaluation: loss and accuracy over the whole eval set, each rank scoring a disjoint slice."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Subset

from .config import TrainConfig
from .runtime import Job, move_to
from .workloads import Workload


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The mixed-precision context of `--precision` (none for fp32), for training and evaluation alike."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


class Evaluation:
    def __init__(self, cfg: TrainConfig, job: Job, workload: Workload, eval_set: Dataset) -> None:
        self.cfg, self.job, self.workload, self.eval_set = cfg, job, workload, eval_set
        self._last: tuple[int, dict[str, float | None]] | None = None  # (step, metrics) of the last evaluation

    def forget(self) -> None:
        """Evaluate again even at the same step (after an in-process recovery every rank must: a collective)."""
        self._last = None

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float | None]:
        """Loss and accuracy of `model` (the module inside DDP: no gradient sync, and ranks may run unequal batch
        counts), the sums reduced over the ranks. Twice at the same step (the end of the last epoch, then the end
        of training) reuses the result."""
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        self.job.timeouts.relax()  # not a step: ranks may take unequal time, and the stall watchdog waits
        env, device = self.job.env, self.job.device
        model.eval()
        shard = Subset(self.eval_set, range(env.rank, len(self.eval_set), env.world_size))
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, count, correct, scored
        for batch in DataLoader(shard, batch_size=self.cfg.data.eval_batch_size, collate_fn=self.workload.collate_fn):
            batch = move_to(batch, device)
            with autocast(self.cfg.optim.precision, device):
                r = self._step(model, batch)
            sums += torch.tensor([float(r["loss"]), float(r["count"]), float(r.get("correct", 0)),
                                  float(r.get("scored", 0))], dtype=torch.float64, device=device)
        model.train()
        dist.all_reduce(sums)
        loss, count, correct, scored = sums.tolist()
        metrics = {"loss": loss / max(count, 1), "accuracy": correct / scored if scored else None}
        self._last = (step, metrics)
        return metrics

    def _step(self, model: torch.nn.Module, batch: Any) -> dict[str, Any]:
        if self.workload.eval_step is not None:
            return self.workload.eval_step(model, batch, self.cfg)
        if isinstance(batch, Mapping):
            out = model(**batch)
            loss = out["loss"] if isinstance(out, Mapping) else out.loss
            n = next(len(v) for v in batch.values() if isinstance(v, torch.Tensor))
            return {"loss": loss.float() * n, "count": n}
        x, y = batch
        out = model(x)
        r = {"loss": self.workload.loss_fn(out.float(), y).double() * len(y), "count": len(y)}
        if out.dim() == 2 and y.dim() == 1:  # classification: accuracy is meaningful
            r.update(correct=(out.argmax(dim=1) == y).sum(), scored=len(y))
        return r
