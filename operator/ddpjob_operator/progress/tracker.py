"""What the operator keeps of a job's reports: per-rank steps, rank 0's values, the step history behind the
ETA, and the decision layer's ProgressObservation published at a bounded rate. The local runner feeds it
the trainer's progress.json, so a job has one ETA and one stall clock wherever it runs."""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .. import decisions
from .reports import Report

RANK0_CLAIM_SECONDS = 15.0  # a pod's claim to rank 0 lapses after this long without its reports
RATE_WINDOW_SECONDS = 120.0  # the step rate behind the ETA is measured over about this long
RECOVERY_GENERATIONS = 8  # recovery reports kept: the newest per generation and kind, for the last this many generations


@dataclass
class _Rank:
    generation: int
    step: int
    last_seen: datetime


@dataclass
class JobProgress:
    generation: int = -1
    step: int = -1
    last_advance: datetime | None = None
    latest: Report | None = None
    received_at: datetime | None = None
    ranks: dict[int, _Rank] = field(default_factory=dict)
    history: collections.deque[tuple[datetime, int]] = field(default_factory=lambda: collections.deque(maxlen=64))
    published: decisions.ProgressObservation | None = None
    published_at: datetime | None = None
    dirty: bool = False
    rank0_index: int | None = None  # the pod (replica index) whose reports say rank 0 in this generation
    rank0_claimed: datetime | None = None  # that pod's newest report saying rank 0
    last_refused: datetime | None = None  # the operator last could not take a report for this job
    timings: decisions.TimingHistory = field(default_factory=decisions.TimingHistory)  # straggler detection
    # rank 0's, by generation and kind (a generation that trains on in place reports a shrink, then a join)
    recoveries: dict[tuple[int, str], decisions.RecoveryReport] = field(default_factory=dict)


