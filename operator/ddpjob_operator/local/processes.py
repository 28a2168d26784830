"""Local "pods": one process tree per worker (a torchrun agent and its trainers) or store.

torchrun starts every trainer in a session of its own, so signalling the agent's process group
does not reach them. Every process of a local job therefore carries one environment marker
(`DDPJOB_LOCAL_POD=<run>/<pod>/<attempt>/`) that children inherit, and the process table is the source of
truth: a pod is killed by killing every live process that carries its marker or belongs to its root's
session, whatever its parent. Both are needed: a process forked (not executed) keeps the environment
block its ancestor was started with, so the workers a `Zygote` forks show the zygote's marker, and
their trainers torchrun forks stay in the worker's session. The same scan of the run's marker proves
that a stopped job left nothing behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

from .. import agent
from .paths import open_for_append

MARKER_ENV = "DDPJOB_LOCAL_POD"
PROC = Path("/proc")


def marker_for(run_id: str, *parts: object) -> str:
    """Markers end in '/', so the marker of a run or pod is a prefix of exactly its processes'."""
    return "".join(f"{p}/" for p in (run_id, *parts))


def exit_code_of(returncode: int) -> int:
    """Popen's returncode as a container runtime reports it: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def marked_pids(*prefixes: str, sessions: tuple[int, ...] = ()) -> list[int]:
    """Live (non-zombie) processes whose marker starts with one of `prefixes` (see `marker_for`) or
    that belong to one of `sessions`."""
    wanted = tuple(f"{MARKER_ENV}={prefix}".encode() for prefix in prefixes)
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            # After the command's ")": state, parent, process group, session.
            state, _, _, session = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
        if state != "Z" and (int(session) in sessions or any(var.startswith(wanted) for var in environ.split(b"\0"))):
            found.append(int(entry.name))
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_marked(*prefixes: str, sessions: tuple[int, ...] = (), timeout: float = 10.0) -> None:
    """SIGKILL every process with one of the markers or in one of the sessions until none is left (a
    dying parent may still fork). Several pods are killed in the same instant: all of them are frozen
    before any dies."""
    deadline = time.monotonic() + timeout
    while pids := marked_pids(*prefixes, sessions=sessions):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of {', '.join(prefixes)} survived SIGKILL for {timeout}s")
        _signal_all(pids, signal.SIGSTOP)  # frozen processes cannot fork while we kill them
        _signal_all(pids, signal.SIGKILL)
        time.sleep(0.05)


class Zygote:
    """Starts worker launchers (agent.command("worker") ARGS...) as forks of one process that
    imported torch once (agent.command("zygote")), in milliseconds instead of seconds of imports.
    It is started on first use; a worker it cannot start (it failed to import) starts as a new
    interpreter instead, so every failure still surfaces as that worker's exit."""

    START_TIMEOUT = 120.0  # the first start waits for its imports

    def __init__(self, python: str, env: dict[str, str], marker: str, log_path: Path):
        self.python, self.env, self.marker, self.log_path = python, env, marker, log_path
        self.popen: subprocess.Popen | None = None
        self.failed = False  # it exited or hung before starting a worker: not tried again
        self._pending = b""
        self._started: list[int] = []
        self._exits: dict[int, int] = {}

    def start(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(open_for_append(self.log_path), "ab") as log:
            self.popen = subprocess.Popen(agent.command("zygote", python=self.python),
                                          env={**self.env, MARKER_ENV: self.marker}, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        os.set_blocking(self.popen.stdout.fileno(), False)
        self._pending = b""

    def handles(self, argv: list[str]) -> bool:
        return not self.failed and argv[:3] == agent.command("worker", python=self.python)

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> int | None:
        """The started worker's pid; None when the zygote is not usable (it exited or hung in its
        imports), from then on."""
        self.start()
        request = json.dumps({"args": argv[3:], "env": env, "log": str(log_path)}).encode() + b"\n"
        pid = self._answer(request)
        if pid is None:
            self.failed = True
            if self.popen is not None:
                self.popen.kill()
        return pid

    def _answer(self, request: bytes) -> int | None:
        assert self.popen is not None and self.popen.stdin is not None
        try:
            self.popen.stdin.write(request)
            self.popen.stdin.flush()
        except BrokenPipeError:
            return None
        deadline = time.monotonic() + self.START_TIMEOUT
        while not self._started:
            remaining = deadline - time.monotonic()
            if remaining < 0 or not self._read(timeout=remaining):
                return None
        return self._started.pop(0)

    def returncode(self, pid: int) -> int | None:
        """As Popen's: -N for a signal N; None while it runs. A worker whose zygote died (a stopped
        run kills both at once) has no exit status left to read: gone means killed."""
        self._read(timeout=0)
        if pid in self._exits:
            return self._exits[pid]
        if self.popen is not None and self.popen.poll() is not None and not marked_pids(sessions=(pid,)):
            return -signal.SIGKILL
        return None

    def wait(self, pid: int, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while (code := self.returncode(pid)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {pid} did not exit within {timeout}s")
            self._read(timeout=0.05)
        return code

    def close(self) -> None:
        """No more workers: the zygote exits (the workers it started are not affected)."""
        if self.popen is None:
            return
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def _read(self, timeout: float) -> bool:
        """Takes in what the zygote said within `timeout`; False once it has exited."""
        assert self.popen is not None and self.popen.stdout is not None
        if self.popen.stdout.closed:
            return False
        fd = self.popen.stdout.fileno()
        if select.select([fd], [], [], timeout)[0]:
            data = os.read(fd, 1 << 16)
            if not data:
                return False
            *lines, self._pending = (self._pending + data).split(b"\n")
            for word, *values in (line.split() for line in lines):
                if word == b"started":
                    self._started.append(int(values[0]))
                elif word == b"exit":
                    self._exits[int(values[0])] = int(values[1])
        return self.popen.poll() is None or bool(self._started)


def kill_together(*processes: "LocalProcess") -> None:
    """Several pods killed in the same instant (frozen together), then their roots reaped."""
    started = [p for p in processes if p.started]
    kill_marked(*(p.marker for p in processes), sessions=tuple(p.pid for p in started))
    for process in processes:
        process.kill()


@dataclass
class LocalProcess:
    """One local pod: its root process runs in its own session, output goes to `log_path`. Given a
    `zygote` that handles its argv, it starts as a fork of the zygote."""

    name: str
    marker: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    zygote: Zygote | None = field(default=None, repr=False)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    terminating_since: datetime | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)
    forked_pid: int | None = None  # the root, when the zygote started it
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, now: datetime) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = os.fdopen(open_for_append(self.log_path), "ab")
        # One line: a `python -c` program (launch.py's store) is shown by its role only.
        shown = ["<program>" if "\n" in arg else arg for arg in self.argv]
        self._log.write(f"---- {self.name}: {' '.join(shown)}\n".encode())
        self._log.flush()
        env = {**self.env, MARKER_ENV: self.marker}
        if self.zygote is not None and self.zygote.handles(self.argv):
            self.forked_pid = self.zygote.spawn(self.argv, env, self.log_path)
        if self.forked_pid is None:
            self.popen = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = now

    @property
    def started(self) -> bool:
        return self.popen is not None or self.forked_pid is not None

    @property
    def pid(self) -> int:
        """The root's, which leads its own session (and process group)."""
        if self.forked_pid is not None:
            return self.forked_pid
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def poll(self, now: datetime) -> int | None:
        """The exit code once the root process has ended (the pod's container exit code)."""
        if not self.started:
            return None
        code = self._returncode()
        if code is None:
            return None
        if self.finished_at is None:
            self.finished_at = now
            self._kill_tree()  # trainers torchrun left behind die with their pod
            self._close_log()
        return exit_code_of(code)

    def terminate(self, now: datetime) -> None:
        """Graceful stop, as the kubelet does it: SIGTERM to the root (torchrun forwards it)."""
        if self.terminating_since is None:
            self.terminating_since = now
        if not self.started:
            return  # never started (a pod not scheduled yet): nothing to stop
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """The whole pod at once: root, trainers, anything they started."""
        self._kill_tree()
        if self.popen is not None:
            self.popen.wait()
        elif self.forked_pid is not None and self.zygote is not None:
            self.zygote.wait(self.forked_pid)

    def _kill_tree(self) -> None:
        kill_marked(self.marker, sessions=(self.pid,) if self.started else ())

    def _returncode(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        assert self.zygote is not None and self.forked_pid is not None
        return self.zygote.returncode(self.forked_pid)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
