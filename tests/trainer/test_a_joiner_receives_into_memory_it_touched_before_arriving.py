"""Join live (issue 36): a view's rank 0 publishes its state's layout (runtime/layout.py); a joiner reads it before it
arrives and touches memory for every tensor its own state does not hold, so the hand-over the survivors wait for
faults in no page (1 GB into fresh memory took 6 s on a loaded 2-core machine, 1 s into touched memory). The layout
is JSON from a store anything on the job's network can write: whatever it holds, a joiner prepares nothing rather
than fail or allocate without bound."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from ddp_trainer.runtime import inprocess
from ddp_trainer.runtime.layout import LAYOUT_KEY, PREPARE_FACTOR, describe, prepare, tensors_by_path

UID = "uid-layout"


@pytest.fixture(scope="module")
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield dist.TCPStore("127.0.0.1", server.port, is_master=False)


def states() -> tuple[dict, dict]:
    """(a survivor's state after a step, a joiner's as built: its model, a fresh optimizer with no state)."""
    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    survivor = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "progress": {"step": 1}}
    fresh = torch.nn.Linear(64, 32)
    joiner = {"model": fresh.state_dict(), "optimizer": torch.optim.AdamW(fresh.parameters()).state_dict()}
    return survivor, joiner


def test_the_joiner_prepares_the_tensors_its_own_state_lacks_in_the_slots_the_exchange_uses(store) -> None:
    survivor, joiner = states()
    store.set(LAYOUT_KEY.format(uid=UID), describe(survivor))
    prepared = prepare(store, UID, joiner, torch.device("cpu"))
    _, sent = inprocess.flatten(survivor)
    paths = [path for path, _ in tensors_by_path(survivor)]
    assert sorted(paths[i] for i in prepared) == sorted(("optimizer", "state", p, k) for p in (0, 1)
                                                        for k in ("step", "exp_avg", "exp_avg_sq"))
    for i, t in prepared.items():  # the slot's shape and dtype, touched (zeros), not the model's own parameters
        assert (t.shape, t.dtype) == (sent[i].shape, sent[i].dtype) and not t.any()


@pytest.mark.parametrize("layout", [
    b"not json", b'{"a": 1}', b'[["path", [1], "float32"]]', b'[[["x"], [-1], "float32"]]',
    b'[[["x"], [2], "system"]]', b'[[["x"], [2], "__class__"]]', b'[[["x"], [2]]]', b'[[[["x"]], [2], "float32"]]',
    b'[[["x"], [1, 1e3], "float32"]]', b'[[["x"], [true], "float32"]]',
])
def test_a_layout_that_is_not_one_prepares_nothing(store, layout: bytes) -> None:
    _, joiner = states()
    store.set(LAYOUT_KEY.format(uid=UID), layout)
    assert prepare(store, UID, joiner, torch.device("cpu")) == {}


def test_a_layout_asking_for_more_than_its_bound_prepares_nothing(store) -> None:
    _, joiner = states()
    own = sum(t.numel() * t.element_size() for _, t in tensors_by_path(joiner))
    asked = json.dumps([[["x"], [PREPARE_FACTOR * own // 4 + 1], "float32"]])
    store.set(LAYOUT_KEY.format(uid=UID), asked)
    assert prepare(store, UID, joiner, torch.device("cpu")) == {}


def test_no_layout_yet_prepares_nothing() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    _, joiner = states()
    assert prepare(server, UID, joiner, torch.device("cpu")) == {}
