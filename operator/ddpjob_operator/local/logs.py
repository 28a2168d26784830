"""Reading what workers write: their log files (new lines, last step/loss) and the trainer's JSON reports."""

from __future__ import annotations

import json
import os
import re
import stat
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


# Commit markers of complete checkpoints, whoever wrote them: the runtime's CheckpointManager
# (step-N.committed beside step-N.pt), runtime.hf (checkpoint-N/ddpjob.committed.json), runtime.lightning
# (step-N.ckpt.ddpjob.json beside the file).
_COMMITTED = re.compile(r"^step-(\d+)\.committed$")
_LIGHTNING = re.compile(r"^(step-(\d+)\.ckpt)\.ddpjob\.json$")
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_HF_MARKER = "ddpjob.committed.json"


def _committed_data(directory: Path, step: str) -> Path:
    """The data file a runtime marker commits: `step-N.pt`, or a survivor's rescue `step-N.rescue.pt` when the
    marker names it (read with a bound: the marker is a few hundred bytes of JSON)."""
    rescue = f"step-{step}.rescue.pt"
    try:  # a regular file only (never block on a FIFO or follow a link someone put there)
        fd = os.open(directory / f"step-{step}.committed", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            marker = json.loads(f.read(1 << 16)) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (OSError, ValueError):
        marker = None
    named = marker.get("data") if isinstance(marker, dict) else None
    return directory / (rescue if named == rescue else f"step-{step}.pt")


def newest_checkpoint(checkpoint_dir: Path | None, max_depth: int = 4) -> tuple[int, Path] | None:
    """(step, path) of the newest committed checkpoint anywhere under the checkpoint directory (the job's
    own subdirectory, a framework's), by its commit marker; None when there is none."""
    if checkpoint_dir is None or not checkpoint_dir.is_dir():
        return None
    best: tuple[int, Path] | None = None
    root_depth = len(checkpoint_dir.parts)
    for here, dirs, files in os.walk(checkpoint_dir):
        base = Path(here)
        if len(base.parts) - root_depth >= max_depth:
            dirs[:] = []
        found = []
        for name in files:
            if m := _COMMITTED.match(name):
                found.append((int(m.group(1)), _committed_data(base, m.group(1))))
            elif m := _LIGHTNING.match(name):
                found.append((int(m.group(2)), base / m.group(1)))
            elif name == _HF_MARKER and (m := _HF_DIR.match(base.name)):
                found.append((int(m.group(1)), base))
        for step, path in found:
            if best is None or step > best[0]:
                best = (step, path)
    return best
