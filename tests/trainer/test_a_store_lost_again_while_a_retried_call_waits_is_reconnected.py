"""runtime/store_client.py: a call retried after a reconnect may wait on the empty new store (rank 0's joiner
watcher reads the generation key, which only an agent publishes again); a second loss of the store during that
wait is a loss like the first: the client reconnects again and the call goes on, instead of raising to the caller
(the watcher then looked again only after 10 s: bench/recovery.py --fault kill-store, every run's second kill)."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from ddp_trainer.runtime.store_client import ReconnectingStore
from tests.rendezvous_store import StoreProcess

pytestmark = pytest.mark.timeout(90)

KEY = "ddpjob/u/generation"


@pytest.fixture
def store():
    process = StoreProcess()
    yield process
    process.close()


def test_a_store_killed_again_while_the_retried_read_waits_is_met_again_and_the_read_answers(store):
    client = ReconnectingStore("127.0.0.1", store.port, timeout=datetime.timedelta(seconds=30))
    client.set(KEY, "3")
    reconnected = threading.Semaphore(0)
    client.on_reconnect(reconnected.release)
    answers, errors = [], []

    def read() -> None:  # the watcher's read, on a thread of its own
        try:
            answers.append(client.get(KEY))
        except Exception as error:  # noqa: BLE001 - the test fails below, naming it
            errors.append(error)

    store.kill()
    reader = threading.Thread(target=read)
    reader.start()
    store.start()
    assert reconnected.acquire(timeout=10), "the reader met the first new store"
    time.sleep(0.5)  # its retried read now waits for the key the new store does not hold
    assert reader.is_alive() and not errors, errors
    store.kill()
    store.start()
    assert reconnected.acquire(timeout=10), f"the reader met the second new store too: {errors}"
    dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=10)).set(KEY, "4")
    reader.join(timeout=10)
    assert errors == [] and answers == [b"4"], (errors, answers)
