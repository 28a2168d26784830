"""`CheckpointManager`: when a job's checkpoints are written (rank 0; asynchronously from a CPU snapshot), read
back before anything older goes, pruned to the newest `keep` good ones, and which one a trainer resumes from."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointDirError, CheckpointVolumeUnreadable, CorruptCheckpoint
from .fence import prune_fences
from .files import _TEMP, READ_RETRIES, READ_RETRY_BACKOFF_SECONDS, _unlink_file, check_writable, read_marker_json
from .layout import _CLAIM, _DATA, _MARKER, _canonical, adopt_legacy_job_directory
from .rescue import RescueCheckpoint
from .store import CheckpointStore

log = logging.getLogger(__name__)
STALE_TEMP_SECONDS = 300.0
_CHUNK = 8 << 20


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



class CheckpointManager(CheckpointStore):
    """`save(step, state)` on rank 0 (others return at once), `load_latest()` anywhere.

    `keep` >= 2 good checkpoints are kept, so a crash while writing the newest still leaves one. The directory,
    the job and its generation are the `CheckpointStore`'s (`job_name`, `namespace`, `generation`, `run_id`)."""

    def __init__(self, directory: str | os.PathLike, keep: int = 2, *, is_writer: bool = True,
                 async_save: bool = False, stale_temp_seconds: float = STALE_TEMP_SECONDS,
                 generation: int | None = None, job_name: str | None = None, run_id: str | None = None,
                 read_retries: int = READ_RETRIES, retry_backoff_s: float = READ_RETRY_BACKOFF_SECONDS,
                 namespace: str | None = None) -> None:
        if keep < 2:
            raise ValueError(f"keep must be >= 2, got {keep}")
        super().__init__(directory, is_writer=is_writer, generation=generation, job_name=job_name, run_id=run_id,
                         read_retries=read_retries, retry_backoff_s=retry_backoff_s, namespace=namespace)
        self.keep, self.async_save = keep, async_save
        self.stale_temp_seconds = stale_temp_seconds
        self._pool: dict[tuple, torch.Tensor] = {}  # snapshot buffers, reused once the last write is done
        if is_writer:
            if self.namespace is not None:
                adopt_legacy_job_directory(self.mount, self.job_name, self.namespace, run=self.run)
            self._refuse_links()  # before the probes: a link is never written through
            check_writable(self.root)
            check_writable(self.dir)
            self._refuse_links()
            self.clean_stale_temp_files()
            self._raise_fence()  # before anything is read: from now on an older generation commits nothing

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


    def _write_guarded(self, step: int, state: dict[str, Any]) -> None:
        try:
            self._write(step, state)
        except BaseException as e:  # handed to the training thread by wait()
            self._error = e

    def _write(self, step: int, state: dict[str, Any]) -> None:
        self._refuse_links()
        if (newer := self.newer_generation()) is not None:
            self._fenced(step, newer, "not written")
            return
        if not _unlink_file(self.marker(step)):  # rewriting a step (e.g. over a corrupt one): uncommit first
            raise CheckpointDirError(f"{self.marker(step)} is a directory where step {step}'s commit marker goes: "
                                     f"remove it (it is not this job's) and restart the job")
        size, digest = self._commit(step, state)
        if self._withdraw_if_fenced(step):
            return
        self._verify(step, size, digest, self.path(step))  # read back before anything older may go
        self.corrupt.discard(step)
        self.last_committed_step = step
        self._prune(step)

    def _commit(self, step: int, state: dict[str, Any]) -> tuple[int, str]:
        buf = io.BytesIO()
        torch.save(state, buf)
        size, digest = self._write_data(self.path(step), buf)
        self._write_marker(step, size, digest, self.generation, self.path(step))
        return size, digest

    def _verify(self, step: int, size: int, digest: str, data: Path) -> None:
        """Read the committed step back (marker and data) and check it is what was written: an I/O
        error is retried, then raised as CheckpointVolumeUnreadable, as is a mismatch (after uncommitting
        the step). Either way nothing is pruned. A survivor's rescue of the same step that committed its own
        file meanwhile stands: ours is removed."""
        def read_back() -> tuple[Any, int | None, str]:
            try:
                marker = read_marker_json(self.marker(step))
            except CorruptCheckpoint:
                marker = None
            rescue = self.rescue_path(step)
            if isinstance(marker, dict) and marker.get("data") == rescue.name and data != rescue:
                return marker, None, ""  # the only other writer of a step: a survivor's rescue
            h, n = hashlib.sha256(), 0
            with open(data, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    n += len(chunk)
            return marker, n, h.hexdigest()

        marker, n, got = self._retrying(read_back, f"reading back checkpoint step {step}")
        if n is None:
            data.unlink(missing_ok=True)
            log.info("checkpoint step %d: a survivor's rescue of it was committed meanwhile (%s); ours removed",
                     step, marker.get("data"))
            return
        expected = {"bytes": size, "sha256": digest}
        if (n, got) != (size, digest) or not isinstance(marker, dict) or \
                {k: marker.get(k) for k in expected} != expected:
            self.marker(step).unlink(missing_ok=True)
            data.unlink(missing_ok=True)
            raise CheckpointVolumeUnreadable(
                self.dir, f"checkpoint step {step} read back as {n} bytes with SHA-256 {got[:16]}... (marker "
                          f"{'intact' if isinstance(marker, dict) and marker.get('sha256') == digest else 'differs'}), "
                          f"written as {size} bytes with {digest[:16]}...: step {step} uncommitted, nothing pruned")

    def save_rescue(self, step: int, state: dict[str, Any]) -> bool:
        """Any rank, after a peer died: commit `state` as step `step` unless another survivor claimed
        that step, a checkpoint of it or of a later step exists, or a later generation has started on
        the directory. Synchronous. True if this process wrote it."""
        rescue = RescueCheckpoint(self, step, state)
        rescue.stayed()
        rescue.run()
        return bool(rescue.written)

    def _prune(self, verified: int) -> None:
        """After `verified` was committed and read back: keep the newest `keep` good checkpoints up to
        it and every good one newer than it (never ours to judge); remove the rest, corrupt ones,
        orphan data files and claims, stale fences and temp files. Best effort: a failure here loses
        nothing and the next save tries again."""
        try:
            self._refuse_links()
            committed = self.committed_steps()
            good = [s for s in committed if s not in self.corrupt]
            keep = {s for s in good if s > verified} | set([s for s in good if s <= verified][: self.keep])
            for step in committed:
                if step not in keep:
                    # Marker first: a crash in between leaves an orphan file, never a marker without data.
                    if _unlink_file(self.marker(step)):
                        _unlink_file(self.path(step))
                        _unlink_file(self.rescue_path(step))
                        self.corrupt.discard(step)
            for p in self.dir.iterdir():  # data files without a marker (torn writes of a killed writer), old claims
                m = _DATA.match(p.name) or _CLAIM.match(p.name)
                if m and (found := _canonical(p, m.group(1))) is not None and found not in keep:
                    _unlink_file(p)
            prune_fences(self.root, self.run)
            self.clean_stale_temp_files()
        except (OSError, CheckpointDirError) as e:
            log.warning("pruning old checkpoints in %s failed (a later save retries): %s", self.dir, e)

    def clean_stale_temp_files(self) -> list[Path]:
        """Remove temp files (of any writer, also of an earlier pod) untouched for stale_temp_seconds.

        A temp file being written has a fresh mtime, so a live writer elsewhere is never disturbed."""
        removed = []
        now = time.time()
        for d in dict.fromkeys((self.mount, self.root, self.dir)):
            if not d.is_dir():
                continue
            for p in d.iterdir():
                try:
                    if not _TEMP.match(p.name):
                        continue
                    st = p.lstat()
                    # A directory or link under a temp name is not ours: left alone.
                    if stat.S_ISREG(st.st_mode) and now - st.st_mtime >= self.stale_temp_seconds and _unlink_file(p):
                        removed.append(p)
                except FileNotFoundError:
                    continue
        return removed

    def load(self, step: int) -> dict[str, Any]:
        """Load one committed checkpoint, verifying size and checksum against its marker: CorruptCheckpoint
        if they differ; an I/O error is retried, then raised as CheckpointVolumeUnreadable."""
        self._refuse_links()
        return self._retrying(lambda: self._read_verified(step), f"reading checkpoint step {step} in {self.dir}")

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """Newest checkpoint that loads cleanly; corrupt ones are skipped with a warning (and, on
        the writer, removed by the next prune without counting towards `keep`). An I/O error is not
        corruption: the whole search is retried, then CheckpointVolumeUnreadable is raised; it never
        falls back to an older checkpoint or to none."""
        self._refuse_links()
        found = self._retrying(self._load_latest_once, f"looking for the newest checkpoint in {self.dir}")
        if found is None:
            self._mention_shared_layout()
        return found

    def _load_latest_once(self) -> tuple[int, dict[str, Any]] | None:
        for step in self.committed_steps():
            try:
                state = self._read_verified(step)
            except CorruptCheckpoint as e:
                log.warning("skipping unreadable checkpoint step %d: %s", step, e)
                self.corrupt.add(step)
                continue
            except FileNotFoundError as e:
                if self.marker(step).exists():  # a marker without its data: never a complete checkpoint
                    log.warning("skipping unreadable checkpoint step %d: %s", step, e)
                    self.corrupt.add(step)
                continue  # else pruned while we looked
            self.last_committed_step = step
            return step, state
        return None

    def _mention_shared_layout(self) -> None:
        """Earlier versions kept every job's checkpoints in <mount>/checkpoints/: say so rather than
        resume from what may be another job's."""
        if self.job_name is None:
            return
        legacy = self.mount / "checkpoints"
        with contextlib.suppress(OSError):
            steps = sorted((step for p in legacy.iterdir() if (m := _MARKER.match(p.name))
                            and (step := _canonical(p, m.group(1))) is not None), reverse=True)
            if steps:
                log.warning("no checkpoint of job %s in %s, but %s holds %d checkpoint(s) (newest step %d) in the "
                            "layout of earlier versions, shared by every job on the volume: not resumed from. To "
                            "resume from them, move them into %s", self.job_name, self.dir, legacy, len(steps),
                            steps[0], self.dir)
