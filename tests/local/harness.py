"""Helpers for `ddpjob run --local` tests: tiny manifests in tmp dirs, the real CLI, the process table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ddpjob_operator.local.processes import LocalProcess

from ..support import read_json, wait_for  # noqa: F401 - read_json: the local tests import it from here

DDPJOB = [sys.executable, "-m", "ddpjob_operator.cli"]
TAG_ENV = "LOCAL_RUNNER_TEST_TAG"  # not DDPJOB_*: the runner strips those, this must reach every process

# Small and fast on 2 shared cores: short rendezvous timeouts, frequent checkpoints.
TINY_DIGITS: dict[str, Any] = {
    "replicas": 2, "minReplicas": 1, "maxReplicas": 2,
    "image": "ghcr.io/ddpjob/ddp-trainer:0.1.0", "entrypoint": "ddp_trainer",
    "args": ["--workload", "digits", "--epochs", "3", "--batch-size", "32", "--lr", "0.05", "--log-every", "5"],
    "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
    "rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 1, "readTimeoutSeconds": 30},
    "checkpoint": {"claimTemplate": {"size": "1Gi"}, "intervalSteps": 10, "keep": 3},
    "failurePolicy": {"maxRestarts": 2, "backoff": {"initialSeconds": 0, "maxSeconds": 1}},
    "template": {"terminationGracePeriodSeconds": 30},
}


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": name},
            "spec": {**TINY_DIGITS, **spec}}


def write_manifest(directory: Path, doc: dict[str, Any]) -> Path:
    path = directory / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def script(directory: Path, name: str, body: str) -> Path:
    """A .py entrypoint (torchrun runs it directly), for behaviour that needs no training."""
    path = directory / name
    path.write_text(body)
    return path


class Run:
    """`ddpjob run FILE --local ...` as a real subprocess in `cwd`, tagged for the process-table check."""

    def __init__(self, cwd: Path, *args: str, ignore_sighup: bool = False):
        self.cwd, self.tag = cwd, uuid.uuid4().hex
        env = {**os.environ, TAG_ENV: self.tag, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([*DDPJOB, "run", *args, "--local"], cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     # as a terminal starts it, or `nohup` (SIGHUP ignored, which exec keeps)
                                     preexec_fn=_as_nohup_starts_it if ignore_sighup else _as_a_terminal_starts_it)

    def wait(self, timeout: float) -> tuple[int, str]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(f"ddpjob run did not finish within {timeout}s:\n{out}") from None
        return self.proc.returncode, out

    def wait_for_step(self, progress: Path, step: int, timeout: float = 180) -> None:
        """Until the trainer's progress.json reports `step` (while the run is still going)."""
        def reached() -> bool:
            assert self.proc.poll() is None, f"the run ended before training reached step {step}"
            return ((read_json(progress) or {}).get("step") or 0) >= step
        wait_for(reached, f"training to reach step {step}", timeout, interval=0.2)

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def leftovers(self) -> list[str]:
        """Live processes (any session, any parent) that inherited this run's environment."""
        return [f"{pid}: {cmdline[:160]}" for pid, cmdline in tagged_processes(self.tag)]


def _as_a_terminal_starts_it() -> None:
    # Whatever started the suite (`nohup`, a background job of a non-interactive shell: SIGINT and SIGHUP ignored,
    # which exec keeps), a run started from a terminal has them at their defaults; the Ctrl-C and SIGHUP tests
    # send them.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _as_nohup_starts_it() -> None:
    _as_a_terminal_starts_it()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def tagged_processes(tag: str) -> list[tuple[int, str]]:
    wanted = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append((int(entry.name), cmdline))
    return found


def kill_tagged(tag: str) -> None:
    for pid, _ in tagged_processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# A process tree's root that starts a grandchild in a session of its own, as torchrun does with its trainers.
SPAWNS_DETACHED_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
if sys.argv[2] == "stay":
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for_file(path: Path, timeout: float = 120) -> str:
    return wait_for(lambda: path.exists() and path.read_text(), f"{path} to be written", timeout, interval=0.05)


def exit_code(process: LocalProcess, now: datetime, timeout: float = 120) -> int:
    """A local pod's exit code, once it has ended."""
    def ended() -> tuple[int] | None:  # a tuple: exit code 0 is an answer too
        code = process.poll(now)
        return None if code is None else (code,)
    return wait_for(ended, f"{process.name} to end", timeout, interval=0.05)[0]


def job_dir(cwd: Path, name: str) -> Path:
    return cwd / ".ddpjob" / name


def job_files(cwd: Path, name: str) -> Path:
    """Where the trainer writes a local job's progress.json, result.json and checkpoints/: the job's own
    directory on its default checkpoint volume (`<mount>/local.<name>`)."""
    return job_dir(cwd, name) / "checkpoints" / f"local.{name}"


# ---- in-process runs (tests/local/test_semantics.py): the runner's own status, not its printout ----

class RunTimeout(AssertionError):
    pass


RESUMED_EVENT = "training resumed from the checkpoint of step"


class TimelineView:
    """A runner View that keeps everything with its time: events, and each pass's phase and
    training progress (progress.json). Past `timeout` seconds it raises RunTimeout once (the
    runner then stops its processes as on Ctrl-C, showing them on the way)."""

    def __init__(self, timeout: float):
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.events: list[tuple[float, str]] = []
        self.samples: list[tuple[float, str, int | None, int | None]] = []  # (t, phase, step, world size)
        # For each resume: the last training step seen before it (nothing trains between a fault and
        # the resume, so this is the step at the fault; rank 0 writes progress.json every step).
        self.step_before_resume: list[int | None] = []
        self.summary = None
        self._raised = False

    def update(self, snap) -> None:
        now = time.monotonic()
        sample = (now, snap.phase, snap.step, snap.world_size)
        if not self.samples or self.samples[-1][1:] != sample[1:]:
            self.samples.append(sample)
        if now > self.deadline and not self._raised:
            self._raised = True
            raise RunTimeout(f"the job did not finish within {self.timeout}s")

    def event(self, text: str) -> None:
        if RESUMED_EVENT in text:
            self.step_before_resume.append(self.samples[-1][2] if self.samples else None)
        self.events.append((time.monotonic(), text))

    def log_line(self, pod: str, line: str) -> None:
        pass

    def close(self, summary) -> None:
        self.summary = summary

    def first_event(self, needle: str) -> tuple[float, str] | None:
        return next(((t, e) for t, e in self.events if needle in e), None)

    def transcript(self) -> str:
        start = self.samples[0][0] if self.samples else 0.0
        return "\n".join(f"{t - start:7.1f}s {e}" for t, e in self.events)
