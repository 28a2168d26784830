"""Crash-safe checkpoints on a shared directory: rank 0 writes, every rank reads.

Layout, with a job name (`$DDPJOB_NAME`: every DDPJob worker has one) and namespace (`$DDPJOB_NAMESPACE`),
under the mount <dir> (`contract.job_directory_name`):
    <dir>/<namespace>.<job>/generation-00000003-<run>.fence   the newest rendezvous generation that started on it
    <dir>/<namespace>.<job>/checkpoints/
        step-00000120.pt          torch.save of the state dict
        step-00000120.committed   JSON {"step", "bytes", "sha256", "time", "generation", "run", "job", "namespace"};
                                  written last, it is the commit
        step-00000120.rescue      a survivor's exclusive claim on writing step 120 as a rescue checkpoint
Without a namespace (a plain script naming a job) the job's directory is <dir>/<job>; without a job name
the same files live directly under <dir>. Two jobs that share storage, also of one name in two namespaces,
thus never see each other's steps. Earlier versions used <dir>/<job>: the writer adopts that directory
(one rename) only where its fences and markers show it is this very job's (`adopt_legacy_job_directory`).

Only the writer's own names count: `step-` and `generation-` with the step in 8 digits (more only for a
step of 10^8 or more, never a leading zero beyond 8). Any other spelling (`step-000000040.committed`) is
not ours: never loaded, never counted in `keep`, never removed; one warning names it. The job's directory
and its checkpoints/ are never used through a symbolic link: `CheckpointDirError` names the path and the fix.

A write goes to a hidden temp name unique to this process (a uuid, never a PID: PIDs repeat across
pods on a shared volume), is fsynced, atomically renamed, then the commit marker is written the same
way. A checkpoint without a marker, or whose bytes do not match the marker, is never loaded: a
SIGKILL mid-write or a truncated file falls back to the previous checkpoint. An I/O error while
reading is not corruption: it is retried, then raised as `CheckpointVolumeUnreadable`, so a flaky
volume never makes a trainer start over from step 0. A save reads its checkpoint back and checks
it before anything is pruned; pruning then keeps the newest `keep` good checkpoints (a corrupt one
never counts) and never removes a good one newer than the one just verified, and removes orphan
`.pt` files and temp files nobody has touched for `stale_temp_seconds`. A full volume (ENOSPC,
EDQUOT) raises `CheckpointVolumeFull` and leaves no temp file behind.

Files someone else put there are never trusted: a checkpoint or marker is read only if it is a regular
file (lstat, opened O_NOFOLLOW|O_NONBLOCK: a FIFO, a device or a link is skipped as corrupt, never opened
or followed) of the size its marker says (a marker: a few KiB at most); steps and generations are ASCII
digits; a directory under a checkpoint's name is left in place with a warning, never removed. A marker is
parsed bounded (`read_marker_json`: nesting depth, no NaN or Infinity, every count a non-negative 64-bit
int) and one that is not valid counts for nothing (not as a later step, not as a newer generation). A
checkpoint's zip archive is checked before torch.load: only stored records (torch.save compresses none),
their sizes within the file's, so a planted archive cannot inflate without bound.

Fencing: every trainer knows its rendezvous generation (torchrun's run id `<job uid>-g<N>`, see
`rendezvous_generation`). The writer of a generation raises the directory's fence to it when it
starts (before it looks for a checkpoint to resume from), and every commit, periodic, final or
rescue, checks the fence and the committed markers before it writes and again after its marker is
in place: a trainer of an older generation (a partitioned worker of a replaced generation) commits
nothing, or withdraws its commit if the newer generation appeared while it wrote. A newer generation
already claimed when a writer *starts* cannot be true (generations start in order): the trainer stops
with `CheckpointFenceError` naming the files, rather than train on with every save skipped.

The HF and Lightning integrations (`runtime.frameworks`) use the same code for their own checkpoints:
the fence (`raise_fence`, `newer_generation`), the read retries (`retry_reads`) and the full volume
(`volume_full`).

Rescue checkpoints (`save_rescue`): when a peer dies, every surviving rank still holds the whole
replica at a step boundary, and any of them may write it, not only rank 0. The step's claim file is
created exclusively (one writer per step, whoever is first), and a step that already has a
checkpoint is never rewritten. In-process recovery writes it on a thread while the survivor joins the next
generation (`RescueCheckpoint`), and commits it in that generation when the generation resumes from exactly
that step: the survivor is one of its members (see `RescueCheckpoint` for why the fence still holds).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import math
import os
import re
import stat
import threading
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from .contract import JOB_NAME_ENV, JOB_NAMESPACE_ENV, job_directory_name

log = logging.getLogger(__name__)
# ASCII digits only (re.ASCII): `\d` also matches other scripts' digits, which int() takes for a step.
_MARKER = re.compile(r"^step-(\d{8,})\.committed$", re.ASCII)
_DATA = re.compile(r"^step-(\d{8,})(?:\.rescue)?\.pt$", re.ASCII)
_CLAIM = re.compile(r"^step-(\d{8,})\.rescue$", re.ASCII)
_FENCE = re.compile(r"^generation-(\d{8,})-([0-9a-f]{12})\.fence$", re.ASCII)
_TEMP = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$|^\.step-.+\.tmp\d*$", re.ASCII)  # ours, and the PID-named ones of 0.1
_RUN_ID = re.compile(r"^(?P<run>.+)-g(?P<generation>\d+)$", re.ASCII)  # the operator's rendezvous id: <job uid>-g<N>
MARKER_LIMIT_BYTES = 1 << 16  # a commit marker or fence is a few hundred bytes of JSON; more is not ours
_JOB_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")  # one safe path component
# A DNS-1123 label (a Kubernetes namespace): no '.', so `<namespace>.<name>` splits one way only.
_NAMESPACE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$", re.ASCII)
MARKER_DEPTH_LIMIT = 8  # a marker nests one object in another (a framework's "files"); json would recurse on
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[{\]}]', re.DOTALL)  # a string (skipped whole) or a bracket
_COUNTS = ("step", "bytes", "generation", "world_size")  # a marker's numbers that name a step, a size, a generation
_COUNT_LIMIT = 1 << 63
_TEXTS = ("run", "job", "namespace", "sha256")  # (a marker's "data": data_path says what is wrong with it)
STALE_TEMP_SECONDS = 300.0
READ_RETRIES = 3  # an I/O error while reading: 3 more tries, 0.5 s, 1 s, 2 s apart
READ_RETRY_BACKOFF_SECONDS = 0.5
_CHUNK = 8 << 20

# The checkpoint volume cannot be used for a reason that is not the script's: the trainer exits with
# this code (EX_TEMPFAIL of sysexits.h) and an error message that starts with one of the prefixes
# below and names the directory, and the job is retried rather than failed as a bug.
CHECKPOINT_VOLUME_EXIT_CODE = 75
CHECKPOINT_VOLUME_FULL_EXIT_CODE = CHECKPOINT_VOLUME_EXIT_CODE
CHECKPOINT_VOLUME_UNREADABLE_EXIT_CODE = CHECKPOINT_VOLUME_EXIT_CODE
CHECKPOINT_VOLUME_FULL_PREFIX = "checkpoint volume full:"
CHECKPOINT_VOLUME_UNREADABLE_PREFIX = "checkpoint volume unreadable:"
_FULL = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if e is not None)

T = TypeVar("T")


class CheckpointDirError(RuntimeError):
    """The checkpoint directory cannot be used; the message names the path and the fix."""


class CheckpointFenceError(CheckpointDirError):
    """A trainer starting on a directory that claims a newer generation of its own job already started
    there: generations start one after another, so the claim cannot be true (a file left or copied in).
    Training on would skip every save; the job stops instead, naming the files and the fix."""


class CorruptCheckpoint(ValueError):
    """A committed checkpoint whose bytes are not what its marker says, or do not load: never used."""


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


_ignored_names: set[Path] = set()  # warned about once each


def _canonical(path: Path, digits: str) -> int | None:
    """The step (or generation) that `digits` in `path`'s name spell if they are the writer's own spelling
    (`%08d`), else None: a name this trainer never writes is someone else's file, ignored with one warning."""
    number = int(digits)
    if f"{number:08d}" == digits:
        return number
    if path not in _ignored_names:
        _ignored_names.add(path)
        log.warning("%s is not a name this trainer writes (%d is written %08d): ignored, never loaded, counted "
                    "or removed (remove it if nobody needs it)", path, number, number)
    return None


