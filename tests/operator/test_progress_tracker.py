"""progress/tracker.py: bounded publishing, the live stall clock, generations and rank 0's values."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ddpjob_operator import progress

T0 = datetime(2026, 11, 22, 12, tzinfo=timezone.utc)


def test_tracker_publishes_at_a_bounded_rate_and_keeps_the_live_clock():
    tracker = progress.ProgressTracker(write_seconds=5)
    key = ("ns", "job")
    tracker.record("uid", key, 0, 0, progress.Report(step=10, total_steps=100, rank=0), T0)
    first = tracker.observation("uid", T0)
    assert first.step == 10 and first.generation == 0 and tracker.due_in("uid", T0) is None
    tracker.record("uid", key, 0, 0, progress.Report(step=20, total_steps=100, rank=0), T0 + timedelta(seconds=1))
    assert tracker.due_in("uid", T0 + timedelta(seconds=1)) == pytest.approx(4)
    held = tracker.observation("uid", T0 + timedelta(seconds=1))
    assert held.step == 10 and held.last_advance == T0 + timedelta(seconds=1)  # display held back, clock live
    later = tracker.observation("uid", T0 + timedelta(seconds=5))
    assert later.step == 20 and later.steps_per_second == pytest.approx(10)


def test_tracker_generations_rank_zero_and_heartbeats():
    tracker = progress.ProgressTracker(write_seconds=0.001)
    key = ("ns", "job")
    tracker.record("uid", key, 1, 0, progress.Report(step=30, rank=1, loss=9.0), T0)
    tracker.record("uid", key, 0, 0, progress.Report(step=30, rank=0, loss=0.5), T0)
    tracker.record("uid", key, 1, 0, progress.Report(step=35, rank=1, loss=9.0), T0 + timedelta(seconds=1))
    seen = tracker.observation("uid", T0 + timedelta(seconds=2))
    assert seen.loss == 0.5  # rank 0's values are the job's
    # A heartbeat repeats the step: it keeps the rank "seen" but does not move the clock.
    tracker.record("uid", key, 0, 0, progress.Report(step=30, rank=0), T0 + timedelta(seconds=9))
    seen = tracker.observation("uid", T0 + timedelta(seconds=9))
    assert seen.last_advance == T0 + timedelta(seconds=1)
    assert {r.index: r.last_seen for r in seen.ranks}[0] == T0 + timedelta(seconds=9)
    # A new generation resets the clock; the old generation's stragglers never move it again.
    tracker.record("uid", key, 0, 1, progress.Report(step=20, rank=0), T0 + timedelta(seconds=20))
    tracker.record("uid", key, 1, 0, progress.Report(step=99, rank=1), T0 + timedelta(seconds=21))
    seen = tracker.observation("uid", T0 + timedelta(seconds=22))
    assert (seen.generation, seen.step, seen.last_advance) == (1, 20, T0 + timedelta(seconds=20))
    tracker.forget("uid")
    assert tracker.observation("uid", T0) is None


def test_rank_zeros_recovery_timeline_reaches_the_decision_layer_per_generation():
    """The newest recovery report of each generation, from the pod holding rank 0's claim only, with the trainer's
    times as datetimes, live (not held back with the rate-limited values) and bounded to recent generations."""
    tracker = progress.ProgressTracker(write_seconds=60)
    key = ("ns", "job")
    rendezvous = T0.timestamp() + 3
    restart = progress.Recovery(path="Restart", resumed_step=100, rendezvous_time=rendezvous, reason="no peer")
    tracker.record("uid", key, 0, 1, progress.Report(step=100, rank=0, recovery=restart), T0)
    # Another pod claiming rank 0 in its body, with a made-up timeline, is not the job's rank 0.
    forged = progress.Recovery(path="InProcess", resumed_step=0, rendezvous_time=rendezvous - 100)
    tracker.record("uid", key, 1, 1, progress.Report(step=100, rank=0, recovery=forged), T0)
    seen = tracker.observation("uid", T0)
    assert [(r.generation, r.path, r.reason, r.resumed_step) for r in seen.recoveries] == [(1, "Restart", "no peer", 100)]
    assert seen.recoveries[0].rendezvous_time == T0 + timedelta(seconds=3) and seen.recoveries[0].first_step_time is None
    stepped = progress.Recovery(path="Restart", resumed_step=100, rendezvous_time=rendezvous,
                                first_step_time=rendezvous + 2, reason="no peer")
    tracker.record("uid", key, 0, 1, progress.Report(step=101, rank=0, recovery=stepped), T0 + timedelta(seconds=5))
    seen = tracker.observation("uid", T0 + timedelta(seconds=5))  # within write_seconds: values held, not this
    assert seen.step == 100 and seen.recoveries[0].first_step_time == T0 + timedelta(seconds=5)
    for generation in range(2, 2 + progress.tracker.RECOVERY_GENERATIONS):
        tracker.record("uid", key, 0, generation, progress.Report(step=100, rank=0, recovery=restart), T0)
    seen = tracker.observation("uid", T0 + timedelta(seconds=6))
    generations = [r.generation for r in seen.recoveries]
    assert generations == list(range(2, 2 + progress.tracker.RECOVERY_GENERATIONS))  # generation 1 aged out


def test_a_job_level_report_is_the_jobs_values_without_ranks_and_step_times_come_apart():
    """What the local runner feeds it (progress.json, written by global rank 0 only): no pod, so no rank is
    tracked and no rank 0 claim is needed; every worker's step time arrives on its own."""
    tracker = progress.ProgressTracker(write_seconds=0)
    key = ("local", "job")
    tracker.record("uid", key, None, 0, progress.Report(step=10, loss=0.5, rank=None), T0)
    tracker.step_time("uid", 1, 0, 10, 0.25, T0)
    tracker.record("uid", key, None, 0, progress.Report(step=12, loss=0.4), T0 + timedelta(seconds=2))
    seen = tracker.observation("uid", T0 + timedelta(seconds=2))
    assert (seen.step, seen.loss, seen.ranks, seen.steps_per_second) == (12, 0.4, (), 1.0)
    assert [(r.index, [s.seconds for s in r.samples]) for r in seen.timings] == [(1, [0.25])]
    # A step time of a generation left behind does not republish the job's values.
    tracker.record("uid", key, None, 1, progress.Report(step=3), T0 + timedelta(seconds=3))
    tracker.observation("uid", T0 + timedelta(seconds=3))
    tracker.step_time("uid", 0, 0, 11, 0.1, T0 + timedelta(seconds=4))
    assert tracker.due_in("uid", T0 + timedelta(seconds=4)) is None
