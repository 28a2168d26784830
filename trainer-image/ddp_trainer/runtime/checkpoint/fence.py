"""Generation fences, of a CheckpointManager's directory or a framework's: the writer of a generation raises the
directory's fence when it starts (`raise_fence`), and a commit of an older generation (`newer_generation` says
one started since) is never made or is withdrawn. A newer generation claimed when a writer starts cannot be
true (`refuse_impossible_fence`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

from .errors import CheckpointFenceError, CorruptCheckpoint
from .files import _unlink_file, atomic_write_json, read_marker_json
from .layout import _FENCE, _canonical, _run_tag, fence_path

def newer_generation(root: str | os.PathLike, run: str, generation: int, markers: Iterable[Path] = ()) -> int | None:
    """The newest generation of `run` (job uid) newer than `generation` that started on `root` (its fence
    file) or committed one of `markers` (commit markers: JSON with "run" and "generation"); None while
    `generation` is the newest."""
    return _newer_generation(root, run, generation, markers)[0]


def _newer_generation(root: str | os.PathLike, run: str, generation: int,
                      markers: Iterable[Path] = ()) -> tuple[int | None, list[Path]]:
    """newer_generation, and the files that claim it."""
    tag, newest, claims = _run_tag(run), None, []
    for p, found, fence_tag in _fences(root):
        if fence_tag == tag and found > generation:
            newest = max(newest or 0, found)
            claims.append(p)
    for path in markers:
        with contextlib.suppress(OSError, CorruptCheckpoint):  # an invalid marker claims nothing
            marker = read_marker_json(path)
            found = marker.get("generation", 0)
            if marker.get("run", "") == run and found > generation:
                newest = max(newest or 0, found)
                claims.append(path)
    return newest, claims


def _fences(root: str | os.PathLike) -> list[tuple[Path, int, str]]:
    """(path, generation, run tag) of the fences in `root` under the writer's own names."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for p in Path(root).iterdir():
            if (m := _FENCE.match(p.name)) and (generation := _canonical(p, m.group(1))) is not None:
                found.append((p, generation, m.group(2)))
    return found


def refuse_impossible_fence(root: str | os.PathLike, run: str, generation: int, markers: Iterable[Path] = ()) -> None:
    """The writer of `generation`, starting: CheckpointFenceError when `root` already claims a newer
    generation of `run`. Generations of a job start one after another, each after the one before it
    ended, so a starting trainer is never older than one that started: the claim is a file left or copied
    in, and a trainer that believed it would train on with every save skipped."""
    if not run:  # a plain script's generation ($DDPJOB_GENERATION) is not the operator's ordered count
        return
    newer, claims = _newer_generation(root, run, generation, markers)
    if newer is None:
        return
    shown = ", ".join(str(p) for p in sorted(claims)[:5]) + (f" and {len(claims) - 5} more" if len(claims) > 5 else "")
    raise CheckpointFenceError(
        f"checkpoint directory {root} claims that generation {newer} of this job (run {run}) has started, but this "
        f"trainer of generation {generation} is starting now, and generations start in order: the claim cannot be "
        f"true (files left or copied in: {shown}). Training on would commit no checkpoint. Remove those files (no "
        f"other generation of this job is running) and restart the job")


def raise_fence(root: str | os.PathLike, run: str, generation: int, markers: Iterable[Path] = ()) -> int | None:
    """The writer of a generation, when it starts, before it looks for a checkpoint: from now on an older
    generation commits nothing in `root`. Returns the newer generation that already started there (then
    nothing is written: this trainer is the one left behind), else None."""
    newer = newer_generation(root, run, generation, markers)
    if newer is None and not fence_path(root, run, generation).exists():
        atomic_write_json(fence_path(root, run, generation), {"generation": generation, "run": run,
                                                              "time": time.time()})
    return newer


def prune_fences(root: str | os.PathLike, run: str) -> None:
    """Keep `run`'s newest fence in `root`; remove superseded ones and those of another run of the job name."""
    tag = _run_tag(run)
    fences = _fences(root)
    ours = max((g for _, g, t in fences if t == tag), default=None)
    for p, generation, t in fences:
        if t != tag or generation != ours:
            _unlink_file(p)
