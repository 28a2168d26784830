"""Where a job's checkpoint files live and what they are called: the job's directory on the volume (`job_key`,
never through a link: `refuse_link`), the writer's own spelling of a step or generation (`_canonical`), the fence
files' names, the trainer's run and generation (`rendezvous_generation`), and the adoption of a job's directory
of the layout before namespaces (`adopt_legacy_job_directory`)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from ..contract import (CHECKPOINT_DIR_ENV, GENERATION_ENV, JOB_NAME_ENV, JOB_NAMESPACE_ENV, env_int,
                        job_directory_name)
from .errors import CheckpointDirError, CorruptCheckpoint
from .files import _fsync_dir, read_marker_json

log = logging.getLogger(__name__)
# ASCII digits only (re.ASCII): `\d` also matches other scripts' digits, which int() takes for a step.
_MARKER = re.compile(r"^step-(\d{8,})\.committed$", re.ASCII)
_DATA = re.compile(r"^step-(\d{8,})(?:\.rescue)?\.pt$", re.ASCII)
_CLAIM = re.compile(r"^step-(\d{8,})\.rescue$", re.ASCII)
_FENCE = re.compile(r"^generation-(\d{8,})-([0-9a-f]{12})\.fence$", re.ASCII)
_RUN_ID = re.compile(r"^(?P<run>.+)-g(?P<generation>\d+)$", re.ASCII)  # the operator's rendezvous id: <job uid>-g<N>
_JOB_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")  # one safe path component
# A DNS-1123 label (a Kubernetes namespace): no '.', so `<namespace>.<name>` splits one way only.
_NAMESPACE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$", re.ASCII)

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
                                 f"should be resumed from), or point {CHECKPOINT_DIR_ENV} at the link's target volume")
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointDirError(f"{what} {path} is not a directory: remove it (this job did not write it) and "
                                 f"restart the job")


def _run_tag(run: str) -> str:
    return hashlib.sha256(run.encode()).hexdigest()[:12]


def fence_path(root: str | os.PathLike, run: str, generation: int) -> Path:
    return Path(root) / f"generation-{generation:08d}-{_run_tag(run)}.fence"


def rendezvous_generation(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(run, generation) of this trainer. Under DDPJob, from torchrun's run id (`TORCHELASTIC_RUN_ID`, the
    rendezvous id `<job uid>-g<N>`): run is the job uid, generation N, right also for an agent that
    joins later generations in place. Otherwise (a plain script, another rendezvous id) ("",
    `$DDPJOB_GENERATION` or 0)."""
    e = os.environ if environ is None else environ
    m = _RUN_ID.match(e.get("TORCHELASTIC_RUN_ID", ""))
    if m:
        return m["run"], int(m["generation"])
    return "", env_int(e, GENERATION_ENV, 0)


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
