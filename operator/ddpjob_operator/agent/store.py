"""The rendezvous store's program: `python AGENT_DIR/bootstrap.py store PORT` (launch.store_command). A standalone
c10d TCPStore that outlives every worker (no worker hosts it: --rdzv-conf is_host=false), serving until SIGTERM or
SIGINT. Like the worker's agent it reaches the store's pod (image spec.rendezvous.storeImage or spec.image: torch,
no operator package) in the job's agent ConfigMap, so the pod's command carries no program; the standard library
and torch only."""

import os
import signal
import sys
from datetime import timedelta

STOP = {signal.SIGTERM, signal.SIGINT}


def main(args):
    if len(args) != 1 or not args[0].isdigit() or not 0 < int(args[0]) < 65536:
        sys.exit(f"usage: bootstrap.py store PORT (a TCP port, 1-65535), got {' '.join(args) or 'nothing'}")
    port = int(args[0])
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)  # before the server thread starts, so it inherits it
    import torch.distributed as dist
    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                          timeout=timedelta(seconds=60))
    print(f"ddpjob rendezvous store listening on port {store.port}", flush=True)  # held until the exit below
    signal.sigwait(STOP)
    print("ddpjob rendezvous store stopping", flush=True)
    # Nothing it holds needs a teardown (the keys live in memory; the kernel closes the sockets), and an
    # interpreter's shutdown with torch loaded took 2.4-3.2 s under load: every stop of a store pod or local run.
    sys.stderr.flush()
    os._exit(0)
