"""runtime/store_client.py against a real rendezvous store process (the operator's own store command): SIGKILLed
and started again on the same port, as the operator recreates a lost store under its Service, while the client
keeps working; the owner's keys published again; bounded when the store never comes back; one log line."""

from __future__ import annotations

import datetime
import logging
import threading
import time

import pytest
import torch.distributed as dist

from ddp_trainer.runtime.store_client import ReconnectingStore
from tests.rendezvous_store import store  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)


def test_a_client_keeps_working_through_a_store_killed_and_started_again(store, caplog):
    port = store.port
    client = ReconnectingStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=10))
    republished = []
    client.on_reconnect(lambda: republished.append(client.compare_set("ddpjob/u/generation", "", "3")))
    client.set("ddpjob/u/generation", "3")
    client.set("ddpjob/u/inprocess/g3/arrived/0", "1")

    counted, errors, stop = [0], [], threading.Event()

    def keep_working() -> None:  # another thread of the same process (a trainer's step loop and its regroup)
        while not stop.is_set():
            try:
                client.add("ddpjob/u/steps", 1)
                counted[0] += 1
            except Exception as error:  # noqa: BLE001 - the test fails below, naming it
                errors.append(error)
                return

    worker = threading.Thread(target=keep_working)
    worker.start()
    with caplog.at_level(logging.INFO, logger="ddp_trainer.runtime.store_client"):
        store.kill()
        store.start()  # an interpreter and torch: seconds, while the other thread waits
        listening = time.monotonic()
        assert client.get("ddpjob/u/generation") == b"3"  # published again by the owner's callback
        back = time.monotonic() - listening
        before = counted[0]
        deadline = time.monotonic() + 10
        while counted[0] < before + 5 and not errors and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        worker.join()
    assert errors == [] and counted[0] >= before + 5, (errors, counted)
    assert republished == [b"3"], "one reconnect for both threads, one republication"
    assert not client.check(["ddpjob/u/inprocess/g3/arrived/0"]), "the new store starts empty"
    lines = [r for r in caplog.records if r.name == "ddp_trainer.runtime.store_client"]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
    assert f"127.0.0.1:{port} was lost" in lines[0].getMessage() and "reconnected after" in lines[0].getMessage()
    assert back < 1.5, f"{back:.1f} s from the new store's start to the republished key (backoff at most 1 s)"


def test_a_process_group_built_on_the_client_forms_a_new_group_after_the_store_came_back(store):
    """Gloo keeps a formed group's store: a later new_group (the in-process exchange's) goes through it."""
    port = store.port
    client = ReconnectingStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=10))
    dist.init_process_group("gloo", store=dist.PrefixStore("g0/", client), rank=0, world_size=1)
    try:
        store.kill()
        store.start()
        group = dist.new_group([0])
        assert dist.get_world_size(group) == 1
    finally:
        dist.destroy_process_group()


def test_a_store_that_never_comes_back_fails_the_call_within_the_bound(store, caplog):
    port = store.port
    client = ReconnectingStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=10), reconnect_within_s=1.0)
    client.set("k", "v")
    store.kill()
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="ddp_trainer.runtime.store_client"), \
            pytest.raises(dist.DistNetworkError):
        client.get("k")
    assert time.monotonic() - began < 3
    lines = [r.getMessage() for r in caplog.records if r.name == "ddp_trainer.runtime.store_client"]
    assert len(lines) == 1 and lines[0].startswith(f"the job's rendezvous store 127.0.0.1:{port} was lost (") \
        and lines[0].endswith(") and did not come back within 1 s"), lines


def test_a_failing_republication_is_named_in_the_one_line_and_the_call_goes_on(store, caplog):
    port = store.port
    client = ReconnectingStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=10))

    def broken() -> None:
        raise ValueError("node range 'x' is not MIN:MAX")

    client.on_reconnect(broken)
    store.kill()
    store.start()
    with caplog.at_level(logging.INFO, logger="ddp_trainer.runtime.store_client"):
        client.set("k", "v")
    assert client.get("k") == b"v"
    lines = [r.getMessage() for r in caplog.records if r.name == "ddp_trainer.runtime.store_client"]
    assert len(lines) == 1 and "could not publish again: ValueError: node range 'x' is not MIN:MAX" in lines[0], lines
