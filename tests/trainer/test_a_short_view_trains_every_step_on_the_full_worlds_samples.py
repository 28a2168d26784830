"""A short view's members, together, train each step on exactly the samples the full world trains in that step
(the missing seats' micro-batches included, from those seats' own shards), from any point of the epoch."""

from __future__ import annotations

import pytest

from ddp_trainer.runtime.views import View
from ddp_trainer.runtime.shards import Shards


def step_samples(view: View, epoch: int, consumed: int, *, length: int = 101, batch: int = 3, accum: int = 2,
                 drop_last: bool = True) -> list[list[int]]:
    """Per optimizer step: every sample the view's members train in it, sorted."""
    per_member = [Shards(length, 7, True, drop_last, batch, accum, view.world, view.coverage(seat))
                  .steps(epoch, consumed) for seat in view.members]
    assert len({len(steps) for steps in per_member}) == 1  # every member makes as many optimizer steps
    return [sorted(i for steps in per_member for micro in steps[k] for i in micro) for k in range(len(per_member[0]))]


@pytest.mark.parametrize("members", [(0, 1), (1, 2), (0, 2), (2,), (0,)])
@pytest.mark.parametrize("consumed", [0, 18, 36])  # a regroup happens at a step boundary: whole steps consumed
@pytest.mark.parametrize("drop_last", [True, False])
def test_each_step_trains_the_same_samples_as_the_whole_world(members, consumed, drop_last) -> None:
    whole, short = View.whole(3, 3), View(3, 1, members, 3)
    assert step_samples(short, 1, consumed, drop_last=drop_last) == \
        step_samples(whole, 1, consumed, drop_last=drop_last)


def test_a_member_trains_its_own_seats_micro_batches_first_then_the_missing_seats() -> None:
    view = View(0, 1, (0, 2), 3)
    own = Shards(60, 1, False, True, 2, 2, 3, (0,)).steps(0, 0)
    covering = Shards(60, 1, False, True, 2, 2, 3, view.coverage(0)).steps(0, 0)
    missing = Shards(60, 1, False, True, 2, 2, 3, (1,)).steps(0, 0)
    assert view.coverage(0) == (0, 1)
    assert all(c == o + m for c, o, m in zip(covering, own, missing))
    assert own[0] == [[0, 3], [6, 9]]  # seat 0's shard of the unshuffled order, two micro-batches of two
