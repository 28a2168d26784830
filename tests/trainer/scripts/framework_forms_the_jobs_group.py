"""A framework's trainer under in-process recovery, DDPJob's part of it: the callback's module forms the job's
process group through the job's store before the framework would (`framework_callback.form_group`), then one
all_reduce over it. `--framework-first`: the framework formed its own group first (from torchrun's variables,
each pod's alone), as an HF script that builds TrainingArguments before calling hf.output_dir() does.
tests/trainer/test_framework_trainers_form_the_jobs_group_under_in_process_recovery.py runs it."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from ddp_trainer.runtime import framework_callback

FRAMEWORK = "the Test Trainer"


def main() -> int:
    if "--framework-first" in sys.argv:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        framework_callback.form_group(FRAMEWORK)  # too late: the framework's group stands
        framework_callback.check_group_formed(FRAMEWORK, "call form_group first")
        return 0
    framework_callback.form_group(FRAMEWORK)
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"rank={dist.get_rank()} world={dist.get_world_size()} WORLD_SIZE={os.environ['WORLD_SIZE']} "
          f"RANK={os.environ['RANK']} sum={int(total.item())}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
