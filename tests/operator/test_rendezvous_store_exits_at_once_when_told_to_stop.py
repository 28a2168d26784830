"""The rendezvous store (the agent's store.py) ends within moments of SIGTERM or SIGINT, exit code 0, its last line
the stop: it holds nothing that needs an orderly teardown (the store is in memory), and an interpreter's shutdown
with torch loaded took 2.4-3.2 s under load, paid at the end of every local run and by a store pod's deletion."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.rendezvous_store import StoreProcess

pytestmark = pytest.mark.timeout(60)

AT_ONCE_SECONDS = 0.5


def test_the_store_exits_at_once_with_code_0_and_its_stop_line():
    stop = signal.SIGTERM  # SIGINT takes the same path (store.STOP); each case starts a store: seconds of imports
    store = StoreProcess()
    process = store.started[-1]
    try:
        signalled = time.monotonic()
        process.send_signal(stop)
        try:
            code = process.wait(timeout=AT_ONCE_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the store was still running {AT_ONCE_SECONDS} s after {stop.name}")
        took = time.monotonic() - signalled
        assert code == 0, f"exit code {code} after {stop.name} ({took:.2f} s)"
        assert process.stdout.read().splitlines() == ["ddpjob rendezvous store stopping"]
    finally:
        store.close()
