"""The operator's rendezvous store (launch.store_command, the agent's store.py) as a real process for tests: SIGKILLed
and started again on its port, as the operator recreates a lost store under its Service."""

from __future__ import annotations

import pytest

import signal
import socket
import subprocess
import sys

from ddpjob_operator import agent, launch


class StoreProcess:
    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.started: list[subprocess.Popen] = []
        self.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """A new store on the port; returns once it listens."""
        store = subprocess.Popen(launch.store_command(self.port, python=sys.executable, agent_dir=agent.DIRECTORY),
                                 stdout=subprocess.PIPE, text=True)
        self.started.append(store)
        assert "listening" in store.stdout.readline()

    def kill(self) -> None:
        self.started[-1].send_signal(signal.SIGKILL)
        self.started[-1].wait()

    def close(self) -> None:
        for store in self.started:
            store.kill()
            store.wait()


@pytest.fixture
def store():
    """A rendezvous store process of the test's own, ended after it (import it into a test module to use it)."""
    process = StoreProcess()
    yield process
    process.close()
