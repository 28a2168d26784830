"""An HF Trainer script as a newcomer writes it on a CPU machine: no `use_cpu=True` (HF then runs each torchrun
process alone, at world size 1). tests/trainer/test_framework_world_size_check.py runs it under torchrun."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from ddp_trainer.runtime import hf  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = (torch.arange(8) + i) % 32
        return {"input_ids": ids, "labels": ids}


def main() -> int:
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=1))
    args = TrainingArguments(output_dir=hf.output_dir(str(Path(sys.argv[1]))), max_steps=3,
                             per_device_train_batch_size=2, save_strategy="no", report_to="none", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[hf.DDPJobCallback()])
    trainer.train(resume_from_checkpoint=hf.resume_from_checkpoint(args))
    return 0


if __name__ == "__main__":
    hf.exit_process(main())
