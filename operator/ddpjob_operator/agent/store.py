"""The rendezvous store's program: `python AGENT_DIR/bootstrap.py store PORT` (launch.store_command). A standalone
c10d TCPStore that outlives every worker (no worker hosts it: --rdzv-conf is_host=false), serving until SIGTERM or
SIGINT. Like the worker's agent it reaches the store's pod (image spec.rendezvous.storeImage or spec.image: torch,
no operator package) in the job's agent ConfigMap, so the pod's command carries no program; the standard library
and torch only."""

import os
import signal
import sys
import threading
import traceback
from datetime import timedelta

STOP = {signal.SIGTERM, signal.SIGINT}
SERVING = []  # the store, held until the process exits


def main(args):
    if len(args) != 1 or not args[0].isdigit() or not 0 < int(args[0]) < 65536:
        sys.exit(f"usage: bootstrap.py store PORT (a TCP port, 1-65535), got {' '.join(args) or 'nothing'}")
    # Blocked before any thread starts (torch's own, the server's), so every one inherits it and only sigwait
    # takes a stop; the imports run beside it: a stop during their seconds ends the store then, not once it serves.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    threading.Thread(target=serve, args=(int(args[0]),), name="store", daemon=True).start()
    signal.sigwait(STOP)
    print("ddpjob rendezvous store stopping", flush=True)
    exit_now(0)


def serve(port):
    try:
        import torch.distributed as dist
        SERVING.append(dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                                     timeout=timedelta(seconds=60)))
    except BaseException:
        traceback.print_exc()
        exit_now(1)
    print(f"ddpjob rendezvous store listening on port {port}", flush=True)


def exit_now(code):
    # Nothing it holds needs a teardown (the keys live in memory; the kernel closes the sockets), and an
    # interpreter's shutdown with torch loaded took 2.4-3.2 s under load: every stop of a store pod or local run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
