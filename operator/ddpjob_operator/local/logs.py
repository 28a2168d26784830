"""Reading what workers write: their log files (new lines, last step/loss) and the trainer's JSON reports."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The trainer's rank-0 progress line (docs/launch-contract.md).
STEP_LINE = re.compile(r"\bstep=(\d+) epoch=(\d+) loss=([-+0-9.eE]+|nan|inf)")
# The bundled trainer's rank-0 log line after loading a checkpoint (other entrypoints may not print it):
# the step, and the world size it resumed at.
RESUME_LINE = re.compile(r"resumed from checkpoint step=(\d+)(?:.*\bnow (\d+)\))?")


@dataclass
class LogTail:
    """New complete lines of a growing log file, and the last training step seen in it."""

    path: Path
    offset: int = 0
    step: int | None = None
    loss: float | None = None
    _partial: bytes = b""

    def read_new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        lines = [c.decode(errors="replace").rstrip("\r") for c in chunks]
        for line in lines:
            match = STEP_LINE.search(line)
            if match:
                self.step, self.loss = int(match.group(1)), float(match.group(3))
        return lines


def read_report(checkpoint_dir: Path | None, name: str) -> dict[str, Any] | None:
    """progress.json or result.json; None while absent or half-written (the trainer writes atomically)."""
    if checkpoint_dir is None:
        return None
    try:
        value = json.loads((checkpoint_dir / name).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
