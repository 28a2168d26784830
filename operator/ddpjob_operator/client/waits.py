"""Waiting for and following a job: built on the API's watch, so nothing is polled."""

from __future__ import annotations

import json
import socket
import time
from typing import Iterable, Iterator

from .. import kube, model
from .errors import JobEnded, JobNotFound, WaitTimeout
from .job import TERMINAL_PHASES, Job
from .transport import Transport


def read(transport: Transport, namespace: str, name: str) -> Job:
    return Job(transport.job_call("GET", namespace, name))


def changes(transport: Transport, namespace: str, name: str, deadline: float | None, *,
            until_gone: bool = False) -> Iterator[Job]:
    """The job, then every version of it a watch sees, until `deadline` (None: for ever). A watch the
    server ends (timeoutSeconds, 410 Gone) is started again from a fresh read."""
    while True:
        try:
            job = read(transport, namespace, name)
        except JobNotFound:
            if until_gone:
                return
            raise
        yield job
        version = job.raw["metadata"].get("resourceVersion")
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return
        seconds = max(1, min(300, int(remaining + 1))) if remaining is not None else 300
        params = {"watch": "true", "fieldSelector": f"metadata.name={name}", "resourceVersion": version,
                  "timeoutSeconds": seconds, "allowWatchBookmarks": "false"}
        try:
            # The socket timeout ends a watch that sees nothing by the deadline.
            with transport.open("GET", kube.DDPJOBS.path(namespace), params=params,
                                timeout=min(seconds, remaining) if remaining is not None else seconds + 30) as stream:
                for line in stream:
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        break  # 410 Gone and the like: read it again, watch again
                    if event.get("type") == "DELETED":
                        if until_gone:
                            return
                        raise JobNotFound(namespace, name)
                    yield Job(event["object"])
                    if deadline is not None and time.monotonic() >= deadline:
                        return
        except (TimeoutError, socket.timeout):
            pass
        if deadline is not None and time.monotonic() >= deadline:
            return


def until_gone(transport: Transport, namespace: str, name: str, timeout: float) -> None:
    """Returns once the job is gone, or `timeout` seconds passed."""
    for _ in changes(transport, namespace, name, time.monotonic() + timeout, until_gone=True):
        pass


def watch(transport: Transport, namespace: str, name: str, timeout: float | None) -> Iterator[Job]:
    """The job now, then each time it changes, until it is Succeeded or Failed (or `timeout` passed)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for job in changes(transport, namespace, name, deadline):
        yield job
        if job.phase in TERMINAL_PHASES:
            return


def progress(transport: Transport, namespace: str, name: str, timeout: float | None) -> Iterator[model.Progress]:
    """status.progress each time it changes, until the job ends."""
    last = None
    for job in watch(transport, namespace, name, timeout):
        current = job.progress
        if current is not None and current != last:
            last = current
            yield current


def wait(transport: Transport, namespace: str, name: str, phase: str | Iterable[str] | None,
         condition: str | None, timeout: float) -> Job:
    """Until the job is in `phase` (default: Succeeded) or has `condition` True; JobEnded when it finished
    otherwise, WaitTimeout after `timeout` seconds (with the last status)."""
    phases = (phase,) if isinstance(phase, str) else tuple(phase or (() if condition else ("Succeeded",)))
    what = " or ".join(
        ([f"to reach phase {'/'.join(phases)}"] if phases else []) + ([f"to have condition {condition}=True"]
                                                                      if condition else []))
    deadline = time.monotonic() + timeout
    last: Job | None = None
    for job in changes(transport, namespace, name, deadline):
        last = job
        c = job.condition(condition) if condition else None
        if job.phase in phases or (c is not None and c.status == "True"):
            return job
        if job.phase in TERMINAL_PHASES:
            raise JobEnded(what, job)
    raise WaitTimeout(what, timeout, last or read(transport, namespace, name))
