"""What the Hugging Face and Lightning integrations (`runtime.hf`, `runtime.lightning`) share, without
importing either framework: where a framework's checkpoints live on the job's volume, a commit marker
that makes a framework's own (non-atomic) checkpoint "complete", and the resume line.

A framework writes its checkpoint its own way (HF: a directory `checkpoint-<step>/` of several files;
Lightning: one `.ckpt` file). Neither is atomic: a worker killed mid-save leaves a partial one that the
framework itself would resume from. So once the framework's files are written, the writer fsyncs them
and writes a marker atomically (`ddpjob.committed.json` inside a checkpoint directory, so the framework's
own rotation removes it with the directory; `<file>.ddpjob.json` beside a file), listing each file and
its size: a
checkpoint is complete when its marker exists and every listed file still has that size. Resume picks
the newest complete one, never a partial one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .checkpoint import atomic_write_json
from .distributed import StopRequest

log = logging.getLogger(__name__)
MARKER_SUFFIX = ".ddpjob.json"
MARKER_NAME = "ddpjob.committed.json"


def job_dir(subdir: str, default: str | os.PathLike | None = None) -> Path | None:
    """`<DDPJOB_CHECKPOINT_DIR>/<DDPJOB_NAME>/<subdir>` under DDPJob (the job's own directory on the
    volume, next to the runtime's `checkpoints/`), else `default`."""
    mount = os.environ.get("DDPJOB_CHECKPOINT_DIR")
    if not mount:
        return Path(default) if default is not None else None
    name = os.environ.get("DDPJOB_NAME", "")
    return Path(mount) / name / subdir if name else Path(mount) / subdir


def marker_path(checkpoint: str | os.PathLike) -> Path:
    p = Path(checkpoint)
    return p / MARKER_NAME if p.is_dir() else p.with_name(p.name + MARKER_SUFFIX)


def _files(checkpoint: Path) -> list[Path]:
    if checkpoint.is_dir():
        return sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != MARKER_NAME)
    return [checkpoint]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(checkpoint: str | os.PathLike, *, step: int, world_size: int, skip: re.Pattern[str] | None = None,
           **extra: Any) -> Path:
    """Make a written checkpoint (file or directory) durable and complete: fsync its files, then its
    marker. Files whose names match `skip` (written by other ranks, maybe still being written) are
    not checked at resume."""
    root = Path(checkpoint)
    sizes = {}
    for f in _files(root):
        _fsync(f)
        if skip is None or not skip.search(f.name):
            sizes[str(f.relative_to(root)) if root.is_dir() else f.name] = f.stat().st_size
    if root.is_dir():
        _fsync(root)
    _fsync(root.parent)
    marker = marker_path(root)
    atomic_write_json(marker, {"step": step, "world_size": world_size, "files": sizes, "time": time.time(), **extra})
    return marker


def read_marker(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The marker of a complete checkpoint, None when it is missing, torn or its files differ."""
    root = Path(checkpoint)
    try:
        marker = json.loads(marker_path(root).read_text())
        for name, size in marker["files"].items():
            path = root / name if root.is_dir() else root
            if path.stat().st_size != size:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return marker


def newest_complete(directory: str | os.PathLike | None, pattern: re.Pattern[str]) -> tuple[int, Path, dict] | None:
    """(step, path, marker) of the newest complete checkpoint in `directory` whose name matches `pattern`
    (group 1: the step); partial ones (no marker, a truncated file) are skipped with a warning."""
    if directory is None or not Path(directory).is_dir():
        return None
    found = sorted(((int(m.group(1)), p) for p in Path(directory).iterdir() if (m := pattern.match(p.name))),
                   reverse=True)
    for step, path in found:
        marker = read_marker(path)
        if marker is not None:
            return step, path, marker
        log.warning("skipping incomplete checkpoint %s (no commit marker, or its files changed)", path)
    return None


def announce(message: str) -> None:
    """The runtime's resume line: logged when the script's logging shows INFO, else printed to stderr,
    so that `ddpjob run --local` (and a reader of the pod's log) sees it without any logging setup."""
    runtime_log = logging.getLogger("ddp_trainer.runtime")
    if runtime_log.isEnabledFor(logging.INFO) and runtime_log.hasHandlers():
        runtime_log.info(message)
    else:
        with contextlib.suppress(OSError, ValueError):
            print(message, file=sys.stderr, flush=True)


def resume_message(step: int, saved_world_size: Any, world_size: int) -> str:
    """The line `ddpjob run --local` recognises (ddpjob_operator.local.logs.RESUME_LINE)."""
    return f"resumed from checkpoint step={step} (saved at world_size={saved_world_size}, now {world_size})"


class PacedStop(StopRequest):
    """`StopRequest` agreed every few steps rather than every step: the callbacks' per-step cost.

    One agreement (an asynchronous 2-int all-reduce on a CPU tensor over Gloo, read at the next check)
    costs a few hundred microseconds on a busy CPU node: 1-3% of a 10 ms step. So each rank proposes
    how many steps make about `target_s` seconds (its own step time), and the all-reduce carries the
    stop flag (MAX) with the proposals (the smallest wins): every rank gets the same flag and the same
    next check step from the same result, so all stop at the same step. A stop is seen within about
    2 x `target_s` (at least the next step, at most `max_every` steps)."""

    def __init__(self, target_s: float = 0.25, max_every: int = 50) -> None:
        super().__init__()
        self.target_s, self.max_every = target_s, max_every
        self.every = 1
        self._countdown = 1
        self._last: float | None = None
        self._step_s: float | None = None

    def step(self) -> bool:
        """Once per optimizer step on every rank: True on all of them, at the same step, once any was signalled."""
        now = time.monotonic()
        if self._last is not None:
            took = now - self._last
            self._step_s = took if self._step_s is None else 0.8 * self._step_s + 0.2 * took
        self._last = now
        self._countdown -= 1
        if self._countdown > 0:
            return False
        proposal = 1 if not self._step_s else int(min(self.max_every, max(1, self.target_s / self._step_s)))
        stop, self.every = self._agree(proposal)
        self._countdown = self.every
        return stop

    def _agree(self, proposal: int) -> tuple[bool, int]:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.requested, proposal
        stop, every = False, 1
        if self._pending is not None:
            work, values = self._pending
            self._pending = None
            work.wait()
            stop, every = bool(values[0].item()), int(-values[1].item())
        values = torch.tensor([1 if self.requested else 0, -proposal], dtype=torch.int32)  # CPU, never the GPU
        self._pending = (dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self._stop_group(), async_op=True),
                         values)
        return stop, every
