"""The Hugging Face `Trainer` on DDPJob, in one line: `trainer.add_callback(DDPJobCallback())`.

    from ddp_trainer.runtime import hf
    args = TrainingArguments(output_dir=hf.output_dir("out"), ...)   # the job's volume under DDPJob
    trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[hf.DDPJobCallback()])
    trainer.train(resume_from_checkpoint=hf.resume_from_checkpoint(args))
    hf.exit_process(0)

What the callback does (docs/hf-and-lightning.md):
- progress: step, total steps, loss, epoch, samples/s and the last checkpoint step to the job's status
  (`report()`, microseconds per step, nothing blocks);
- checkpoints every `DDPJOB_CHECKPOINT_INTERVAL_STEPS` (HF's own `checkpoint-<step>/`), each made
  complete by a commit marker once written, fenced by rendezvous generation; the callback, not HF's
  rotation (which deletes before the new checkpoint is committed), keeps `DDPJOB_CHECKPOINT_KEEP` (or
  `save_total_limit`) complete ones, pruning only after a commit;
- a full checkpoint volume while saving, or one that keeps failing reads while resuming: exit 75 with
  `checkpoint volume full: <dir>` / `checkpoint volume unreadable: <dir>`, as the bundled trainer;
- SIGTERM (scale-down, eviction, suspend): every rank agrees at the same step (`PacedStop`), HF saves
  a checkpoint and stops, and the trainer exits 143 once rank 0's checkpoint is committed;
- a peer's death, whichever rank it was: the survivors' next collective fails inside the Trainer's epoch
  loop; the callback (which wraps that loop of the Trainer it is called from) saves the replica they hold
  (weights, optimizer, scheduler, scaler, trainer state after the last completed step, every rank's RNG
  file) as `checkpoint-<step>/` before the exception goes on, committed only if HF can load it, so the
  next generation resumes at most the step in flight behind;
- exact resumes: each optimizer step's random streams come from (seed, step, rank) (`on_step_begin`), and
  each rank's running loss travels with periodic checkpoints (docs/hf-and-lightning.md, "What a resume
  reproduces");
- HF's world size is checked against torchrun's when training starts (HF on CPU without `use_cpu=True`
  runs each process alone): a mismatch ends every process with 1 and a message naming the fix;
- a hung or silent peer, as with `Job` (`frameworks.StallGuard`): `steady_timeout_s` > 0 is the collective
  timeout after the first 10 steps, relaxed around HF's evaluations and saves and at an epoch's end; the
  stall watchdog makes a trainer blocked in a collective obey SIGTERM within seconds (exit 143), and
  one whose steps stopped for longer than the steady timeout allows leave with a `Timed out` peer failure;
- `resume_from_checkpoint()`: the newest complete checkpoint HF can load (one without weights or trainer
  state is skipped with a warning naming it), for HF's `resume_from_checkpoint`, which
  restores its own data order (it skips the batches already trained in the epoch) and scheduler. At
  another world size HF skips that many steps' batches of the new sharding: from the next step on, the run
  trains what an undisturbed run at the new world size would (scaling down, some samples of the epoch are
  trained twice; scaling up, some are skipped); the schedule goes on by step (docs/hf-and-lightning.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from transformers import PreTrainedModel, TrainerCallback
from transformers.utils import (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME,
                                SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME)

from . import frameworks
from .contract import CHECKPOINT_DIR_ENV
from .distributed import barrier, exit_process, is_peer_failure
from .framework_callback import FrameworkCallback, check_group_formed, form_group, job_env
from .progress import write_result

__all__ = ["DDPJobCallback", "exit_process", "output_dir", "resume_from_checkpoint"]

log = logging.getLogger(__name__)
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$", re.ASCII)  # HF's PREFIX_CHECKPOINT_DIR-<global step>
# Each rank writes its own RNG state and loss accumulator: not waited for by rank 0's marker.
OTHER_RANKS_FILES = re.compile(r"^(rng_state|ddpjob_loss_)")
SUBDIR = "hf"
FRAMEWORK = "the Hugging Face Trainer"
# What HF's `_load_from_checkpoint` takes as a checkpoint's weights (one of them must be there).
WEIGHT_FILES = (WEIGHTS_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_INDEX_NAME, ADAPTER_WEIGHTS_NAME,
                ADAPTER_SAFE_WEIGHTS_NAME)
TRAINER_STATE = "trainer_state.json"


def _loss_file(rank: int) -> str:
    return f"ddpjob_loss_{rank}.json"


def unloadable(checkpoint: str | os.PathLike) -> str | None:
    """Why HF's own loader cannot resume from `checkpoint` (no weights: it raises `Can't find a valid checkpoint`;
    no trainer state: it would start again from step 0 with the weights), or None."""
    root = Path(checkpoint)
    if not (any((root / name).is_file() for name in WEIGHT_FILES)
            or any(p.name.startswith("pytorch_model_fsdp") for p in root.iterdir())):
        return "no model weights"
    if not (root / TRAINER_STATE).is_file():
        return f"no {TRAINER_STATE}"
    return None


def output_dir(default: str | os.PathLike = "outputs") -> str:
    """`TrainingArguments(output_dir=...)`: `<DDPJOB_CHECKPOINT_DIR>/<DDPJOB_NAMESPACE>.<DDPJOB_NAME>/hf` under DDPJob (the
    job's volume, so a replaced pod resumes from it), `default` elsewhere. Under in-process recovery it forms the job's
    process group first (`form_group`): call it before `TrainingArguments`, which initialises distributed."""
    form_group(FRAMEWORK)
    return str(frameworks.job_dir(SUBDIR, default))


def resume_from_checkpoint(args: Any = None) -> str | None:
    """The newest complete `checkpoint-<step>` in `args.output_dir` (TrainingArguments, or a path; default
    `output_dir()`), or None: pass it to `trainer.train(resume_from_checkpoint=...)`. Every rank gets
    rank 0's choice. A partial checkpoint (a worker killed while HF wrote it) is skipped. Rank 0 first
    raises the directory's generation fence (`frameworks.start_generation`). An I/O error that outlasts
    the retries ends the process with 75 (`checkpoint volume unreadable: <dir>`)."""
    directory = getattr(args, "output_dir", args) if args is not None else output_dir()
    if args is not None and hasattr(args, "device"):
        args.device  # noqa: B018 - HF sets up the process group here, so the choice can be shared
    env = job_env()
    rank, world = (env.rank, env.world_size) if env else (0, 1)
    shared = dist.is_initialized() and dist.get_world_size() > 1  # else every rank reads the same directory
    found = None
    if rank == 0 or not shared:
        def look() -> tuple[int, Path, dict] | None:
            if rank == 0 and directory is not None:
                frameworks.start_generation(directory)
            return frameworks.newest_complete(directory, CHECKPOINT, unloadable)

        found = frameworks.guard_volume(look, directory, "a generation fence")
    chosen = [None if found is None else (str(found[1]), found[0], found[2].get("world_size"))]
    if shared:
        dist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        return None
    path, step, saved_world = chosen[0]
    if rank == 0:
        frameworks.announce(frameworks.resume_message(step, saved_world, world))
    return path


class DDPJobCallback(TrainerCallback, FrameworkCallback):
    """`Trainer(callbacks=[DDPJobCallback()])` or `trainer.add_callback(DDPJobCallback())`.

    `every_steps` / `keep`: checkpoint interval and how many complete checkpoints are kept (default: the
    manifest's `checkpoint.intervalSteps` / `keep` via DDPJOB_CHECKPOINT_*; 0: only HF's own `save_steps`;
    `TrainingArguments.save_total_limit`, when set, is the `keep`: HF's own rotation is switched off, as it
    deletes before the new checkpoint is committed, and the callback prunes after the commit instead).
    `exit_on_stop`: after a SIGTERM stop, end the process with 143 once the checkpoint is committed
    (code after `trainer.train()` does not run: the pod is going away). `rescue`: on a peer's death,
    save the survivor's replica from inside `trainer.train()` (see the module docstring).
    `steady_timeout_s`: the collective timeout once steps are regular (after the first 10, and 2 after an
    evaluation, a save or an epoch's end), as `Job.start(steady_timeout_s=...)`; 0 (the default, as
    there): `TrainingArguments.ddp_timeout` throughout. The stall watchdog runs in every case."""

    framework = FRAMEWORK

    def __init__(self, *, every_steps: int | None = None, keep: int | None = None, exit_on_stop: bool = True,
                 rescue: bool = True, report_every: int = 1, steady_timeout_s: float = 0.0) -> None:
        self._init_job(every_steps=every_steps, exit_on_stop=exit_on_stop, report_every=report_every,
                       steady_timeout_s=steady_timeout_s)
        self.keep = keep if keep is not None else (self.env.checkpoint_keep if self.env else None)
        self.rescue_enabled = rescue
        self.loss: float | None = None
        self._refs: dict[str, Any] = {}
        self._trainer: Any = None
        self._hooked = False

    # ---- HF events ----------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        check_group_formed(FRAMEWORK, "TrainingArguments(output_dir=hf.output_dir(...), ...): hf.output_dir() "
                                      "forms the job's group before TrainingArguments does")
        frameworks.check_world_size(
            args.world_size, FRAMEWORK,
            "TrainingArguments(..., use_cpu=True) when the processes see no GPU (without it, HF on CPU runs each "
            "process alone), or one GPU per process (torchrun --nproc-per-node = the GPUs)")
        self._refs = {"args": args, "state": state, "model": model, "optimizer": optimizer,
                      "lr_scheduler": lr_scheduler}
        self._trainer, resumed_from = _calling_trainer()
        if args.save_total_limit is not None:
            # HF's rotation runs inside its save, before on_save commits the new checkpoint, and counts
            # partial ones (by mtime): it can delete the last complete checkpoint. `prune` replaces it.
            self.keep = args.save_total_limit if args.save_total_limit > 0 else None
            args.save_total_limit = None
        self._start_training(  # HF's process group timeout: relax() goes back to it
            timeout_s=getattr(args, "ddp_timeout", None), fence=args.output_dir if args.should_save else None,
            model=model, device=next(model.parameters()).device if model is not None else None,
            resumed_step=state.global_step, is_main=self.env is None or self.env.is_main)
        if not self._hooked:
            self._wrap_trainer(args)
        if state.global_step:
            self._restore_loss(resumed_from, state.global_step)

    def on_step_begin(self, args, state, control, **kwargs):
        # This step's dropout (every draw of its forward and backward passes) from (seed, step, rank) alone:
        # the same after a resume from any checkpoint, a rescue included (HF's RNG files hold one rank's history).
        frameworks.seed_step(args.seed, state.global_step, self.rank)

    # ---- HF's running loss (the mean of the steps since the last log) travels with the checkpoint ----------

    def _loss_state(self, step: int) -> dict[str, Any] | None:
        trainer = self._trainer
        if trainer is None or not hasattr(trainer, "_tr_loss") or not hasattr(trainer, "_globalstep_last_logged"):
            return None
        return {"step": step, "tr_loss": float(trainer._tr_loss.item()),  # float32 -> float: exact
                "total_loss_scalar": float(getattr(trainer, "_total_loss_scalar", 0.0)),
                "last_logged": int(trainer._globalstep_last_logged)}

    def _save_loss(self, directory: Path, step: int) -> None:
        """This rank's accumulator, as HF's `rng_state_<rank>.pth`: a plain write (rank 0's commit lists the
        directory meanwhile), a torn one is ignored at resume."""
        if (loss := self._loss_state(step)) is not None and directory.is_dir():
            (directory / _loss_file(self.rank)).write_text(json.dumps(loss))

    def _restore_loss(self, checkpoint: str | None, step: int) -> None:
        """HF starts its running loss afresh on resume (so the first logged loss after it averages fewer steps);
        this rank's saved one puts it back. Missing (a rescue by another rank), it stays HF's fresh one."""
        trainer = self._trainer
        if checkpoint is None or trainer is None or not hasattr(trainer, "_tr_loss"):
            return
        try:
            saved = json.loads((Path(checkpoint) / _loss_file(self.rank)).read_text())
            if saved["step"] != step:
                return
            trainer._tr_loss = torch.full_like(trainer._tr_loss, saved["tr_loss"])
            trainer._total_loss_scalar = float(saved["total_loss_scalar"])
            trainer._globalstep_last_logged = int(saved["last_logged"])
        except (OSError, ValueError, KeyError, TypeError):
            return

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and isinstance(logs.get("loss"), (int, float)):
            self.loss = float(logs["loss"])

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if self.every_steps and step % self.every_steps == 0:
            control.should_save = True
        if self.timer is not None:
            self.timer.boundary()
        stop = self._agree_stop()
        if control.should_training_stop:
            self.guard.relax()  # the last step: what follows until on_train_end is not a step
        if stop:
            if not self.stopped:
                log.warning("stop requested (signal %s) at step %d: saving a checkpoint", self.stop.signum, step)
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
        now = time.monotonic()
        self._times.append((now, step))
        first = frameworks.first_step(self.reporter)  # of a resumed run: reported at once
        if self.reporter is not None and (step % self.report_every == 0 or control.should_training_stop or first):
            per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            self._send_report(step=step, total_steps=state.max_steps or None, loss=self.loss,
                              epoch=int(state.epoch or 0), samples_per_second=self._samples_per_second(step, now,
                                                                                                       per_step),
                              world_size=args.world_size)
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        self.guard.relax()  # the next epoch's first batches wait for its data loader (workers start again)

    def on_prediction_step(self, args, state, control, **kwargs):
        self.guard.alive()  # an evaluation batch: not blocked (a SIGTERM now waits for the next step)

    def on_save(self, args, state, control, **kwargs):
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self._guard(lambda: self._save_loss(path, state.global_step), args.output_dir, path.name)
        if not args.should_save:
            self.last_checkpoint_step = state.global_step
            return
        # The process that wrote the model, optimizer, scheduler and trainer state: commit, then prune.
        if not path.is_dir():
            return
        if (why := unloadable(path)) is not None:
            log.warning("checkpoint %s not committed: HF could not resume from it (%s)", path.name, why)
            return
        marker = self._guard(lambda: frameworks.commit(path, step=state.global_step, world_size=args.world_size,
                                                       skip=OTHER_RANKS_FILES), args.output_dir, path.name)
        if marker is None:
            return  # fenced: a newer generation started on the directory
        self.last_checkpoint_step = state.global_step
        if self.keep:
            frameworks.prune(path, CHECKPOINT, self.keep,
                             protect=(state.best_model_checkpoint,) if state.best_model_checkpoint else ())

    def on_train_end(self, args, state, control, **kwargs):
        if self.stopped:
            if dist.is_initialized() and dist.get_world_size() > 1:
                barrier(args.device)  # nobody exits before rank 0's checkpoint is committed
            self._end_after_stop()
            return
        mount = os.environ.get(CHECKPOINT_DIR_ENV)
        if args.should_save and mount:
            self._guard(lambda: write_result(mount, {
                "status": "completed", "world_size": args.world_size, "step": state.global_step, "loss": self.loss}),
                mount, "result.json")
        self._close()

    # ---- the Trainer's own methods: its save (a full volume), evaluation, its epoch loop (rescue) -----

    def _wrap_trainer(self, args) -> None:
        """HF passes callbacks no Trainer, so it is found as the caller of `on_train_begin` (a Trainer method),
        and its methods are wrapped on that instance: `_save_checkpoint`, where HF writes a checkpoint
        (a full volume there exits 75, `checkpoint volume full: <dir>`, not 1 as the script's bug; the
        collective timeouts are relaxed first: the other ranks wait for rank 0's write), `evaluate` (relaxed
        too: not a step), and, with `rescue`, the epoch loop (below)."""
        trainer = self._trainer
        self._hooked = True
        save = getattr(trainer, "_save_checkpoint", None)
        if save is not None:
            def save_checkpoint(*a: Any, **k: Any) -> Any:
                self.guard.relax()
                try:
                    return self._guard(lambda: save(*a, **k), args.output_dir,
                                       f"checkpoint-{trainer.state.global_step}")
                finally:
                    self.guard.alive()  # saved: a stop asked for meanwhile counts its grace from here

            trainer._save_checkpoint = save_checkpoint
        else:
            log.warning("DDPJobCallback: a full checkpoint volume exits 1, not 75, with this transformers version")
        evaluate = getattr(trainer, "evaluate", None)
        if evaluate is not None:
            def evaluate_relaxed(*a: Any, **k: Any) -> Any:
                self.guard.relax()  # every rank evaluates at the same step: not a step, ranks may take unequal time
                return evaluate(*a, **k)

            trainer.evaluate = evaluate_relaxed
        if self.rescue_enabled:
            self._wrap_epoch_loop(trainer)

    def _wrap_epoch_loop(self, trainer) -> None:
        """Catch a peer's failure where it surfaces, inside `trainer.train()`, while the replica is intact:
        the Trainer's epoch loop (`_run_epoch`, HF's per-epoch method, looked up on the instance each epoch)
        is wrapped on that instance. The exception propagates unchanged, unless the stall watchdog found a
        silent peer and aborted the process groups to get this rank out of its collective: the process then
        ends with the watchdog's verdict (a `Timed out` peer failure) once the replica is saved. An exception
        hook would not do: torchrun's worker wrapper catches the exception and exits, so `sys.excepthook`
        never runs."""
        original = getattr(trainer, "_run_epoch", None)
        if original is None:
            log.warning("DDPJobCallback: no rescue checkpoint on a peer's failure with this transformers version: "
                        "catch the exception of trainer.train() and call callback.rescue(error)")
            return

        def run_epoch(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except Exception as e:
                self._after_failure(e, self.rescue)
                raise

        trainer._run_epoch = run_epoch

    def rescue(self, error: BaseException) -> bool:
        """After `trainer.train()` raised: if a peer died (`is_peer_failure`), save this rank's replica as
        `checkpoint-<global step>` (what HF resumes from: weights, optimizer, scheduler, scaler, trainer state,
        every rank's RNG file), committed only if HF can load it. Any surviving rank may write it (rank 0's
        death included), the first to place it wins; a step that already
        has a complete checkpoint is left alone. No collective. True if this process wrote it. The callback
        calls it from inside `trainer.train()`; call it yourself for an exception raised elsewhere."""
        if not (self._refs and (is_peer_failure(error) or self.guard.verdict is not None)):
            return False
        args, state = self._refs["args"], self._refs["state"]
        step, root = state.global_step, Path(args.output_dir)
        tmp = root / f".tmp-checkpoint-{step}-{uuid.uuid4().hex}"
        return self._place_rescue(step, root / f"checkpoint-{step}", tmp, lambda: self._write_replica(tmp, args, state),
                                  unloadable, "HF", args.world_size)

    def _write_replica(self, directory: Path, args, state) -> None:
        """HF's checkpoint layout (Trainer._save_checkpoint), from any rank and without a collective."""
        directory.mkdir(parents=True)
        _write_weights(self._refs["model"], directory)
        torch.save(args, directory / "training_args.bin")
        torch.save(self._refs["optimizer"].state_dict(), directory / "optimizer.pt")
        if self._refs["lr_scheduler"] is not None:
            torch.save(self._refs["lr_scheduler"].state_dict(), directory / "scheduler.pt")
        scaler = getattr(getattr(self._trainer, "accelerator", None), "scaler", None)
        if scaler is not None:
            torch.save(scaler.state_dict(), directory / "scaler.pt")  # HF's SCALER_NAME
        _write_rng_states(directory, args, state.global_step)
        # No running loss: the dead rank's is gone, so every rank resumes with HF's fresh one (last logged: this
        # step), which is exact when this step's loss was logged, as with logging_steps=1.
        trainer = self._trainer
        if trainer is not None:  # as HF's save: the stateful callbacks' (early stopping's) state in trainer_state
            from transformers.trainer_callback import ExportableState

            for cb in [*trainer.callback_handler.callbacks, trainer.control]:
                if isinstance(cb, ExportableState) and cb.__class__.__name__ in state.stateful_callbacks:
                    name = cb.__class__.__name__
                    if isinstance(state.stateful_callbacks[name], list):
                        state.stateful_callbacks[name].append(cb.state())
                    else:
                        state.stateful_callbacks[name] = cb.state()
        state.save_to_json(str(directory / TRAINER_STATE))


def _write_weights(model: Any, directory: Path) -> None:
    """The model as HF's save writes it, from whichever rank: `save_pretrained` writes only on rank 0 of an
    initialized process group (transformers 5), so this rank is made the writer for this one call."""
    if isinstance(model, PreTrainedModel):
        model.should_save_on_this_rank = lambda is_main_process: True  # (an instance attribute, removed below)
        try:
            model.save_pretrained(str(directory), is_main_process=True)
        finally:
            with contextlib.suppress(AttributeError):
                del model.should_save_on_this_rank
    elif hasattr(model, "save_pretrained"):  # a PEFT model: its adapter, as HF saves it
        model.save_pretrained(str(directory), is_main_process=True)
    if unloadable(directory) == "no model weights":  # a plain nn.Module (or a save that wrote nothing here)
        import safetensors.torch  # as HF saves a plain nn.Module: its state dict

        state_dict = model.state_dict()
        try:
            safetensors.torch.save_file(state_dict, str(directory / SAFE_WEIGHTS_NAME), metadata={"format": "pt"})
        except RuntimeError:  # shared tensors (tied weights)
            (directory / SAFE_WEIGHTS_NAME).unlink(missing_ok=True)
            torch.save(state_dict, directory / WEIGHTS_NAME)


def _write_rng_states(directory: Path, args: Any, step: int) -> None:
    """Every rank's `rng_state_<rank>.pth`, derived from (seed, step, rank) as `seed_step` makes each rank's
    streams (the dead rank's history is gone; from the next step on, `on_step_begin` seeds them anyway):
    HF loads one per rank and warns of lost reproducibility where its own is missing."""
    own = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    cuda = torch.cuda.random.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        for rank in range(args.world_size):
            frameworks.seed_step(args.seed, step, rank)
            rng = {"python": random.getstate(), "numpy": np.random.get_state(),
                   "cpu": torch.random.get_rng_state()}
            if cuda is not None:
                rng["cuda"] = torch.cuda.random.get_rng_state_all()
            torch.save(rng, directory / (f"rng_state_{rank}.pth" if args.world_size > 1 else "rng_state.pth"))
    finally:
        random.setstate(own["python"])
        np.random.set_state(own["numpy"])
        torch.random.set_rng_state(own["cpu"])
        if cuda is not None:
            torch.cuda.random.set_rng_state_all(cuda)


def _calling_trainer() -> tuple[Any, str | None]:
    """HF passes callbacks no Trainer: it is found as the caller of `on_train_begin` (its training loop, a Trainer
    method), with the checkpoint that loop resumes from (its `resume_from_checkpoint`); (None, None) elsewhere."""
    from transformers import Trainer

    frame = sys._getframe(2)
    while frame is not None and not isinstance(frame.f_locals.get("self"), Trainer):
        frame = frame.f_back
    if frame is None:
        return None, None
    resumed = frame.f_locals.get("resume_from_checkpoint")
    return frame.f_locals["self"], resumed if isinstance(resumed, (str, os.PathLike)) else None
