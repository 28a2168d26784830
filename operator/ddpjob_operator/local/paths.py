"""The local run's own files, treated as hostile: what a cloned repository, a kept `.ddpjob` or a neighbour
may have put there (a symbolic link, a FIFO, a directory under a file's name, a huge or deeply nested file).
Nothing is written, emptied or read through a link; nothing blocks on a FIFO; and one run at a time owns a
directory (an advisory lock the kernel releases when its holder dies, so a crash leaves no stale lock)."""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import stat
import uuid
from pathlib import Path

from ..validation import FieldError, InvalidJob

# What the runner reads of a file the trainer or a launcher wrote: a report, a marker, a termination message.
READ_LIMIT_BYTES = 1 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotARegularFile(ValueError):
    """A path the runner reads is a link, a FIFO, a device, a directory, or larger than it may be."""


def _shown(path: Path) -> str:
    """A path as a message shows it: a planted name may hold newlines or terminal escapes, shown escaped."""
    text = str(path)
    return text if text.isprintable() else text.encode("unicode_escape").decode()


def _removal(path: Path, mode: int) -> str:
    """The fix for something planted where the run writes a file."""
    if stat.S_ISDIR(mode):
        return f"move it away (`mv {shlex.quote(_shown(path))} {shlex.quote(_shown(path) + '.old')}`) and run again"
    return (f"remove it (`rm {shlex.quote(_shown(path))}`; for a link, `rm` removes the link, not what it points to) "
            f"and run again")


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or special file"


def refuse_unusable_directories(*paths: Path, fix: str) -> None:
    """Each path must be absent or a real directory: a link would have the run empty and write what it points
    to, and a file or FIFO under a directory's name cannot hold the run's files. `fix` says what else to do."""
    errors = []
    for path in paths:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except NotADirectoryError:  # a parent is a file: that parent is named by its own check
            continue
        shown = _shown(path)
        if stat.S_ISLNK(mode):
            errors.append(FieldError(shown, f"is a symbolic link (to {_shown(Path(os.readlink(path)))}): the local "
                                     f"run empties and writes its own directories and never does so through a link",
                                     f"remove the link (`rm {shlex.quote(shown)}`: what it points to is left alone) "
                                     f"and run again, or {fix}"))
        elif not stat.S_ISDIR(mode):
            errors.append(FieldError(shown, f"is {_kind(mode)}, not a directory: the local run keeps its files in it",
                                     f"move it away (`mv {shlex.quote(shown)} {shlex.quote(shown + '.old')}`) and "
                                     f"run again, or {fix}"))
    if errors:
        raise InvalidJob(errors)


def user_directory(path: Path, flag: str) -> Path:
    """A directory the user named (`flag`), resolved: it may be a link (their choice), but must lead to a
    directory or to nothing yet; InvalidJob naming the flag and the fix otherwise (a link loop included)."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a link loop, before Python 3.13
        raise InvalidJob([FieldError(flag, f"{_shown(path)} cannot be resolved ({e})",
                                     f"give {flag} a directory")]) from None
    refuse_unusable_directories(resolved, fix=f"give another {flag}")
    return resolved


def refuse_planted_entries(directory: Path) -> None:
    """Every entry of a directory only the runner writes (its logs) must be a regular file: a link there would
    have worker output appended to, or a file removed, wherever it points; a FIFO would block the run."""
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return
    errors = []
    for entry in entries:
        mode = os.lstat(entry).st_mode
        if not stat.S_ISREG(mode):
            errors.append(FieldError(_shown(entry), f"is {_kind(mode)}: the local run writes only regular files "
                                     f"here and never through a link", _removal(entry, mode)))
    if errors:
        raise InvalidJob(errors)


def read_regular(path: Path, limit: int = READ_LIMIT_BYTES, since: float | None = None) -> bytes | None:
    """The file's bytes; None while it is absent (or, with `since`, last modified before that time).
    NotARegularFile for anything but a regular file of at most `limit` bytes (never followed, never blocked on)."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotARegularFile(f"{path} is a symbolic link") from None
        raise
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or (since is not None and status.st_mtime < since):
        os.close(fd)
        if not stat.S_ISREG(status.st_mode):
            raise NotARegularFile(f"{path} is {_kind(status.st_mode)}")
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotARegularFile(f"{path} is larger than {limit} bytes")
    return data


def _open_regular(path: Path, flags: int, role: str) -> int:
    """os.open of a regular file only; InvalidJob naming the path and the fix for a link, a FIFO (refused at
    once with O_NONBLOCK, never waited on), a directory or a device."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # ENXIO: a FIFO nobody reads
            raise
        mode = os.lstat(path).st_mode
    else:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
    raise InvalidJob([FieldError(_shown(path), f"is {_kind(mode)}: {role}", _removal(path, mode))])


def open_for_append(path: Path) -> int:
    """A file descriptor appending to `path` (created if absent); InvalidJob naming the path and the fix when it
    is not a regular file."""
    return _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                         "the local run appends its processes' output only to regular files")


def replace_file(path: Path, data: bytes) -> None:
    """`path` holds `data`, written to a new file of a unique name beside it (O_EXCL|O_NOFOLLOW: never through
    something planted) then renamed over it: a link at `path` is replaced, never written through."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


class DirectoryLock:
    """One run per directory: an exclusive, non-blocking flock on `<directory>/<name>`, held until `release()`
    or the holder's death (the kernel drops it: a crashed run leaves no stale lock). The file holds the
    holder's PID, shown to a refused run (informative only: the lock, not the PID, decides)."""

    def __init__(self, directory: Path, name: str, what: str, fix: str):
        self.path = directory / name
        self._fd: int | None = _open_regular(self.path, os.O_RDWR | os.O_CREAT,
                                             "the local run's lock file must be a regular file")
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip()
            self.release()
            by = f" (PID {holder})" if holder.isascii() and holder.isdigit() else ""
            raise InvalidJob([FieldError(_shown(directory), f"is in use by another local run{by}: {what}",
                                         f"wait for that run to end, stop it (Ctrl-C in its terminal"
                                         f"{f', or kill {holder}' if by else ''}), or {fix}")]) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None
