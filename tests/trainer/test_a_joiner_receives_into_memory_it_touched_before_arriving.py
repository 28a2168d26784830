"""Join live (issue 36): a view's rank 0 publishes its state's layout (runtime/layout.py); a joiner reads it before it
arrives and touches memory for every tensor its own state does not hold, so the hand-over the survivors wait for
faults in no page (1 GB into fresh memory took 6 s on a loaded 2-core machine, 1 s into touched memory). The layout
is JSON from a store anything on the job's network can write: whatever it holds, a joiner prepares nothing rather
than fail or allocate without bound.

The joiner's first step touches memory beyond the state (gradients, DDP's buckets, the optimizer's temporaries): on a
CPU it holds a touched scratch block up to the publisher's peak resident memory through the hand-over, within the
same bound, and a peak that is no size prepares no scratch."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from ddp_trainer.runtime import inprocess
from ddp_trainer.runtime.layout import (LAYOUT_KEY, PREPARE_FACTOR, SCRATCH_MIN_BYTES, describe, prepare,
                                        resident_bytes, tensors_by_path)

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
    prepared = prepare(store, UID, joiner, torch.device("cpu")).slots
    _, sent = inprocess.flatten(survivor)
    paths = [path for path, _ in tensors_by_path(survivor)]
    assert sorted(paths[i] for i in prepared) == sorted(("optimizer", "state", p, k) for p in (0, 1)
                                                        for k in ("step", "exp_avg", "exp_avg_sq"))
    for i, t in prepared.items():  # the slot's shape and dtype, touched (zeros), not the model's own parameters
        assert (t.shape, t.dtype) == (sent[i].shape, sent[i].dtype) and not t.any()


def tensors(entries: str) -> bytes:
    return b'{"tensors": %s, "peak_resident_bytes": 1099511627776}' % entries.encode()


@pytest.mark.parametrize("layout", [
    b"not json", b'{"a": 1}', b'[[["x"], [2], "float32"]]', b'{"tensors": {"x": 1}}', tensors('[["path", [1], "float32"]]'),
    tensors('[[["x"], [-1], "float32"]]'), tensors('[[["x"], [2], "system"]]'), tensors('[[["x"], [2], "__class__"]]'),
    tensors('[[["x"], [2]]]'), tensors('[[[["x"]], [2], "float32"]]'), tensors('[[["x"], [1, 1e3], "float32"]]'),
    tensors('[[["x"], [true], "float32"]]'),
])
def test_a_layout_that_is_not_one_prepares_nothing(store, layout: bytes) -> None:
    _, joiner = states()
    store.set(LAYOUT_KEY.format(uid=UID), layout)
    prepared = prepare(store, UID, joiner, torch.device("cpu"))
    assert prepared.slots == {} and prepared.scratch is None


def test_a_layout_asking_for_more_than_its_bound_prepares_nothing(store) -> None:
    _, joiner = states()
    own = sum(t.numel() * t.element_size() for _, t in tensors_by_path(joiner))
    asked = json.dumps({"tensors": [[["x"], [PREPARE_FACTOR * own // 4 + 1], "float32"]], "peak_resident_bytes": 0})
    store.set(LAYOUT_KEY.format(uid=UID), asked)
    prepared = prepare(store, UID, joiner, torch.device("cpu"))
    assert prepared.slots == {} and prepared.scratch is None


def test_no_layout_yet_prepares_nothing() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    _, joiner = states()
    prepared = prepare(server, UID, joiner, torch.device("cpu"))
    assert prepared.slots == {} and prepared.scratch is None


MIB = 2**20
LARGE = {"model": {"w": torch.zeros(16 * MIB)}}  # 64 MiB of its own state: a bound of 256 MiB


@pytest.mark.skipif(resident_bytes() is None, reason="resident memory is read from /proc (Linux)")
def test_the_joiner_holds_touched_scratch_up_to_the_publishers_peak_and_releases_it(store) -> None:
    store.set(LAYOUT_KEY.format(uid=UID), describe(LARGE, resident_bytes() + 96 * MIB))
    before = resident_bytes()
    prepared = prepare(store, UID, LARGE, torch.device("cpu"))
    assert prepared.slots == {}  # its own state holds every tensor already
    assert prepared.scratch is not None and SCRATCH_MIN_BYTES <= prepared.scratch.numel() <= 96 * MIB
    assert resident_bytes() - before >= 0.9 * prepared.scratch.numel()  # touched, not only reserved
    prepared.release()
    assert prepared.scratch is None and prepared.slots == {}


@pytest.mark.parametrize("peak", ['-1', 'true', '"1e12"', '1e12', '[1]', 'null', '0'])
def test_a_peak_that_is_no_size_or_below_this_process_prepares_no_scratch(store, peak: str) -> None:
    store.set(LAYOUT_KEY.format(uid=UID), b'{"tensors": [], "peak_resident_bytes": %s}' % peak.encode())
    assert prepare(store, UID, LARGE, torch.device("cpu")).scratch is None


def test_the_scratch_stays_within_the_bound_with_the_slots(store) -> None:
    store.set(LAYOUT_KEY.format(uid=UID), json.dumps({"tensors": [[["model", "w"], [16 * MIB], "float32"],
                                                                  [["other"], [40 * MIB], "float32"]],
                                                      "peak_resident_bytes": 2**50}))
    prepared = prepare(store, UID, LARGE, torch.device("cpu"))
    own = 64 * MIB
    assert set(prepared.slots) == {1} and prepared.scratch is not None
    assert 160 * MIB + prepared.scratch.numel() <= PREPARE_FACTOR * own


def test_no_scratch_off_the_cpu(store) -> None:
    """On a GPU a step's transients are the device's (its caching allocator), not host memory."""
    store.set(LAYOUT_KEY.format(uid=UID), describe(LARGE, 2**40))
    assert prepare(store, UID, {"model": {"w": torch.zeros(16 * MIB, device="meta")}}, torch.device("meta")).scratch \
        is None
