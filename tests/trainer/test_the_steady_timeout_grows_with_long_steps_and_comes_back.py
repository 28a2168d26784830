"""The steady collective timeout (5 s by default, so a silent peer is caught within 10 s) never judges a model
whose steps take seconds: it is at least STEADY_STEP_FACTOR x the longest recent step, and comes back down."""

from __future__ import annotations

import pytest

from ddp_trainer.runtime.distributed import RECENT_STEPS, STEADY_STEP_FACTOR, CollectiveTimeout


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_steps(timeouts: CollectiveTimeout, clock: Clock, seconds: float, count: int) -> None:
    for _ in range(count):
        clock.now += seconds
        timeouts.step()


def test_short_steps_keep_the_default_and_long_ones_raise_it_at_once() -> None:
    clock = Clock()
    timeouts = CollectiveTimeout(1800.0, 5.0, after_steps=3, clock=clock)
    run_steps(timeouts, clock, 0.05, 3)
    assert (timeouts.steady, timeouts.current_s) == (True, 5.0)
    run_steps(timeouts, clock, 0.05, 10)
    assert timeouts.current_s == 5.0
    run_steps(timeouts, clock, 4.0, 1)  # one step of 4 s: the next collective may wait 12 s
    assert timeouts.current_s == pytest.approx(STEADY_STEP_FACTOR * 4.0)
    run_steps(timeouts, clock, 0.05, RECENT_STEPS)  # once it is no longer recent: back to the default
    assert timeouts.current_s == 5.0


def test_saves_and_start_up_do_not_count_as_steps() -> None:
    clock = Clock()
    timeouts = CollectiveTimeout(1800.0, 5.0, after_steps=2, clock=clock)
    run_steps(timeouts, clock, 60.0, 2)  # start-up: compilation, the first batches
    assert timeouts.current_s == 5.0
    timeouts.relax()
    assert (timeouts.steady, timeouts.current_s) == (False, 1800.0)
    run_steps(timeouts, clock, 90.0, 2)  # a checkpoint save the others waited for
    assert timeouts.current_s == 5.0


def test_a_regroup_of_warm_processes_is_steady_again_after_fewer_steps() -> None:
    clock = Clock()
    timeouts = CollectiveTimeout(1800.0, 5.0, after_steps=10, clock=clock)
    run_steps(timeouts, clock, 0.05, 10)
    timeouts.restart(after_steps=2)
    assert timeouts.current_s == 1800.0
    run_steps(timeouts, clock, 0.05, 2)
    assert (timeouts.steady, timeouts.current_s) == (True, 5.0)


def test_off_means_the_long_timeout_throughout() -> None:
    clock = Clock()
    timeouts = CollectiveTimeout(1800.0, 0.0, after_steps=1, clock=clock)
    run_steps(timeouts, clock, 10.0, 20)
    assert (timeouts.steady, timeouts.current_s) == (False, 1800.0)
