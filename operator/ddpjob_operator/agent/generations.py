"""The job's rendezvous store as the agents' channel for rendezvous generations (`Generations`: the newest one
published and read, a lost store reconnected to), and torchrun's flags that name a generation (--rdzv-id ending
in -g<generation>, --nnodes). Part of the pod's agent (worker.py, spare.py): the standard library, torch and
contract.py only."""

import re
import socket
import sys
import threading
import time
from datetime import timedelta

from torch.distributed import DistNetworkError, TCPStore

from .contract import GENERATION_KEY, NNODES_KEY


def flag(args, name):
    prefix = f"--{name}="
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)


def with_flags(args, **values):
    # Only torchrun's own flags, which come before the entrypoint: the user's args are never touched.
    out, ours = [], True
    for a in args:
        name = a[2:].split("=", 1)[0] if ours and a.startswith("--") and "=" in a else None
        if name is None:
            ours = False
        key = name.replace("-", "_") if name else None
        out.append(f"--{name}={values[key]}" if key in values else a)
    return out


# A lost store's pod is recreated by the operator under the same Service (in-process recovery keeps the
# workers): an agent whose store call fails on the connection waits this long for the new one to accept.
STORE_RETURN_SECONDS = 60


class Generations:
    # The job's rendezvous store as the survivors' channel (see REJOIN_ENV in contract.py). On a lost connection
    # it connects again (the store came back empty) and publishes again the newest generation it knows.
    def __init__(self, endpoint, uid):
        host, _, port = endpoint.rpartition(":")
        self.uid, self.address = uid, (host, int(port))
        self.known = None  # (generation, nnodes): the newest this agent published or read
        self.store = self.connect()

    def connect(self):
        return TCPStore(*self.address, is_master=False, timeout=timedelta(seconds=60))

    def call(self, op, *args):
        # A TCPStore method, retried once on a new connection after the newest generation is published again.
        try:
            result = getattr(self.store, op)(*args)
            if op == "set":  # sent unanswered: to a store that died it is lost without an error, so ask once
                self.store.num_keys()
            return result
        except DistNetworkError as lost:
            self.reconnect(lost)
            return getattr(self.store, op)(*args)

    def reconnect(self, lost):
        began, wait, where = time.monotonic(), 0.05, "{}:{}".format(*self.address)
        cause = (str(lost).strip().splitlines() or [type(lost).__name__])[0]
        while not accepts(self.address):
            if time.monotonic() - began + wait > STORE_RETURN_SECONDS:
                print(f"the job's rendezvous store {where} was lost ({cause}) and did not come back within "
                      f"{STORE_RETURN_SECONDS} s", file=sys.stderr, flush=True)
                raise lost
            time.sleep(wait)
            wait = min(2 * wait, 1.0)
        self.store = self.connect()
        again = f"; generation {self.known[0]} ({self.known[1]} nodes) published again" if self.known else ""
        if self.known:
            self.publish(*self.known)
        print(f"the job's rendezvous store {where} was lost ({cause}); reconnected after "
              f"{time.monotonic() - began:.1f} s{again}", file=sys.stderr, flush=True)

    def note(self, generation, nnodes):
        if self.known is None or generation >= self.known[0]:
            self.known = (generation, nnodes)

    def publish(self, generation, nnodes):
        self.note(generation, nnodes)
        self.call("set", NNODES_KEY.format(uid=self.uid, generation=generation), nnodes)
        key, seen = GENERATION_KEY.format(uid=self.uid), ""
        while True:  # the newest generation wins: compare-and-set until ours is no longer newer
            current = self.call("compare_set", key, seen, str(generation)).decode()
            if int(current) >= generation:
                return
            seen = current

    def newest(self):
        key = GENERATION_KEY.format(uid=self.uid)
        if not self.call("check", [key]):
            return None
        generation = int(self.call("get", key))
        nnodes = self.call("get", NNODES_KEY.format(uid=self.uid, generation=generation)).decode()
        self.note(generation, nnodes)
        return generation, nnodes

    def wait_newer(self, generation, timeout, stop=None, every=0.2):
        deadline, stop = time.monotonic() + timeout, stop or threading.Event()
        while time.monotonic() < deadline and not stop.is_set():
            newest = self.newest()
            if newest is not None and newest[0] > generation:
                return newest
            stop.wait(every)
        return None


def accepts(address):
    # A plain connect: a TCPStore built against a closed port retries for its whole timeout, logging a C++ stack.
    try:
        with socket.create_connection(address, timeout=1):
            return True
    except OSError:
        return False


def generation_of(rdzv_id):
    match = re.search(r"-g(\d+)$", rdzv_id or "")
    return int(match.group(1)) if match else None