def job_key(name: str, namespace: str) -> str:
    """The job's directory under the mount (`contract.job_directory_name`), after refusing a job name or a
    namespace that is not one safe path component (CheckpointDirError naming the variable and the fix)."""
    if name and not _JOB_NAME.match(name):
        raise CheckpointDirError(f"job name {name!r} ({JOB_NAME_ENV}) cannot name a checkpoint directory: use letters, "
                                 f"digits, '.', '-' and '_' (a Kubernetes object name)")
    if name and namespace and not _NAMESPACE.match(namespace):
        raise CheckpointDirError(f"namespace {namespace!r} ({JOB_NAMESPACE_ENV}) cannot name a checkpoint directory: "
                                 f"use a Kubernetes namespace (lower-case letters, digits and '-', at most 63)")
    return job_directory_name(name or None, namespace or None)


def refuse_link(path: str | os.PathLike, what: str) -> None:
    """CheckpointDirError when `path` (a directory the trainer writes, prunes or loads in) is a symbolic link or
    not a directory; nothing when it is a real directory or absent. Never followed: its target is someone else's."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        target = ""
        with contextlib.suppress(OSError):
            target = f" (to {os.readlink(path)})"
        raise CheckpointDirError(f"{what} {path} is a symbolic link{target}: the trainer never writes, prunes or "
                                 f"loads through one. Fix: replace the link with a real directory (move into it what "
                                 f"should be resumed from), or point DDPJOB_CHECKPOINT_DIR at the link's target volume")
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointDirError(f"{what} {path} is not a directory: remove it (this job did not write it) and "
                                 f"restart the job")


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


class CheckpointVolumeError(OSError):
    """The checkpoint volume failed us (full, or unreadable after retries): an infrastructure
    condition, not the script's bug. `str(error)` starts with the class's `prefix` and names the
    directory; `record()` hands it to torchrun and returns `exit_code` (75) for the process to exit with."""

    prefix = ""
    exit_code = CHECKPOINT_VOLUME_EXIT_CODE

    def __init__(self, directory: str | os.PathLike, detail: str, *, code: int | None = None) -> None:
        super().__init__(f"{self.prefix} {directory}: {detail}")
        self.directory, self.detail = Path(directory), detail
        self.errno = code
        self.time = time.time()  # when it happened: torchrun takes the earliest failure as the cause

    def __reduce__(self):  # pickles (to another process) with its own arguments, not OSError's
        return type(self), (self.directory, self.detail), {"errno": self.errno, "time": self.time}

    def record(self) -> int:
        """Write this error where torchrun reads a failed trainer's error (`$TORCHELASTIC_ERROR_FILE`,
        as torch's `@record` does, with the message itself first, so the pod's termination message reads
        `rank R ... exited with code 75: checkpoint volume full: <dir>: ...`); return `exit_code`.

            try:
                code = main()
            except CheckpointVolumeError as e:
                code = e.record()
            exit_process(code)
        """
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            stack = "".join(traceback.format_exception(type(self), self, self.__traceback__))
            data = {"message": {"message": str(self), "extraInfo": {"py_callstack": stack,
                                                                     "timestamp": str(int(self.time))}}}
            with contextlib.suppress(OSError):
                Path(path).write_text(json.dumps(data))
        return self.exit_code


class CheckpointVolumeFull(CheckpointVolumeError):
    """ENOSPC or EDQUOT while writing to the checkpoint volume."""

    prefix = CHECKPOINT_VOLUME_FULL_PREFIX


class CheckpointVolumeUnreadable(CheckpointVolumeError):
    """Reading the checkpoint volume kept failing (I/O errors, retried), or a checkpoint did not read
    back as written: nothing was skipped as corrupt and nothing was pruned."""

    prefix = CHECKPOINT_VOLUME_UNREADABLE_PREFIX


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


# ---- generation fences (see "Fencing" above), of a CheckpointManager's directory or a framework's -------

def _run_tag(run: str) -> str:
    return hashlib.sha256(run.encode()).hexdigest()[:12]


def fence_path(root: str | os.PathLike, run: str, generation: int) -> Path:
    return Path(root) / f"generation-{generation:08d}-{_run_tag(run)}.fence"


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


def rendezvous_generation(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(run, generation) of this trainer. Under DDPJob, from torchrun's run id (`TORCHELASTIC_RUN_ID`, the
    rendezvous id `<job uid>-g<N>`): run is the job uid, generation N, right also for an agent that
    joins later generations in place. Otherwise (a plain script, another rendezvous id) ("",
    `$DDPJOB_GENERATION` or 0)."""
    e = os.environ if environ is None else environ
    m = _RUN_ID.match(e.get("TORCHELASTIC_RUN_ID", ""))
    if m:
        return m["run"], int(m["generation"])
    raw = e.get("DDPJOB_GENERATION", "")
    try:
        return "", int(raw) if raw else 0
    except ValueError as err:
        raise ValueError(f"environment DDPJOB_GENERATION must be an integer, got {raw!r}") from err


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
                else "point DDPJOB_CHECKPOINT_DIR / --checkpoint-dir at a writable directory")
        raise CheckpointDirError(f"checkpoint directory {path} is not writable by {who} "
                                 f"({e.strerror or e}): {hint}") from e
    return path


