"""Crash-safe checkpoints on a shared directory: rank 0 writes, every rank reads.

Layout under <dir>/checkpoints/:
    step-00000120.pt          torch.save of the state dict
    step-00000120.committed   JSON {"step", "bytes", "sha256", "time", "generation"}; written last, it is the commit
    step-00000120.rescue      a survivor's exclusive claim on writing step 120 as a rescue checkpoint

A write goes to a hidden temp name unique to this process (a uuid, never a PID: PIDs repeat across
pods on a shared volume), is fsynced, atomically renamed, then the commit marker is written the same
way. A checkpoint without a marker, or whose bytes do not match the marker, is never loaded: a
SIGKILL mid-write or a truncated file falls back to the previous checkpoint. Pruning keeps the newest
`keep` checkpoints that are known good (a corrupt one never counts), and removes orphan `.pt` files
and temp files nobody has touched for `stale_temp_seconds`.

Rescue checkpoints (`save_rescue`): when a peer dies, every surviving rank still holds the whole
replica at a step boundary, and any of them may write it, not only rank 0. Writers are fenced: the
step's claim file is created exclusively (one writer per step, whoever is first), a step that already
has a checkpoint is never rewritten, and a writer whose generation is older than any committed
checkpoint's (a partitioned worker of a replaced generation) writes nothing, or withdraws its commit
if such a checkpoint appears while it writes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_MARKER = re.compile(r"^step-(\d{8,})\.committed$")
_DATA = re.compile(r"^step-(\d{8,})\.pt$")
_CLAIM = re.compile(r"^step-(\d{8,})\.rescue$")
_TEMP = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$|^\.step-.+\.tmp\d*$")  # ours, and the PID-named ones of 0.1
STALE_TEMP_SECONDS = 300.0


class CheckpointDirError(RuntimeError):
    """The checkpoint directory cannot be used; the message names the path and the fix."""


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write `path` so that readers see the old content or the new one, never a mix."""
    tmp = _temp_name(Path(path))
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves no stray temp file
        raise
    _fsync_dir(Path(path).parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, sort_keys=True) + "\n").encode())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # makes the rename itself durable
    finally:
        os.close(fd)


def check_writable(directory: str | os.PathLike) -> Path:
    """Create `directory` if needed and prove that this process can write, fsync and rename in it.

    Raises CheckpointDirError naming the path, the user and the fix. Call it at start-up, so a
    misconfigured volume fails the job in seconds instead of at the first save, after training."""
    path = Path(directory)
    who = f"uid {os.getuid()} gid {os.getgid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path / f".write-probe-{uuid.uuid4().hex}", b"probe")
        for probe in path.glob(".write-probe-*"):
            probe.unlink(missing_ok=True)
    except OSError as e:
        hint = ("give the pod fsGroup matching the trainer's group (DDPJob spec.template.fsGroup, default "
                "1000) or mount the volume read-write" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
                else "point DDPJOB_CHECKPOINT_DIR / --checkpoint-dir at a writable directory")
        raise CheckpointDirError(f"checkpoint directory {path} is not writable by {who} "
                                 f"({e.strerror or e}): {hint}") from e
    return path


