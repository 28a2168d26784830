"""The training loop on the runtime library: DDP, resumable sharding, checkpoints, stop, evaluation, reporting."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .config import ConfigError, TrainConfig
from .evaluation import Evaluation, autocast
from .fault import after_training_due as fault_after_training_due
from .fault import due as fault_due, hang as fault_hang, hang_due as fault_hang_due, strike as fault_strike
from .fault import slow_down as fault_slow_down, slow_due as fault_slow_due
from .runtime import Job, check_resume, is_peer_failure, move_to
from .runtime.shards import MicroBatch, Shards, step_batches
from .runtime.views import OWN_BATCH, View
from .workloads import Workload, load_workload

log = logging.getLogger(__name__)


class PeerStopped(dist.DistError):
    """A peer was signalled to stop (its pod deleted or evicted) and left after the agreed final checkpoint.
    With in-process recovery this rank is a survivor as after a peer's failure (`Job.recover`: a DistError)."""


@dataclass
class Progress:
    epoch: int = 0
    step: int = 0  # optimizer steps, over all epochs
    epoch_samples: int = 0  # global samples consumed in the current epoch: the sampler's resume point
    total_samples: int = 0


def lr_factor(schedule: str, warmup_fraction: float, frac: float) -> float:
    """LR multiplier at training progress `frac` in [0, 1]: linear warmup, then cosine/linear/constant."""
    frac = min(max(frac, 0.0), 1.0)
    if frac < warmup_fraction:
        return frac / warmup_fraction
    rest = (frac - warmup_fraction) / (1.0 - warmup_fraction)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * rest))
    if schedule == "linear":
        return 1.0 - rest
    return 1.0


