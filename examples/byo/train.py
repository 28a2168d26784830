"""Bring your own script: a plain PyTorch DDP loop with Hugging Face-style dict batches.

Everything DDPJob promises comes from `ddp_trainer.runtime` in a handful of lines (marked "DDPJob"):
a final checkpoint on SIGTERM and exit 143, resume after a restart or a resize (also at another
world size, without repeating or skipping a sample), progress in the job's status, a clear error
for an unwritable checkpoint volume. Run it:

    torchrun --standalone --nproc-per-node=2 examples/byo/train.py --max-steps 200
    ddpjob run examples/byo/byo-text.yaml --local
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from ddp_trainer.runtime import (Job, ResumableDistributedSampler, exit_process, is_peer_failure, move_to,  # DDPJob
                                 worker_init_fn)

log = logging.getLogger("byo")
VOCAB, PAD = 64, 0


class ToyText(Dataset):
    """Token sequences of 4..24 tokens; the label says whether token 7 occurs more often than token 9."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(4, 25, (n,), generator=g)
        self.items = []
        for length in lengths.tolist():
            ids = torch.randint(1, VOCAB, (length,), generator=g)
            self.items.append({"input_ids": ids, "labels": int((ids == 7).sum() > (ids == 9).sum())})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def collate(samples: list[dict]) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence: {"input_ids", "attention_mask", "labels"}, like a tokenizer's output."""
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), width), PAD, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, : len(s["input_ids"])] = s["input_ids"]
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(),
            "labels": torch.tensor([s["labels"] for s in samples])}


class TinyClassifier(nn.Module):
    """Returns {"logits", "loss"} like a Hugging Face model called with labels."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden, padding_idx=PAD)
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, input_ids, attention_mask, labels=None):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        logits = self.mlp(pooled)
        return {"logits": logits, **({"loss": F.cross_entropy(logits, labels)} if labels is not None else {})}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0, help="demo/test: slow each step down (seconds)")
    return p.parse_args(argv)


@torch.no_grad()
def accuracy(model: nn.Module, data: Dataset, job: Job) -> float:
    """Each rank scores a disjoint slice; the counts are summed over ranks."""
    model.eval()
    mine = [data[i] for i in range(job.env.rank, len(data), job.env.world_size)]
    batch = move_to(collate(mine), job.device)
    correct = (model(batch["input_ids"], batch["attention_mask"])["logits"].argmax(1) == batch["labels"]).sum()
    model.train()
    return job.mean(correct.float()) * job.env.world_size / len(data)


@record  # DDPJob: an exception reaches the termination message
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # DDPJob: env, device, process group, SIGTERM handler, checkpoint dir checked; after the first steps a
    # silent peer (a lost node) fails the collectives within 30 s instead of 30 minutes.
    with Job.start(steady_timeout_s=30) as job:
        logging.basicConfig(level=logging.INFO if job.env.is_main else logging.WARNING,
                            format=f"%(asctime)s rank{job.env.rank} %(levelname)s %(name)s: %(message)s")
        torch.manual_seed(args.seed)
        model = TinyClassifier().to(job.device)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        train, held_out = ToyText(args.samples, seed=1234), ToyText(512, seed=4321)
        sampler = ResumableDistributedSampler(len(train), job.env.rank, job.env.world_size, seed=args.seed)
        step = 0
        state = job.resume()  # DDPJob: newest intact checkpoint, the same on every rank
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            sampler.load_state_dict(state["sampler"])  # refuses another seed or dataset (ResumeMismatch)
            step = state["step"]
        ddp = DDP(model)

        def checkpoint() -> dict:  # model, not ddp: the keys must load without the DDP wrapper
            return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                    "sampler": sampler.state_dict()}

        loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, collate_fn=collate,
                            num_workers=args.num_workers, worker_init_fn=worker_init_fn())  # DDPJob
        t0 = time.perf_counter()
        try:
            while step < args.max_steps:
                for batch in loader:
                    loss = ddp(**move_to(batch, job.device))["loss"]
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    step += 1
                    sampler.advance(len(batch["labels"]))  # DDPJob: the resume position
                    time.sleep(args.step_sleep)
                    if step % args.log_every == 0:
                        mean = job.mean(loss.detach())  # averaged over ranks (a collective: every rank)
                        rate = args.log_every * args.batch_size * job.env.world_size / (time.perf_counter() - t0)
                        t0 = time.perf_counter()
                        if job.env.is_main:
                            print(f"step={step} epoch={sampler.epoch} loss={mean:.4f} samples_per_s={rate:.1f}",
                                  flush=True)
                        job.report(step=step, total_steps=args.max_steps, loss=mean, epoch=sampler.epoch,
                                   samples_per_second=rate)  # DDPJob: progress, non-blocking
                    if job.should_save(step):
                        job.save(step, checkpoint())  # DDPJob: rank 0 writes atomically
                    if job.should_stop():  # DDPJob: SIGTERM on any rank -> all ranks, same step
                        log.warning("stop requested at step %d: writing a final checkpoint", step)
                        job.save(step, checkpoint(), final=True)
                        return job.stop.exit_code  # 143
                    if step >= args.max_steps:
                        break
                else:
                    sampler.set_epoch(sampler.epoch + 1)
        except Exception as e:
            if is_peer_failure(e):  # DDPJob: a peer died; this replica is whole after `step` steps
                job.rescue(step, checkpoint())  # the first survivor saves it: at most 1 step lost
            raise
        acc = accuracy(model, held_out, job)
        job.save(step, checkpoint(), final=True)
        job.result(step=step, eval_accuracy=acc)  # DDPJob: result.json
        log.info("finished at step %d: held-out accuracy %.3f", step, acc)
    return 0


if __name__ == "__main__":
    exit_process(main())  # DDPJob: no interpreter teardown after a clean finish
