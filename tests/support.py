"""Helpers every test tier shares: the one synchronous polling loop, and reading a JSON file that may be
half-written or absent. (The operator tier's asynchronous poller is tests/operator/conftest.eventually.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str, timeout: float, interval: float = 0.1,
             explain: Callable[[], str] | None = None) -> T:
    """Poll `check` until it returns something truthy and return that; fail naming `what` (and
    `explain()`: what was seen instead) after `timeout` seconds. The pause between polls is the only
    sleep a test may use."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            seen = f"; {explain()}" if explain else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{seen}")
        time.sleep(interval)
    return value


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's JSON object; None while it is absent or not yet complete (a writer mid-way)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
