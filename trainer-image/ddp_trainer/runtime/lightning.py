"""PyTorch Lightning on DDPJob: `Trainer(**lightning.trainer_kwargs(), callbacks=[DDPJobCallback()])`.

    from ddp_trainer.runtime import lightning as ddpjob
    trainer = L.Trainer(max_steps=..., callbacks=[ddpjob.DDPJobCallback()], **ddpjob.trainer_kwargs())
    trainer.fit(model, train_loader, ckpt_path=ddpjob.resume_from_checkpoint())
    ddpjob.exit_process(0)

- `trainer_kwargs()`: what Lightning needs to run under torchrun, as DDPJob starts it: `strategy="ddp"`,
  `devices` = the pod's processes (LOCAL_WORLD_SIZE), `num_nodes` = WORLD_SIZE / LOCAL_WORLD_SIZE (this
  generation's, which changes when the job is resized), the accelerator. Lightning then detects
  torchrun (TorchElasticEnvironment) and takes ranks and the rendezvous from its environment.
- the callback: progress to the job's status; a checkpoint (Lightning's own `.ckpt`, every
  `DDPJOB_CHECKPOINT_INTERVAL_STEPS`, the newest `DDPJOB_CHECKPOINT_KEEP` complete ones kept, pruned only
  after a commit) made complete by a commit marker, fenced by rendezvous generation; a full volume while
  saving exits 75 (`checkpoint volume full: <dir>`), as the bundled trainer; on SIGTERM every rank agrees
  at the same step, saves, and exits 143; on a peer's death, a survivor saves its replica (Lightning's
  full checkpoint: model, optimizers, schedulers, loops) without a collective, so the next generation
  resumes at most the step in flight behind;
  a `ResumableDistributedSampler` in the train loader is advanced every step and its position saved
  in the checkpoint (the callback's state), so the data order continues exactly at any world size;
  each optimizer step's random streams come from (seed, step, rank), so a resume from any checkpoint, a
  rescue included, draws what an undisturbed run draws; Lightning's world size is checked against
  torchrun's when `fit` starts (a mismatch ends every process with 1, naming `trainer_kwargs()`);
  against a hung or silent peer, what `Job` has (`frameworks.StallGuard`): `steady_timeout_s` > 0 is the
  collective timeout after the first 10 steps, relaxed around validation, checkpoint saves and an epoch's
  end; the stall watchdog makes a trainer blocked in a collective obey SIGTERM within seconds (exit 143),
  and one whose steps stopped for longer than the steady timeout allows leave with a `Timed out` peer failure.
- `resume_from_checkpoint()`: the newest complete checkpoint that is a `torch.save` archive (others are
  skipped with a warning naming them), for `trainer.fit(ckpt_path=...)`; an I/O
  error that outlasts the retries exits 75 (`checkpoint volume unreadable: <dir>`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from . import frameworks
from .data import batch_size_of
from .contract import CHECKPOINT_DIR_ENV
from .distributed import exit_process, is_peer_failure
from .framework_callback import FrameworkCallback, check_group_formed, form_group, job_env
from .progress import REPORT_PACE_S, write_result
from .sampler import ResumableDistributedSampler

__all__ = ["DDPJobCallback", "checkpoint_dir", "exit_process", "resume_from_checkpoint", "trainer_kwargs"]

log = logging.getLogger(__name__)
CHECKPOINT = re.compile(r"^step-(\d+)\.ckpt$", re.ASCII)
SUBDIR = "lightning"
FRAMEWORK = "the Lightning Trainer"


def checkpoint_dir(default: str | os.PathLike = "lightning_checkpoints") -> Path:
    """`<DDPJOB_CHECKPOINT_DIR>/<DDPJOB_NAMESPACE>.<DDPJOB_NAME>/lightning` under DDPJob, `default` elsewhere."""
    form_group(FRAMEWORK)
    return frameworks.job_dir(SUBDIR, default)


def trainer_kwargs(accelerator: str = "auto") -> dict[str, Any]:
    """`L.Trainer(**trainer_kwargs(), ...)`: devices and nodes of this rendezvous generation, DDP (under in-process
    recovery, of the job's group, formed here first: `form_group`)."""
    form_group(FRAMEWORK)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if accelerator == "auto":
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    return {"accelerator": accelerator, "devices": local, "num_nodes": max(1, world // local),
            "strategy": "ddp" if world > 1 else "auto"}


def unloadable(checkpoint: str | os.PathLike) -> str | None:
    """Why Lightning's loader (`torch.load`) cannot read `checkpoint`, or None: it must be a `torch.save` archive
    (a zip; its end record is read, not the whole file)."""
    return None if zipfile.is_zipfile(checkpoint) else "not a torch.save archive"


def resume_from_checkpoint(directory: str | os.PathLike | None = None) -> str | None:
    """The newest complete checkpoint (`step-<N>.ckpt` with its commit marker) for `fit(ckpt_path=...)`, or
    None. Call it before `fit` (no process group yet): every rank reads the same shared directory, rank 0
    after raising its generation fence (`frameworks.start_generation`). An I/O error that outlasts the
    retries ends the process with 75 (`checkpoint volume unreadable: <dir>`)."""
    env = job_env()
    directory = directory if directory is not None else checkpoint_dir()

    def look() -> tuple[int, Path, dict] | None:
        if (env is None or env.is_main) and directory is not None:
            frameworks.start_generation(directory)
        return frameworks.newest_complete(directory, CHECKPOINT, unloadable)

    found = frameworks.guard_volume(look, directory, "a generation fence")
    if found is None:
        return None
    step, path, marker = found
    if env is None or env.is_main:
        frameworks.announce(frameworks.resume_message(step, marker.get("world_size"), env.world_size if env else 1))
    return str(path)


class DDPJobCallback(Callback, FrameworkCallback):
    """`L.Trainer(callbacks=[DDPJobCallback()])`. `every_steps`/`keep` default to the manifest's
    checkpoint.intervalSteps/keep; `directory` to `checkpoint_dir()`. `exit_on_stop`: after a SIGTERM
    stop, exit 143 once the checkpoint is committed. `steady_timeout_s`: the collective timeout once steps
    are regular (after the first 10, and 2 after a validation, a save or an epoch's end), as
    `Job.start(steady_timeout_s=...)`; 0 (the default, as there): the strategy's timeout throughout. The
    stall watchdog runs in every case."""

    framework = FRAMEWORK

    def __init__(self, *, every_steps: int | None = None, keep: int | None = None,
                 directory: str | os.PathLike | None = None, exit_on_stop: bool = True, report_every: int = 1,
                 steady_timeout_s: float = 0.0, seed: int | None = None) -> None:
        self._init_job(every_steps=every_steps, exit_on_stop=exit_on_stop, report_every=report_every,
                       steady_timeout_s=steady_timeout_s)
        # Each optimizer step's random streams come from (seed, step, rank): `L.seed_everything`'s seed by default.
        self.seed = seed if seed is not None else int(os.environ.get("PL_GLOBAL_SEED", "0") or 0)
        self._rescuing = False
        self.keep = max(2, keep if keep is not None else (self.env.checkpoint_keep if self.env else 2))
        self.directory = Path(directory) if directory is not None else checkpoint_dir()
        self.sampler: ResumableDistributedSampler | None = None
        self._sampler_state: dict | None = None
        self._loss: torch.Tensor | None = None
        self._world_size, self._total_steps = 1, None  # set when training starts
        self._unreported: tuple | None = None  # (step, samples, time, loss, epoch) of a step not reported yet
        self._next_report = 0.0

    # ---- the sampler's position travels in the checkpoint, as this callback's state ------------

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()} if self.sampler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._sampler_state = state_dict.get("sampler")

    def _find_sampler(self, trainer) -> ResumableDistributedSampler | None:
        loader = trainer.train_dataloader
        for candidate in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None),
                                                                         "sampler", None)):
            if isinstance(candidate, ResumableDistributedSampler):
                return candidate
        return None

    # ---- Lightning events -----------------------------------------------------------------------

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            fix = "L.Trainer(**ddpjob.trainer_kwargs(), ...) (devices and num_nodes of this generation, strategy ddp)"
            check_group_formed(FRAMEWORK, fix)
            frameworks.check_world_size(trainer.world_size, FRAMEWORK, fix)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx % max(1, trainer.accumulate_grad_batches) == 0:  # an optimizer step's first micro-batch
            # This step's dropout from (seed, step, rank) alone: the same after a resume from any checkpoint,
            # a rescue included (which holds its survivor's random state only).
            frameworks.seed_step(self.seed, trainer.global_step, self.rank)

    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning's own SIGTERM handling (a broadcast inside the signal handler, then an exception at the
        # batch's end, no checkpoint) replaced `fit`'s handlers; DDPJob's stop is ours: restore it.
        for signum in self.stop._previous:
            signal.signal(signum, self.stop._handle)
        timeout = getattr(trainer.strategy, "_timeout", None)  # DDPStrategy's process group timeout
        # The fence on rank 0 also creates the directory (and the volume's root outside DDPJob).
        self._start_training(timeout_s=timeout.total_seconds() if timeout is not None else None,
                             fence=self.directory if trainer.is_global_zero else None, model=pl_module,
                             device=pl_module.device, resumed_step=trainer.global_step,
                             is_main=trainer.is_global_zero)
        # Fixed for the fit; Lightning computes both from the strategy and the environment on every read,
        # which is a noticeable share of a small step's hook.
        self._world_size = trainer.world_size
        self._total_steps = trainer.max_steps if trainer.max_steps > 0 else None
        self._restore_sampler(trainer)

    def _restore_sampler(self, trainer) -> None:
        """Resume the sampler where the checkpoint's replica was. Lightning then calls `set_epoch` for the
        resumed epoch (which would start it over) before the epoch's first batch: that one call keeps the
        position."""
        self.sampler = sampler = self._find_sampler(trainer)
        state, self._sampler_state = self._sampler_state, None
        if sampler is None or state is None:
            return
        sampler.load_state_dict(state)  # refuses another seed, shuffle or dataset (ResumeMismatch)

        def set_epoch(epoch: int, consumed: int = 0) -> None:
            del sampler.set_epoch  # once: the class's own from now on
            if epoch == sampler.epoch and consumed == 0:
                consumed = sampler.position
            sampler.set_epoch(epoch, consumed)

        sampler.set_epoch = set_epoch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        samples = batch_size_of(batch)
        if self.sampler is not None:
            self.sampler.advance(samples)  # what this rank trained on
        if self.timer is not None:
            self.timer.boundary()
        if self.every_steps and step % self.every_steps == 0:
            with self.timer.waiting() if self.timer is not None else contextlib.nullcontext():  # not training work
                self._save(trainer, step)
        stop = self._agree_stop()
        if stop:
            log.warning("stop requested (signal %s) at step %d: saving a checkpoint", self.stop.signum, step)
            self.stopped = True
            if self.last_checkpoint_step != step:
                self._save(trainer, step)
            trainer.should_stop = True
        now = time.monotonic()
        self._times.append((now, step))
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        # The previous step's loss: long computed by now, so reading it never waits for the GPU.
        loss, self._loss = self._loss, loss.detach() if isinstance(loss, torch.Tensor) else None
        first = frameworks.first_step(self.reporter)  # of a resumed run: reported at once
        if self.reporter is not None and (step % self.report_every == 0 or first):
            self._unreported = (step, samples, now, loss, trainer.current_epoch)
            # The reporter publishes at most every FILE_INTERVAL_S: a report per short step would be overwritten
            # unseen, and building one is most of this hook's cost. Whatever is left is sent when training ends.
            if now >= self._next_report or stop or step == self._total_steps or first:
                self._report()

    def _report(self) -> None:
        """Send the newest step not reported yet (paced by on_train_batch_end; at the end, whatever is left)."""
        if self.reporter is None or self._unreported is None:
            return
        (step, samples, now, loss, epoch), self._unreported = self._unreported, None
        self._next_report = now + REPORT_PACE_S
        self._send_report(step=step, total_steps=self._total_steps,
                          loss=float(loss) if isinstance(loss, torch.Tensor) else None, epoch=epoch,
                          samples_per_second=self._samples_per_second(step, now, samples * self._world_size),
                          world_size=self._world_size)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.guard.relax()  # the epoch's end (checkpoints, validation, the end of fit), the next one's data loader

    def on_validation_start(self, trainer, pl_module) -> None:
        self.guard.relax()  # not a step: ranks may take unequal time

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.guard.alive()  # not blocked (a SIGTERM now waits for the next step)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if not self._rescuing:  # any save (ours, ModelCheckpoint's): the other ranks wait for rank 0's write
            self.guard.relax()

    def on_train_end(self, trainer, pl_module) -> None:
        self._report()
        if self.stopped:
            self._end_after_stop()  # save_checkpoint's barrier: rank 0's file is committed
            return
        mount = os.environ.get(CHECKPOINT_DIR_ENV)
        if trainer.is_global_zero and mount:
            loss = trainer.callback_metrics.get("train_loss", trainer.callback_metrics.get("loss"))
            result = {"status": "completed", "world_size": trainer.world_size, "step": trainer.global_step,
                      **({"loss": float(loss)} if loss is not None else {})}
            self._guard(lambda: write_result(mount, result), mount, "result.json")
        self._close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._after_failure(exception, lambda error: self.rescue(trainer, error))

    # ---- checkpoints ----------------------------------------------------------------------------

    def _path(self, step: int) -> Path:
        return self.directory / f"step-{step:08d}.ckpt"

    def _save(self, trainer, step: int) -> None:
        """Every rank (Lightning's save ends with a barrier); rank 0 writes, commits and prunes (only after
        the commit, and not at all when fenced). A full volume exits 75, as the bundled trainer."""
        path = self._path(step)
        if trainer.is_global_zero:
            self._guard(lambda: self.directory.mkdir(parents=True, exist_ok=True), self.directory, path.name)
        self._guard(lambda: trainer.save_checkpoint(str(path)), self.directory, path.name)
        self.last_checkpoint_step = step  # on every rank alike: the stop's save depends on it (a collective)
        if trainer.is_global_zero and self._guard(
                lambda: frameworks.commit(path, step=step, world_size=trainer.world_size), self.directory,
                path.name) is not None:
            frameworks.prune(path, CHECKPOINT, self.keep)  # (not when fenced: a newer generation started there)

    def rescue(self, trainer, error: BaseException) -> bool:
        """After a collective failed because a peer died: this rank writes its replica as a complete
        checkpoint of the last completed step, unless one exists (any surviving rank may; the first to
        place it wins). No collective. Lightning calls it through `on_exception`."""
        if not (is_peer_failure(error) or self.guard.verdict is not None):
            return False
        step = trainer.global_step
        final = self._path(step)
        tmp = self.directory / f".tmp-{final.name}-{uuid.uuid4().hex}"

        def write() -> None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._rescuing = True  # (no relax: the process groups may be aborted)
            try:
                checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            finally:
                self._rescuing = False
            torch.save(checkpoint, tmp)

        # Any error is dropped: the peer's failure matters more than this one.
        return self._place_rescue(step, final, tmp, write, unloadable, "Lightning", trainer.world_size,
                                  errors=(Exception,))
