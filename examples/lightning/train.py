"""PyTorch Lightning on DDPJob: a tiny classifier built in code, a synthetic dataset, a warmup-cosine
schedule stepped every optimizer step, and the DDPJob callback.

    torchrun --standalone --nproc-per-node=2 examples/lightning/train.py --max-steps 60
    ddpjob run examples/lightning/lightning-tiny.yaml --local --kill-worker 1 --kill-at-step 25

Rank 0 prints one line per step (`step= epoch= loss= lr= samples=`): the learning rate and the
dataset indices it trained on, which tests/local/test_frameworks.py compares with an undisturbed run.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ddp_trainer.runtime import ResumableDistributedSampler
from ddp_trainer.runtime import lightning as ddpjob  # DDPJob


class Points(Dataset):
    """Two Gaussian blobs in 16 dimensions; each item carries its index."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.x = torch.randn(n, 16, generator=g) + self.y[:, None].float()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i], "idx": i}


class Tiny(L.LightningModule):
    def __init__(self, lr: float, warmup: int, max_steps: int, step_sleep: float, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 2))
        self.lr, self.warmup, self.max_steps, self.step_sleep = lr, warmup, max_steps, step_sleep

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self.net(batch["x"]), batch["y"])
        if self.trainer.is_global_zero:
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            print(f"step={self.global_step + 1} epoch={self.current_epoch} loss={loss.item():.6f} lr={lr:.10g} "
                  f"samples={batch['idx'].tolist()}", flush=True)
        time.sleep(self.step_sleep)  # demo/test: slow each step down
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)

        def warmup_cosine(step: int) -> float:
            if step < self.warmup:
                return (step + 1) / self.warmup
            return 0.5 * (1 + math.cos(math.pi * (step - self.warmup) / max(1, self.max_steps - self.warmup)))

        schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    L.seed_everything(a.seed, verbose=False)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    data = Points(a.samples, seed=1234)
    # DDPJob: a sampler that resumes mid-epoch at any world size; the callback advances it and saves it.
    sampler = ResumableDistributedSampler(len(data), rank, world, seed=a.seed)
    loader = DataLoader(data, batch_size=a.batch_size, sampler=sampler, num_workers=0)
    trainer = L.Trainer(max_steps=a.max_steps, callbacks=[ddpjob.DDPJobCallback(steady_timeout_s=30)],  # DDPJob
                        use_distributed_sampler=False, enable_checkpointing=False, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, **ddpjob.trainer_kwargs())  # DDPJob
    model = Tiny(a.lr, a.warmup_steps, a.max_steps, a.step_sleep, a.dropout)
    trainer.fit(model, loader, ckpt_path=ddpjob.resume_from_checkpoint())  # DDPJob: newest complete checkpoint
    return 0


if __name__ == "__main__":
    ddpjob.exit_process(main())  # DDPJob: no interpreter teardown after a clean finish
