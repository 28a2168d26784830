"""Progress reporting: one cheap, non-blocking, bounded client, a no-op when nothing is configured.

    from ddp_trainer.runtime import report
    report(step=120, total_steps=1000, loss=0.42, epoch=1, samples_per_second=812.0)

`report()` only stores the newest values and wakes a background thread (latest wins: the backlog is
never more than one report, whatever the rate), so it costs microseconds and never waits for a
disk or a network. Only global rank 0 reports; other ranks, and processes with neither transport
configured, do nothing. Transports:

- file: `<DDPJOB_CHECKPOINT_DIR>/progress.json`, written atomically (what `ddpjob run --local` and
  the operator read; keys in docs/launch-contract.md);
- HTTP: a JSON POST to `$DDPJOB_PROGRESS_URL` when set (timeout 2 s, failures logged once and
  dropped: progress is advisory and must never stop training).

`flush()` (also called by `close()`) writes the newest report synchronously, for the end of a run.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checkpoint import atomic_write_json

log = logging.getLogger(__name__)
PROGRESS_FILE = "progress.json"
URL_ENV = "DDPJOB_PROGRESS_URL"


class ProgressReporter:
    def __init__(self, directory: str | os.PathLike | None = None, url: str | None = None, *,
                 enabled: bool = True, http_timeout_s: float = 2.0) -> None:
        self.path = Path(directory) / PROGRESS_FILE if directory else None
        self.url = url or None
        self.enabled = enabled and (self.path is not None or self.url is not None)
        self.http_timeout_s = http_timeout_s
        self._latest: dict[str, Any] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()
        self._warned: set[str] = set()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ProgressReporter":
        e = os.environ if env is None else env
        return cls(e.get("DDPJOB_CHECKPOINT_DIR") or None, e.get(URL_ENV) or None,
                   enabled=e.get("RANK", "0") == "0")

    def report(self, *, step: int, total_steps: int | None = None, loss: float | None = None,
               **fields: Any) -> None:
        """Record the newest progress; returns at once. Extra keyword fields are passed through
        (epoch, samples_per_second, world_size, last_checkpoint_step, eval_loss, ...)."""
        if not self.enabled:
            return
        values = {"step": int(step), "total_steps": total_steps, "loss": None if loss is None else float(loss),
                  **fields, "time": time.time()}
        with self._cond:
            self._latest = values
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="ddpjob-progress", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._latest is None and not self._closed:
                    self._cond.wait()
                values, self._latest = self._latest, None
                if values is None:  # closed and drained
                    return
            self._send(values)

    def _send(self, values: dict[str, Any]) -> None:
        with self._write_lock:
            if self.path is not None:
                try:
                    atomic_write_json(self.path, values)
                except OSError as e:
                    self._warn_once("file", f"cannot write {self.path}: {e}")
            if self.url is not None:
                try:
                    req = urllib.request.Request(self.url, data=json.dumps(values).encode(), method="POST",
                                                 headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=self.http_timeout_s) as resp:
                        resp.read()
                except Exception as e:  # noqa: BLE001 - any transport failure is dropped the same way
                    self._warn_once("http", f"progress POST to {self.url} failed: {e}")

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s (further failures are not logged)", msg)

    def flush(self) -> None:
        """Write the newest pending report now, in this thread."""
        with self._cond:
            values, self._latest = self._latest, None
        if values is not None:
            self._send(values)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)


_default: ProgressReporter | None = None
_default_lock = threading.Lock()


def default_reporter() -> ProgressReporter:
    """The process's reporter, configured from the environment on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ProgressReporter.from_env()
        return _default


def report(*, step: int, total_steps: int | None = None, loss: float | None = None, **fields: Any) -> None:
    """`ProgressReporter.report` on the process's default reporter (see the module docstring)."""
    default_reporter().report(step=step, total_steps=total_steps, loss=loss, **fields)
