"""The option of issue 36 that trades the same math for speed while short (`--while-short own-batch`,
`View.with_while_short(OWN_BATCH)`): each member trains its own seat's micro-batches only, in its seat's own
order, as many steps as the whole world makes, its loss unscaled; a whole view trains the same under either
choice, and the default is the full batch."""

from __future__ import annotations

import subprocess

import pytest

from ddp_trainer.config import ConfigError, DataConfig, parse_config
from ddp_trainer.runtime import FULL_BATCH, OWN_BATCH, View
from ddp_trainer.runtime.shards import Shards

from trainer_harness import PY, base_env

VIEWS = [(3, (0, 1)), (3, (1, 2)), (3, (0,)), (8, (1, 4, 6)), (6, (0, 2, 3, 5))]


def steps_of(view: View, seat: int, consumed: int = 0) -> list[list[list[int]]]:
    return Shards(101, 7, True, True, 3, 2, view.world, view.coverage(seat)).steps(1, consumed)


@pytest.mark.parametrize("world,members", VIEWS)
def test_a_short_member_trains_its_own_seat_alone_with_its_loss_unscaled(world, members) -> None:
    view = View(4, 1, members, world).with_while_short(OWN_BATCH)
    assert [view.coverage(seat) for seat in members] == [(seat,) for seat in members]
    assert view.loss_scale == 1.0 and view.seats_trained == len(members)
    full = View(4, 1, members, world)
    assert full.while_short == FULL_BATCH and full.seats_trained == world  # the default: the same math
    assert full.loss_scale == pytest.approx(len(members) / world)
    # DDP's mean over the members of unscaled per-seat gradients is the mean over the members' seats.
    grads = {seat: float(seat * seat + 1) for seat in range(world)}
    ddp_mean = sum(view.loss_scale * sum(grads[s] for s in view.coverage(m)) for m in members) / view.size
    assert ddp_mean == pytest.approx(sum(grads[m] for m in members) / len(members))


@pytest.mark.parametrize("consumed", [0, 18, 36])  # a regroup happens at a step boundary: whole steps consumed
@pytest.mark.parametrize("world,members", VIEWS)
def test_each_seat_keeps_its_order_and_the_epoch_its_steps_and_no_missing_seats_sample_is_trained(
        world, members, consumed) -> None:
    whole, short = View.whole(4, world), View(4, 1, members, world).with_while_short(OWN_BATCH)
    for seat in members:  # the undisturbed run's micro-batches of this seat, step for step
        assert steps_of(short, seat, consumed) == steps_of(whole, seat, consumed)
    trained = {i for seat in members for step in steps_of(short, seat, consumed) for micro in step for i in micro}
    missed = {i for seat in short.missing for step in steps_of(whole, seat, consumed) for micro in step for i in micro}
    assert trained and missed and not trained & missed


def test_after_a_loss_and_a_join_each_seat_trains_its_undisturbed_steps_but_the_short_ones_of_the_lost_seat() -> None:
    """Seat 1 of 3 lost after step 2, back (joined) after step 5: each view builds its steps from the epoch's
    position (whole steps x the world's samples, trained or not), as the trainer does after every regroup."""
    world, per_step = 3, 3 * 2 * 3  # seats x batch x grad_accum samples: one step's position
    views = [(0, View.whole(2, world)), (2, View(2, 1, (0, 2), world)), (5, View.whole(2, world, round=2))]
    trained: dict[int, list[list[list[int]]]] = {seat: [] for seat in range(world)}
    for (start, view), (end, _) in zip(views, [*views[1:], (6, None)]):  # the epoch's 6 steps
        view = view.with_while_short(OWN_BATCH)
        for seat in view.members:
            trained[seat] += steps_of(view, seat, start * per_step)[:end - start]
    undisturbed = {seat: steps_of(View.whole(2, world), seat) for seat in range(world)}
    assert [len(steps) for steps in undisturbed.values()] == [6, 6, 6]
    assert trained[0] == undisturbed[0] and trained[2] == undisturbed[2]
    assert trained[1] == undisturbed[1][:2] + undisturbed[1][5:]  # its steps 3-5 trained by nobody


def test_a_whole_view_trains_the_same_under_either_choice() -> None:
    for choice in (FULL_BATCH, OWN_BATCH):
        view = View.whole(2, 4, round=3).with_while_short(choice)
        assert [view.coverage(seat) for seat in range(4)] == [(0,), (1,), (2,), (3,)]
        assert view.loss_scale == 1.0 and view.seats_trained == 4


@pytest.mark.parametrize("choice", ["own_batch", "OWN-BATCH", "", None, 1])
def test_a_choice_that_is_not_one_is_refused_naming_the_choices(choice) -> None:
    with pytest.raises(ValueError, match="while_short must be one of full-batch, own-batch, got"):
        View.whole(0, 2).with_while_short(choice)
    with pytest.raises(ConfigError, match="data.while_short must be one of full-batch, own-batch, got"):
        DataConfig(while_short=choice)


def test_the_trainer_flag_defaults_to_the_full_batch_and_takes_own_batch() -> None:
    assert parse_config([]).data.while_short == FULL_BATCH
    assert parse_config(["--while-short", "own-batch"]).data.while_short == OWN_BATCH


def test_the_trainer_names_the_flag_and_its_choices_for_a_bad_value_without_a_traceback(tmp_path) -> None:
    done = subprocess.run([PY, "-m", "ddp_trainer", "--while-short", "fast"], env=base_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "argument --while-short: invalid choice: 'fast' (choose from" in done.stderr, done.stderr
    assert "full-batch" in done.stderr and "own-batch" in done.stderr and "Traceback" not in done.stderr
