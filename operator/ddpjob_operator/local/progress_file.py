"""The trainer's progress.json read as the operator reads reports: parsed by the same parser and kept by the
same `ProgressTracker` (progress/tracker.py), so a job shows one ETA and meets one stall rule locally and on a
cluster. Only the transport differs: global rank 0 rewrites the file (no per-pod reports, so no ranks), and
a new report is one whose `time` changed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .. import decisions, progress
from ..progress.reports import MAX_STEP_SECONDS
from .logs import PROGRESS_FILE, JobFiles


class ProgressFile:
    """`observe()` -> the decision layer's ProgressObservation of the job, from the newest progress.json.

    The files' `warn` is told once when the trainer writes a report the operator's endpoint would refuse (422):
    such reports are not progress here either."""

    def __init__(self, files: JobFiles, uid: str, key: tuple[str, str], started_at: datetime):
        self.files, self.uid, self.key = files, uid, key
        self.started = started_at.timestamp()  # a file left by an earlier run (kept with --resume) is not news
        # Nothing to bound locally (no API server): every observation shows the newest report.
        self.tracker = progress.ProgressTracker(write_seconds=0.0)
        self._stamp: object = None
        self._warned = False

    def observe(self, generation: int, now: datetime) -> decisions.ProgressObservation | None:
        """`generation`: the one the runner's pods serve now (status.generation); the clock is the runner's."""
        raw = self.files.report(PROGRESS_FILE)
        stamp = raw.get("time") if raw is not None else None
        if raw is not None and stamp != self._stamp and not (isinstance(stamp, (int, float)) and stamp < self.started):
            self._stamp = stamp
            self._take(raw, generation, now)
        return self.tracker.observation(self.uid, now)

    def _take(self, raw: dict[str, Any], generation: int, now: datetime) -> None:
        try:
            report = progress.report_from(raw)
        except progress.BadReport as bad:
            if not self._warned:
                self._warned = True
                self.files.warn(f"Warning: {PROGRESS_FILE} holds a report the operator would refuse ({bad}); such reports "
                          f"are not taken as progress, locally or on a cluster")
            return
        served = report.attributed_to(generation)
        self.tracker.record(self.uid, self.key, None, served, report, now)
        # Rank 0 gathers every worker's own step time (at its log interval), by replica index.
        by_worker = raw.get("step_seconds_by_worker")
        if isinstance(by_worker, dict):
            for index, seconds in by_worker.items():
                if _replica_index(index) is not None and isinstance(seconds, (int, float)) \
                        and not isinstance(seconds, bool) and 0 <= seconds < MAX_STEP_SECONDS:
                    self.tracker.step_time(self.uid, _replica_index(index), served, report.step, float(seconds), now)


def _replica_index(key: object) -> int | None:
    """A JSON key naming a replica index ("0", "12"); None for anything else (ASCII digits only, few of them)."""
    text = str(key)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 6 else None