_not_adopted: set[Path] = set()  # said so once
_MARKER_NAMES = re.compile(r"\.committed$|^ddpjob\.committed\.json$|\.ddpjob\.json$")  # ours and the frameworks'
_ADOPTION_SCAN_LIMIT = 100_000  # entries looked at before giving up on proving a directory is this job's


def _whose(directory: Path, run: str, namespace: str) -> str | None:
    """Why `directory` (a job's directory in the layout before namespaces) cannot be shown to be the job of
    `run` (its uid) in `namespace`; None when it can: at least one fence or valid commit marker in it (ours
    or a framework's, up to three levels down, never through a link) names `run`, and none names another
    run or another namespace."""
    tag, ours, seen = _run_tag(run), 0, 0
    pending = [(directory, 0)]
    while pending:
        folder, depth = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                seen += 1
                if seen > _ADOPTION_SCAN_LIMIT:
                    return f"it holds more than {_ADOPTION_SCAN_LIMIT} files, too many to check"
                if entry.is_dir(follow_symlinks=False):
                    if depth < 2:
                        pending.append((Path(entry.path), depth + 1))
                    continue
                if (m := _FENCE.match(entry.name)) and _canonical(Path(entry.path), m.group(1)) is not None:
                    if m.group(2) != tag:
                        return f"{entry.path} is the fence of another run (tag {m.group(2)}; this job's is {tag})"
                    ours += 1
                elif _MARKER_NAMES.search(entry.name):
                    try:
                        marker = read_marker_json(entry.path)
                    except (OSError, CorruptCheckpoint):
                        continue  # counts for nothing, either way
                    if marker.get("run", "") != run:
                        return f"{entry.path} was committed by run {marker.get('run', '')[:64]!r}, not {run!r}"
                    if marker.get("namespace") not in (None, namespace):  # markers of before name none
                        return f"{entry.path} was committed in namespace {marker['namespace'][:64]!r}"
                    ours += 1
    return None if ours else "no fence or commit marker in it names this job's run"