def planned_steps(cfg: TrainConfig, p: Progress, dataset_length: int, world: int) -> int:
    """Planned optimizer steps at a world of `world` seats (an estimate again after a resize)."""
    d, accum = cfg.data, cfg.optim.grad_accum

    def steps(samples: int) -> int:  # optimizer steps over `samples` global samples of one epoch
        per_rank = samples // world if d.drop_last else -(-samples // world)
        return -(-(-(-per_rank // d.batch_size)) // accum)

    total = p.step + steps(dataset_length - p.epoch_samples) + (cfg.epochs - p.epoch - 1) * steps(dataset_length)
    return min(total, cfg.max_steps) if cfg.max_steps else total


def default_train_step(model: torch.nn.Module, batch: Any, loss_fn) -> torch.Tensor:
    """(input, target) -> loss_fn(model(input), target); a dict (Hugging Face style) -> model(**batch).loss."""
    if isinstance(batch, Mapping):
        out = model(**batch)
        return out["loss"] if isinstance(out, Mapping) else out.loss
    x, y = batch
    return loss_fn(model(x), y)


class ProgressLog:
    """The progress line and report of the training steps since the last one: the samples trained, their loss
    summed on the device (no sync per step) and the count, averaged over every rank when written."""

    def __init__(self, cfg: TrainConfig, job: Job, dataset_length: int) -> None:
        self.cfg, self.job, self.dataset_length = cfg, job, dataset_length
        self._begin(time.perf_counter())

    def _begin(self, now: float) -> None:
        self.start, self.samples, self.loss_total, self.steps = now, 0, torch.zeros((), device=self.job.device), 0

    def add(self, trained: int, loss_sum: torch.Tensor) -> None:
        self.samples, self.loss_total, self.steps = self.samples + trained, self.loss_total + loss_sum, self.steps + 1

    def write(self, p: Progress, lr: float) -> None:
        """Every rank (a collective): the window's training loss averaged over steps and ranks; every rank
        reports (the file is rank 0's, the endpoint hears from local rank 0 of each pod)."""
        loss = self.job.mean(self.loss_total / max(self.steps, 1))  # one small all_reduce per log interval
        step_seconds, pods = self.job.step_seconds()  # own time per step, every pod's (one small all_gather)
        now = time.perf_counter()
        rate = self.samples / max(now - self.start, 1e-9)
        self._begin(now)
        is_main = self.job.env.is_main
        if is_main:
            print(f"step={p.step} epoch={p.epoch} loss={loss:.4f} samples_per_s={rate:.1f} lr={lr:.6g}", flush=True)
        extra = {"step_seconds_by_worker": {str(i): s for i, s in sorted(pods.items())}} if is_main else {}
        self.job.report(step=p.step, total_steps=planned_steps(self.cfg, p, self.dataset_length, self.job.view.world),
                        loss=loss, epoch=p.epoch, samples_per_second=rate, step_seconds=step_seconds, **extra)


class Trainer:
    def __init__(self, cfg: TrainConfig, job: Job, workload: Workload | None = None) -> None:
        # A warm spare's job has no place (no rank) yet: what does not depend on the rank is built first, and
        # the place is taken in _resume (Job.start(build_first=True)), so that it costs a rendezvous and a broadcast.
        self.cfg, self.job, self.device = cfg, job, job.device
        self.workload = workload or load_workload(cfg.workload.name)
        self.train_set, self.eval_set = self.workload.build_datasets(cfg)
        torch.manual_seed(cfg.data.seed)  # identical init everywhere (DDP broadcasts rank 0's anyway)
        model = self.workload.build_model(cfg)
        if cfg.model.sync_batchnorm:
            if self.device.type != "cuda":
                raise ConfigError(f"model.sync_batchnorm needs CUDA devices (torch's SyncBatchNorm), got {self.device}")
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = model.to(self.device)
        self.optimizer = self.workload.build_optimizer(model, cfg)
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]  # the schedule scales these
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.optim.precision == "fp16")
        self.progress = Progress()
        self._resume(model)
        self._module = model
        self._wrap()
        # DDPJOB_INPROCESS=1: a peer's failure leaves this process training in the next generation.
        job.carry(state=lambda: self._state(rng=None), load=lambda state: self._load(self._module, state),
                  rewrap=self._wrap, step=lambda: self.progress.step, rescue=cfg.checkpoint.rescue,
                  release=self._unwrap)
        # Per seat: a short view's member records the missing seats' samples it trains in its own seat's file.
        self._records = open(f"{cfg.record_samples}.rank{job.seat}", "a") if cfg.record_samples else None
        self.progress_log = ProgressLog(cfg, job, len(self.train_set))
        self.evaluation = Evaluation(cfg, job, self.workload, self.eval_set)

    @property
    def env(self):
        """This process in the job's group of now (a warm spare's rank is known once it resumed; a regroup moves it)."""
        return self.job.env

    def _wrap(self) -> None:
        """DDP around the model, in the process group of now (again after an in-process recovery)."""
        m = self.cfg.model
        self.optimizer.zero_grad(set_to_none=True)  # a failed step's partial gradients
        self.model = DDP(self._module, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                         find_unused_parameters=m.find_unused_parameters, static_graph=m.static_graph,
                         gradient_as_bucket_view=m.gradient_as_bucket_view, bucket_cap_mb=m.bucket_cap_mb,
                         init_sync=not self.job.replicas_agree)
        self.job.step_timer.watch(self.model)  # the wait at the end of backward is not this rank's own work
        self.forward = torch.compile(self.model) if m.compile else self.model

    def _unwrap(self) -> None:
        """No reference to the failed group left here (DDP holds one): leaving it then closes its connections,
        and a peer blocked on this rank fails at once, not at its collective timeout."""
        self.model = self.forward = None

    # ---- loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Train to the end (exit code 0) or until a signal asks to stop (128 + signal number). A peer's
        death fails this rank's next collective: the replica is then still whole at the last completed
        step, so it is saved as a rescue checkpoint before the error ends the process."""
        try:
            return self._run()
        except Exception as e:
            # A peer died, or went silent and the stall watchdog aborted the collective: the replica is intact.
            if self.cfg.checkpoint.rescue and (is_peer_failure(e) or self.job.watchdog.verdict is not None):
                self.job.rescue(self.progress.step, self._state(rng=None))
            raise

    def _run(self) -> int:
        while True:
            try:
                while not self._finished():
                    code = self._train_epoch()
                    if code is not None:
                        return code
                return self._finish()
            except Exception as e:
                # In process: on from the progress in memory, the epoch's steps or the work after the last one.
                if self.job.recover(e):
                    self.evaluation.forget()  # every rank evaluates again (a collective), the replacement included
                    continue
                if isinstance(e, PeerStopped):  # no in-process path after all: stop as the signalled peer did
                    return self.job.stop.exit_code
                raise

    def _finish(self) -> int:
        """After the last step: its report, the final evaluation, the final checkpoint, result.json."""
        # The final step reported (sent before exit: the status shows it with Succeeded); by a generation that
        # recovered after it, too (its timeline, without a first step: it trains none).
        if self.progress.step % self.cfg.log_every or self.job.recovering:
            self._log_progress()
        if fault_after_training_due(self.cfg.fault, self.job.seat):
            fault_strike(self.cfg.fault, self.job.seat, self.progress.step)
        metrics = self.evaluate()
        self._save(final=True)
        self.job.result(step=self.progress.step, epoch=self.progress.epoch, eval_loss=metrics["loss"],
                        eval_accuracy=metrics["accuracy"])
        return 0

    def _train_epoch(self) -> int | None:
        """The rest of the current epoch; the exit code when a stop was agreed on."""
        for micro_batches in self._step_batches():
            self._train_step(micro_batches)
            if self.job.should_stop():
                log.warning("stop requested at step %d: writing a final checkpoint (%s)", self.progress.step,
                            "signalled here" if self.job.stop.requested else "a peer was signalled")
                self._save(final=True)
                if not self.job.stop.requested and self.job.rendezvous is not None:  # in process: a survivor
                    raise PeerStopped(f"a peer was stopped at step {self.progress.step} (its pod deleted or "
                                      f"evicted) and left after the final checkpoint")
                return self.job.stop.exit_code
            if self._finished() or self.job.regrouped:  # another view: the rest of the epoch for its coverage
                return None
        self.progress.epoch += 1
        self.progress.epoch_samples = 0
        self._log_eval()
        return None

    def _finished(self) -> bool:
        p, cfg = self.progress, self.cfg
        return p.epoch >= cfg.epochs or (cfg.max_steps > 0 and p.step >= cfg.max_steps)

    @property
    def view(self) -> View:
        """The job's view of now, trained as --while-short says while it is short."""
        return self.job.view.with_while_short(self.cfg.data.while_short)

    def _shards(self) -> Shards:
        """The data order and the seats this process trains in the job's view of now (whole: its own seat)."""
        d, view = self.cfg.data, self.view
        if view.short and view.while_short == OWN_BATCH and self.env.is_main:
            log.info("training short with --while-short own-batch (missing seats %s): their samples are not "
                     "trained until the view is whole again", ", ".join(map(str, view.missing)))
        return Shards(len(self.train_set), d.seed, d.shuffle, d.drop_last, d.batch_size, self.cfg.optim.grad_accum,
                      view.world, view.coverage(self.job.seat))

    def _step_batches(self) -> Iterator[list[MicroBatch]]:
        """Micro-batches of each remaining optimizer step of the current epoch, for every seat this process trains."""
        return step_batches(self.train_set, self._shards(), self.progress.epoch, self.progress.epoch_samples,
                            collate_fn=self.workload.collate_fn, num_workers=self.cfg.data.num_workers,
                            pin_memory=self.device.type == "cuda")

    def _train_step(self, micro_batches: list[MicroBatch]) -> None:
        view = self.view
        per_seat = len(micro_batches) // len(view.coverage(self.job.seat))  # micro-batches of each seat trained
        seat_samples = sum(len(idx) for idx, _ in micro_batches[:per_seat])  # every seat's are as many
        # The epoch's position moves by every seat's share, trained or not (own-batch while short: the step count
        # and sample order stay the whole world's); the throughput counts what was trained.
        samples, trained = view.world * seat_samples, view.seats_trained * seat_samples
        self._set_lr(samples)
        last = len(micro_batches) - 1
        # DDP averages over the view's members, the step's batch is `seats_trained` seats': scaled so the two
        # agree (1.0 when whole or own-batch, where the division alone is exactly what it was before views).
        scale = view.loss_scale
        loss_sum = torch.zeros((), device=self.device)
        for i, (_, batch) in enumerate(micro_batches):
            batch = move_to(batch, self.device)
            # Gradients are all-reduced only on the final micro-step; earlier ones accumulate locally.
            with self.model.no_sync() if i < last else contextlib.nullcontext():
                with autocast(self.cfg.optim.precision, self.device):
                    loss = self._loss(batch) / per_seat
                    if scale != 1.0:
                        loss = loss * scale
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if self.cfg.optim.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if fault_slow_due(self.cfg.fault, self.job.seat):
            fault_slow_down(self.cfg.fault, self.job.step_timer.own_so_far(), self.job.seat)

        p = self.progress
        p.step, p.epoch_samples, p.total_samples = p.step + 1, p.epoch_samples + samples, p.total_samples + samples
        if self._records:
            self._records.writelines(f"{p.epoch} {i}\n" for idx, _ in micro_batches for i in idx)
            self._records.flush()
            loss = self.job.mean(loss_sum)  # the step's mean over every seat: one all_reduce, only when recording
            if self.env.is_main:
                with open(f"{self.cfg.record_samples}.loss", "a") as losses:
                    losses.write(f"{p.step} {loss!r}\n")
        self.progress_log.add(trained, loss_sum)
        if p.step % self.cfg.log_every == 0 or self.job.recovering:  # a resumed generation's first step: at once
            self._log_progress()
        if fault_due(self.cfg.fault, self.job.seat, p.step):
            fault_strike(self.cfg.fault, self.job.seat, p.step)
        if fault_hang_due(self.cfg.fault, self.job.seat, p.step):
            fault_hang(self.job.seat, p.step)
        if self.job.should_save(p.step):
            self._save(final=False)

    def _loss(self, batch: Any) -> torch.Tensor:
        if self.workload.train_step is not None:
            return self.workload.train_step(self.forward, batch, self.cfg)
        return default_train_step(self.forward, batch, self.workload.loss_fn)

    def _set_lr(self, step_samples: int) -> None:
        """Set the LR of the step about to run from the progress at its middle (never 0 at either end).

        Progress is the larger of two fractions, each independent of the world size: samples over
        the planned epochs, and (with --max-steps) steps over max_steps. Training ends exactly when
        one reaches 1, and neither jumps when a resumed job runs at another world size."""
        o, p = self.cfg.optim, self.progress
        frac = (p.total_samples + step_samples / 2) / (self.cfg.epochs * len(self.train_set))
        if self.cfg.max_steps:
            frac = max(frac, (p.step + 0.5) / self.cfg.max_steps)
        factor = lr_factor(o.schedule, o.warmup_fraction, frac)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor

    # ---- evaluation and reporting -----------------------------------------------------------

    def evaluate(self) -> dict[str, float | None]:
        """Loss and accuracy over the whole eval set (evaluation.py), every rank (a collective)."""
        return self.evaluation(self.model.module, self.progress.step)

    def _log_eval(self) -> None:
        m = self.evaluate()
        if self.env.is_main:
            log.info("eval epoch=%d step=%d eval_loss=%.4f eval_accuracy=%s", self.progress.epoch,
                     self.progress.step, m["loss"], f"{m['accuracy']:.4f}" if m["accuracy"] is not None else "n/a")

    def _log_progress(self) -> None:
        self.progress_log.write(self.progress, lr=self.optimizer.param_groups[0]["lr"])

    # ---- checkpoints ------------------------------------------------------------------------

    def _data_signature(self) -> dict[str, Any]:
        """What the saved sample position depends on: resuming under other values would repeat and skip."""
        d = self.cfg.data
        return {"seed": d.seed, "shuffle": d.shuffle, "dataset_length": len(self.train_set)}

    def _save(self, final: bool) -> None:
        if self.job.checkpoints is None:
            return
        rng = [None] * self.env.world_size
        with self.job.step_timer.waiting():
            dist.all_gather_object(rng, _rng_state())  # every rank's RNG, so an equal-size resume is exact
        self.job.save(self.progress.step, self._state(rng) if self.env.is_main else {}, final=final)

    def _state(self, rng: list[dict[str, Any]] | None) -> dict[str, Any]:
        """What a checkpoint holds; `rng` None (a rescue: no collective to gather it) derives fresh streams."""
        return {"model": self._module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(), "progress": asdict(self.progress),
                "world_size": self.env.world_size, "rng": rng, "data": self._data_signature()}

    def _resume(self, model: torch.nn.Module) -> None:
        """All ranks load the checkpoint rank 0 found to be the newest intact one (or a peer's state)."""
        state = self.job.resume(announce=False, into=lambda: {"model": model.state_dict(),
                                                               "optimizer": self.optimizer.state_dict()})
        if state is None:
            if self.job.checkpoints is not None and self.env.is_main:
                log.info("no checkpoint found: starting from scratch")
            return
        self._load(model, state)

    def _load(self, model: torch.nn.Module, state: dict[str, Any]) -> None:
        """A checkpoint's state, or a peer's (in-process recovery: `state["ddpjob"]["peer"]`), into this rank."""
        if "data" in state:
            try:
                check_resume(state["data"], self._data_signature(), what=f"checkpoint of step "
                                                                          f"{state['progress']['step']}")
            except ValueError as e:
                raise ConfigError(str(e)) from None
        model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])  # its saved LRs are replaced before the next step
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        if state["world_size"] == self.env.world_size and state.get("rng"):
            _set_rng_state(state["rng"][self.env.rank])
        else:  # another world, or a rescue checkpoint: no per-rank stream to continue, derive a fresh one
            torch.manual_seed(self.cfg.data.seed + 1_000_003 * self.progress.step + self.job.seat)
        meta = state.get("ddpjob") or {}
        if meta.get("peer") is not None:  # every receiving rank says so: the replacement is not always rank 0
            log.warning("resumed from peer rank %d by broadcast step=%d epoch=%d epoch_samples=%d (no checkpoint "
                        "read; %.2f s)", meta["peer"], self.progress.step, self.progress.epoch,
                        self.progress.epoch_samples, meta.get("seconds", 0.0))
        elif self.env.is_main:
            log.info("resumed from checkpoint step=%d epoch=%d epoch_samples=%d (saved at world_size=%d, now %d)",
                     self.progress.step, self.progress.epoch, self.progress.epoch_samples, state["world_size"],
                     self.env.world_size)

    def close(self, clean: bool) -> None:
        """Every exit path: the job (pending checkpoint, progress, stop handler), the sample records."""
        try:
            self.job.close(clean)
        finally:
            if self._records:
                self._records.close()


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
