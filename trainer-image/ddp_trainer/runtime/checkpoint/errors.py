"""The checkpoint package's errors, and the exit code and message prefixes of a volume that failed us."""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from pathlib import Path

# The checkpoint volume cannot be used for a reason that is not the script's: the trainer exits with
# this code (EX_TEMPFAIL of sysexits.h) and an error message that starts with one of the prefixes
# below and names the directory, and the job is retried rather than failed as a bug.
CHECKPOINT_VOLUME_EXIT_CODE = 75
CHECKPOINT_VOLUME_FULL_EXIT_CODE = CHECKPOINT_VOLUME_EXIT_CODE
CHECKPOINT_VOLUME_UNREADABLE_EXIT_CODE = CHECKPOINT_VOLUME_EXIT_CODE
CHECKPOINT_VOLUME_FULL_PREFIX = "checkpoint volume full:"
CHECKPOINT_VOLUME_UNREADABLE_PREFIX = "checkpoint volume unreadable:"


def record_for_torchrun(error: BaseException, *, when: float, stack: bool) -> None:
    """Write `error` where torchrun reads a failed trainer's error (`$TORCHELASTIC_ERROR_FILE`, as torch's `@record`
    does), its message first, so torchrun's failure summary and the pod's termination message quote it; with
    `stack` False no `py_callstack` (torchrun would show that instead of the message)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    info = {"timestamp": str(int(when))}
    if stack:
        info["py_callstack"] = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps({"message": {"message": str(error), "extraInfo": info}}))


class CheckpointDirError(RuntimeError):
    """The checkpoint directory cannot be used (a link, a name that is no path component, no write access): the
    user's configuration, which no retry mends. The message names the path and the fix; `record()` hands it alone
    to torchrun and returns `exit_code` (1: a permanent failure, unlike the volume's 75)."""

    exit_code = 1

    def record(self) -> int:
        record_for_torchrun(self, when=time.time(), stack=False)
        return self.exit_code


class CheckpointFenceError(CheckpointDirError):
    """A trainer starting on a directory that claims a newer generation of its own job already started
    there: generations start one after another, so the claim cannot be true (a file left or copied in).
    Training on would skip every save; the job stops instead, naming the files and the fix."""


class CorruptCheckpoint(ValueError):
    """A committed checkpoint whose bytes are not what its marker says, or do not load: never used."""



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
        record_for_torchrun(self, when=self.time, stack=True)
        return self.exit_code


class CheckpointVolumeFull(CheckpointVolumeError):
    """ENOSPC or EDQUOT while writing to the checkpoint volume."""

    prefix = CHECKPOINT_VOLUME_FULL_PREFIX


class CheckpointVolumeUnreadable(CheckpointVolumeError):
    """Reading the checkpoint volume kept failing (I/O errors, retried), or a checkpoint did not read
    back as written: nothing was skipped as corrupt and nothing was pruned."""

    prefix = CHECKPOINT_VOLUME_UNREADABLE_PREFIX
