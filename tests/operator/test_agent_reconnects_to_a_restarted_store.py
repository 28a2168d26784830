"""The worker agent's store client (agent/worker.py `Generations`) against a real rendezvous store process (the
operator's store command), SIGKILLed and started again on the same port as the operator recreates a lost store
under its Service: the agent reconnects, publishes again the newest generation and node range it knows (the new
store starts empty), and a survivor waiting for the next generation sees the replacement's; one line each, no
traceback; a store that never comes back fails the call within the bound."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from ddpjob_operator import launch
from ddpjob_operator.local.pods import free_port

torch = pytest.importorskip("torch", reason="the agent's worker module imports torch")
worker = pytest.importorskip("ddpjob_operator.agent.worker")

pytestmark = pytest.mark.timeout(60)


def start_store(port: int) -> subprocess.Popen:
    store = subprocess.Popen(launch.store_command(port, python=sys.executable), stdout=subprocess.PIPE, text=True)
    assert "listening" in store.stdout.readline()
    return store


@pytest.fixture
def store():
    """(the endpoint, a function that SIGKILLs the store and starts a new one on its port)."""
    port = free_port()
    running = [start_store(port)]

    def kill_and_restart(restart: bool = True) -> None:
        running[-1].send_signal(signal.SIGKILL)
        running[-1].wait()
        if restart:
            running.append(start_store(port))

    yield f"127.0.0.1:{port}", kill_and_restart
    for process in running:
        process.kill()
        process.wait()


def store_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "the job's rendezvous store" in line]


def test_an_agent_publishes_its_generation_again_on_the_new_store(store, capfd):
    endpoint, kill_and_restart = store
    generations = worker.Generations(endpoint, "uid")
    generations.publish(3, "1:3")
    kill_and_restart()
    assert generations.newest() == (3, "1:3")
    err = capfd.readouterr().err
    assert len(store_lines(err)) == 1 and "Traceback" not in err, err
    assert f"the job's rendezvous store {endpoint} was lost (" in store_lines(err)[0]
    assert "generation 3 (1:3 nodes) published again" in store_lines(err)[0]


def test_a_survivor_waiting_for_the_next_generation_sees_the_replacements_across_a_lost_store(store, capfd):
    endpoint, kill_and_restart = store
    survivor = worker.Generations(endpoint, "uid")
    survivor.publish(3, "1:3")
    seen: list[tuple[int, str] | None] = []
    waiting = threading.Thread(target=lambda: seen.append(survivor.wait_newer(3, 30, every=0.05)))
    waiting.start()
    kill_and_restart()
    replacement = worker.Generations(endpoint, "uid")  # the operator's next pod, started against the new store
    replacement.publish(4, "1:3")
    waiting.join()
    assert seen == [(4, "1:3")]
    assert replacement.newest() == (4, "1:3"), "the survivor's republished generation 3 never wins over 4"
    assert len(store_lines(capfd.readouterr().err)) == 1


def test_a_store_that_never_comes_back_fails_the_call_within_the_bound(store, monkeypatch, capfd):
    endpoint, kill_and_restart = store
    monkeypatch.setattr(worker, "STORE_RETURN_SECONDS", 1)
    generations = worker.Generations(endpoint, "uid")
    generations.publish(0, "2")
    kill_and_restart(restart=False)
    began = time.monotonic()
    with pytest.raises(torch.distributed.DistNetworkError):
        generations.newest()
    assert time.monotonic() - began < 3
    lines = store_lines(capfd.readouterr().err)
    assert len(lines) == 1 and lines[0].endswith("and did not come back within 1 s"), lines
