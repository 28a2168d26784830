"""Under in-process recovery (DDPJOB_INPROCESS=1, the default with restartScope Pod) each pod's agent runs torchrun
with a rendezvous of the pod's own: torchrun's RANK and WORLD_SIZE are the pod's alone. A plain torchrun script that
forms its group itself (`dist.init_process_group()`, env://) trained alone then, one model per pod, and exited 0.
The agent now takes torchrun's MASTER_ADDR/MASTER_PORT out of its trainers' environment, so that such a script fails
at once, and the pod's termination message names the fix. Both ways the agent starts trainers: forked from it (the
default on CPU) and spawned fresh (GPU nodes). The pod's launcher from the ConfigMap's files, real torchrun."""

from __future__ import annotations

import time

import pytest

from ddpjob_operator.agent import contract
from ddpjob_operator.decisions.common import short_message

from .test_worker_agent_program import run_program

pytest.importorskip("torch", reason="the agent's worker module imports torch")

PLAIN = ("import torch.distributed as dist\n"
         "dist.init_process_group('gloo')\n"
         "print(f'trained alone: rank {dist.get_rank()} of {dist.get_world_size()}', flush=True)\n"
         "dist.destroy_process_group()\n")
FIX = ("this trainer forms its own process group (torch.distributed.init_process_group); in-process recovery, the "
       "default with restartScope Pod, needs ddp_trainer.runtime.Job (or the HF/Lightning callbacks). Fix: set "
       "failurePolicy.recovery: Restart in the DDPJob")


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "spawned"])
def test_a_plain_script_fails_at_once_with_the_fix(tmp_path, fork):
    began = time.monotonic()
    done = run_program(tmp_path, {contract.INPROCESS_ENV: "1", contract.FORK_TRAINER_ENV: fork,
                                  # a static gang's pod has them too (launch.py): no trainer may read them either
                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}, PLAIN)
    took = time.monotonic() - began
    assert "trained alone" not in done.stdout, done.stdout
    assert done.returncode == 1, done.stderr[-3000:]  # a user's error: the operator fails the job, never restarts it
    message = (tmp_path / "termination-log").read_text()
    assert FIX in message, message
    assert FIX in short_message(message)  # the job's Failed condition keeps it whole
    assert FIX in done.stderr
    assert took < 60, took


def test_the_restart_path_leaves_a_plain_script_its_group(tmp_path):
    done = run_program(tmp_path, {contract.INPROCESS_ENV: ""}, PLAIN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained alone: rank 0 of 1" in done.stdout