class ProgressTracker:
    """Reports -> per-job state -> the decision layer's ProgressObservation, published at a bounded rate."""

    def __init__(self, write_seconds: float = 5.0):
        self.write_seconds = write_seconds
        self.jobs: dict[str, JobProgress] = {}
        self.names: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name), for the metrics

    def record(self, uid: str, key: tuple[str, str], index: int | None, generation: int, report: Report,
               now: datetime) -> None:
        """A report of the job's pod `index` (its replica index, from the operator's records), attributed to
        `generation`. `index` None: a report of the job itself, no pod's (the local runner's progress.json,
        which only global rank 0 writes): its values are the job's, and no rank is tracked."""
        self.names[uid] = key
        job = self.jobs.setdefault(uid, JobProgress())
        if index is not None:
            rank = job.ranks.get(index)
            if rank is None or generation >= rank.generation:
                job.ranks[index] = _Rank(generation, report.step, now)
            if report.step_seconds is not None:
                self.step_time(uid, index, generation, report.step, report.step_seconds, now)
        if generation < job.generation and not (report.in_place and self._in_place(job)):
            # A pod of a generation left behind (still stopping): its rank's silence is all it tells. A trainer
            # that trains on in place keeps the generation it started in while the next one's ranks join it.
            return
        if generation > job.generation:
            job.generation, job.step, job.last_advance, job.latest = generation, -1, None, None
            job.rank0_index = job.rank0_claimed = None
            job.history.clear()
        if report.step > job.step:
            job.step, job.last_advance = report.step, now
            job.history.append((now, report.step))
        if index is not None:
            report = self._claim_rank0(job, index, report, now)
        own = index is None or report.rank == 0
        if own and report.recovery is not None:
            _keep_recovery(job, generation, report)
        if job.latest is None or own or (job.latest.rank != 0 and report.step >= job.latest.step):
            job.latest, job.received_at, job.dirty = report, now, True

    @staticmethod
    def _in_place(job: JobProgress) -> bool:
        """The job's newest generation trains with the survivors in place: its rank 0 has not spoken, or says
        so. A rank 0 of its own that does not (a restarted gang) makes an older generation's reports stale."""
        return job.latest is None or job.latest.rank != 0 or job.latest.in_place

    @staticmethod
    def _claim_rank0(job: JobProgress, index: int, report: Report, now: datetime) -> Report:
        """The report as it counts: its `rank: 0` dropped unless its pod holds the generation's rank 0 claim."""
        # Rank 0's values are the job's (its loss is already averaged over ranks); otherwise the newest step.
        # The body's rank is only a claim: the first pod making it in a generation keeps it while it says so,
        # so another pod saying `rank: 0` never takes over the job's values. The claim ends when its pod
        # reports another rank (a re-rendezvous gave rank 0 to another pod: a promoted spare, a replacement)
        # or stops saying rank 0 for RANK0_CLAIM_SECONDS, even while it goes on reporting as another rank.
        if job.rank0_index == index and report.rank is not None and report.rank != 0:
            job.rank0_index = job.rank0_claimed = None
            if job.latest is not None and job.latest.rank == 0:
                job.latest = dataclasses.replace(job.latest, rank=None)  # no longer rank 0's: the newest step wins
        if report.rank == 0 and (job.rank0_index is None or job.rank0_claimed is None
                                 or (now - job.rank0_claimed).total_seconds() > RANK0_CLAIM_SECONDS):
            job.rank0_index = index  # unclaimed, or its claim lapsed
        if report.rank == 0 and job.rank0_index == index:
            job.rank0_claimed = now
        elif report.rank == 0:
            report = dataclasses.replace(report, rank=None)
        return report

    def step_time(self, uid: str, index: int, generation: int, step: int, seconds: float, now: datetime) -> None:
        """Worker `index`'s own time per step (straggler detection): from its pod's report, or, locally, from
        the times rank 0 gathered from every worker into progress.json."""
        job = self.jobs.setdefault(uid, JobProgress())
        job.timings.add(index, generation, step, seconds, now)
        if generation >= job.generation:
            job.dirty = True  # stepTimes follow every worker's reports, not only rank 0's

    def refused(self, uid: str, now: datetime) -> None:
        """The operator could not take a report for this job (a review budget spent, a failed review): its
        silence is then the operator's, and decisions/progress.py holds the stall clock for it."""
        self.jobs.setdefault(uid, JobProgress()).last_refused = now

    def due_in(self, uid: str, now: datetime) -> float | None:
        """Seconds until the job's new reports may be published (0: now); None when nothing is new."""
        job = self.jobs.get(uid)
        if job is None or not job.dirty:
            return None
        if job.published_at is None:
            return 0.0
        return max(0.0, (job.published_at + timedelta(seconds=self.write_seconds) - now).total_seconds())

    def observation(self, uid: str, now: datetime, final: bool = False) -> decisions.ProgressObservation | None:
        """What the decision layer sees: the job-level values as last published (a publish happens here,
        at most every write_seconds, and at once when `final`: a worker finished, so the status write that
        may say Succeeded carries the trainers' last report), with the live clock of the stall rule."""
        job = self.jobs.get(uid)
        if job is None or job.last_advance is None or job.latest is None:
            return None
        if job.dirty and (final or (self.due_in(uid, now) or 0.0) <= 0.0):
            latest = job.latest
            job.published = decisions.ProgressObservation(
                generation=job.generation, step=latest.step, last_advance=job.last_advance,
                total_steps=latest.total_steps, epoch=latest.epoch, loss=latest.loss,
                samples_per_second=latest.samples_per_second, last_checkpoint_step=latest.last_checkpoint_step,
                world_size=latest.world_size, steps_per_second=self._rate(job), updated_at=job.received_at,
                timings=job.timings.snapshot(), desired_world_size=latest.desired_world_size,
                missing_ranks=latest.missing_ranks or (), waiting_for_ranks=latest.waiting_for_ranks,
                short_since=None if latest.short_since is None else decisions.unix_time(latest.short_since),
                in_place=latest.in_place)
            job.published_at, job.dirty = now, False
        if job.published is None:
            return None
        ranks = tuple(decisions.RankReport(i, r.generation, r.step, r.last_seen) for i, r in sorted(job.ranks.items()))
        return _replace(job.published, generation=job.generation, last_advance=job.last_advance, ranks=ranks,
                        last_refused=job.last_refused, recoveries=tuple(v for _, v in sorted(job.recoveries.items())))

    @staticmethod
    def _rate(job: JobProgress) -> float | None:
        points = list(job.history)
        if len(points) < 2:
            return None
        newest = points[-1]
        oldest = next((p for p in points if (newest[0] - p[0]).total_seconds() <= RATE_WINDOW_SECONDS), points[0])
        if oldest is newest:
            oldest = points[-2]
        seconds = (newest[0] - oldest[0]).total_seconds()
        return (newest[1] - oldest[1]) / seconds if seconds > 0 else None

    def forget(self, uid: str) -> None:
        self.jobs.pop(uid, None)
        self.names.pop(uid, None)


def _keep_recovery(job: JobProgress, generation: int, report: Report) -> None:
    """Rank 0's recovery timeline of its generation (the newest wins: its first step time comes later), kept
    apart from the rate-limited values: decisions/recovery.py reads it in the pass that sees it."""
    given = report.recovery
    assert given is not None
    job.recoveries[(generation, given.kind or "")] = decisions.RecoveryReport(
        generation=generation, path=given.path, reason=given.reason, resumed_step=given.resumed_step,
        rendezvous_time=decisions.unix_time(given.rendezvous_time), kind=given.kind, world_size=report.world_size,
        first_step_time=None if given.first_step_time is None else decisions.unix_time(given.first_step_time))
    kept = {g for g, _ in job.recoveries}
    for old in [key for key in job.recoveries if key[0] in sorted(kept)[:-RECOVERY_GENERATIONS]]:
        del job.recoveries[old]


def _replace(observation: decisions.ProgressObservation, **changes: Any) -> decisions.ProgressObservation:
    return dataclasses.replace(observation, **changes)
