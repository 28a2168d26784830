"""`FrameworkCallback`: what DDPJob's Hugging Face and Lightning callbacks share (hf.py, lightning.py), in one
place that imports neither framework: the stop every rank agrees on at the same step, the stall guard's wiring,
the generation fence at the start of training, the resume announcement, progress reports with the step timer,
a rescue checkpoint's placement and commit, and the way out after a failure or a stop. Each framework's callback
keeps only what its framework's events and checkpoint layout need.

Under in-process recovery (`DDPJOB_INPROCESS=1`, the default with restartScope Pod) the launcher starts each pod's
trainers in a torchrun rendezvous of the pod's own, and a `Job` forms the job's process group through the job's store.
A framework owns its DDP wrapper and its loop, so its trainers cannot keep their processes across a peer's failure:
`form_group` forms their group through the store as `Job.start` does (before the framework initialises distributed),
and a peer's failure ends the trainer as on the restart path, so its launcher starts one for the next generation,
which resumes from the rescue checkpoint. The job says so once (`RESTART_PATH`), and each resume's timeline says why.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import frameworks, inprocess
from .contract import INPROCESS_ENV
from .distributed import JobEnv
from .progress import ProgressReporter
from .recovery import join_first_group, publish_environ
from .timing import StepTimer

log = logging.getLogger(__name__)
# Why a framework's trainer takes the restart path under in-process recovery: the log line (once a job) and the reason
# in each resume's recovery timeline (status.incidents[].recovery.fallbackReason, the Recovered event).
RESTART_PATH = ("{framework} takes the restart path: it owns its DDP wrapper and its training loop, so a peer's "
                "failure restarts its trainers, which resume from the rescue checkpoint; in-process recovery needs "
                "a script on ddp_trainer.runtime.Job")
RESTART_PATH_SAID_KEY = "ddpjob/{uid}/inprocess/restart-path-said"  # in the job's store: said by the first rank 0
GROUP_TIMEOUT_S = 1800.0  # torch's default; the framework's own timeout is restored when training starts
_formed: list[inprocess.Rendezvous] = []  # the job's store, once this process formed its group through it


def form_group(framework: str) -> None:
    """Under in-process recovery: form this process's group through the job's store (a warm spare: once it has its
    place), so that the framework finds it initialised and reads its rank and world size from torchrun's variables
    (`publish_environ`). Call it before the framework initialises distributed: the callbacks' constructors and their
    modules' `output_dir`, `checkpoint_dir` and `trainer_kwargs` do. Once per process; nothing elsewhere."""
    if _formed or not inprocess.enabled() or dist.is_initialized():
        return
    try:
        rdzv, device, env = join_first_group("auto", "auto", GROUP_TIMEOUT_S)
        if env is None:  # a warm spare: its launcher writes its place once the operator gives it one (as take_place)
            publish_environ(rdzv, rdzv.join(rdzv.wait_place(lambda: False), device, GROUP_TIMEOUT_S, lambda: False))
    except inprocess.CannotRecover as e:
        frameworks.refuse(f"DDPJob: {e}. Fix: run under DDPJob's launcher, or set failurePolicy.recovery: Restart")
        return
    _formed.append(rdzv)
    # The launcher withholds torchrun's MASTER_ADDR/MASTER_PORT from in-process trainers (a group formed from them
    # would be the pod's alone); accelerate refuses a multi-node world without them even once the group exists.
    host, _, port = os.environ[inprocess.ENDPOINT_ENV].rpartition(":")
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port)
    if JobEnv.from_env().rank == 0 and _first_to_say(rdzv):
        frameworks.announce(RESTART_PATH.format(framework=framework))


def _first_to_say(rdzv: inprocess.Rendezvous) -> bool:
    """True in the first process of the job to ask (the line is the job's, not each generation's)."""
    me = f"{os.uname().nodename}/{os.getpid()}"
    try:
        said = rdzv.store.compare_set(RESTART_PATH_SAID_KEY.format(uid=rdzv.uid), "", me)
    except RuntimeError:  # the store: the line only
        return True
    return (said.decode("utf-8", "replace") if isinstance(said, bytes) else said) == me


def check_group_formed(framework: str, fix: str) -> None:
    """When training starts, under in-process recovery: the group must be the job's (`form_group`), not one the
    framework formed from torchrun's variables, which are each pod's alone (every pod would train by itself). End every
    process at once with 1 and `fix`."""
    if inprocess.enabled() and not _formed:
        frameworks.refuse(f"DDPJob: {framework} formed its process group before DDPJob could (in-process recovery, "
                          f"{INPROCESS_ENV}=1, forms it through the job's store): each pod would train "
                          f"alone. Fix: {fix}, or set failurePolicy.recovery: Restart")


def restart_reason(framework: str) -> str:
    """The reason a resume's recovery timeline gives: "" unless in-process recovery was asked for."""
    return RESTART_PATH.format(framework=framework) if inprocess.enabled() else ""


def job_env() -> JobEnv | None:
    """This process's place under torchrun, or None (not under torchrun: a single process)."""
    try:
        return JobEnv.from_env()
    except RuntimeError:
        return None


