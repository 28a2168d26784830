"""Files on a volume that others write too: atomic writes (temp name, fsync, rename), bounded reads of files
nobody vouches for (`read_regular_file`, a commit marker's JSON, a torch.save archive's records), read retries
(an I/O error is not corruption) and a full volume told apart from other errors."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import math
import os
import re
import stat
import time
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..contract import CHECKPOINT_DIR_ENV
from .errors import (CheckpointDirError, CheckpointVolumeError, CheckpointVolumeFull, CheckpointVolumeUnreadable,
                     CorruptCheckpoint)

log = logging.getLogger(__name__)
_TEMP = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$|^\.step-.+\.tmp\d*$", re.ASCII)  # ours, and the PID-named ones of 0.1
MARKER_LIMIT_BYTES = 1 << 16  # a commit marker or fence is a few hundred bytes of JSON; more is not ours
MARKER_DEPTH_LIMIT = 8  # a marker nests one object in another (a framework's "files"); json would recurse on
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[{\]}]', re.DOTALL)  # a string (skipped whole) or a bracket
_COUNTS = ("step", "bytes", "generation", "world_size")  # a marker's numbers that name a step, a size, a generation
_COUNT_LIMIT = 1 << 63
_TEXTS = ("run", "job", "namespace", "sha256")  # (a marker's "data": data_path says what is wrong with it)
READ_RETRIES = 3  # an I/O error while reading: 3 more tries, 0.5 s, 1 s, 2 s apart
READ_RETRY_BACKOFF_SECONDS = 0.5
_FULL = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if e is not None)

T = TypeVar("T")


def read_regular_file(path: str | os.PathLike, *, limit: int | None = None, size: int | None = None) -> bytes:
    """The bytes of `path` if it is a regular file (never through a symbolic link: lstat, O_NOFOLLOW) of
    exactly `size` bytes, or at most `limit`; else CorruptCheckpoint. A FIFO, a device, a directory or a
    link in a checkpoint directory is someone else's file: it is never opened (no hang on a FIFO, no
    endless read of /dev/zero), and a file larger than its marker says is never read (no MemoryError on
    a sparse file). FileNotFoundError passes through (removed meanwhile); other OSErrors are I/O errors."""
    path = Path(path)

    def check(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket")
            raise CorruptCheckpoint(f"{path} is {kind}, not a regular file: not read")
        if size is not None and st.st_size != size:
            raise CorruptCheckpoint(f"checkpoint {path} has {st.st_size} bytes, its commit marker says {size} "
                                    f"(truncated, torn or replaced)")
        if limit is not None and st.st_size > limit:
            raise CorruptCheckpoint(f"{path} has {st.st_size} bytes, more than the {limit} a marker may have")

    check(os.lstat(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise CorruptCheckpoint(f"{path} is a symbolic link, not a regular file: not read") from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        check(st)  # what was opened, not what was looked at
        data = f.read(st.st_size + 1)  # one byte more tells a file that grew since
    if len(data) != st.st_size:
        raise CorruptCheckpoint(f"{path} changed size while it was read ({st.st_size} -> {len(data)}+ bytes)")
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a marker holds")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def _nesting_exceeds(raw: bytes, limit: int) -> bool:
    """Whether JSON `raw` nests brackets deeper than `limit`: a linear scan, before json.loads recurses into them."""
    depth = 0
    for token in _JSON_TOKENS.finditer(raw):
        first = token.group()[:1]
        if first in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif first in (b"]", b"}"):
            depth -= 1
    return False


def read_marker_json(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object of the commit marker (or a framework's) at `path`, a regular file of at most
    MARKER_LIMIT_BYTES; CorruptCheckpoint naming it when it is not one: nested deeper than MARKER_DEPTH_LIMIT,
    NaN or Infinity (or a number that overflows to it), not an object, a step, size, generation or world size
    that is not an int from 0 to 2^63, a run, job, namespace or digest that is not a string (or null). Whatever it
    says is then safe to compare and count. FileNotFoundError and other OSErrors (I/O) pass through."""
    raw = read_regular_file(path, limit=MARKER_LIMIT_BYTES)
    try:
        if _nesting_exceeds(raw, MARKER_DEPTH_LIMIT):
            raise ValueError(f"brackets nested deeper than {MARKER_DEPTH_LIMIT}")
        marker = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite)
        if not isinstance(marker, dict):
            raise ValueError(f"a JSON {type(marker).__name__}, not an object")
        for key in _COUNTS:
            if key in marker and (type(marker[key]) is not int or not 0 <= marker[key] < _COUNT_LIMIT):
                raise ValueError(f"{key!r} is a {type(marker[key]).__name__} out of 0..2^63, not a count")
        for key in _TEXTS:
            if marker.get(key) is not None and not isinstance(marker[key], str):  # null: no job name, no namespace
                raise ValueError(f"{key!r} is a {type(marker[key]).__name__}, not a string")
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise CorruptCheckpoint(f"commit marker {path} is not valid ({e})") from None
    return marker



