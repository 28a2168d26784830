"""The controller's rooms built as handlers.Controller builds them, without kopf or a work queue, against the
emulated API server: the job cache, the actuator and the reconciler, with what they report to recorded
(requeues, refused creations) and the leadership in the test's hands."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from ddpjob_operator import kube, progress
from ddpjob_operator.actuator import Actuator
from ddpjob_operator.job_cache import JobCache, JobKey
from ddpjob_operator.metrics import Metrics
from ddpjob_operator.reconciler import Reconciler
from ddpjob_operator.settings import Settings
from ddpjob_operator.side_tasks import SideTasks


class Rooms:
    def __init__(self, url: str, settings: Settings, clock: Callable[[], datetime] = lambda: datetime.now(
            timezone.utc)) -> None:
        self.api = kube.Kube(kube.Connection(server=url))
        self.cache, self.side_tasks, self.metrics = JobCache(), SideTasks(), Metrics()
        self.requeued: list[tuple[JobKey, float]] = []
        self.refused: list[JobKey] = []
        self.leads = True
        self.actuator = Actuator(self.api, self.cache.written, self.metrics, self.side_tasks,
                                 progress_endpoint=None, on_refused=self.refused.append, clock=clock)
        self.reconciler = Reconciler(self.api, self.cache, self.actuator, progress.ProgressTracker(), settings,
                                     self.metrics, clock=clock, leading=lambda: self.leads,
                                     requeue=lambda key, delay: self.requeued.append((key, delay)))

    def counted(self, series: str) -> float | None:
        return self.metrics.registry.get_sample_value(series)

    async def __aenter__(self) -> "Rooms":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.side_tasks.stop()
        await self.api.close()
