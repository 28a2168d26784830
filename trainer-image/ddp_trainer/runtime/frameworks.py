"""What the Hugging Face and Lightning integrations (`runtime.hf`, `runtime.lightning`) share, without
importing either framework: where a framework's checkpoints live on the job's volume, a commit marker
that makes a framework's own (non-atomic) checkpoint "complete", and the resume line.

A framework writes its checkpoint its own way (HF: a directory `checkpoint-<step>/` of several files;
Lightning: one `.ckpt` file). Neither is atomic: a worker killed mid-save leaves a partial one that the
framework itself would resume from. So once the framework's files are written, the writer fsyncs them
and writes a marker atomically (`ddpjob.committed.json` inside a checkpoint directory, so the framework's
removal of the directory takes it along; `<file>.ddpjob.json` beside a file), listing each file and
its size, the rendezvous generation and the run (job uid): a checkpoint is complete when its marker
exists and every listed file still has that size. Resume picks the newest complete one, never a partial
one. The rest is the bundled `CheckpointManager`'s, with its code (`runtime.checkpoint`):
- an I/O error while reading a marker is not an incomplete checkpoint: it is retried, then raised as
  `CheckpointVolumeUnreadable` (`guard_volume`: exit 75), never skipped for an older one;
- every commit is fenced by generation: the writer raises the directory's fence when it starts
  (`start_generation`, before it looks for a checkpoint), and a trainer of an older generation commits
  nothing, or withdraws its marker if the newer one started while it wrote;
- `prune` (instead of a framework's own rotation) runs only after a commit that reads back complete,
  and never removes the newest `keep` complete checkpoints up to it, nor anything newer;
- a full volume during a save (ENOSPC, EDQUOT) is `CheckpointVolumeFull` (`guard_volume`): exit 75,
  `checkpoint volume full: <dir>`.

Against hung and silent peers the callbacks have what `Job` has, with its code (`StallGuard`): the steady
collective timeout after the first steps (`CollectiveTimeout`), relaxed around work that is not a step,
and the stall watchdog (`runtime.watchdog`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import stat
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from .checkpoint import (CheckpointVolumeError, CorruptCheckpoint, adopt_legacy_job_directory, atomic_write_json,
                         check_archive, newer_generation, prune_fences, raise_fence, read_marker_json,
                         refuse_impossible_fence, refuse_link, rendezvous_generation, retry_reads, volume_full)
from .contract import CHECKPOINT_DIR_ENV, JOB_NAME_ENV, JOB_NAMESPACE_ENV, job_root
from .distributed import CollectiveTimeout, StopRequest, abort_process_groups, exit_process
from .progress import ProgressReporter, job_directory, recovery_field
from .watchdog import StallWatchdog

log = logging.getLogger(__name__)
MARKER_SUFFIX = ".ddpjob.json"
MARKER_NAME = "ddpjob.committed.json"
T = TypeVar("T")


def job_dir(subdir: str, default: str | os.PathLike | None = None) -> Path | None:
    """`<DDPJOB_CHECKPOINT_DIR>/<DDPJOB_NAMESPACE>.<DDPJOB_NAME>/<subdir>` under DDPJob (the job's own directory
    on the volume, next to the runtime's `checkpoints/`; `progress.job_directory`), else `default`. A name or namespace
    that is not one path component: CheckpointDirError."""
    mount = os.environ.get(CHECKPOINT_DIR_ENV)
    if not mount:
        return Path(default) if default is not None else None
    return job_directory(mount) / subdir


def _own_job_dir(directory: Path) -> None:
    """Before a framework's checkpoints in `directory` are looked for or written: where it is the job's own
    (`job_dir`), carry the job's directory over from the layout before namespaces (`adopt_legacy_job_directory`;
    any rank: the rename happens once) and refuse a link at the job's directory or at `directory`."""
    mount = os.environ.get(CHECKPOINT_DIR_ENV)
    if not mount or directory.parent != job_root(mount) or directory.parent == Path(mount):
        return
    adopt_legacy_job_directory(mount, os.environ.get(JOB_NAME_ENV, ""), os.environ.get(JOB_NAMESPACE_ENV, ""))
    refuse_link(directory.parent, "the job's checkpoint directory")
    refuse_link(directory, "the job's checkpoints directory")


