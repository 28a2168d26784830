"""Prometheus metrics: jobs by phase, ranks training and desired per job, restarts, disruptions, recovery time,
reconcile latency, errors and queue depth, leadership.

Each operator instance has its own registry (tests run several in one process).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from .model import DDPJobStatus, IncidentRecovery, PHASES

# An in-process recovery takes seconds; a restart that reads a large checkpoint back, minutes.
RECOVERY_BUCKETS = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900, 1800)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.jobs = Gauge("ddpjob_jobs", "DDPJobs known to the operator, by phase", ["phase"],
                          registry=self.registry)
        self.restarts = Counter("ddpjob_restarts", "Worker restarts charged to a restart budget",
                                registry=self.registry)
        self.disruptions = Counter("ddpjob_disruptions", "Replacements after evictions, node loss or store loss "
                                   "(not charged)", registry=self.registry)
        self.reconcile_seconds = Histogram("ddpjob_reconcile_duration_seconds", "Time of one reconcile pass",
                                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                           registry=self.registry)
        self.reconcile_errors = Counter("ddpjob_reconcile_errors", "Reconcile passes that failed (retried)",
                                        registry=self.registry)
        self.leader = Gauge("ddpjob_leader", "1 while this replica holds the operator Lease and acts, else 0",
                            registry=self.registry)
        self.leader_changes = Counter("ddpjob_leader_changes", "Changes of the operator Lease's holder this "
                                      "replica has seen (its own acquisitions included)", registry=self.registry)
        self.progress_reports = Counter("ddpjob_progress_reports", "Progress reports received, by result (accepted, "
                                        "unauthenticated, forbidden, invalid, too_large, rate_limited, standby, "
                                        "unavailable)", ["result"], registry=self.registry)
        # Observed once per incident, from the status it writes (decisions.recovered): an operator restart reads
        # the timelines already complete from the stored status and observes none of them again.
        self.recovery_seconds = Histogram("ddpjob_recovery_seconds", "An incident's recovery time: failure seen by "
                                          "the operator to the next generation's first training step "
                                          "(status.incidents[].recovery.seconds), by path (InProcess, Restart)",
                                          ["path"], buckets=RECOVERY_BUCKETS, registry=self.registry)
        self.stalls = Counter("ddpjob_stalls", "Stalls detected (runPolicy.progressDeadlineSeconds passed without a "
                              "step)", registry=self.registry)
        # Set from the controller's work queue at each scrape (watch_queue): a burst waits for a reconcile slot.
        self.queue_depth = Gauge("ddpjob_reconcile_queue_depth", "Jobs whose reconcile pass is queued or running "
                                 "(waiting for one of DDPJOB_OPERATOR_MAX_CONCURRENT_RECONCILES slots, or in one)",
                                 registry=self.registry)
        # Per job, from the status each pass decides: WORLD below DESIRED while it trains short (docs/operator.md).
        self.ranks_training = Gauge("ddpjob_ranks_training", "Ranks a DDPJob trains with now (status.worldSize while "
                                    "Running, else 0)", ["namespace", "name"], registry=self.registry)
        self.ranks_desired = Gauge("ddpjob_ranks_desired", "Ranks of a DDPJob's whole world (status.desiredWorldSize)",
                                   ["namespace", "name"], registry=self.registry)
        self._phase_of: dict[str, str] = {}
        self._name_of: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name): the world gauges' labels
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(0)
        self._server: Any = None

    def job_phase(self, uid: str, phase: str | None) -> None:
        """Move one job between phase gauges (None: the job is gone, and its world gauges with it)."""
        old = self._phase_of.pop(uid, None)
        if old is not None:
            self.jobs.labels(phase=old).dec()
        if phase is not None:
            self._phase_of[uid] = phase
            self.jobs.labels(phase=phase).inc()
        elif (labels := self._name_of.pop(uid, None)) is not None:
            self.ranks_training.remove(*labels)
            self.ranks_desired.remove(*labels)

    def job_world(self, uid: str, namespace: str, name: str, status: DDPJobStatus) -> None:
        """One job's ranks training (none unless Running: a job restarting or waiting trains nothing) and desired."""
        self._name_of[uid] = (namespace, name)
        self.ranks_training.labels(namespace, name).set(status.world_size if status.phase == "Running" else 0)
        self.ranks_desired.labels(namespace, name).set(status.desired_world_size)

    def recovered(self, timelines: list[IncidentRecovery]) -> None:
        """Observe the timelines a status write completed (decisions.recovered(old, new))."""
        for timeline in timelines:
            if timeline.seconds is not None:
                self.recovery_seconds.labels(path=timeline.path or "Unknown").observe(timeline.seconds)

    def watch_queue(self, depth: Callable[[], int]) -> None:
        """The queue depth gauge reads `depth()` when scraped."""
        self.queue_depth.set_function(depth)

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def serve(self, port: int, address: str) -> None:
        """A negative port (settings' "auto"): one the kernel picks; the bound port is logged."""
        self._server, _ = start_http_server(max(port, 0), addr=address, registry=self.registry)
        logging.getLogger("ddpjob_operator").info("metrics on http://%s:%d/metrics", address,
                                                  self._server.server_port)

    @property
    def port(self) -> int | None:
        """The port the metrics server is bound to (the kernel's pick for "auto"); None when not serving."""
        return None if self._server is None else self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
