"""One job's checkpoints on the volume (`CheckpointStore`): where each file of a step goes, the generation fence
over the directory, a step's data and commit marker written, and a committed step read back and verified. The
policy over them (when to write, read back, prune, which step to load) is `CheckpointManager`'s; a survivor's
`RescueCheckpoint` writes through the same store."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..contract import JOB_NAME_ENV, JOB_NAMESPACE_ENV
from .errors import CheckpointVolumeError, CorruptCheckpoint
from .fence import newer_generation, raise_fence, refuse_impossible_fence
from .files import (READ_RETRIES, READ_RETRY_BACKOFF_SECONDS, T, atomic_write_bytes, atomic_write_json,
                    check_archive, read_marker_json, read_regular_file, retry_reads)
from .layout import _MARKER, _canonical, fence_path, job_key, refuse_link, rendezvous_generation

log = logging.getLogger(__name__)


class CheckpointStore:
    """The files of one job's checkpoints under `<directory>/<namespace>.<job_name>/`
    (`contract.job_directory_name`): `job_name` (default `$DDPJOB_NAME`; "" for none) and `namespace` (default
    `$DDPJOB_NAMESPACE`; "" for none); `generation` and `run_id` default to torchrun's run id
    (`rendezvous_generation`). Creates nothing: the writer's set-up is `CheckpointManager`'s."""

    def __init__(self, directory: str | os.PathLike, *, is_writer: bool = True, generation: int | None = None,
                 job_name: str | None = None, run_id: str | None = None, read_retries: int = READ_RETRIES,
                 retry_backoff_s: float = READ_RETRY_BACKOFF_SECONDS, namespace: str | None = None) -> None:
        name = os.environ.get(JOB_NAME_ENV, "") if job_name is None else job_name
        namespace = os.environ.get(JOB_NAMESPACE_ENV, "") if namespace is None else namespace
        key = job_key(name, namespace)
        self.mount = Path(directory)
        self.job_name = name or None
        self.namespace = namespace if name and namespace else None
        self.root = self.mount / key if key else self.mount  # this job's own directory on the volume
        self.dir = self.root / "checkpoints"
        self.is_writer = is_writer
        self.read_retries, self.retry_backoff_s = read_retries, retry_backoff_s
        env = os.environ if run_id is None else {**os.environ, "TORCHELASTIC_RUN_ID": run_id}
        self.run, derived = rendezvous_generation(env)
        self.generation = derived if generation is None else generation  # in every marker: the fence
        self.fenced_by: int | None = None  # a newer generation found when this one tried to commit
        self.last_committed_step: int | None = None
        self.corrupt: set[int] = set()  # steps found corrupt: never loaded, never counted as kept
        self._thread: threading.Thread | None = None  # the write in flight (`CheckpointManager.save`)
        self._error: BaseException | None = None  # what it raised, for `wait`

    def _refuse_links(self) -> None:
        """The job's directory and its checkpoints/ are real directories (or absent): CheckpointDirError otherwise.
        Before every write, prune and load: a link put there later is not followed either. (Without a job name the
        job's directory is the mount itself, the user's to choose.)"""
        if self.root != self.mount:
            refuse_link(self.root, "the job's checkpoint directory")
        refuse_link(self.dir, "the job's checkpoints directory")

    def path(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}.pt"

    def rescue_path(self, step: int) -> Path:
        """A rescue's data file: never the one the writer's own save of that step (maybe in flight when the peer
        failed) writes. The marker names the file it commits."""
        return self.dir / f"step-{step:08d}.rescue.pt"

    def data_path(self, step: int, marker: Mapping[str, Any]) -> Path:
        """The data file a step's marker commits (`data`; a marker without it commits `path(step)`). Any other
        name is not a file of this step: CorruptCheckpoint."""
        name = marker.get("data", self.path(step).name)
        for candidate in (self.path(step), self.rescue_path(step)):
            if name == candidate.name:
                return candidate
        raise CorruptCheckpoint(f"commit marker {self.marker(step)} names {str(name)[:80]!r}, which is not a data "
                                f"file of step {step}")

    def marker(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}.committed"

    def claim(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}.rescue"

    def fence(self, generation: int) -> Path:
        return fence_path(self.root, self.run, generation)

    # ---- fencing ------------------------------------------------------------------------------

    def _markers(self) -> Iterable[Path]:
        return (self.marker(step) for step in self.committed_steps())

    def _raise_fence(self) -> None:
        refuse_impossible_fence(self.root, self.run, self.generation, self._markers())
        raise_fence(self.root, self.run, self.generation, self._markers())

    def newer_generation(self) -> int | None:
        """The newest generation of this run (job uid) newer than ours that started on this directory
        or committed a checkpoint in it; None while ours is the newest."""
        return newer_generation(self.root, self.run, self.generation, self._markers())

    def _withdraw_if_fenced(self, step: int) -> bool:
        """After our marker is in place: a newer generation that appeared meanwhile wins; ours goes."""
        newer = self.newer_generation()
        if newer is None:
            return False
        self.marker(step).unlink(missing_ok=True)
        self.path(step).unlink(missing_ok=True)
        self._fenced(step, newer, "withdrawn")
        return True

    def _fenced(self, step: int, newer: int, what: str) -> None:
        self.fenced_by = newer
        log.warning("checkpoint of step %d %s: generation %d has started on %s, this trainer is of generation "
                    "%d (replaced; it commits nothing)", step, what, newer, self.root, self.generation)

    def wait(self) -> None:
        """Block until the pending async write is committed; re-raise its error, if any (a
        `CheckpointVolumeError` as itself, so its message and exit code reach the process's end)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            if isinstance(err, CheckpointVolumeError):
                raise err
            raise RuntimeError("asynchronous checkpoint write failed") from err


    # ---- committing a step ---------------------------------------------------------------------

    def _write_data(self, path: Path, buf: io.BytesIO) -> tuple[int, str]:
        data = buf.getbuffer()
        digest = hashlib.sha256(data).hexdigest()
        atomic_write_bytes(path, data)
        return len(data), digest

    def _write_marker(self, step: int, size: int, digest: str, generation: int, data: Path) -> None:
        try:
            atomic_write_json(self.marker(step), {"step": step, "bytes": size, "sha256": digest, "data": data.name,
                                                  "time": time.time(), "generation": generation, "run": self.run,
                                                  "job": self.job_name, "namespace": self.namespace})
        except BaseException:
            with contextlib.suppress(OSError):
                data.unlink(missing_ok=True)  # never committed: give its space back
            raise

    # ---- reading ------------------------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Steps with a commit marker under the writer's own name, newest first (valid or not: see `holds`)."""
        if not self.dir.is_dir():
            return []
        steps = [step for p in self.dir.iterdir()
                 if (m := _MARKER.match(p.name)) and (step := _canonical(p, m.group(1))) is not None]
        return sorted(steps, reverse=True)

    def holds(self, step: int) -> bool:
        """Whether `step` is committed as far as a cheap look tells: a valid marker and the regular file of the size
        it names (no hash). An empty or invalid marker, maybe of a huge step, counts for nothing."""
        try:
            marker = read_marker_json(self.marker(step))
            st = os.lstat(self.data_path(step, marker))
            return marker.get("step", step) == step and stat.S_ISREG(st.st_mode) and st.st_size == marker["bytes"]
        except (OSError, CorruptCheckpoint, KeyError):
            return False

    def _retrying(self, read: Callable[[], T], what: str) -> T:
        """`read()`, again after an OSError (a transient I/O error is not corruption), `read_retries`
        times with a doubling pause; then CheckpointVolumeUnreadable."""
        return retry_reads(read, what, self.dir, retries=self.read_retries, backoff_s=self.retry_backoff_s)

    def _read_verified(self, step: int) -> dict[str, Any]:
        """One try: OSError for an I/O error, CorruptCheckpoint when the files are not a good checkpoint."""
        marker = read_marker_json(self.marker(step))
        size, sha = marker.get("bytes"), marker.get("sha256")
        if size is None or not isinstance(sha, str) or marker.get("step", step) != step:
            raise CorruptCheckpoint(f"commit marker {self.marker(step)} is not valid (bytes {size!r}, sha256 "
                                    f"{str(sha)[:16]!r}, step {marker.get('step')!r})")
        path = self.data_path(step, marker)
        data = read_regular_file(path, size=size)  # before reading: never more than the marker says
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha:
            raise CorruptCheckpoint(f"checkpoint {path} has SHA-256 {digest[:16]}..., its commit marker "
                                    f"says {str(sha)[:16]}... (same size {len(data)} bytes: corrupted in place)")
        check_archive(data, path)
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - the bytes are what was committed and do not load
            raise CorruptCheckpoint(f"checkpoint {path} does not load ({type(e).__name__}: {e})") from e