def cpu_snapshot(obj: Any, pool: dict[tuple, torch.Tensor] | None = None, key: tuple = ()) -> Any:
    """Deep copy with every tensor copied to CPU, so training can keep mutating the originals.

    With a `pool`, CPU buffers from the previous snapshot are reused: a fresh 100 MB allocation
    costs page faults on first touch (3-8x the memcpy itself on the benchmark box)."""
    if isinstance(obj, torch.Tensor):
        buf = pool.get(key) if pool is not None else None
        if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
            buf = torch.empty(obj.shape, dtype=obj.dtype, device="cpu",
                              pin_memory=obj.is_cuda)  # pinned: the device copy can be async
            if pool is not None:
                pool[key] = buf
        buf.copy_(obj.detach(), non_blocking=obj.is_cuda)
        return buf
    if isinstance(obj, dict):
        return {k: cpu_snapshot(v, pool, (*key, k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_snapshot(v, pool, (*key, i)) for i, v in enumerate(obj))
    return obj


class CheckpointManager:
    """`save(step, state)` on rank 0 (others return at once), `load_latest()` anywhere.

    `keep` >= 2 good checkpoints are kept, so a crash while writing the newest still leaves one."""

    def __init__(self, directory: str | os.PathLike, keep: int = 2, *, is_writer: bool = True,
                 async_save: bool = False, stale_temp_seconds: float = STALE_TEMP_SECONDS,
                 generation: int = 0) -> None:
        if keep < 2:
            raise ValueError(f"keep must be >= 2, got {keep}")
        self.root = Path(directory)
        self.dir = self.root / "checkpoints"
        self.keep, self.is_writer, self.async_save = keep, is_writer, async_save
        self.stale_temp_seconds = stale_temp_seconds
        self.generation = generation  # written into every marker: the fence of save_rescue
        self.last_committed_step: int | None = None
        self.corrupt: set[int] = set()  # steps found unreadable: never loaded, never counted as kept
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pool: dict[tuple, torch.Tensor] = {}  # snapshot buffers, reused once the last write is done
        if is_writer:
            check_writable(self.root)
            check_writable(self.dir)
            self.clean_stale_temp_files()

    def path(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}.pt"

    def marker(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}.committed"

    def claim(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}.rescue"

    # ---- writing ------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], *, blocking: bool = False) -> None:
        """Rank 0 only. Async mode returns after a CPU snapshot; the write runs on a thread."""
        if not self.is_writer:
            return
        self.wait()  # at most one write in flight; also surfaces a failed previous write
        if self.async_save and not blocking:
            snapshot = cpu_snapshot(state, self._pool)
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the non_blocking device-to-host copies must land first
            self._thread = threading.Thread(target=self._write_guarded, args=(step, snapshot),
                                            name=f"checkpoint-{step}", daemon=True)
            self._thread.start()
        else:
            self._write(step, state)

    def wait(self) -> None:
        """Block until the pending async write is committed; re-raise its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError("asynchronous checkpoint write failed") from err

    def _write_guarded(self, step: int, state: dict[str, Any]) -> None:
        try:
            self._write(step, state)
        except BaseException as e:  # handed to the training thread by wait()
            self._error = e

    def _write(self, step: int, state: dict[str, Any]) -> None:
        self.marker(step).unlink(missing_ok=True)  # rewriting a step (e.g. over a corrupt one): uncommit first
        self._commit(step, state)
        self.corrupt.discard(step)
        self.last_committed_step = step
        self._prune()

    def _commit(self, step: int, state: dict[str, Any]) -> None:
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getbuffer()
        atomic_write_bytes(self.path(step), data)
        marker = {"step": step, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "time": time.time(),
                  "generation": self.generation}
        atomic_write_json(self.marker(step), marker)

    def save_rescue(self, step: int, state: dict[str, Any]) -> bool:
        """Any rank, after a peer died: commit `state` as step `step` unless another survivor claimed
        that step, a checkpoint of it or of a later step exists, or a later generation has committed
        any checkpoint. Synchronous. True if this process wrote it."""
        if self.is_writer:
            with contextlib.suppress(Exception):  # a failed async write must not stop the rescue
                self.wait()
        newest = self.committed_steps()
        if (newest and newest[0] >= step) or self._newer_generation_committed():
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(self.claim(step), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False  # another survivor writes this step
        self._commit(step, state)
        if self._newer_generation_committed():  # a new generation committed while we wrote: withdraw
            self.marker(step).unlink(missing_ok=True)
            self.path(step).unlink(missing_ok=True)
            return False
        self.last_committed_step = step
        return True

    def _newer_generation_committed(self) -> bool:
        for step in self.committed_steps():
            with contextlib.suppress(OSError, ValueError):
                if json.loads(self.marker(step).read_text()).get("generation", 0) > self.generation:
                    return True
        return False

    def _prune(self) -> None:
        good = [s for s in self.committed_steps() if s not in self.corrupt]
        keep = set(good[: self.keep])
        for step in self.committed_steps():
            if step not in keep:
                # Marker first: a crash in between leaves an orphan file, never a marker without data.
                self.marker(step).unlink(missing_ok=True)
                self.path(step).unlink(missing_ok=True)
                self.corrupt.discard(step)
        for p in self.dir.iterdir():  # data files without a marker (torn writes of a killed writer), old claims
            m = _DATA.match(p.name) or _CLAIM.match(p.name)
            if m and int(m.group(1)) not in keep:
                p.unlink(missing_ok=True)
        self.clean_stale_temp_files()

    def clean_stale_temp_files(self) -> list[Path]:
        """Remove temp files (of any writer, also of an earlier pod) untouched for stale_temp_seconds.

        A temp file being written has a fresh mtime, so a live writer elsewhere is never disturbed."""
        removed = []
        now = time.time()
        for d in (self.root, self.dir):
            if not d.is_dir():
                continue
            for p in d.iterdir():
                try:
                    if _TEMP.match(p.name) and now - p.stat().st_mtime >= self.stale_temp_seconds:
                        p.unlink()
                        removed.append(p)
                except FileNotFoundError:
                    continue
        return removed

    # ---- reading ------------------------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Steps with a commit marker, newest first."""
        if not self.dir.is_dir():
            return []
        steps = [int(m.group(1)) for p in self.dir.iterdir() if (m := _MARKER.match(p.name))]
        return sorted(steps, reverse=True)

    def load(self, step: int) -> dict[str, Any]:
        """Load one committed checkpoint, verifying size and checksum against its marker."""
        marker = json.loads(self.marker(step).read_text())
        data = self.path(step).read_bytes()
        if len(data) != marker["bytes"]:
            raise ValueError(f"checkpoint {self.path(step)} has {len(data)} bytes, its commit marker says "
                             f"{marker['bytes']} (truncated or torn write)")
        digest = hashlib.sha256(data).hexdigest()
        if digest != marker["sha256"]:
            raise ValueError(f"checkpoint {self.path(step)} has SHA-256 {digest[:16]}..., its commit marker "
                             f"says {marker['sha256'][:16]}... (same size {len(data)} bytes: corrupted in place)")
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """Newest checkpoint that loads cleanly; corrupt ones are skipped with a warning (and, on
        the writer, removed by the next prune without counting towards `keep`)."""
        for step in self.committed_steps():
            try:
                state = self.load(step)
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is skipped the same way
                log.warning("skipping unreadable checkpoint step %d: %s", step, e)
                self.corrupt.add(step)
                continue
            self.last_committed_step = step
            return step, state
        return None
