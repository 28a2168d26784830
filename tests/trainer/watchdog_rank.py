"""One rank of tests/trainer/test_watchdog.py's silent-peer test: two ranks all_reduce over Gloo, rank 1 freezes after
step 5 (alive, sockets open), rank 0's stall watchdog gets it out. argv: rank, the store's port, the mode ("stop":
only the stop rule, the test sends SIGTERM; "silent": the silent-peer rule, 4 s)."""

from __future__ import annotations

import datetime
import sys
import time

import torch
import torch.distributed as dist

from ddp_trainer.runtime.distributed import StopRequest, abort_process_groups
from ddp_trainer.runtime.watchdog import StallWatchdog

rank, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
stop = StopRequest()
store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
# Gloo's abort cannot get the main thread out of its wait: the watchdog exits the process itself.
dog = StallWatchdog(lambda: 1.0, silent_s=None if mode == "stop" else 4.0, stop_grace_s=2.0,
                    abort=lambda: abort_process_groups([None]))
if mode == "stop":
    dog.silent_s = 3600.0  # only the stop rule here
for step in range(1000):
    if rank == 1 and step == 5:
        print("frozen", flush=True)
        time.sleep(3600)  # alive, sockets open, never answering again
    dist.all_reduce(torch.ones(4))
    dog.step()
    print(f"step {step}", flush=True)
