"""ddp_trainer.runtime: what any torchrun script needs to keep DDPJob's promises. Depends on torch only.

API version 1 (`API_VERSION`); additions keep it, a breaking change bumps it. See docs/your-own-script.md.

| name | what |
| --- | --- |
| `Job` | one object per trainer process: `Job.start()`, `resume()`, `save()`, `should_save()`, `should_stop()`, `rescue()`, `report()`, `mean()`, `close()` |
| `is_peer_failure` | an exception from a collective that failed because a peer died: call `job.rescue()` with the intact replica |
| `exit_process(code)` | the last line of a script's `__main__`: exit without interpreter teardown, where torch's C++ threads can abort a finished trainer |
| `JobEnv` | rank, world size, restart count, generation, job name, checkpoint settings from the environment |
| `CheckpointManager` | atomic save (temp + fsync + rename + commit marker, read back), keep K >= 2 good ones, `load_latest` skipping corrupt ones; one directory per job (`$DDPJOB_NAME`), commits fenced by rendezvous generation (`rendezvous_generation`) |
| `CheckpointVolumeError` (`CheckpointVolumeFull`, `CheckpointVolumeUnreadable`) | the volume is full, or kept failing reads: exit `CHECKPOINT_VOLUME_EXIT_CODE` (75) with `error.record()`, message starting `checkpoint volume full:` / `checkpoint volume unreadable:` |
| `StopRequest` | SIGTERM/SIGINT -> a flag all ranks agree on at the same step, without a device sync; `exit_code` 143 |
| `ResumableDistributedSampler` | per-epoch permutation sharded over ranks, resumable mid-epoch at any world size |
| `View`, `Shards`, `step_batches` | who trains now (`job.view`, `job.seat`) and each step's micro-batches for every seat a process covers: a short view trains the missing seats' shards too (gradient accumulation, `View.loss_scale`), so the global batch and sample order stay the full world's; `job.view.with_while_short(OWN_BATCH)` (`FULL_BATCH`, the default; `WHILE_SHORT`, both) trades that for speed: each member its own seat only, a smaller global batch while short |
| `report()`, `ProgressReporter` | non-blocking progress (progress.json in the job's own directory; POST to $DDPJOB_PROGRESS_URL); `ProgressReporter.from_env()` builds every reporter |
| `worker_init_fn()`, `ignore_stop_signals` | DataLoader workers that outlive SIGTERM until the final checkpoint |
| `seed_step(seed, step, rank)` | every random stream of the process (Python, NumPy, torch CPU/CUDA) from (seed, step, rank) alone: call it before each step's forward pass and dropout draws the same after a resume from any checkpoint, a rescue included |
| `move_to`, `batch_size_of` | batches of any structure (tensors, dicts, tuples) |
| `check_writable`, `check_resume` | fail early: unwritable checkpoint dir, resume with another data order |
| `ddp_trainer.runtime.contract` | every `DDPJOB_*` variable's name, and `job_root`: the job's own directory on its volume |

Framework integrations, imported on their own (they need their framework; docs/hf-and-lightning.md):
`ddp_trainer.runtime.hf` (`DDPJobCallback` for the Hugging Face `Trainer`, `resume_from_checkpoint`,
`output_dir`) and `ddp_trainer.runtime.lightning` (`DDPJobCallback`, `trainer_kwargs`, `resume_from_checkpoint`).
"""

from .checkpoint import (CHECKPOINT_VOLUME_EXIT_CODE, CHECKPOINT_VOLUME_FULL_EXIT_CODE,
                         CHECKPOINT_VOLUME_FULL_PREFIX, CHECKPOINT_VOLUME_UNREADABLE_EXIT_CODE,
                         CHECKPOINT_VOLUME_UNREADABLE_PREFIX, CheckpointDirError, CheckpointManager,
                         CheckpointVolumeError, CheckpointVolumeFull, CheckpointVolumeUnreadable, CorruptCheckpoint,
                         atomic_write_bytes, atomic_write_json, check_writable, rendezvous_generation)
from .data import batch_size_of, ignore_stop_signals, move_to, worker_init_fn
from .distributed import (JobEnv, StopRequest, barrier, destroy_process_group, exit_process, init_process_group,
                          is_peer_failure, select_device)
from .frameworks import seed_step
from .job import Job
from .progress import ProgressReporter, default_reporter, report
from .sampler import ResumableDistributedSampler, ResumeMismatch, check_resume
from .shards import Shards, step_batches
from .views import FULL_BATCH, OWN_BATCH, WHILE_SHORT, View

API_VERSION = 1

__all__ = [
    "API_VERSION", "CHECKPOINT_VOLUME_EXIT_CODE", "CHECKPOINT_VOLUME_FULL_EXIT_CODE", "CHECKPOINT_VOLUME_FULL_PREFIX",
    "CHECKPOINT_VOLUME_UNREADABLE_EXIT_CODE", "CHECKPOINT_VOLUME_UNREADABLE_PREFIX", "CheckpointDirError",
    "CheckpointManager", "CheckpointVolumeError", "CheckpointVolumeFull", "CheckpointVolumeUnreadable",
    "CorruptCheckpoint", "Job", "JobEnv", "ProgressReporter", "ResumableDistributedSampler", "ResumeMismatch",
    "StopRequest", "atomic_write_bytes", "atomic_write_json", "barrier", "batch_size_of", "check_resume",
    "check_writable", "default_reporter", "destroy_process_group", "exit_process", "ignore_stop_signals",
    "init_process_group", "is_peer_failure", "move_to", "rendezvous_generation", "report", "seed_step",
    "select_device", "worker_init_fn", "Shards", "View", "step_batches", "FULL_BATCH", "OWN_BATCH", "WHILE_SHORT",
]