def adopt_legacy_job_directory(mount: str | os.PathLike, name: str, namespace: str, *,
                               run: str | None = None) -> bool:
    """Carry a job's files over from the layout before namespaces (`<mount>/<name>`) to its directory now
    (`<mount>/<namespace>.<name>`, `contract.job_directory_name`): one atomic rename, by the writer at start,
    before it looks for a checkpoint. Only a real directory (never a link), only while the new one does not
    exist, and only when it is shown to be this very job's: its fences and commit markers name this job's run
    (the job's uid, from the rendezvous id; `run`, default `rendezvous_generation()`) and no other (`_whose`).
    Otherwise it is left untouched, with one line saying why and how to move it by hand. True once adopted."""
    if not name or not namespace:
        return False
    mount = Path(mount)
    legacy, target = mount / name, mount / job_directory_name(name, namespace)
    try:
        kind = os.lstat(legacy).st_mode
    except FileNotFoundError:
        return False
    if os.path.lexists(target):
        return False  # adopted already, or this job started in the new layout
    run = rendezvous_generation()[0] if run is None else run
    if stat.S_ISLNK(kind):
        why = "it is a symbolic link, never followed"
    elif not stat.S_ISDIR(kind):
        why = "it is not a directory"
    elif not run:
        why = "this trainer has no job uid (rendezvous id) to compare its files with"
    else:
        try:
            why = _whose(legacy, run, namespace)
        except OSError as e:  # unreadable: not shown to be this job's
            why = f"it could not be read ({e.strerror or e})"
    if why is None:
        try:
            os.rename(legacy, target)  # atomic; fails rather than merge into a directory created meanwhile
        except FileNotFoundError:
            return os.path.isdir(target)  # another process of this job adopted it first
        except OSError as e:
            why = f"renaming it failed ({e.strerror or e})"
        else:
            _fsync_dir(mount)
            log.info("adopted %s, this job's directory in the layout before namespaces, as %s", legacy, target)
            return True
    if legacy not in _not_adopted:  # once per process: the frameworks look at every lookup, on every rank
        _not_adopted.add(legacy)
        log.warning("%s (the layout before namespaces) was not adopted as this job's %s: %s. If it is this job's, "
                    "move it while the job is suspended: mv %s %s", legacy, target, why, legacy, target)
    return False


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


