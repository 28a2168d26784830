"""The Hugging Face `Trainer` on DDPJob: a tiny causal LM built from a config (nothing is downloaded),
a synthetic dataset, a warmup-cosine schedule, and one line for DDPJob (`DDPJobCallback`).

    torchrun --standalone --nproc-per-node=2 examples/hf/train.py --max-steps 60
    ddpjob run examples/hf/hf-tiny-lm.yaml --local --kill-worker 1 --kill-at-step 25

Rank 0 prints one line per optimizer step (`step= epoch= loss= lr= samples=`): the learning rate and
the dataset indices it trained on, which tests/local/test_frameworks.py compares with an undisturbed run.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, not a download: never reach for the Hub

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from ddp_trainer.runtime import hf  # DDPJob

VOCAB, LENGTH = 64, 16


class Sequences(Dataset):
    """Token sequences with a learnable rule (each token is the previous plus a per-sequence stride)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(LENGTH)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i], "idx": i}


class TinyLM(GPT2LMHeadModel):
    """GPT-2 that also takes the batch's dataset indices (`idx`), to show which samples a step trained on."""

    def forward(self, input_ids=None, labels=None, idx=None, **kwargs):
        self.seen = idx
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


class StepLine(TrainerCallback):
    """Rank 0: `step=N epoch=E loss=L lr=X samples=[...]` after every logged step (logging_steps=1)."""

    def __init__(self, model: TinyLM, step_sleep: float) -> None:
        self.model, self.step_sleep = model, step_sleep

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.step_sleep)  # demo/test: slow each step down

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            seen = self.model.seen.tolist() if self.model.seen is not None else []
            print(f"step={state.global_step} epoch={int(state.epoch or 0)} loss={logs['loss']:.6f} "
                  f"lr={logs.get('learning_rate', 0.0):.10g} samples={seen}", flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.1, help="GPT-2's default")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    torch.manual_seed(a.seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=a.dropout, embd_pdrop=a.dropout, attn_pdrop=a.dropout)
    model = TinyLM(config)
    args = TrainingArguments(
        output_dir=hf.output_dir("outputs/hf-tiny-lm"),  # DDPJob: the job's checkpoint volume
        max_steps=a.max_steps, per_device_train_batch_size=a.batch_size, learning_rate=a.lr,
        lr_scheduler_type="cosine", warmup_steps=a.warmup_steps, logging_steps=1, save_strategy="no",
        seed=a.seed, data_seed=a.seed, report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
        use_cpu=not torch.cuda.is_available())
    trainer = Trainer(model=model, args=args, train_dataset=Sequences(a.samples, seed=1234),
                      # DDPJob: one line (a silent peer ends a collective after 30 s, not HF's 30 min)
                      callbacks=[hf.DDPJobCallback(steady_timeout_s=30), StepLine(model, a.step_sleep)])
    trainer.train(resume_from_checkpoint=hf.resume_from_checkpoint(args))  # DDPJob: newest complete checkpoint
    return 0


if __name__ == "__main__":
    hf.exit_process(main())  # DDPJob: no interpreter teardown after a clean finish
