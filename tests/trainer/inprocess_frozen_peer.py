"""Run by test_inprocess_recovery: a trainer on the runtime (`Job`, DDPJOB_INPROCESS=1) whose peer (rank 1)
freezes (SIGSTOP) while an operation of rank 0 is in flight on their Gloo group. Rank 0's wait gives up
first (a timed-out peer), and `job.recover` must then find that the group cannot be left: a Gloo operation
waiting on a live, silent peer cannot be cut short in torch 2.13 (destroy_process_group waits for it). It
must say so, return False, and let the process end at once (exit code 3) instead of hanging."""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys

import torch
import torch.distributed as dist

from ddp_trainer.runtime import Job, exit_process, inprocess

inprocess.LEAVE_TIMEOUT_S = 2.0
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stdout)
job = Job.start(timeout_s=60)
model = torch.nn.Linear(4, 2)
job.carry(state=lambda: {"model": model.state_dict()}, load=model.load_state_dict, rewrap=lambda: None,
          step=lambda: 0)
x = torch.ones(4)
dist.all_reduce(x)  # both ranks are in the group
if job.env.rank == 1:
    print("rank 1 freezing", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
work = dist.all_reduce(x, async_op=True)  # waits on the frozen rank 1 for the group's 60 s
try:
    work.wait(timeout=datetime.timedelta(seconds=1))
    code = 0
except RuntimeError as error:
    print(f"wait failed: {error}", flush=True)
    code = 3 if not job.recover(error) else 4
job.close(clean=False)
print(f"exiting with code {code}", flush=True)
exit_process(code)
