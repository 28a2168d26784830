"""Reading what workers write: their log files (new lines, last step/loss) and the trainer's JSON reports."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .paths import NotARegularFile, read_regular

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
        try:  # the runner's own log: a regular file (paths.refuse_planted_entries), never a link or a FIFO
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return []
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        lines = [c.decode(errors="replace").rstrip("\r") for c in chunks]
        for line in lines:
            match = STEP_LINE.search(line)
            if match:
                self.step, self.loss = int(match.group(1)), float(match.group(3))
        return lines


def job_directory_name(name: str | None, namespace: str | None) -> str:
    """The job's own directory under the checkpoint volume's mount, as the trainer names it
    (trainer-image/ddp_trainer/runtime/contract.py `job_directory_name`, mirrored: this package never imports
    the trainer's): `<namespace>.<name>`; the name alone without a namespace; "" (the mount) without a name."""
    if not name:
        return ""
    return f"{namespace}.{name}" if namespace else name


PROGRESS_FILE = "progress.json"  # global rank 0's newest report (runtime/progress.py)
RESULT_FILE = "result.json"  # rank 0's final metrics (runtime/job.py, trainer.py, the HF/Lightning callbacks)
MAX_JSON_DEPTH = 32  # a report is a flat object of figures; deeper nesting is not the trainer's


class CorruptFile(ValueError):
    """A file the runner reads is not what the trainer writes there (see `load_report`)."""


def _depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (iteratively: a hostile file cannot exhaust the stack here)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_report(path: Path, since: float | None = None) -> dict[str, Any] | None:
    """The JSON object in a report file; None while it is absent (or, with `since`, last written before that
    time: an earlier run's). CorruptFile for a link, a FIFO, a directory, more than a MiB, JSON nested
    deeper than MAX_JSON_DEPTH, or anything but a JSON object (the trainer writes its reports atomically,
    so a half-written file is not one of its)."""
    try:
        data = read_regular(path, since=since)
        if data is None:
            return None
        value = json.loads(data)
    except NotARegularFile as e:
        raise CorruptFile(str(e)) from None
    except OSError as e:  # a file where a directory should be, no permission
        raise CorruptFile(f"{path} cannot be read ({e.strerror})") from None
    except RecursionError:  # nested deeper than the parser's stack
        raise CorruptFile(f"{path} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:
        raise CorruptFile(f"{path} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise CorruptFile(f"{path} holds {type(value).__name__}, not a JSON object")
    if _depth(value) > MAX_JSON_DEPTH:
        raise CorruptFile(f"{path} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


class JobFiles:
    """What the trainer writes in the job's own directory on the checkpoint volume (`<mount>/local.<name>`):
    progress.json, result.json and the checkpoints. Each file is untrusted: one that is not what the trainer
    writes is skipped as absent, with one warning naming it."""

    def __init__(self, directory: Path | None, warn: Callable[[str], None]):
        self.directory, self.warn = directory, warn
        self._warned: set[Path] = set()

    def report(self, name: str, since: float | None = None) -> dict[str, Any] | None:
        if self.directory is None:
            return None
        path = self.directory / name
        try:
            return load_report(path, since)
        except CorruptFile as e:
            if path not in self._warned:
                self._warned.add(path)
                self.warn(f"Warning: {e}: skipped as corrupt (the trainer rewrites it; remove it if it is not "
                          f"the trainer's)")
            return None

    def progress(self) -> dict[str, Any]:
        """The newest progress report, {} while there is none."""
        return self.report(PROGRESS_FILE) or {}

    def newest_checkpoint(self) -> tuple[int, Path] | None:
        return newest_checkpoint(self.directory)


# Commit markers of complete checkpoints, whoever wrote them: the runtime's CheckpointManager
# (step-N.committed beside step-N.pt), runtime.hf (checkpoint-N/ddpjob.committed.json), runtime.lightning
# (step-N.ckpt.ddpjob.json beside the file).
# ASCII digits only: `\d` would take other scripts' digits, which int() reads as a step.
_COMMITTED = re.compile(r"^step-([0-9]+)\.committed$")
_LIGHTNING = re.compile(r"^(step-([0-9]+)\.ckpt)\.ddpjob\.json$")
_HF_DIR = re.compile(r"^checkpoint-([0-9]+)$")
_HF_MARKER = "ddpjob.committed.json"


def _canonical_step(digits: str) -> int | None:
    """The step of a runtime marker's `step-%08d`, exactly as the trainer writes it (`step-000000040` is not
    step 40: the trainer never wrote it, nor does it load or prune it)."""
    return int(digits) if f"{int(digits):08d}" == digits else None


def _committed_data(directory: Path, step: str) -> Path:
    """The data file a runtime marker commits: `step-N.pt`, or a survivor's rescue `step-N.rescue.pt` when the
    marker names it (read with a bound: the marker is a few hundred bytes of JSON)."""
    rescue = f"step-{step}.rescue.pt"
    try:
        marker = load_report(directory / f"step-{step}.committed")
    except (OSError, CorruptFile):
        marker = None
    named = marker.get("data") if isinstance(marker, dict) else None
    return directory / (rescue if named == rescue else f"step-{step}.pt")


def newest_checkpoint(checkpoint_dir: Path | None, max_depth: int = 4) -> tuple[int, Path] | None:
    """(step, path) of the newest committed checkpoint anywhere under the checkpoint directory (the job's
    own subdirectory, a framework's), by its commit marker; None when there is none."""
    try:  # the directory itself, never a link's target (walked below without following links either)
        if checkpoint_dir is None or not stat.S_ISDIR(os.lstat(checkpoint_dir).st_mode):
            return None
    except OSError:
        return None
    best: tuple[int, Path] | None = None
    root_depth = len(checkpoint_dir.parts)
    for here, dirs, files in os.walk(checkpoint_dir):
        base = Path(here)
        if len(base.parts) - root_depth >= max_depth:
            dirs[:] = []
        found = []
        for name in files:
            if (m := _COMMITTED.match(name)) and (step := _canonical_step(m.group(1))) is not None:
                found.append((step, _committed_data(base, m.group(1))))
            elif m := _LIGHTNING.match(name):
                found.append((int(m.group(2)), base / m.group(1)))
            elif name == _HF_MARKER and (m := _HF_DIR.match(base.name)):
                found.append((int(m.group(1)), base))
        for step, path in found:
            if best is None or step > best[0]:
                best = (step, path)
    return best