# Added to the rescue thread's niceness once it has read the tensors: its write (hash, file) then gives way to
# the hand-over training waits for (a spare's broadcast, a replacement's start on the node, the first steps).
RESCUE_NICENESS = 10


def _yield_cpu() -> None:
    """This thread (Linux: niceness is per thread) gives way to the process's and the node's other work; the
    write may take a little longer itself."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + RESCUE_NICENESS))
    except (OSError, AttributeError):  # no per-thread priority here: the write only competes a little more
        pass


class RescueCheckpoint:
    """A survivor's rescue checkpoint of `step` (any rank; `CheckpointManager.save_rescue` is its synchronous
    form). In-process recovery (`Job.recover`) runs it on a thread while the survivor joins the next generation:
    `read` is set once the state's tensors are serialized (from then on training may change them), and the
    commit waits for nothing but the write.

    The fence. A commit marker carries the generation it is committed in, and nothing commits in a generation
    once a newer one has started on the directory (its writer's fence file, or a marker of it). The rescue
    commits in the generation this process is a member of when its marker is written:
    - before `joined` or after `stayed` (the exit path): the failed generation, as any rescue: nothing once a
      newer generation has started there;
    - once `joined(g, resumed_step)`: this process is a member of generation g (it formed g's group with every
      rank of it), and g resumes from `resumed_step`. If that is `step`, the rescue is g's own starting point,
      written by one of its members: committed in g, it is exactly the checkpoint g itself would write at that
      step, so the fence of g (its replacement rank 0 raised it while the rescue was being written) does not
      withdraw it. Otherwise (g resumed from a later step a peer held) it is not written.
    A trainer left behind in an old generation (partitioned, frozen, not in g's group) never `joined` g, so it
    still commits nothing once g has started. Never either where a later step is committed (checked before and
    after the marker, as the fence is): a rescue only ever adds the newest checkpoint.

    `after_writer`: a step the job's writer (rank 0) saves itself, a periodic one, on another rank. The writer
    may be writing it at this moment (its save in flight when the peer failed). The rescue's own data file keeps
    the two apart whatever happens (`rescue_path`); this only spares a second copy of the step: such a rescue
    claims it once it is known that the writer was lost (`joined` a generation where rank 0 held no state) or on
    the exit path (`stayed`); where the writer lives on, its own save, or its own rescue, commits the step."""

    def __init__(self, manager: "CheckpointManager", step: int, state: dict[str, Any],
                 done: Callable[["RescueCheckpoint"], None] | None = None, *, after_writer: bool = False) -> None:
        """`done(self)`: called on the writing thread once it is decided (`written`, `generation`)."""
        self.manager, self.step, self.generation, self.done = manager, step, manager.generation, done
        self.after_writer = after_writer
        self._writer_kept = False
        self.state: dict[str, Any] | None = state
        self.read = threading.Event()  # the state's tensors are read: the caller may change them
        self.written: bool | None = None  # None: not decided yet
        self.error: BaseException | None = None
        self._settled = threading.Condition()
        self._member: tuple[int, int] | None = None  # (generation joined, the step it resumed from)
        self._stayed = False
        self._thread: threading.Thread | None = None

    def start(self) -> "RescueCheckpoint":
        self._thread = threading.Thread(target=self.run, name="ddpjob-rescue", daemon=True)
        self._thread.start()
        return self

    def joined(self, generation: int, resumed_step: int, writer_kept: bool = False) -> None:
        """This process is a member of `generation`, which resumes from `resumed_step`; `writer_kept`: the
        writer of the generation that failed is in it too."""
        with self._settled:
            self._member, self._writer_kept = (generation, resumed_step), writer_kept
            self._settled.notify_all()

    def stayed(self) -> None:
        """This process does not move on (the exit path): unless it `joined` a generation already, commit under
        the failed generation's fence or not at all."""
        with self._settled:
            self._stayed = self._member is None
            self._settled.notify_all()

    def join(self) -> bool:
        """Wait for the write; True if this process committed the step."""
        if self._thread is not None:
            self._thread.join()
        return bool(self.written)

    def run(self) -> None:
        try:
            self.written = self._save()
        except BaseException as e:  # noqa: BLE001 - the rescue must never hide the failure it follows
            self.error, self.written = e, False
            log.warning("rescue checkpoint of step %d not written: %s", self.step, e)
        finally:
            self.state = None
            self.read.set()
        if self.done is not None:
            self.done(self)

    def _claim(self) -> bool:
        """This process writes the step's rescue; False: another survivor does."""
        try:
            os.close(os.open(self.manager.claim(self.step), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        return True

    def _later_committed(self, than: int) -> bool:
        return any(s > than and self.manager.holds(s) for s in self.manager.committed_steps())

    def _save(self) -> bool:
        m, step = self.manager, self.step
        if self._later_committed(step - 1):
            return False
        if self._stayed and (newer := m.newer_generation()) is not None:
            m._fenced(step, newer, "(rescue) not written")
            return False
        m._refuse_links()  # before mkdir: never created, nor written, through a link
        m.dir.mkdir(parents=True, exist_ok=True)
        m._refuse_links()
        if not self.after_writer and not self._claim():
            return False  # another survivor writes this step
        buf = io.BytesIO()
        torch.save(self.state, buf)
        self.state = None
        self.read.set()  # before waiting for anything else: the survivor waits for this only
        _yield_cpu()  # the read was on the critical path, the write is not
        if self.after_writer:
            with self._settled:
                self._settled.wait_for(lambda: self._member is not None or self._stayed)
                writer_kept = self._writer_kept and not self._stayed
            if writer_kept:
                log.info("rescue checkpoint of step %d left to rank 0, which saves that step itself", step)
                return False
            if self._later_committed(step - 1) or not self._claim():
                return False
        if m.is_writer:
            with contextlib.suppress(Exception):  # a failed async write must not stop the rescue
                m.wait()
            if self._later_committed(step - 1):  # that write was of this step (or a later one)
                m.claim(step).unlink(missing_ok=True)
                return False
        size, digest = m._write_data(m.rescue_path(step), buf)
        del buf
        while True:
            with self._settled:
                member, stayed = self._member, self._stayed
            generation = member[0] if member is not None else self.generation
            if member is not None and member[1] != step:
                return self._drop(f"generation {generation} resumed from step {member[1]}")
            newer = newer_generation(m.root, m.run, generation, m._markers())
            if newer is None and not self._later_committed(step):
                m._write_marker(step, size, digest, generation, m.rescue_path(step))
                newer = newer_generation(m.root, m.run, generation, m._markers())
                if newer is None and not self._later_committed(step):
                    m.last_committed_step = step
                    self.generation = generation
                    return True
                m.marker(step).unlink(missing_ok=True)  # withdrawn; the data stays while it may commit later
            if self._later_committed(step):
                return self._drop("a later step is committed")
            if member is not None or stayed:  # fenced where it commits: it never will
                m._fenced(step, newer, "(rescue) not written")
                return self._drop("")
            with self._settled:  # a newer generation started: commit in it once this process is a member
                self._settled.wait_for(lambda: self._member is not None or self._stayed)

    def _drop(self, why: str) -> bool:
        self.manager.rescue_path(self.step).unlink(missing_ok=True)
        self.manager.claim(self.step).unlink(missing_ok=True)  # the step is free again (a later rescue of it)
        if why:
            log.info("rescue checkpoint of step %d not committed: %s", self.step, why)
        return False


class CheckpointManager:
    """`save(step, state)` on rank 0 (others return at once), `load_latest()` anywhere.

    `keep` >= 2 good checkpoints are kept, so a crash while writing the newest still leaves one.
    `job_name` (default `$DDPJOB_NAME`; "" for none) and `namespace` (default `$DDPJOB_NAMESPACE`; "" for none)
    put everything under `<directory>/<namespace>.<job_name>/` (`contract.job_directory_name`);
    `generation` and `run_id` default to torchrun's run id (`rendezvous_generation`)."""

    def __init__(self, directory: str | os.PathLike, keep: int = 2, *, is_writer: bool = True,
                 async_save: bool = False, stale_temp_seconds: float = STALE_TEMP_SECONDS,
                 generation: int | None = None, job_name: str | None = None, run_id: str | None = None,
                 read_retries: int = READ_RETRIES, retry_backoff_s: float = READ_RETRY_BACKOFF_SECONDS,
                 namespace: str | None = None) -> None:
        if keep < 2:
            raise ValueError(f"keep must be >= 2, got {keep}")
        name = os.environ.get(JOB_NAME_ENV, "") if job_name is None else job_name
        namespace = os.environ.get(JOB_NAMESPACE_ENV, "") if namespace is None else namespace
        key = job_key(name, namespace)
        self.mount = Path(directory)
        self.job_name = name or None
        self.namespace = namespace if name and namespace else None
        self.root = self.mount / key if key else self.mount  # this job's own directory on the volume
        self.dir = self.root / "checkpoints"
        self.keep, self.is_writer, self.async_save = keep, is_writer, async_save
        self.stale_temp_seconds = stale_temp_seconds
        self.read_retries, self.retry_backoff_s = read_retries, retry_backoff_s
        env = os.environ if run_id is None else {**os.environ, "TORCHELASTIC_RUN_ID": run_id}
        self.run, derived = rendezvous_generation(env)
        self.generation = derived if generation is None else generation  # in every marker: the fence
        self.fenced_by: int | None = None  # a newer generation found when this one tried to commit
        self.last_committed_step: int | None = None
        self.corrupt: set[int] = set()  # steps found corrupt: never loaded, never counted as kept
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pool: dict[tuple, torch.Tensor] = {}  # snapshot buffers, reused once the last write is done
        if is_writer:
            if self.namespace is not None:
                adopt_legacy_job_directory(self.mount, name, namespace, run=self.run)
            self._refuse_links()  # before the probes: a link is never written through
            check_writable(self.root)
            check_writable(self.dir)
            self._refuse_links()
            self.clean_stale_temp_files()
            self._raise_fence()  # before anything is read: from now on an older generation commits nothing

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
