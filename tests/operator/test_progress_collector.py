"""progress/collector.py: the tracker's Prometheus gauges, per job and per rank, read at each scrape."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from prometheus_client import CollectorRegistry

from ddpjob_operator import progress

T0 = datetime(2026, 11, 22, 12, tzinfo=timezone.utc)


def test_gauges_follow_the_tracker_and_forget_a_deleted_job():
    tracker = progress.ProgressTracker(write_seconds=0.0)
    now = [T0]
    registry = CollectorRegistry()
    registry.register(progress.TrackerCollector(tracker, lambda: now[0]))
    job = {"namespace": "ns", "ddpjob": "job"}
    assert registry.get_sample_value("ddpjob_job_progress_step", job) is None  # nothing reported yet
    tracker.record("uid", ("ns", "job"), 0, 0, progress.Report(step=40, rank=0, samples_per_second=800.0,
                                                               step_seconds=0.25), T0)
    tracker.record("uid", ("ns", "job"), 1, 0, progress.Report(step=40, rank=1, step_seconds=0.5), T0)
    now[0] = T0 + timedelta(seconds=7)
    assert registry.get_sample_value("ddpjob_job_progress_step", job) == 40
    assert registry.get_sample_value("ddpjob_job_samples_per_second", job) == 800.0
    assert registry.get_sample_value("ddpjob_job_seconds_since_progress", job) == 7.0
    assert registry.get_sample_value("ddpjob_rank_step_seconds", {**job, "rank": "1"}) == 0.5
    tracker.forget("uid")
    assert registry.get_sample_value("ddpjob_job_progress_step", job) is None
