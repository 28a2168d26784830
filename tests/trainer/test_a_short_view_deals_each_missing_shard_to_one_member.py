"""A short view trains every seat's shard exactly once, spread evenly, and scales the loss to the full world's."""

from __future__ import annotations

import itertools

import pytest

from ddp_trainer.runtime.views import View


@pytest.mark.parametrize("world,members", [
    (3, (0, 1)), (3, (1, 2)), (3, (0,)), (4, (0, 1, 2, 3)), (8, (1, 4, 6)), (5, (4,)), (6, (0, 2, 3, 5)),
])
def test_every_seat_is_trained_once_and_no_member_trains_two_shards_more_than_another(world, members) -> None:
    view = View(7, 2, members, world)
    covered = [view.coverage(seat) for seat in members]
    assert sorted(itertools.chain.from_iterable(covered)) == list(range(world))
    assert all(c[0] == seat for c, seat in zip(covered, members))  # its own shard first
    assert max(map(len, covered)) - min(map(len, covered)) <= 1
    assert [view.rank_of(s) for s in members] == list(range(len(members)))
    assert view.short == (len(members) < world)
    assert view.loss_scale == pytest.approx(len(members) / world)


def test_the_mean_over_members_of_scaled_sums_is_the_mean_over_seats() -> None:
    world, members = 5, (0, 3)
    view = View(0, 1, members, world)
    grads = {seat: float(seat * seat + 1) for seat in range(world)}  # one number per seat's shard
    ddp_mean = sum(view.loss_scale * sum(grads[s] for s in view.coverage(m)) for m in members) / view.size
    assert ddp_mean == pytest.approx(sum(grads.values()) / world)


@pytest.mark.parametrize("world,members,why", [
    (3, (), "distinct seats"), (3, (1, 0), "ascending"), (3, (1, 1), "distinct"), (3, (0, 3), "seats 0..2"),
    (0, (0,), "at least one seat"), (3, (-1, 0), "seats 0..2"),
])
def test_a_view_that_cannot_be_is_refused(world, members, why) -> None:
    with pytest.raises(ValueError, match=why):
        View(0, 0, members, world)


def test_a_seat_outside_the_view_has_no_rank() -> None:
    with pytest.raises(ValueError, match="seat 2 is not a member"):
        View(1, 1, (0, 1), 3).rank_of(2)
    assert View.whole(4, 3).describe() == "3 of 3 ranks"
    assert View(4, 1, (0, 2), 3).describe() == "2 of 3 ranks (missing 1)"
