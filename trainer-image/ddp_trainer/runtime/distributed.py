"""The torchrun + DDPJob environment, process-group setup, and the cooperative stop request."""

from __future__ import annotations

import collections
import datetime
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .contract import (CHECKPOINT_DIR_ENV, CHECKPOINT_INTERVAL_ENV, CHECKPOINT_KEEP_ENV, GENERATION_ENV, JOB_NAME_ENV,
                       JOB_NAMESPACE_ENV, REPLICA_INDEX_ENV, env_int)


@dataclass(frozen=True)
class JobEnv:
    """What torchrun and the operator put into every trainer's environment (docs/launch-contract.md)."""

    rank: int
    local_rank: int
    world_size: int
    group_rank: int = 0
    local_world_size: int = 1
    restart_count: int = 0  # TORCHELASTIC_RESTART_COUNT: always 0 under DDPJob (--max-restarts=0)
    generation: int = 0  # DDPJOB_GENERATION: the operator's restarts and resizes move it
    job_name: str | None = None
    namespace: str | None = None
    replica_index: int | None = None  # worker pod <job>-worker-<i>
    checkpoint_dir: str | None = None  # unset: no checkpoints
    checkpoint_interval_steps: int = 0
    checkpoint_keep: int = 2

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "JobEnv":
        e = os.environ if env is None else env
        missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in e]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not set: run the trainer under torchrun")
        return cls(rank=int(e["RANK"]), local_rank=int(e["LOCAL_RANK"]), world_size=int(e["WORLD_SIZE"]),
                   group_rank=env_int(e, "GROUP_RANK", 0), local_world_size=env_int(e, "LOCAL_WORLD_SIZE", 1),
                   restart_count=env_int(e, "TORCHELASTIC_RESTART_COUNT", 0),
                   generation=env_int(e, GENERATION_ENV, 0), job_name=e.get(JOB_NAME_ENV),
                   namespace=e.get(JOB_NAMESPACE_ENV), replica_index=env_int(e, REPLICA_INDEX_ENV, None),
                   checkpoint_dir=e.get(CHECKPOINT_DIR_ENV) or None,
                   checkpoint_interval_steps=env_int(e, CHECKPOINT_INTERVAL_ENV, 0),
                   checkpoint_keep=env_int(e, CHECKPOINT_KEEP_ENV, 2))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


DistEnv = JobEnv  # the 0.1 name


def select_device(requested: str, env: JobEnv) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda requested but CUDA is not available")
        torch.cuda.set_device(env.local_rank)  # before init, so NCCL binds the right GPU
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def init_process_group(env: JobEnv, device: torch.device, *, backend: str = "auto",
                       timeout_s: float = 1800.0) -> None:
    backend = backend if backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)


def barrier(device: torch.device) -> None:
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


# What Gloo and NCCL say when a peer is gone: its process died, its node vanished, or it stopped
# answering until the collective timed out. torch raises these as RuntimeError (DistError in newer
# code). The operator classifies a trainer's exit by the same pattern (ddpjob_operator.agent.contract).
PEER_FAILURE_PATTERN = (r"Connection (closed|reset) by peer|Broken pipe|Connection refused|Timed out|timed out|"
                        r"timeout caused pair closure|NCCL (communicator was aborted|error)|remote process exited|"
                        r"ncclRemoteError|ProcessGroupNCCL.*(Watchdog|abort)|Socket Timeout|Read error")
_PEER_FAILURE = re.compile(PEER_FAILURE_PATTERN, re.IGNORECASE)


def is_peer_failure(error: BaseException) -> bool:
    """True for a collective that failed because another rank did (not for an error in this rank's
    own code): the survivors' replicas are then intact at the last completed optimizer step."""
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and bool(_PEER_FAILURE.search(str(error)))


def abort_process_groups(groups: list[dist.ProcessGroup | None]) -> bool:
    """From any thread: abort the NCCL groups among `groups` (None: the default group), which fails the
    collectives blocked on them in other threads (the main thread's wait raises). True if there was
    one. Gloo groups are left alone: torch 2.13's ProcessGroupGloo has no abort (ProcessGroup.abort()
    does nothing there), and a thread inside a Gloo wait cannot be unblocked otherwise. The groups stay
    registered (torch's `_abort_process_group` would clear the registry, the main thread's to change)."""
    if not dist.is_initialized():
        return False
    aborted = False
    for group in groups:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        if "nccl" in str(dist.get_backend(pg)):
            pg.abort()
            aborted = True
    return aborted


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


STEADY_STEP_FACTOR = 3.0  # a steady collective waits at least this many times the longest recent step
RECENT_STEPS = 32  # the steps that count as recent


