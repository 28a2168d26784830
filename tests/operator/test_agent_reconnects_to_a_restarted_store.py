"""The worker agent's store client (agent/generations.py `Generations`) against a real rendezvous store process
(the operator's store command), SIGKILLed and started again on the same port as the operator recreates a lost store
under its Service: the agent reconnects, publishes again the newest generation and node range it knows (the new
store starts empty), and a survivor waiting for the next generation sees the replacement's; one line each, no
traceback; a store that never comes back fails the call within the bound."""

from __future__ import annotations

import threading
import time

import pytest

from tests.rendezvous_store import store  # noqa: F401 - the fixture

torch = pytest.importorskip("torch", reason="the agent's generations module imports torch")
agent_generations = pytest.importorskip("ddpjob_operator.agent.generations")

pytestmark = pytest.mark.timeout(60)


def store_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "the job's rendezvous store" in line]


def test_an_agent_publishes_its_generation_again_on_the_new_store(store, capfd):
    endpoint = store.endpoint
    generations = agent_generations.Generations(endpoint, "uid")
    generations.publish(3, "1:3")
    store.kill()
    store.start()
    assert generations.newest() == (3, "1:3")
    err = capfd.readouterr().err
    assert len(store_lines(err)) == 1 and "Traceback" not in err, err
    assert f"the job's rendezvous store {endpoint} was lost (" in store_lines(err)[0]
    assert "generation 3 (1:3 nodes) published again" in store_lines(err)[0]


def test_a_survivor_waiting_for_the_next_generation_sees_the_replacements_across_a_lost_store(store, capfd):
    endpoint = store.endpoint
    survivor = agent_generations.Generations(endpoint, "uid")
    survivor.publish(3, "1:3")
    seen: list[tuple[int, str] | None] = []
    waiting = threading.Thread(target=lambda: seen.append(survivor.wait_newer(3, 30, every=0.05)))
    waiting.start()
    store.kill()
    store.start()
    # The operator's next pod, started against the new store.
    replacement = agent_generations.Generations(endpoint, "uid")
    replacement.publish(4, "1:3")
    waiting.join()
    assert seen == [(4, "1:3")]
    assert replacement.newest() == (4, "1:3"), "the survivor's republished generation 3 never wins over 4"
    assert len(store_lines(capfd.readouterr().err)) == 1


def test_a_store_that_never_comes_back_fails_the_call_within_the_bound(store, monkeypatch, capfd):
    monkeypatch.setattr(agent_generations, "STORE_RETURN_SECONDS", 1)
    generations = agent_generations.Generations(store.endpoint, "uid")
    generations.publish(0, "2")
    store.kill()
    began = time.monotonic()
    with pytest.raises(torch.distributed.DistNetworkError):
        generations.newest()
    assert time.monotonic() - began < 3
    lines = store_lines(capfd.readouterr().err)
    assert len(lines) == 1 and lines[0].endswith("and did not come back within 1 s"), lines
