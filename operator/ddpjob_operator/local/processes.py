"""Local "pods": one process tree per worker (a torchrun agent and its trainers) or store.

torchrun starts every trainer in a session of its own, so signalling the agent's process group
does not reach them. Every process of a local job therefore carries one environment marker
(`DDPJOB_LOCAL_POD=<run>/<pod>/<attempt>/`) that children inherit, and the process table is the source of
truth: a pod is killed by killing every live process that carries its marker, whatever its
session or parent. The same scan proves that a stopped job left nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

MARKER_ENV = "DDPJOB_LOCAL_POD"
PROC = Path("/proc")


def marker_for(run_id: str, *parts: object) -> str:
    """Markers end in '/', so the marker of a run or pod is a prefix of exactly its processes'."""
    return "".join(f"{p}/" for p in (run_id, *parts))


def exit_code_of(returncode: int) -> int:
    """Popen's returncode as a container runtime reports it: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def marked_pids(*prefixes: str) -> list[int]:
    """Live (non-zombie) processes whose marker starts with one of `prefixes` (see `marker_for`)."""
    wanted = tuple(f"{MARKER_ENV}={prefix}".encode() for prefix in prefixes)
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # gone meanwhile, or not ours to read
            continue
        if state != "Z" and any(var.startswith(wanted) for var in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_marked(*prefixes: str, timeout: float = 10.0) -> None:
    """SIGKILL every process with one of the markers until none is left (a dying parent may still
    fork). Several pods are killed in the same instant: all of them are frozen before any dies."""
    deadline = time.monotonic() + timeout
    while pids := marked_pids(*prefixes):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of {', '.join(prefixes)} survived SIGKILL for {timeout}s")
        _signal_all(pids, signal.SIGSTOP)  # frozen processes cannot fork while we kill them
        _signal_all(pids, signal.SIGKILL)
        time.sleep(0.05)


@dataclass
class LocalProcess:
    """One local pod: its root process runs in its own session, output goes to `log_path`."""

    name: str
    marker: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    started_at: datetime | None = None
    finished_at: datetime | None = None
    terminating_since: datetime | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, now: datetime) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        # One line: a `python -c` program (the builders' launcher or store) is shown by its role only.
        shown = ["<program>" if "\n" in arg else arg for arg in self.argv]
        self._log.write(f"---- {self.name}: {' '.join(shown)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(self.argv, env={**self.env, MARKER_ENV: self.marker},
                                      stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = now

    @property
    def started(self) -> bool:
        return self.popen is not None

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def poll(self, now: datetime) -> int | None:
        """The exit code once the root process has ended (the pod's container exit code)."""
        if self.popen is None:
            return None
        code = self.popen.poll()
        if code is None:
            return None
        if self.finished_at is None:
            self.finished_at = now
            kill_marked(self.marker)  # trainers torchrun left behind die with their pod
            self._close_log()
        return exit_code_of(code)

    def terminate(self, now: datetime) -> None:
        """Graceful stop, as the kubelet does it: SIGTERM to the root (torchrun forwards it)."""
        if self.terminating_since is None:
            self.terminating_since = now
        if self.popen is None:
            return  # never started (a pod not scheduled yet): nothing to stop
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """The whole pod at once: root, trainers, anything they started."""
        kill_marked(self.marker)
        if self.popen is not None:
            self.popen.wait()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
