"""The training loop: DDP, resumable sharding, checkpoints, cooperative stop, evaluation, reporting."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, Subset

from .checkpoint import CheckpointManager, atomic_write_json
from .config import TrainConfig
from .distributed import DistEnv, StopSignal, barrier
from .fault import due as fault_due, strike as fault_strike
from .sampler import ResumableDistributedSampler
from .workloads import load_workload

log = logging.getLogger(__name__)

MicroBatch = tuple[list[int], tuple[torch.Tensor, torch.Tensor]]  # (sample indices, (inputs, targets))


@dataclass
class Progress:
    epoch: int = 0
    step: int = 0  # optimizer steps, over all epochs
    epoch_samples: int = 0  # global samples consumed in the current epoch: the sampler's resume point
    total_samples: int = 0


class Trainer:
    def __init__(self, cfg: TrainConfig, env: DistEnv, device: torch.device) -> None:
        self.cfg, self.env, self.device = cfg, env, device
        self.stop = StopSignal(device)  # first, so a SIGTERM during setup is not lost
        workload = load_workload(cfg.workload.name)
        self.loss_fn = workload.loss_fn
        self.train_set, self.eval_set = workload.build_datasets(cfg)
        torch.manual_seed(cfg.data.seed)  # identical init everywhere (DDP broadcasts rank 0's anyway)
        model = workload.build_model(cfg).to(device)
        self.optimizer = workload.build_optimizer(model, cfg)
        self.progress = Progress()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: self._lr_factor())
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.optim.precision == "fp16")
        self.sampler = ResumableDistributedSampler(len(self.train_set), env.rank, env.world_size,
                                                   seed=cfg.data.seed, shuffle=cfg.data.shuffle,
                                                   drop_last=cfg.data.drop_last)
        self.checkpoints = None
        if cfg.checkpoint.dir:
            self.checkpoints = CheckpointManager(cfg.checkpoint.dir, cfg.checkpoint.keep, is_writer=env.is_main,
                                                 async_save=cfg.checkpoint.async_save)
            self._resume(model)
        self.model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        self._records = open(f"{cfg.record_samples}.rank{env.rank}", "a") if cfg.record_samples else None
        self._window = (time.perf_counter(), 0, 0.0, 0)  # (start, samples, loss sum, steps) since last log

    # ---- loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Train to the end (exit code 0) or until a signal asks to stop (128 + signal number)."""
        while not self._finished():
            for micro_batches in self._step_batches():
                self._train_step(micro_batches)
                if self.stop.agreed():
                    log.warning("stop requested at step %d: writing a final checkpoint", self.progress.step)
                    self._save(final=True)
                    return 128 + (self.stop.signum or signal.SIGTERM)
                if self._finished():
                    break
            else:
                self.progress.epoch += 1
                self.progress.epoch_samples = 0
                self._log_eval()
        metrics = self.evaluate()
        self._save(final=True)
        self._write_json("result.json", {"status": "completed", "step": self.progress.step,
                                         "epoch": self.progress.epoch, "eval_loss": metrics["loss"],
                                         "eval_accuracy": metrics["accuracy"], "world_size": self.env.world_size})
        return 0

    def _finished(self) -> bool:
        p, cfg = self.progress, self.cfg
        return p.epoch >= cfg.epochs or (cfg.max_steps > 0 and p.step >= cfg.max_steps)

    def _step_batches(self) -> Iterator[list[MicroBatch]]:
        """Micro-batches of each remaining optimizer step of the current epoch."""
        self.sampler.set_epoch(self.progress.epoch, self.progress.epoch_samples)
        index_batches = list(BatchSampler(self.sampler, self.cfg.data.batch_size, drop_last=False))
        loader = DataLoader(self.train_set, batch_sampler=index_batches, num_workers=self.cfg.data.num_workers,
                            pin_memory=self.device.type == "cuda")
        group: list[MicroBatch] = []
        for indices, batch in zip(index_batches, loader):  # the loader yields in batch_sampler order
            group.append((indices, batch))
            if len(group) == self.cfg.optim.grad_accum:
                yield group
                group = []
        if group:  # the epoch's last, shorter accumulation group still makes one optimizer step
            yield group

    def _train_step(self, micro_batches: list[MicroBatch]) -> None:
        last = len(micro_batches) - 1
        loss_sum = torch.zeros((), device=self.device)
        for i, (_, (x, y)) in enumerate(micro_batches):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            # Gradients are all-reduced only on the final micro-step; earlier ones accumulate locally.
            with self.model.no_sync() if i < last else contextlib.nullcontext():
                with self._autocast():
                    loss = self.loss_fn(self.model(x), y) / len(micro_batches)
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if self.cfg.optim.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

        samples = self.env.world_size * sum(len(idx) for idx, _ in micro_batches)  # equal on every rank
        p = self.progress
        p.step, p.epoch_samples, p.total_samples = p.step + 1, p.epoch_samples + samples, p.total_samples + samples
        self.scheduler.step()  # after the progress update: the factor looks at the next step
        if self._records:
            self._records.writelines(f"{p.epoch} {i}\n" for idx, _ in micro_batches for i in idx)
            self._records.flush()
        start, n, loss_total, steps = self._window
        self._window = (start, n + samples, loss_total + loss_sum, steps + 1)
        if p.step % self.cfg.log_every == 0:
            self._log_progress()
        if fault_due(self.cfg.fault, self.env.rank, p.step):
            fault_strike(self.cfg.fault, self.env.rank, p.step)
        if self.cfg.checkpoint.every_steps and p.step % self.cfg.checkpoint.every_steps == 0:
            self._save(final=False)

    def _autocast(self) -> contextlib.AbstractContextManager:
        precision = self.cfg.optim.precision
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)

    def _lr_factor(self) -> float:
        """LR multiplier as a function of the fraction of planned samples consumed after the next step.

        Progress is counted in samples, not steps, so the schedule stays continuous when a resumed
        job runs at a different world size (and therefore a different number of steps per epoch).
        """
        o = self.cfg.optim
        global_batch = self.cfg.data.batch_size * self.env.world_size * o.grad_accum
        planned = self.cfg.epochs * len(self.train_set)
        if self.cfg.max_steps:
            planned = min(planned, self.cfg.max_steps * global_batch)
        frac = min(1.0, (self.progress.total_samples + global_batch) / planned)
        if frac < o.warmup_fraction:
            return frac / o.warmup_fraction
        rest = (frac - o.warmup_fraction) / (1.0 - o.warmup_fraction)
        if o.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * rest))
        if o.schedule == "linear":
            return 1.0 - rest
        return 1.0

    # ---- evaluation and reporting -----------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        """Loss and accuracy over the whole eval set: each rank scores a disjoint slice, then sums are reduced."""
        model = self.model.module  # no DDP forward: no gradient sync and ranks may run unequal batch counts
        model.eval()
        shard = Subset(self.eval_set, range(self.env.rank, len(self.eval_set), self.env.world_size))
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss sum, count, correct, scored
        for x, y in DataLoader(shard, batch_size=self.cfg.data.eval_batch_size):
            x, y = x.to(self.device), y.to(self.device)
            with self._autocast():
                out = model(x)
            sums[0] += self.loss_fn(out.float(), y).double() * len(y)
            sums[1] += len(y)
            if out.dim() == 2 and y.dim() == 1:  # classification: accuracy is meaningful
                sums[2] += (out.argmax(dim=1) == y).sum()
                sums[3] += len(y)
        model.train()
        dist.all_reduce(sums)
        loss, count, correct, scored = sums.tolist()
        return {"loss": loss / max(count, 1), "accuracy": correct / scored if scored else None}

    def _log_eval(self) -> None:
        m = self.evaluate()
        if self.env.is_main:
            log.info("eval epoch=%d step=%d eval_loss=%.4f eval_accuracy=%s", self.progress.epoch,
                     self.progress.step, m["loss"], f"{m['accuracy']:.4f}" if m["accuracy"] is not None else "n/a")

    def _log_progress(self) -> None:
        start, samples, loss_total, steps = self._window
        now = time.perf_counter()
        self._window = (now, 0, 0.0, 0)
        if not self.env.is_main:
            return
        loss = float(loss_total) / max(steps, 1)  # rank 0's loss, averaged over the log window
        rate = samples / max(now - start, 1e-9)
        p = self.progress
        print(f"step={p.step} epoch={p.epoch} loss={loss:.4f} samples_per_s={rate:.1f}", flush=True)
        last = self.checkpoints.last_committed_step if self.checkpoints else None
        self._write_json("progress.json", {"step": p.step, "epoch": p.epoch, "loss": loss,
                                           "samples_per_second": rate, "world_size": self.env.world_size,
                                           "last_checkpoint_step": last, "time": time.time()})

    def _write_json(self, name: str, obj: dict[str, Any]) -> None:
        if self.env.is_main and self.cfg.checkpoint.dir:
            atomic_write_json(Path(self.cfg.checkpoint.dir) / name, obj)

    # ---- checkpoints ------------------------------------------------------------------------

    def _save(self, final: bool) -> None:
        if self.checkpoints is None:
            return
        rng = [None] * self.env.world_size
        dist.all_gather_object(rng, _rng_state())  # every rank's RNG, so an equal-size resume is exact
        if self.env.is_main:
            if final:
                self.checkpoints.wait()  # a pending async write of this very step needs no rewrite
        if self.env.is_main and self.checkpoints.last_committed_step != self.progress.step:
            state = {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                     "progress": asdict(self.progress), "world_size": self.env.world_size, "rng": rng}
            self.checkpoints.save(self.progress.step, state, blocking=final)
        if final:
            # Nobody exits before the commit: torchrun tears down a node's other workers as soon
            # as one of them exits, and global rank 0 may live on that node.
            barrier(self.device)

    def _resume(self, model: torch.nn.Module) -> None:
        """All ranks load the checkpoint rank 0 found to be the newest intact one."""
        found = self.checkpoints.load_latest() if self.env.is_main else None
        chosen = [found[0] if found else None]
        dist.broadcast_object_list(chosen, src=0)
        step = chosen[0]
        if step is None:
            log.info("no checkpoint found: starting from scratch")
            return
        state = found[1] if found else self.checkpoints.load(step)
        model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        if state["world_size"] == self.env.world_size:
            _set_rng_state(state["rng"][self.env.rank])
        else:  # a different world: no per-rank stream to continue, derive a fresh distinct one
            torch.manual_seed(self.cfg.data.seed + 1_000_003 * self.progress.step + self.env.rank)
        if self.env.is_main:
            log.info("resumed from checkpoint step=%d epoch=%d epoch_samples=%d (saved at world_size=%d, now %d)",
                     step, self.progress.epoch, self.progress.epoch_samples, state["world_size"], self.env.world_size)

    def close(self, clean: bool) -> None:
        """Every exit path: finish the pending checkpoint write, drain collectives, close files."""
        try:
            if self.checkpoints is not None:
                self.checkpoints.wait()
        finally:
            self.stop.close(drain=clean)
            if self._records:
                self._records.close()


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
