"""Observing a local run: its processes as the decision layer's observations (what the API server's pods and
the kubelet would say), its exits and the trainer's resumes as they happen. What a kubelet does on its own is
done here too: a held pod starts once its hold ends, a deleted one is killed after its grace period and
vanishes once its processes are gone."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

from .. import decisions, model
from .logs import RESUME_LINE
from .paths import NotARegularFile, read_regular
from .pods import LOCALHOST, ExitRecord, LocalPods, Resume, WorkerProcess
from .progress_file import ProgressFile
from .view import View

# What the scheduler says of a pod no node can take (an Unschedulable option's worker).
UNSCHEDULABLE = "Unschedulable"
UNSCHEDULABLE_MESSAGE = "0/1 nodes are available: held Pending by the local run's Unschedulable option"


class LocalObserver:
    def __init__(self, pods: LocalPods, progress: ProgressFile, view: View, clock: Callable[[], datetime]):
        self.pods, self.progress, self.view, self.clock = pods, progress, view, clock
        self.exits: list[ExitRecord] = []
        self.resumes: list[Resume] = []

    def observe(self, status: model.DDPJobStatus, grace: timedelta, now: datetime) -> decisions.Observed:
        workers, spares = [], []
        for name, w in list(self.pods.workers.items()):
            if w.held:
                if w.deleted:
                    del self.pods.workers[name]  # a pod that never ran goes at once
                    continue
                if w.held_until is not None and now >= w.held_until:
                    w.start(now)  # scheduled at last
            code = w.process.poll(now)
            if code is not None and not w.exit_recorded:
                self._record_exit(name, w, code)
            if w.deleted and code is not None:
                del self.pods.workers[name]  # a deleted pod whose processes are gone no longer exists
                continue
            if w.deleted and now >= w.process.terminating_since + grace:
                w.process.kill()  # the grace period is over, as the kubelet would do
            (spares if w.assignment_file is not None else workers).append(_observation(name, w, code))
        return decisions.Observed(workers=tuple(workers), store=self._store_observation(now), now=now,
                                  progress=self.progress.observe(status.generation, now), spares=tuple(spares))

    def read_logs(self, now: datetime, print_logs: bool) -> None:
        """Each pod's new log lines: shown with --logs, and a resume noted where rank 0 logged one."""
        for name, tail in self.pods.tails.items():
            for line in tail.read_new_lines():
                if print_logs:
                    self.view.log_line(name, line)
                resumed = RESUME_LINE.search(line)
                if resumed:
                    world = int(resumed.group(2)) if resumed.group(2) else None
                    w = self.pods.workers.get(name)
                    self.resumes.append(Resume(at=now, pod=name, generation=w.generation if w else None,
                                               step=int(resumed.group(1)), world_size=world))
                    self.view.event(f"{name}: training resumed from the checkpoint of step {resumed.group(1)}"
                                    + (f" at world size {world}" if world else ""))

    def _record_exit(self, name: str, w: WorkerProcess, code: int) -> None:
        w.exit_recorded = True
        message = _read_text(w.termination_log)
        record = ExitRecord(at=w.process.finished_at or self.clock(), pod=name, index=w.index,
                            generation=w.generation, attempt=w.attempt, exit_code=code, message=message,
                            deleted=w.deleted)
        self.exits.append(record)
        self.view.event(f"{name} (generation {w.generation}, attempt {w.attempt}) exited with code {code}"
                        + (" after its deletion" if w.deleted else "")
                        + (f": {decisions.short_message(message)}" if message else ""))

    def _store_observation(self, now: datetime) -> decisions.StoreObservation | None:
        pods = self.pods
        if pods.store is None:
            return None
        code = pods.store.poll(now)
        if code is not None:
            if pods.store.terminating_since is not None:
                pods.store = None  # deleted and gone
                return None
            return decisions.StoreObservation(phase="Succeeded" if code == 0 else "Failed")
        pods.store_ready = pods.store_ready or _accepts_connections(pods.store_port)
        return decisions.StoreObservation(phase="Running", ready=pods.store_ready,
                                          terminating_since=pods.store.terminating_since)


def _observation(name: str, w: WorkerProcess, code: int | None) -> decisions.WorkerObservation:
    message = None
    if w.held:
        return decisions.WorkerObservation(
            index=w.index, name=name, uid=w.uid, generation=w.generation, phase="Pending", attempt=w.attempt,
            terminating_since=w.process.terminating_since, node_range=w.node_range,
            unschedulable=decisions.Waiting(UNSCHEDULABLE, UNSCHEDULABLE_MESSAGE, w.created_at))
    if code is None:
        phase, reason = "Running", None
    else:
        phase, reason = ("Succeeded", "Completed") if code == 0 else ("Failed", "Error")
        message = _read_text(w.termination_log)
    return decisions.WorkerObservation(
        index=w.index, name=name, uid=w.uid, generation=w.generation, phase=phase, attempt=w.attempt,
        ready=code is None and _spare_ready(w), exit_code=code, reason=reason, message=message,
        terminating_since=w.process.terminating_since, node_range=w.node_range,
        node=LOCALHOST, started_at=w.process.started_at, finished_at=w.process.finished_at)


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((LOCALHOST, port), timeout=0.2):
            return True
    except OSError:
        return False


def _spare_ready(w: WorkerProcess) -> bool:
    """A worker is Ready while it runs; a spare once its launcher wrote its readiness mark (the probe)."""
    if w.ready_file is None or w.ready_seen:
        return True
    w.ready_seen = w.ready_file.exists()
    return w.ready_seen


def _read_text(path: Path) -> str | None:
    """A termination message: the launcher's file, or None (absent, or not a regular file of at most 64 KiB)."""
    try:
        data = read_regular(path, limit=1 << 16)
    except (OSError, NotARegularFile):
        return None
    return None if data is None else data.decode(errors="replace")
