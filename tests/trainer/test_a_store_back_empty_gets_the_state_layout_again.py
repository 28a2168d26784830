"""Join live (issue 36) after a lost store: rank 0 publishes the state's layout once per view (runtime/layout.py), and
the store the operator recreates comes back empty. Without the layout a joiner would receive the whole state into
fresh memory (1 GB: 6 s on a loaded 2-core machine against 1 s), until the next view. So rank 0 publishes it again
at its first step after the store came back, and only then: not at every step."""

from __future__ import annotations

import datetime
import json
import time

import pytest
import torch

from ddp_trainer.runtime.layout import LAYOUT_KEY, Publisher
from ddp_trainer.runtime.store_client import ReconnectingStore
from tests.rendezvous_store import store  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)
KEY = LAYOUT_KEY.format(uid="u")


def published(client: ReconnectingStore) -> list:
    """The tensors of the layout in the store (the publisher writes on a thread), [] while there is none."""
    deadline = time.monotonic() + 10
    while not client.check([KEY]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return json.loads(client.get(KEY))["tensors"] if client.check([KEY]) else []


def test_rank_0_publishes_the_layout_again_after_the_store_came_back_empty(store) -> None:
    client = ReconnectingStore("127.0.0.1", store.port, timeout=datetime.timedelta(seconds=10))
    publisher = Publisher(client, "u")
    states = []

    def state() -> dict:
        states.append(1)
        return {"model": {"w": torch.zeros(3, 2)}}

    publisher.stepped("view g1", state)
    assert published(client) == [[["model", "w"], [3, 2], "float32"]]
    publisher.stepped("view g1", state)  # the same view: not described again
    assert len(states) == 1

    store.kill()
    store.start()
    assert not client.check([KEY])  # the client reconnected: an empty store
    publisher.stepped("view g1", state)
    assert published(client) == [[["model", "w"], [3, 2], "float32"]] and len(states) == 2
