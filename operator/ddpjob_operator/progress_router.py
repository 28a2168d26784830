"""The progress router: gets the trainers' progress reports to the replica that acts, and from there into
the controller.

It owns the progress endpoint of this replica (progress.ProgressServer, started beside the controller,
over HTTPS when a certificate is configured), which looks workers up in the job cache and, for each
accepted report, requeues the job when its progress may be published (at most one write per
DDPJOB_OPERATOR_PROGRESS_WRITE_SECONDS); and the routing label: the acting replica's pod carries
PROGRESS_LEADER_LABEL, which the chart's progress Service selects, so reports reach the leader alone.
(A readiness only the leader passes would deadlock rolling updates and drains: the new pods stand by,
never ready, while the old leader holds the Lease.)

Imports progress (public names only), job_manifests, kube, leader, model, naming, the job cache and settings; never
the reconciler or the actuator.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any, Callable

from . import job_manifests, kube, leader, model, naming, progress
from .job_cache import JobCache, JobKey
from .metrics import Metrics
from .settings import Settings
from .side_tasks import SideTasks

logger = logging.getLogger("ddpjob_operator")

PROGRESS_LEADER_LABEL = f"{model.GROUP}/progress-leader"


def read_ca(path: str) -> str:
    """The CA (PEM) workers verify the progress endpoint with; "" without one (or unreadable: said loudly,
    since workers then cannot verify an https endpoint)."""
    if not path:
        return ""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        logger.error("progress endpoint: cannot read the CA %s (workers cannot verify the endpoint): %s", path, exc)
        return ""


def endpoint(settings: Settings) -> job_manifests.ProgressEndpoint | None:
    """What workers report to (their pods carry it); None without a progress URL."""
    if not settings.progress_url:
        return None
    return job_manifests.ProgressEndpoint(settings.progress_url, settings.progress_audience,
                                          read_ca(settings.progress_ca_file))


class ProgressRouter:
    def __init__(self, settings: Settings, tracker: progress.ProgressTracker, cache: JobCache, metrics: Metrics,
                 reviews: progress.TokenReviewer, *, clock: Callable[[], datetime], leading: Callable[[], bool],
                 requeue: Callable[[JobKey, float], None], elector: leader.Elector | None, labeler: kube.Kube):
        self.settings, self.tracker, self.cache, self.clock = settings, tracker, cache, clock
        self.leading, self.requeue, self.elector = leading, requeue, elector
        # Unfenced, so a fenced replica still removes its label; on this loop (the elector's own client lives
        # on the election's thread, and an aiohttp session serves only the loop it was made on).
        self.labeler = labeler
        def spec_of(body: dict[str, Any]) -> Any:
            return cache.parsed_spec(body["metadata"].get("uid", ""), body)[0]
        self.server = progress.ProgressServer(
            tracker, reviews,
            find_worker=lambda ns, name, who: progress.find_worker_in(cache.pods, cache.jobs, ns, name, who,
                                                                      naming.ROLE_WORKER),
            assignment=lambda ns, name, who: progress.assignment_in(cache.pods, cache.jobs, ns, name, who, spec_of),
            generation=lambda ns, name, who: progress.generation_in(cache.pods, cache.jobs, ns, name, who,
                                                                    naming.ROLE_WORKER, spec_of),
            leading=leading, accepted=self.accepted,
            count=lambda result: metrics.progress_reports.labels(result=result).inc(), clock=clock,
            refused=self.refused)
        self._wake: asyncio.Event | None = None  # set while the label is kept (leader election and a label)
        self._labeled: bool | None = None  # what this replica's pod label says (None: unknown)

    @property
    def labeled(self) -> bool | None:
        """Whether this replica's pod carries the routing label, as last written (None: not written yet)."""
        return self._labeled

    # ------------------------------------------------------------ lifecycle

    def start(self, side_tasks: SideTasks) -> None:
        if not self.settings.progress_port:
            return
        side_tasks.spawn(self._serve(), "the progress endpoint")
        if self.settings.progress_leader_label and self.elector is not None:
            self._wake = asyncio.Event()
            side_tasks.spawn(self._route(self.elector, self._wake), "progress routing")

    def leadership_changed(self) -> None:
        """Label or unlabel this replica's pod now, not at the next retry period."""
        if self._wake is not None:
            self._wake.set()

    async def stop(self) -> None:
        """Stop serving; reports go to the next leader only."""
        await self.server.stop()
        if self.elector is None or self._wake is None or self._labeled is False:
            return
        try:
            await asyncio.wait_for(self._label_own_pod(self.elector, False), self.settings.lease_retry_period_seconds)
        except (*kube.RETRYABLE_ERRORS, OSError) as exc:
            log = logger.info if leader.permission_withdrawn(exc) else logger.warning  # an uninstall
            log("could not remove the progress label from this pod: %s", exc)

    # ------------------------------------------------------------ reports

    def accepted(self, namespace: str, name: str, uid: str) -> None:
        """A report was accepted: reconcile the job when its progress may be published (coalesced: the
        earliest timer wins, so a job gets at most one progress write per progress_write_seconds)."""
        due = self.tracker.due_in(uid, self.clock())
        if due is not None and self.leading():
            self.requeue((namespace, name), due)

    def refused(self, namespace: str, name: str) -> None:
        """A report for this job could not be taken (a review budget spent, a failed review): the stall
        clock holds (decisions/progress.py), since the silence is the operator's."""
        uid = self.cache.uid((namespace, name))
        if uid is not None:
            self.tracker.refused(uid, self.clock())

    # ------------------------------------------------------------ inside

    async def _serve(self) -> None:
        certificate = None
        if self.settings.progress_tls_cert_file:  # HTTPS; a certificate that cannot be loaded is logged
            certificate = progress.ServerCertificate(self.settings.progress_tls_cert_file,
                                                     self.settings.progress_tls_key_file)
        # A negative port (settings' "auto"): one the kernel picks; the bound port is logged.
        await self.server.start(max(self.settings.progress_port, 0), self.settings.bind_address, certificate)
        logger.info("progress endpoint on %s:%d", self.settings.bind_address, self.server.port)

    async def _route(self, elector: leader.Elector, wake: asyncio.Event) -> None:
        """Keep this replica's pod labeled PROGRESS_LEADER_LABEL exactly while it leads (woken by the
        elector's callbacks, retried every Lease retry period)."""
        while True:
            want = self.leading()
            if want != self._labeled:
                try:
                    await self._label_own_pod(elector, want)
                except kube.ApiError as exc:
                    if exc.status == 404:
                        logger.error("progress routing: pod %s/%s not found (POD_NAME must name this pod); reports "
                                     "reach every replica", self.settings.lease_namespace, self.settings.identity)
                        return
                    # Refused with the Lease too: an uninstall took the Role (leader.py); alone: a missing rule.
                    uninstall = leader.permission_withdrawn(exc) and elector.withdrawn_since is not None
                    (logger.info if uninstall else logger.warning)(
                        "progress routing: could not label pod %s: %s", self.settings.identity, exc)
                except (*kube.RETRYABLE_ERRORS, OSError) as exc:
                    logger.warning("progress routing: could not label pod %s: %s", self.settings.identity, exc)
            try:
                await asyncio.wait_for(wake.wait(), self.settings.lease_retry_period_seconds)
            except asyncio.TimeoutError:
                pass
            wake.clear()

    async def _label_own_pod(self, elector: leader.Elector, leading: bool) -> None:
        await self.labeler.patch_pod_labels(self.settings.lease_namespace, self.settings.identity,
                                            {PROGRESS_LEADER_LABEL: "true" if leading else None})
        self._labeled = leading