def _is_dir(path: Path) -> bool:
    """A real directory, never a link to one."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def marker_path(checkpoint: str | os.PathLike) -> Path:
    p = Path(checkpoint)
    return p / MARKER_NAME if _is_dir(p) else p.with_name(p.name + MARKER_SUFFIX)


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


def _markers(directory: Path) -> Iterator[Path]:
    """Where the commit markers of `directory`'s checkpoints are (a fence also counts a newer generation's)."""
    with contextlib.suppress(FileNotFoundError):
        for p in directory.iterdir():
            if p.name.endswith(MARKER_SUFFIX):
                yield p
            elif not p.name.startswith("."):
                yield p / MARKER_NAME  # a directory's (read errors, a plain file: ignored by the fence)


def start_generation(directory: str | os.PathLike) -> int | None:
    """The writer (rank 0), when it starts and before it looks for a checkpoint to resume from: raise
    `directory`'s fence to this trainer's rendezvous generation (torchrun's run id `<job uid>-g<N>`), so
    that from now on a trainer of an older generation commits nothing there. Returns the newer generation
    already there, if any (this trainer is the one left behind: it will commit nothing)."""
    root = Path(directory)
    _own_job_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    _own_job_dir(root)  # created: a link put there meanwhile is refused too
    run, generation = rendezvous_generation()
    refuse_impossible_fence(root, run, generation, _markers(root))  # a newer generation already: cannot be true
    newer = raise_fence(root, run, generation, _markers(root))
    if newer is not None:
        log.warning("generation %d has started on %s, this trainer is of generation %d (replaced; it commits "
                    "nothing)", newer, root, generation)
    return newer


def _fenced(checkpoint: Path, newer: int, generation: int, what: str) -> None:
    log.warning("checkpoint %s %s: generation %d has started on %s, this trainer is of generation %d (replaced; "
                "it commits nothing)", checkpoint.name, what, newer, checkpoint.parent, generation)


def commit(checkpoint: str | os.PathLike, *, step: int, world_size: int, skip: re.Pattern[str] | None = None,
           **extra: Any) -> Path | None:
    """Make a written checkpoint (file or directory) durable and complete: fsync its files, then its
    marker. Files whose names match `skip` (written by other ranks, maybe still being written) are
    not checked at resume. Fenced by generation: None, and nothing committed, when a newer generation
    started on the directory before the marker was written (its files are left: the step may be the
    newer generation's too) or while it was (the marker is withdrawn)."""
    root = Path(checkpoint)
    run, generation = rendezvous_generation()
    if (newer := newer_generation(root.parent, run, generation, _markers(root.parent))) is not None:
        _fenced(root, newer, generation, "not committed")
        return None
    sizes = {}
    for f in _files(root):
        _fsync(f)
        if skip is None or not skip.search(f.name):
            sizes[str(f.relative_to(root)) if root.is_dir() else f.name] = f.stat().st_size
    if root.is_dir():
        _fsync(root)
    _fsync(root.parent)
    marker = marker_path(root)
    atomic_write_json(marker, {"step": step, "world_size": world_size, "files": sizes, "time": time.time(),
                               "generation": generation, "run": run, **extra})
    if (newer := newer_generation(root.parent, run, generation, _markers(root.parent))) is not None:
        marker.unlink(missing_ok=True)
        _fenced(root, newer, generation, "withdrawn")
        return None
    return marker


def _read_marker_once(root: Path) -> dict[str, Any] | None:
    try:
        is_dir = stat.S_ISDIR(root.lstat().st_mode)  # never through a link (issue 31)
        # A FIFO or device marker is never opened; one nested too deep, with Infinity, a count out of range: invalid.
        marker = read_marker_json(root / MARKER_NAME if is_dir else root.with_name(root.name + MARKER_SUFFIX))
    except (FileNotFoundError, CorruptCheckpoint):
        return None  # no checkpoint, its writer died before the marker, or a marker that is not a valid file
    files = marker.get("files")
    if not isinstance(files, dict) or not all(type(size) is int and size >= 0 for size in files.values()) or \
            not all(_inside(name) for name in files):
        return None
    for name, size in files.items():
        try:
            st = (root / name if is_dir else root).lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:  # a FIFO, a device, a link: not what was committed
                return None
        except FileNotFoundError:
            return None
    return marker


def _inside(name: str) -> bool:
    """A marker's file name that stays inside its checkpoint: relative, no '..'."""
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def _inflating(checkpoint: Path, marker: dict[str, Any]) -> str | None:
    """Why a committed checkpoint's torch.save archives (a Lightning `.ckpt`, an HF `optimizer.pt`) must not reach
    torch.load (`checkpoint.check_archive`: a compressed record would inflate unchecked), or None."""
    for name in marker["files"]:
        path = checkpoint / name if _is_dir(checkpoint) else checkpoint
        if zipfile.is_zipfile(path):
            try:
                check_archive(None, path)
            except CorruptCheckpoint as e:
                return str(e)
    return None


def read_marker(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The marker of a complete checkpoint, None when it is missing, torn or its files differ. An I/O
    error is not an incomplete checkpoint: it is retried (as the bundled trainer's reads), then raised
    as `CheckpointVolumeUnreadable` naming the directory."""
    root = Path(checkpoint)
    return retry_reads(lambda: _read_marker_once(root), f"reading the commit marker of {root}", root.parent)


def _checkpoints(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    """(step, path) of `directory`'s checkpoints (name matching `pattern`, group 1: the step), newest first."""
    return sorted(((int(m.group(1)), p) for p in directory.iterdir() if (m := pattern.match(p.name))), reverse=True)


def newest_complete(directory: str | os.PathLike | None, pattern: re.Pattern[str],
                    unloadable: Callable[[Path], str | None] | None = None) -> tuple[int, Path, dict] | None:
    """(step, path, marker) of the newest complete checkpoint in `directory` whose name matches `pattern`
    (group 1: the step); partial ones (no marker, a truncated file) are skipped with a warning, and so are
    complete ones the framework's own loader cannot take (`unloadable(path)`: why not, or None; e.g. an HF
    checkpoint without weights, as a rescue by a rank other than 0 wrote before issue 32). An I/O error raises
    `CheckpointVolumeUnreadable` (after retries): never an older checkpoint, or none, instead."""
    if directory is None:
        return None
    _own_job_dir(Path(directory))
    if not Path(directory).is_dir():
        return None
    for step, path in _checkpoints(Path(directory), pattern):
        marker = read_marker(path)
        if marker is None:
            log.warning("skipping incomplete checkpoint %s (no commit marker, or its files changed)", path)
            continue
        why = _inflating(path, marker) or (unloadable(path) if unloadable is not None else None)
        if why is None:
            return step, path, marker
        log.warning("skipping checkpoint %s: the framework cannot load it (%s)", path, why)
    return None


def seed_step(seed: int, step: int, rank: int) -> None:
    """Every random stream of this process (Python's, NumPy's, torch's CPU and CUDA ones) from (seed, step,
    rank) alone, as the bundled trainer's: called by the callbacks before each optimizer step's forward pass,
    so dropout's draws at step N+1 do not depend on history and a resume from any checkpoint, a rescue that
    holds only its survivor's state included, draws what an undisturbed run draws."""
    derived = (int(seed) + 1_000_003 * int(step) + 7_919 * int(rank)) % (2 ** 32)
    random.seed(derived)
    np.random.seed(derived)
    torch.default_generator.manual_seed(derived)  # (torch.manual_seed: the same, 100x slower: it asks every backend)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(derived)


def check_world_size(framework_world_size: int, framework: str, fix: str) -> None:
    """At the start of training: the framework's world size must be torchrun's (WORLD_SIZE). Otherwise each
    process trains alone on all the data (HF on CPU without `use_cpu=True`), all writing one checkpoint
    directory: end every process at once with 1 and a message naming `fix` (to torchrun's error file too,
    so the pod's termination message and the job's status say it)."""
    launched = os.environ.get("WORLD_SIZE")
    if not launched or not launched.isdigit() or int(launched) == int(framework_world_size):
        return
    refuse(f"DDPJob: {framework} runs at world size {framework_world_size}, but torchrun started "
           f"{launched} processes (WORLD_SIZE={launched}): each process would train alone on all the data. Fix: {fix}")


def resumed(reporter: ProgressReporter | None, step: int, is_main: bool, reason: str = "") -> None:
    """A callback's resume from `step` as the recovery timeline rank 0 reports (path Restart, the callbacks'
    only one; the framework's process group is complete by the time training begins). `reason`: why, where
    in-process recovery was asked for."""
    if reporter is not None and is_main:
        reporter.recovery = recovery_field("Restart", reason=reason, resumed_step=step, rendezvous_time=time.time())


def first_step(reporter: ProgressReporter | None) -> bool:
    """After each optimizer step: True once, at a resumed run's first (its time ends the timeline: report now)."""
    if reporter is None or reporter.recovery is None or reporter.recovery["first_step_time"] is not None:
        return False
    reporter.recovery = {**reporter.recovery, "first_step_time": time.time()}
    return True


def refuse(message: str) -> None:
    """End this process with 1 and `message` (stderr, and torchrun's error file: the termination message)."""
    with contextlib.suppress(OSError, ValueError):
        print(message, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps({"message": {"message": message, "extraInfo": {
                "py_callstack": message, "timestamp": str(int(time.time()))}}}))
    exit_process(1)


def _remove(checkpoint: Path) -> None:
    """Marker first: a crash in between leaves an incomplete checkpoint, never a marker without its files. A link
    or anything else but a file or directory under a checkpoint's name is not the framework's: left alone."""
    mode = checkpoint.lstat().st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        log.warning("%s is not a file or directory a framework wrote: left in place (remove it)", checkpoint)
        return
    marker_path(checkpoint).unlink(missing_ok=True)
    if stat.S_ISDIR(mode):
        shutil.rmtree(checkpoint)
    else:
        checkpoint.unlink(missing_ok=True)


def prune(verified: str | os.PathLike, pattern: re.Pattern[str], keep: int, *,
          protect: tuple[str | os.PathLike, ...] = ()) -> list[Path]:
    """After `verified` (a checkpoint in a directory of checkpoints named by `pattern`) was committed by this
    trainer: if it reads back complete, keep the newest `keep` (>= 1) complete checkpoints up to it and every
    checkpoint newer than it (never ours to judge), and remove the older complete ones and the incomplete
    ones older than it; `protect` (e.g. HF's best model) stays. Nothing is removed before the whole set was
    read, and a read error (`CheckpointVolumeUnreadable`) or any other OSError removes nothing: best effort,
    the next save tries again. Returns what was removed."""
    verified = Path(verified)
    directory = verified.parent
    try:
        m = pattern.match(verified.name)
        if m is None or read_marker(verified) is None:
            log.warning("checkpoint %s does not read back complete: nothing pruned", verified)
            return []
        newest, kept, doomed = int(m.group(1)), {Path(p).resolve() for p in protect}, []
        complete = 0
        for step, path in _checkpoints(directory, pattern):
            if step > newest or path.resolve() in kept:
                continue
            if read_marker(path) is not None and complete < max(1, keep):
                complete += 1
                continue
            if step < newest:
                doomed.append(path)
        for path in doomed:
            _remove(path)
        prune_fences(directory, rendezvous_generation()[0])
        return doomed
    except OSError as e:
        log.warning("pruning old checkpoints in %s failed (a later save retries): %s", directory, e)
        return []


def guard_volume(write: Callable[[], T], directory: str | os.PathLike | None, what: str, *,
                 before_exit: Callable[[], None] | None = None) -> T:
    """`write()` (a save, a commit, a resume's lookup), where a checkpoint volume that fails ends the process
    as the bundled trainer's `__main__` does: the message to torchrun's error file (`record()`), exit 75,
    which the operator retries as the volume's failure instead of failing the job as the script's bug.
    The volume failed: a `CheckpointVolumeError` (full, or unreadable after the retries), or another
    exception while the volume was full (`checkpoint.volume_full`: writing `what` into `directory`).
    `before_exit` (closing the progress reporter) runs first. Any other exception propagates."""
    try:
        return write()
    except Exception as e:
        failure = e if isinstance(e, CheckpointVolumeError) else \
            volume_full(e, directory, what) if directory is not None else None
        if failure is None:
            raise
        if failure is not e and failure.__cause__ is None:
            failure.__cause__ = e
        if before_exit is not None:
            with contextlib.suppress(Exception):
                before_exit()
        log.error("exiting with code %d: %s", failure.exit_code, failure)
        exit_process(failure.record())
        raise  # (exit_process does not return)


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


class StallGuard:
    """`Job`'s defences against a hung or silent peer, for a framework's callback, which drives them from the
    framework's events instead of `Job.should_stop`, `Job.rescue` and `Job.close`:

    - `steady_timeout_s` > 0: the process groups' collective timeout after the first 10 steps (`Job.start`'s
      `steady_timeout_s`, default 0: the framework's own timeout throughout), back to the framework's own
      (`start(long_s)`) around work that is not a step (`relax()`: an evaluation, a checkpoint save, an
      epoch's end) until two more steps finished;
    - the stall watchdog (`StallWatchdog`, with `Job`'s settings): a trainer blocked in a collective
      obeys SIGTERM within seconds (exit 128 + the signal), and, while the steady timeout is in force, one
      whose steps stopped for that timeout + its longest recent step + 5 s leaves with a `Timed out` peer
      failure, after aborting the process groups (NCCL) so that the rescue path can save the replica
      (`rescuing()`, then `leave()` ends the process with that verdict).

    Create it in the main thread (the watchdog sees signals through `signal.set_wakeup_fd`)."""

    def __init__(self, steady_timeout_s: float = 0.0, long_s: float = 1800.0) -> None:
        if steady_timeout_s < 0:
            raise ValueError(f"steady_timeout_s must be >= 0 (0: off), got {steady_timeout_s!r}")
        self.timeouts = CollectiveTimeout(long_s, steady_timeout_s)
        self.watchdog = StallWatchdog(lambda: self.timeouts.current_s if self.timeouts.steady else 0.0,
                                      abort=lambda: abort_process_groups(self.timeouts.groups))
        self._stop_group: Any = None  # the stop agreement's side group, once added to the timed-out groups

    def start(self, long_s: float | None) -> None:
        """Training starts: `long_s` is the timeout the framework gave its process group (what `relax()`
        goes back to); None: keep the one given at creation."""
        if long_s:
            self.timeouts.long_s = float(long_s)
            if self.timeouts.steady_s > self.timeouts.long_s:
                log.warning("steady_timeout_s %g is longer than the process group's own timeout %g s",
                            self.timeouts.steady_s, self.timeouts.long_s)

    def step(self, stop: StopRequest | None = None) -> None:
        """Once per optimizer step, on every rank (after the stop agreement: its side group, if any, then
        times out with the others)."""
        self.timeouts.step()
        self.watchdog.step()
        if stop is not None and stop.group is not None and stop.group is not self._stop_group:
            self.timeouts.add_group(stop.group)  # once: comparing process groups costs microseconds a step
            self._stop_group = stop.group

    def relax(self) -> None:
        """Before work that is not a step, on every rank alike (the others may wait for it in a collective).
        Never shortens the first steps' long timeout (a framework may validate before training: a sanity check)."""
        calm_from = self.timeouts._calm_from
        self.timeouts.relax()
        self.timeouts._calm_from = max(calm_from, self.timeouts._calm_from)
        self.watchdog.busy()  # a SIGTERM during a save waits for the next step, not the save's middle

    def alive(self) -> None:
        """Such work made progress (an evaluation batch): the main thread is not blocked."""
        self.watchdog.alive()

    def rescuing(self) -> None:
        """The main thread is out of the failed collective and writes its rescue checkpoint now."""
        self.watchdog.release()

    @property
    def verdict(self) -> tuple[int, str] | None:
        """The watchdog's silent-peer exit (code, message), once it gave one."""
        return self.watchdog.verdict

    def leave(self) -> None:
        """After the rescue checkpoint: where the watchdog found a silent peer, end the process with its
        verdict (a peer failure to the launcher), not with whatever the aborted collective raised."""
        if self.watchdog.verdict is not None:
            self.watchdog.exit()

    def close(self) -> None:
        """Every exit path of the callback (the watchdog's thread and its wakeup fd)."""
        self.watchdog.close()


class PacedStop(StopRequest):
    """`StopRequest` agreed every few steps rather than every step: the callbacks' per-step cost.

    One agreement (an asynchronous 2-int all-reduce on a CPU tensor over Gloo, read at the next check)
    costs a few hundred microseconds on a busy CPU node: 1-3% of a 10 ms step. So each rank proposes
    how many steps make about `target_s` seconds (its own step time), and the all-reduce carries the
    stop flag (MAX) with the proposals (the smallest wins): every rank gets the same flag and the same
    next check step from the same result, so all stop at the same step. A stop is seen within about
    2 x `target_s` (at least the next step, at most `max_every` steps)."""

    def __init__(self, target_s: float = 0.5, max_every: int = 100) -> None:
        super().__init__()
        self.target_s, self.max_every = target_s, max_every
        self.every = 1
        self._countdown = 1
        self._last: float | None = None
        self._step_s: float | None = None

    @property
    def due(self) -> bool:
        """The next step() agrees (waits for the others); the steps between only count down."""
        return self._countdown <= 1

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
