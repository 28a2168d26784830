"""A rendezvous store told to stop (SIGTERM) while it still imports torch (seconds under load) exits at once, code 0,
its one line the stop: it was held until it served, so a local run stopped early (a Ctrl-C at its start, a job that
failed at once) waited up to STORE_STOP_SECONDS for it, and a store pod deleted at its start took as long."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpjob_operator import agent, launch

pytestmark = pytest.mark.timeout(60)

AT_ONCE_SECONDS = 1.0


def takes_over(pid: int, sig: int) -> bool:
    """Whether a thread of the process blocks `sig` (the store's program handles it now, not the interpreter's
    default). Any thread: one in sigwait shows the signals it waits for as unblocked."""
    bit = 1 << (sig - 1)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        blocked = next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:"))
        if int(blocked, 16) & bit:
            return True
    return False


def test_a_store_stopped_before_it_listens_exits_at_once_with_code_0():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = subprocess.Popen(launch.store_command(port, python=sys.executable, agent_dir=agent.DIRECTORY),
                             stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not takes_over(store.pid, signal.SIGTERM):
            assert time.monotonic() < deadline and store.poll() is None, "the store never took over SIGTERM"
            time.sleep(0.005)
        signalled = time.monotonic()
        store.send_signal(signal.SIGTERM)
        try:
            code = store.wait(timeout=AT_ONCE_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the store, stopped while starting, was still running {AT_ONCE_SECONDS} s after SIGTERM")
        assert code == 0, f"exit code {code} ({time.monotonic() - signalled:.2f} s after SIGTERM)"
        assert store.stdout.read().splitlines() == ["ddpjob rendezvous store stopping"]
    finally:
        store.kill()
        store.wait()
