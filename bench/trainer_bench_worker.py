"""Worker side of bench/trainer_step.py and bench/checkpoint_stall.py (started by torchrun).

Modes:
  step   alternate rounds of a minimal hand-written DDP loop and the real Trainer loop (same model,
         data, batch and world size) and record the wall time between consecutive optimizer steps.
  stall  run the real Trainer loop with checkpoints every N steps, synchronous and asynchronous,
         and record how long each save() call blocks rank 0's training loop.
Rank 0 writes the raw timings as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddp_trainer.config import parse_config
from ddp_trainer.runtime import Job, JobEnv, StopRequest, init_process_group, select_device
from ddp_trainer.trainer import Trainer
from ddp_trainer.workloads import load_workload


def trainer_args(a: argparse.Namespace, steps: int, extra: list[str]) -> list[str]:
    return ["--workload", "synthetic", "--workload-option", f"samples={a.samples}", "--workload-option",
            f"hidden={a.hidden}", "--workload-option", f"layers={a.layers}", "--workload-option", "eval_samples=64",
            "--batch-size", str(a.batch_size), "--max-steps", str(steps), "--epochs", "1000", "--log-every",
            "1000000", "--device", a.device, "--precision", a.precision, *extra]


def make_job(cfg, env: JobEnv, device: torch.device) -> Job:
    """A Job on the already initialised process group (as `Job.start()` makes one in __main__)."""
    c = cfg.checkpoint
    return Job(env, device, StopRequest(), checkpoint_dir=c.dir or "", keep=c.keep, every_steps=c.every_steps,
               async_save=c.async_save)


def run_trainer(cfg_args: list[str], env: JobEnv, device: torch.device) -> tuple[list[float], Trainer]:
    """The Trainer's own loop; a timestamp at every _train_step entry (a wrapper costs ~1 us)."""
    cfg = parse_config(cfg_args, env={})
    trainer = Trainer(cfg, make_job(cfg, env, device))
    stamps: list[float] = []
    inner = trainer._train_step

    def timed(micro_batches):
        stamps.append(time.perf_counter())
        inner(micro_batches)

    trainer._train_step = timed
    try:
        trainer.run()
    finally:
        trainer.close(clean=True)
    return stamps, trainer


def run_baseline(cfg_args: list[str], env: JobEnv, device: torch.device) -> list[float]:
    """What a user would write by hand: DistributedSampler, DataLoader, DDP, AdamW."""
    cfg = parse_config(cfg_args, env={})
    workload = load_workload("synthetic")
    train, _ = workload.build_datasets(cfg)
    torch.manual_seed(cfg.data.seed)
    model = DDP(workload.build_model(cfg).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    sampler = DistributedSampler(train, env.world_size, env.rank, seed=cfg.data.seed, drop_last=True)
    loader = DataLoader(train, batch_size=cfg.data.batch_size, sampler=sampler, pin_memory=device.type == "cuda")
    amp = cfg.optim.precision == "bf16"
    stamps: list[float] = []
    epoch = 0
    while len(stamps) < cfg.max_steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if len(stamps) == cfg.max_steps:
                break
            stamps.append(time.perf_counter())
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return stamps


def step_times(stamps: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:])]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["step", "stall"])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    a = p.parse_args()

    env = JobEnv.from_env()
    device = select_device(a.device, env)
    init_process_group(env, device)
    results: dict[str, list] = {}
    if a.mode == "step":
        results = {"baseline": [], "trainer": []}
        args = trainer_args(a, a.steps, [])
        for _ in range(a.rounds):  # interleaved, so drift on a shared machine hits both alike
            results["baseline"] += step_times(run_baseline(args, env, device), a.warmup)
            results["trainer"] += step_times(run_trainer(args, env, device)[0], a.warmup)
    else:
        results = {"none": [], "sync": [], "async": [], "sync_save_s": [], "async_save_s": []}
        root = tempfile.mkdtemp(prefix="ckpt-bench-") if env.is_main else None
        shared = [root]
        dist.broadcast_object_list(shared, src=0)
        for _ in range(a.rounds):
            for mode in ("none", "sync", "async"):
                ckpt = os.path.join(shared[0], mode)
                extra = [] if mode == "none" else ["--checkpoint-dir", ckpt, "--checkpoint-every",
                                                   str(a.checkpoint_every)]
                if mode == "async":
                    extra.append("--async-checkpoint")
                saves: list[float] = []
                if mode != "none" and env.is_main:
                    _time_saves(saves)
                stamps, _ = run_trainer(trainer_args(a, a.steps, extra), env, device)
                _time_saves(None)
                results[mode] += step_times(stamps, a.warmup)
                if mode != "none":
                    results[f"{mode}_save_s"] += saves[:-1]  # the last one is the blocking final save
                dist.barrier()
                if env.is_main:
                    shutil.rmtree(ckpt, ignore_errors=True)
        if env.is_main:
            shutil.rmtree(shared[0], ignore_errors=True)
    if env.is_main:
        with open(a.out, "w") as f:
            json.dump({"world_size": env.world_size, "device": str(device), "args": vars(a), **results}, f)
    dist.destroy_process_group()


_original_save = None


def _time_saves(sink: list[float] | None) -> None:
    """Time every CheckpointManager.save call (the stall the training loop sees) into `sink`."""
    from ddp_trainer.runtime.checkpoint import CheckpointManager

    global _original_save
    if _original_save is None:
        _original_save = CheckpointManager.save
    if sink is None:
        CheckpointManager.save = _original_save
        return

    def timed(self, step, state, *, blocking=False):
        t = time.perf_counter()
        _original_save(self, step, state, blocking=blocking)
        sink.append(time.perf_counter() - t)

    CheckpointManager.save = timed


if __name__ == "__main__":
    main()
