"""The in-process view protocol in the job's store (runtime/membership.py, issue 36), against a real TCPStore: who
closes a view, who is placed where, when survivors wait, and what rank 0 sees at a step boundary. No process
group: each `Membership` is one trainer's side."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ddp_trainer.runtime.membership import (GENERATION_KEY, NNODES_KEY, SETTLE_S, CannotRecover, JobFinished,
                                            Membership, node_range)
from ddp_trainer.runtime.progress import recovery_field
from ddp_trainer.runtime.views import View

UID = "uid-views"


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield dist.TCPStore("127.0.0.1", server.port, is_master=False)


def publish(store, generation: int, nnodes: str) -> None:
    store.set(NNODES_KEY.format(uid=UID, generation=generation), nnodes)
    store.set(GENERATION_KEY.format(uid=UID), str(generation))


def trainer(store, seat: int) -> Membership:
    return Membership(store, UID, 1, lambda: seat)


@pytest.mark.parametrize("text, expected", [("2:3", (2, 3)), ("3", (3, 3)), ("1:1", (1, 1))])
def test_a_node_range_gives_the_fewest_and_the_most(text, expected) -> None:
    assert node_range(text) == expected


@pytest.mark.parametrize("text", ["", "a:b", "3:2", "0:2", "2:", ":"])
def test_a_node_range_that_is_none_is_refused_naming_it(text) -> None:
    with pytest.raises(ValueError, match=f"node range {text!r} is not MIN:MAX"):
        node_range(text)


def test_the_first_view_forms_once_every_seat_arrived_and_places_them_all(store) -> None:
    publish(store, 1, "2:2")
    first, second = trainer(store, 0), trainer(store, 1)
    with pytest.raises(CannotRecover, match="no place in generation 1 within 0.1 s"):
        first.wait_placed(1, lambda: False, timeout_s=0.1)  # seat 1 has not arrived
    assert second.wait_placed(1, lambda: False) == View.whole(1, 2)  # the last to arrive closes it
    assert first.view(store.get(first.key(1, "placed/0")).decode()) == View.whole(1, 2)  # and places everyone


def test_a_trainer_without_a_seat_in_the_newest_generation_is_told_so(store) -> None:
    publish(store, 1, "2:2")
    with pytest.raises(CannotRecover, match="rank 2 has no place in generation 1 of 2 ranks"):
        trainer(store, 2).wait_placed(1, lambda: False)


def test_survivors_close_the_successor_without_the_lost_rank_and_the_loser_reads_the_winners(store) -> None:
    publish(store, 1, "1:3")
    failed = View.whole(1, 3)
    below = []
    survivors = [trainer(store, seat) for seat in (0, 1)]
    survivors[0].store.set(survivors[0].key(failed, "left/1"), "x")  # seat 1 arrived too
    closed = survivors[0].successor_after_failure(failed, lambda: False, 5, below.append, since=-SETTLE_S)
    assert (closed.generation, closed.members, closed.world) == (1, (0, 1), 3) and closed.round > 0
    assert survivors[0].kind(closed) == "Shrink"
    assert survivors[1].successor_after_failure(failed, lambda: False, 5, below.append) == closed
    assert below == []


def test_below_the_minimum_a_survivor_waits_and_a_joiner_lets_it_close(store) -> None:
    publish(store, 1, "2:3")
    failed, survivor, waiting = View.whole(1, 3), trainer(store, 0), []

    def stopped() -> bool:  # the joiner arrives while the survivor waits
        if waiting and not store.check([survivor.key(2, "arrived/2")]):
            publish(store, 2, "2:3")
            trainer(store, 2).arrive(2)
        return False

    closed = survivor.successor_after_failure(failed, stopped, 10, waiting.append, since=-SETTLE_S)
    assert (closed.generation, closed.members) == (2, (0, 2)) and waiting == [1, None]
    assert survivor.kind(closed) == "Shrink"
    assert trainer(store, 2).view(store.get(survivor.key(2, "placed/2")).decode()) == closed


def test_below_the_minimum_the_wait_ends_at_the_timeout(store) -> None:
    publish(store, 1, "2:3")
    with pytest.raises(CannotRecover, match="fewer ranks than the minimum arrived within 0.2 s"):
        trainer(store, 0).successor_after_failure(View.whole(1, 3), lambda: False, 0.2, lambda more: None,
                                                  since=-SETTLE_S)


def test_rank_0_sees_a_joiner_at_a_step_boundary_and_closes_the_view_with_it(store) -> None:
    publish(store, 1, "1:3")
    rank_0 = trainer(store, 0)
    rank_0.start_boundary_checks()
    short = rank_0.close(View.whole(1, 3), 1, [0, 1], 3)
    assert rank_0.change_due(short) is None and rank_0.change_due(short) is None  # nothing waits
    publish(store, 2, "1:3")
    trainer(store, 2).arrive(2)
    change = rank_0.change_due(short)
    assert (change.successor.generation, change.successor.members, change.joiners) == (2, (0, 1, 2), (2,))
    assert rank_0.kind(change.successor) == "Join" and rank_0.kind(short) is None
    assert rank_0.successor_of(short) == change.successor
    assert rank_0.change_due(change.successor) is None  # placed: no joiner waits any more


def test_a_scale_down_drops_the_seats_past_the_new_world(store) -> None:
    publish(store, 1, "1:3")
    rank_0 = trainer(store, 0)
    rank_0.start_boundary_checks()
    publish(store, 2, "1:2")
    change = rank_0.change_due(View.whole(1, 3))
    assert (change.successor.generation, change.successor.members, change.successor.world) == (2, (0, 1), 2)


def test_a_survivor_left_out_arrives_anew_and_forgets_its_old_place(store) -> None:
    publish(store, 1, "1:2")
    late = trainer(store, 1)
    late.arrive(1)
    trainer(store, 0).arrive(1)
    first = late.wait_placed(1, lambda: False)
    short = late.close(first, 1, [0], 2)
    late.arrive(1)  # its place in the first view is not a place in the next
    assert not store.check([late.key(1, "placed/1")])
    assert late.joiners(1, 2, short.members) == (1,)


@pytest.mark.parametrize("kind", ["Shrink", "Join", None])
def test_the_recovery_timeline_names_its_kind_only_when_it_has_one(kind) -> None:
    field = recovery_field("InProcess", resumed_step=3, rendezvous_time=1.0, kind=kind)
    assert field.get("kind") == kind and ("kind" in field) == (kind is not None)


def test_a_recovery_kind_that_is_none_is_refused() -> None:
    with pytest.raises(ValueError, match="recovery kind 'Grow' is not one of Shrink, Join"):
        recovery_field("InProcess", resumed_step=3, rendezvous_time=1.0, kind="Grow")


@pytest.mark.parametrize("name, members", [("1:x", None), ("1:5", b"not json"), ("1:5", b'{"members": [2, 1]}'),
                                           ("1:5", b'{"members": [0, 7], "world": 2}'), ("1:5", b"[]")])
def test_a_view_in_the_store_that_is_none_is_refused_naming_it(store, name, members) -> None:
    reader = trainer(store, 0)
    if members is not None:
        store.set(reader.key(1, "r5/members"), members)
    with pytest.raises(CannotRecover, match=f"view '{name}' in the job's store is not a generation:round"):
        reader.view(name)


def test_a_joiner_still_waiting_when_the_job_finished_exits_0_instead_of_holding_it(store) -> None:
    """A replacement whose trainer was built after the survivors trained the last step: no view will take it in,
    and a job whose success waits for every worker must not wait for it (it would until its join timeout)."""
    publish(store, 1, "1:3")
    joiner = trainer(store, 2)
    with pytest.raises(CannotRecover, match="no place"):
        joiner.wait_placed(1, lambda: False, timeout_s=0.1)
    trainer(store, 0).finish()  # rank 0 of the survivors, at the job's successful end (Job.result)
    with pytest.raises(JobFinished) as finished:
        joiner.wait_placed(1, lambda: False, timeout_s=30)
    assert finished.value.code == 0
