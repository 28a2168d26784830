"""One rank of tests/trainer/test_watchdog.py's abort test: a `Job` rank whose collective the abort gets it out of, as
NCCL's abort fails the collective blocked on it. That needs two GPUs; here the abort stands in by ending the frozen
peer, which fails rank 0's Gloo all_reduce the way a closed socket does. Everything else is the runtime's own: the
watchdog's verdict, the rescue checkpoint, the exit from Job.close. argv: rank, the checkpoint directory."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from ddp_trainer.runtime import Job

job = Job.start(device="cpu", timeout_s=300, checkpoint_dir=sys.argv[2])
store = dist.distributed_c10d._get_default_store()
if job.env.rank == 1:
    store.set("frozen", str(os.getpid()))
job.watchdog.abort = lambda: os.kill(int(store.get("frozen")), signal.SIGKILL) or True
job.watchdog.steady_s, job.watchdog.silent_s = (lambda: 1.0), 4.0
step = 0
try:
    for step in range(1, 1000):
        if job.env.rank == 1 and step == 5:
            print("frozen", flush=True)
            time.sleep(3600)  # alive, sockets open, never answering again
        dist.all_reduce(torch.ones(4))
        job.should_stop()
        print(f"step {step}", flush=True)
except RuntimeError as error:
    print(f"collective failed: {error}", flush=True)
    job.rescue(step - 1, {"weights": torch.ones(2)})
finally:
    job.close(clean=False)
