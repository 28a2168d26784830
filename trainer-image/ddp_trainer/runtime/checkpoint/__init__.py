"""Crash-safe checkpoints on a shared directory: rank 0 writes, every rank reads.

Layout, with a job name (`contract.JOB_NAME_ENV`: every DDPJob worker has one) and namespace
(`contract.JOB_NAMESPACE_ENV`), under the mount <dir> (`contract.job_directory_name`):
    <dir>/<namespace>.<job>/generation-00000003-<run>.fence   the newest rendezvous generation that started on it
    <dir>/<namespace>.<job>/checkpoints/
        step-00000120.pt          torch.save of the state dict (a survivor's rescue: step-00000120.rescue.pt)
        step-00000120.committed   JSON {"step", "bytes", "sha256", "data", "time", "generation", "run", "job",
                                  "namespace"}; written last, it is the commit
        step-00000120.rescue      a survivor's exclusive claim on writing step 120 as a rescue checkpoint
Without a namespace (a plain script naming a job) the job's directory is <dir>/<job>; without a job name the
same files live directly under <dir>. Two jobs that share storage, also of one name in two namespaces, thus
never see each other's steps. Earlier versions used <dir>/<job>: the writer adopts that directory (one rename)
only where its fences and markers show it is this very job's.

The modules, by concern:
- `layout`: the job's directory (`job_key`, never through a link: `refuse_link`), the writer's own names (only
  `step-%08d` and `generation-%08d` count: another spelling is someone else's file, never loaded, counted or
  removed), fence names, `rendezvous_generation`, `adopt_legacy_job_directory`.
- `files`: atomic writes (a uuid temp name, fsync, rename; a full volume is `CheckpointVolumeFull` and leaves no
  temp file), bounded reads of untrusted files (`read_regular_file`: a regular file of the size its marker says,
  never a FIFO, device or link; `read_marker_json`: bounded JSON whose counts are 64-bit ints; `check_archive`:
  stored records only, within the file's size), read retries (an I/O error is not corruption: retried, then
  `CheckpointVolumeUnreadable`), `check_writable`.
- `fence`: generation fences. The writer of a generation raises the directory's fence when it starts, and every
  commit (periodic, final or rescue) checks it before and after its marker is in place: a trainer of an older
  generation commits nothing, or withdraws its commit. A newer generation already claimed when a writer starts
  cannot be true: `CheckpointFenceError` names the files.
- `store`: one job's checkpoint files (`CheckpointStore`): names, the fence over them, a step committed and read
  back verified (a checkpoint without a marker, or whose bytes differ from it, is never loaded).
- `manager`: `CheckpointManager`: save (read back before anything is pruned), keep the newest `keep` good ones
  (never a good one newer than the one just verified), `load_latest` skipping corrupt ones.
- `rescue`: `RescueCheckpoint` (`CheckpointManager.save_rescue`), a survivor's checkpoint after a peer died.
- `errors`: the exceptions, and exit code 75 with its message prefixes for a volume that failed us.

The HF and Lightning integrations (`runtime.frameworks`) use the same fence, read retries and full-volume code
for their own checkpoints.
"""

from .errors import (CHECKPOINT_VOLUME_EXIT_CODE, CHECKPOINT_VOLUME_FULL_EXIT_CODE, CHECKPOINT_VOLUME_FULL_PREFIX,
                     CHECKPOINT_VOLUME_UNREADABLE_EXIT_CODE, CHECKPOINT_VOLUME_UNREADABLE_PREFIX, CheckpointDirError,
                     CheckpointFenceError, CheckpointVolumeError, CheckpointVolumeFull, CheckpointVolumeUnreadable,
                     CorruptCheckpoint)
from .fence import newer_generation, prune_fences, raise_fence, refuse_impossible_fence
from .files import (MARKER_DEPTH_LIMIT, MARKER_LIMIT_BYTES, READ_RETRIES, READ_RETRY_BACKOFF_SECONDS,
                    atomic_write_bytes, atomic_write_json, check_archive, check_writable, read_marker_json,
                    read_regular_file, retry_reads, volume_full)
from .layout import adopt_legacy_job_directory, fence_path, job_key, refuse_link, rendezvous_generation
from .manager import STALE_TEMP_SECONDS, CheckpointManager, cpu_snapshot
from .rescue import RESCUE_NICENESS, RescueCheckpoint
from .store import CheckpointStore

__all__ = [
    "CHECKPOINT_VOLUME_EXIT_CODE", "CHECKPOINT_VOLUME_FULL_EXIT_CODE", "CHECKPOINT_VOLUME_FULL_PREFIX",
    "CHECKPOINT_VOLUME_UNREADABLE_EXIT_CODE", "CHECKPOINT_VOLUME_UNREADABLE_PREFIX", "MARKER_DEPTH_LIMIT",
    "MARKER_LIMIT_BYTES", "READ_RETRIES", "READ_RETRY_BACKOFF_SECONDS", "RESCUE_NICENESS", "STALE_TEMP_SECONDS",
    "CheckpointDirError", "CheckpointFenceError", "CheckpointManager", "CheckpointStore", "CheckpointVolumeError",
    "CheckpointVolumeFull", "CheckpointVolumeUnreadable", "CorruptCheckpoint", "RescueCheckpoint",
    "adopt_legacy_job_directory", "atomic_write_bytes", "atomic_write_json", "check_archive", "check_writable",
    "cpu_snapshot", "fence_path", "job_key", "newer_generation", "prune_fences", "raise_fence", "read_marker_json",
    "read_regular_file", "refuse_impossible_fence", "refuse_link", "rendezvous_generation", "retry_reads",
    "volume_full",
]