class FrameworkCallback:
    """Mixed into a framework's callback class; `_init_job` from its `__init__`."""

    framework = "the framework"  # named in messages ("the Hugging Face Trainer")

    def _init_job(self, *, every_steps: int | None, exit_on_stop: bool, report_every: int,
                  steady_timeout_s: float) -> None:
        form_group(self.framework)
        self.env = job_env()
        self.stop = frameworks.PacedStop()  # now, in the main thread: a SIGTERM during set-up is not lost
        # A hung or silent peer, and SIGTERM while blocked in a collective (main thread: signals' wakeup fd).
        self.guard = frameworks.StallGuard(steady_timeout_s)
        self.every_steps = every_steps if every_steps is not None else (self.env.checkpoint_interval_steps
                                                                        if self.env else 0)
        self.exit_on_stop, self.report_every = exit_on_stop, max(1, report_every)
        self.stopped = False
        self.last_checkpoint_step: int | None = None
        self.reporter: ProgressReporter | None = None
        self._times: collections.deque[tuple[float, int]] = collections.deque(maxlen=20)  # (time, step)
        self.timer: StepTimer | None = None  # own time per step, apart from waiting for the others (issue 22)

    @property
    def exit_code(self) -> int:
        """0, or 128 + the signal after a stop (143 for SIGTERM)."""
        return self.stop.exit_code if self.stopped else 0

    @property
    def rank(self) -> int:
        return self.env.rank if self.env else 0

    # ---- training starts, steps, ends -----------------------------------------------------------

    def _start_training(self, *, timeout_s: float | None, fence: str | os.PathLike | None,
                        model: torch.nn.Module | None, device: torch.device | None, resumed_step: int,
                        is_main: bool) -> None:
        """The stall guard (back to the framework's collective timeout `timeout_s` when relaxed), the reporter,
        the generation fence on `fence` (the writer's checkpoint directory; None elsewhere), the step timer
        watching `model`'s gradient all_reduce, and a resume's announcement (its timeline starts)."""
        self.guard.start(timeout_s)
        if self.reporter is None:
            self.reporter = ProgressReporter.from_env()
        if fence is not None:
            self._guard(lambda: frameworks.start_generation(fence), fence, "a generation fence")
        if self.timer is None and model is not None:
            self.timer = StepTimer(device)
            self.timer.watch(model)  # the wait for DDP's gradient all_reduce is not this rank's work
        if resumed_step:
            self.last_checkpoint_step = resumed_step  # resumed from it
            frameworks.resumed(self.reporter, resumed_step, is_main, restart_reason(self.framework))

    def _agree_stop(self) -> bool:
        """Every rank, once per step: the same answer at the same step (an agreement is a wait, not training
        work); the stall guard sees the step."""
        with self.timer.waiting() if self.timer is not None and self.stop.due else contextlib.nullcontext():
            stop = self.stop.step()
        self.guard.step(self.stop)
        return stop

    def _samples_per_second(self, step: int, now: float, samples_per_step: int) -> float | None:
        """Over the last steps noted in `_times` (None before two)."""
        if len(self._times) >= 2 and now > self._times[0][0]:
            return samples_per_step * (step - self._times[0][1]) / (now - self._times[0][0])
        return None

    def _send_report(self, *, step: int, total_steps: int | None, loss: float | None, epoch: int,
                     samples_per_second: float | None, world_size: int) -> None:
        self.reporter.report(step=step, total_steps=total_steps, loss=loss, epoch=epoch,
                             samples_per_second=samples_per_second, world_size=world_size,
                             last_checkpoint_step=self.last_checkpoint_step,
                             step_seconds=self.timer.take() if self.timer is not None else None)

    def _report(self) -> None:
        """Send what is not reported yet (a callback that paces its reports); nothing by default."""

    def _guard(self, write: Callable[[], Any], directory: str | os.PathLike, what: str) -> Any:
        """`write()`; a full (or failing) checkpoint volume ends the process with 75, as the bundled trainer."""
        return frameworks.guard_volume(write, directory, what, before_exit=self._close)

    def _close(self) -> None:
        self.guard.close()
        if self.reporter is not None:
            self.reporter.close()
        self.stop.close(drain=False)

    def _end_after_stop(self) -> None:
        """Training stopped on a signal, the checkpoint committed: close, and exit 128+N where asked to."""
        self._close()
        if self.exit_on_stop:
            frameworks.exit_process(self.exit_code)

    def _after_failure(self, error: BaseException, rescue: Callable[[BaseException], object]) -> None:
        """Training raised `error`: `rescue(error)` (it decides whether it was a peer's failure), the last step
        reported, and a silent peer's verdict (not the aborted collective's error) ends the process."""
        self.guard.rescuing()  # out of the collective: the watchdog waits for this save before exiting
        rescue(error)
        self._report()
        if self.reporter is not None:
            self.reporter.flush()  # the last step reached, before the process ends
        if self.guard.verdict is not None:
            self._close()
            self.guard.leave()

    # ---- a rescue checkpoint --------------------------------------------------------------------

    def _place_rescue(self, step: int, final: Path, tmp: Path, write: Callable[[], None],
                      unloadable: Callable[[Path], str | None], framework: str, world_size: int,
                      errors: tuple[type[BaseException], ...] = (OSError,)) -> bool:
        """A survivor's replica as the complete checkpoint `final` of `step`: `write()` puts it at `tmp`, which
        replaces `final` (a partial one, its writer died) only if `framework` can load it, and is committed.
        Any surviving rank may (the first to commit wins); a step already complete is left alone. No collective.
        An error of `errors` is logged and dropped: the peer's failure matters more than this one."""
        if step == 0:
            return False
        try:
            if frameworks.read_marker(final) is not None:
                return False
            write()
            if (why := unloadable(tmp)) is not None:
                raise OSError(f"{framework} could not resume from it ({why})")
            if final.is_dir() and not final.is_symlink():
                shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            if frameworks.commit(final, step=step, world_size=world_size, rescued_by_rank=self.rank) is None:
                return False  # a newer generation started on the directory
        except errors as e:
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
            log.warning("rescue checkpoint of step %d not written: %s", step, e)
            return False
        log.warning("rescue checkpoint: rank %d saved step %d after a peer failed", self.rank, step)
        return True
