"""The tracker's per-job Prometheus gauges, read at each scrape (nothing is kept twice)."""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily

from .tracker import ProgressTracker


def gauges(tracker: ProgressTracker, now: Callable[[], datetime]) -> Iterable[GaugeMetricFamily]:
    """Per-job Prometheus gauges: step, samples/s, seconds since the step last advanced."""
    labels = ["namespace", "ddpjob"]
    step = GaugeMetricFamily("ddpjob_job_progress_step", "Last optimizer step a DDPJob reported", labels=labels)
    rate = GaugeMetricFamily("ddpjob_job_samples_per_second", "Training throughput a DDPJob reported",
                             labels=labels)
    since = GaugeMetricFamily("ddpjob_job_seconds_since_progress",
                              "Seconds since a DDPJob's step last advanced (in its newest generation)",
                              labels=labels)
    own = GaugeMetricFamily("ddpjob_rank_step_seconds", "A DDPJob worker's own time per step (apart from "
                            "waiting for the others in collectives), its newest report in the job's generation",
                            labels=labels + ["rank"])
    moment = now()
    for uid, job in list(tracker.jobs.items()):
        if uid not in tracker.names or job.latest is None or job.last_advance is None:
            continue
        key = list(tracker.names[uid])
        for rank in job.timings.snapshot():
            if rank.generation == job.generation and rank.samples:
                own.add_metric(key + [str(rank.index)], rank.samples[-1].seconds)
        step.add_metric(key, job.latest.step)
        if job.latest.samples_per_second is not None:
            rate.add_metric(key, job.latest.samples_per_second)
        since.add_metric(key, max(0.0, (moment - job.last_advance).total_seconds()))
    return [step, rate, since, own]


class TrackerCollector:
    """Adapts the tracker to prometheus_client's collector protocol."""

    def __init__(self, tracker: ProgressTracker, clock: Callable[[], datetime]):
        self.tracker, self.clock = tracker, clock

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return gauges(self.tracker, self.clock)