class CollectiveTimeout:
    """The process groups' collective timeout: long (`long_s`) for the first `after_steps` steps
    (compilation, autotuning, data warm-up) and around checkpoint saves that other ranks wait for;
    `steady_s` once steps are regular. A hung or silently vanished peer (no connection reset: a frozen
    process, a lost node) then fails the survivors' next collective in minutes instead of NCCL's 10 or
    Gloo's 30, and they save their replicas (rescue checkpoint) and exit instead of hanging.
    `steady_s` 0: keep `long_s` throughout."""

    def __init__(self, long_s: float, steady_s: float = 0.0, after_steps: int = 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.long_s, self.steady_s, self._clock = long_s, steady_s, clock
        self.groups: list[dist.ProcessGroup | None] = [None]  # None: the default group
        self.steady = False
        self._steps, self._calm_from, self._after_steps = 0, after_steps, after_steps
        # Steps longer than steady_s / STEADY_STEP_FACTOR raise the bound to that many of the longest recent one:
        # a short default (5 s: a silent peer caught within 10 s) must not judge a model whose steps take seconds.
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self._last_step: float | None = None
        self.current_s = long_s  # the bound in force (steady: steady_s or more)

    def add_group(self, group: dist.ProcessGroup) -> None:
        if group not in self.groups:
            self.groups.append(group)
            if self.steady:
                self._set(self.current_s, [group])

    def restart(self, after_steps: int | None = None) -> None:
        """In a new process group (in-process recovery): the default group only, long until `after_steps` more
        steps completed (default: as many as at the start; a regroup of warm processes needs fewer)."""
        self.groups = [None]
        self.steady = False
        self._calm_from = self._steps + (self._after_steps if after_steps is None else after_steps)
        self._last_step = None
        self._set(self.long_s)

    @property
    def steady_bound_s(self) -> float:
        """The steady timeout for steps like the recent ones: steady_s, or STEADY_STEP_FACTOR x the longest."""
        return max(self.steady_s, STEADY_STEP_FACTOR * max(self._recent, default=0.0))

    def step(self) -> None:
        """Once per optimizer step, on every rank."""
        now = self._clock()
        if self._last_step is not None and self.steady:  # long-timeout steps (start, saves) are not the steady kind
            self._recent.append(now - self._last_step)
        self._last_step = now
        self._steps += 1
        if self.steady_s > 0 and not self.steady and self._steps >= self._calm_from:
            self.steady = True
            self._set(self.steady_bound_s)
        elif self.steady and not 0.8 * self.current_s <= self.steady_bound_s <= self.current_s:
            self._set(self.steady_bound_s)  # longer steps at once; shorter ones once clearly so (no churn)

    def relax(self, steps: int = 2) -> None:
        """Long again until `steps` more steps completed: around a save rank 0 writes while the others
        wait in their next collective."""
        if self.steady:
            self._set(self.long_s)
            self.steady = False
        self._calm_from = self._steps + steps

    def _set(self, seconds: float, groups: list[dist.ProcessGroup | None] | None = None) -> None:
        if groups is None:
            self.current_s = seconds
        if not dist.is_initialized():
            return
        timeout = datetime.timedelta(seconds=seconds)
        for group in self.groups if groups is None else groups:
            dist.distributed_c10d._set_pg_timeout(timeout, group)


class StopRequest:
    """SIGTERM/SIGINT set a local flag; ranks agree on it with one small all_reduce per step.

    The all_reduce for step k is started asynchronously at step k and read at step k+1, so it
    overlaps with compute instead of adding a round-trip per step. It runs on a CPU tensor over a
    Gloo group (the default group when it is Gloo, a side group next to NCCL), so agreeing never
    copies to the GPU nor waits for it: no device sync per step. Every rank calls `agreed()` exactly
    once per step, hence all ranks see the same answer at the same step, even when only one node
    was signalled. Create it before the process group when possible (a SIGTERM during start-up is
    then not lost); the group is made at the first `agreed()`, which every rank reaches together.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.requested = False
        self.signum: int | None = None
        self.regroup = False  # agreed with the flag: a rank asked every rank to move to the next view at this step
        self._group: dist.ProcessGroup | None = None
        self._pending: tuple[dist.Work, torch.Tensor] | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum: int, _frame: object) -> None:
        self.requested, self.signum = True, signum

    @property
    def exit_code(self) -> int:
        """128 + the signal: what a process killed by it would report (143 for SIGTERM)."""
        return 128 + (self.signum or signal.SIGTERM)

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The Gloo side group the flag travels on next to NCCL (None: the default group)."""
        return self._group

    def _stop_group(self) -> dist.ProcessGroup | None:
        if self._group is None and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # collective: all ranks are here together
        return self._group

    def agreed(self, regroup: bool = False) -> bool:
        """True on every rank once any rank was signalled (one step late at most). `regroup`: this rank asks every
        rank to move to the next view (in-process recovery, runtime/regroup.py); it travels with the stop flag, and
        `self.regroup` is then True on every rank at the same step. Once it is, nothing new is in flight: the group
        is left next, and the next `agreed()` starts over in the new one."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            self.regroup = regroup
            return self.requested
        stop = self._collect()
        if self.regroup:
            return stop
        flag = torch.tensor([1 if self.requested else 0, 1 if regroup else 0], dtype=torch.int32)  # CPU, never GPU
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._stop_group(), async_op=True),
                         flag)
        return stop

    def _collect(self) -> bool:
        self.regroup = False
        if self._pending is None:
            return False
        work, flag = self._pending
        self._pending = None
        work.wait()
        stop, self.regroup = (bool(value) for value in flag.tolist())
        return stop

    def reset(self) -> None:
        """The process group it ran on is gone (in-process recovery): forget the flag in flight and the side
        group; the next `agreed()` starts over in the new group. A signal already received stays."""
        self._pending, self._group, self.regroup = None, None, False

    def close(self, drain: bool = True) -> None:
        """Restore handlers; on a clean exit first drain the in-flight all_reduce (a failed peer
        could make that wait block until the collective timeout, so the error path skips it)."""
        try:
            if drain and self._pending is not None and dist.is_initialized():
                self._pending[0].wait()
        finally:
            self._pending = None
            for s, h in self._previous.items():
                signal.signal(s, h)


StopSignal = StopRequest  # the 0.1 name


def exit_process(code: int) -> None:
    """End a trainer that has closed its `Job` (checkpoint committed, process group destroyed) without
    interpreter teardown: C++ objects torch leaves to static destructors (process-group and store
    threads) can abort there ("terminate called without an active exception"), and a SIGABRT after
    a clean finish would make the operator restart a finished job. Flushes logging and stdio first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