def check_archive(data: bytes | memoryview | None, path: Path) -> None:
    """CorruptCheckpoint unless `data` (None: the file at `path`) is a zip archive as torch.save writes it: stored
    records only (it compresses none) whose sizes add up to no more than the archive's own. torch.load inflates
    whatever a record says: a compressed one of 256 KB takes 257 MiB before it fails or loads. Reads the central
    directory only; an I/O error reading the file passes through (it is not corruption)."""
    size = os.stat(path).st_size if data is None else len(data)
    try:
        with zipfile.ZipFile(path if data is None else io.BytesIO(data)) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as e:
        raise CorruptCheckpoint(f"checkpoint {path} is not a torch.save archive ({type(e).__name__}: {e})") from None
    packed = [r.filename for r in records if r.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise CorruptCheckpoint(f"checkpoint {path} holds {len(packed)} compressed record(s) ({packed[0][:80]!r}): "
                                f"torch.save writes none, and torch.load would inflate them unchecked; not loaded")
    unpacked = sum(r.file_size for r in records)
    if unpacked > size:
        raise CorruptCheckpoint(f"checkpoint {path}'s records claim {unpacked} bytes in a {size}-byte archive; "
                                f"not loaded")


def _volume_full(e: OSError, directory: Path, what: str) -> CheckpointVolumeFull:
    return CheckpointVolumeFull(directory, f"{e.strerror or e} while writing {what}: free space on the volume "
                                           f"or give its claim more capacity; the job is retried", code=e.errno)


def volume_full(error: BaseException, directory: str | os.PathLike, what: str) -> CheckpointVolumeFull | None:
    """`error`, raised while something (ours or a framework's writer) wrote `what` into `directory`, as
    `CheckpointVolumeFull` when the volume was full, else None. Full: an ENOSPC or EDQUOT `OSError` in the
    exception's chain (causes and contexts), or, for a writer that does not keep the errno (torch.save's
    C++ stream raises a bare RuntimeError), a volume with no space left for unprivileged writers now."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, CheckpointVolumeFull):
            return e
        if isinstance(e, OSError) and e.errno in _FULL:
            return _volume_full(e, Path(directory), what)
        e = e.__cause__ or e.__context__
    try:
        space = os.statvfs(directory)
    except OSError:
        return None
    if space.f_bavail == 0:
        return _volume_full(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), Path(directory), what)
    return None


def retry_reads(read: Callable[[], T], what: str, directory: str | os.PathLike, *, retries: int | None = None,
                backoff_s: float | None = None) -> T:
    """`read()`, again after an OSError (a transient I/O error is not corruption), `retries` times (default
    READ_RETRIES) with a doubling pause from `backoff_s` (default READ_RETRY_BACKOFF_SECONDS); then
    CheckpointVolumeUnreadable naming `directory`. A FileNotFoundError that means "not there" (not an I/O
    error) is `read`'s to catch."""
    retries = READ_RETRIES if retries is None else retries
    backoff_s = READ_RETRY_BACKOFF_SECONDS if backoff_s is None else backoff_s
    for attempt in range(retries + 1):
        try:
            return read()
        except CheckpointVolumeError:
            raise
        except OSError as e:
            if attempt == retries:
                raise CheckpointVolumeUnreadable(
                    directory, f"{what} failed {attempt + 1} times, last with {type(e).__name__}: {e}; no "
                               f"checkpoint was skipped or removed, the job is retried") from e
            pause = backoff_s * 2 ** attempt
            log.warning("%s failed (%s: %s): trying again in %.1f s", what, type(e).__name__, e, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")



def _unlink_file(path: Path) -> bool:
    """Remove `path` (a link itself, never its target); True once it is gone. A directory is not ours to
    remove (a checkpoint writes none under these names): left in place with a warning, False."""
    try:
        path.unlink(missing_ok=True)
        return True
    except OSError as e:
        if e.errno not in (errno.EISDIR, errno.EPERM) or not path.is_dir():
            raise
        log.warning("%s is a directory, not a file of this job's checkpoints: left in place (remove it)", path)
        return False


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """Write `path` so that readers see the old content or the new one, never a mix. A full volume
    (ENOSPC, EDQUOT) raises `CheckpointVolumeFull` naming the directory; no temp file is left behind."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)  # a failed write leaves no stray temp file (a retry needs the space)
            raise
        _fsync_dir(path.parent)
    except CheckpointVolumeError:
        raise
    except OSError as e:
        if e.errno in _FULL:
            raise _volume_full(e, path.parent, f"{path.name} ({len(data)} bytes)") from e
        if e.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST) and stat.S_ISDIR(os.lstat(path).st_mode):
            raise CheckpointDirError(f"{path} is a directory where this job writes a file: remove it (this job "
                                     f"did not write it) and restart the job") from None
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, sort_keys=True) + "\n").encode())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # makes the rename itself durable
    finally:
        os.close(fd)


def check_writable(directory: str | os.PathLike) -> Path:
    """Create `directory` if needed and prove that this process can write, fsync and rename in it.

    Raises CheckpointDirError naming the path, the user and the fix (CheckpointVolumeFull when the
    volume is full). Call it at start-up, so a misconfigured volume fails the job in seconds instead
    of at the first save, after training."""
    path = Path(directory)
    who = f"uid {os.getuid()} gid {os.getgid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{uuid.uuid4().hex}"  # this process's own: what else is there is not ours
        atomic_write_bytes(probe, b"probe")
        probe.unlink()
    except CheckpointVolumeError:
        raise
    except OSError as e:
        if e.errno in _FULL:
            raise _volume_full(e, path, "a probe file") from e
        hint = ("give the pod fsGroup matching the trainer's group (DDPJob spec.template.fsGroup, default "
                "1000) or mount the volume read-write" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
                else f"point {CHECKPOINT_DIR_ENV} / --checkpoint-dir at a writable directory")
        raise CheckpointDirError(f"checkpoint directory {path} is not writable by {who} "
                                 f"({e.strerror or e}): {hint}") from e
    return path
