"""DataLoader helpers: workers that survive SIGTERM until the step is done, batches of any shape."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Mapping
from typing import Any

import torch


def ignore_stop_signals(worker_id: int | None = None) -> None:
    """DataLoader `worker_init_fn`: a worker ignores SIGTERM and SIGINT.

    torchrun forwards SIGTERM to each trainer's whole process group, DataLoader workers included.
    A worker that dies of it makes the trainer's next batch raise ("DataLoader worker ... is killed
    by signal: Terminated"), so the trainer crashes before its final checkpoint. Ignoring the signal
    lets the trainer finish the step, checkpoint and exit; the workers then end with it (and the
    agent's SIGKILL after --shutdown-timeout still ends everything)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Forked under `iter_with_stop_signals_held`: a signal held since the fork is discarded now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def iter_with_stop_signals_held(loader: Any) -> Any:
    """`iter(loader)` with SIGTERM and SIGINT held while it forks its workers: a worker inherits the hold until
    its worker_init_fn ignores them. A signal in between (an epoch's workers starting as the pod is stopped)
    would kill it by the default action; this process gets a held one as soon as the workers exist."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _chained(user: Callable[[int], None] | None, worker_id: int) -> None:
    ignore_stop_signals(worker_id)
    if user is not None:
        user(worker_id)


def worker_init_fn(user: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """`ignore_stop_signals` followed by the user's own worker_init_fn (picklable for spawn)."""
    return functools.partial(_chained, user)


def move_to(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """Tensors of a batch (tensor, dict such as a Hugging Face BatchEncoding, list, tuple) to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: move_to(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(move_to(v, device, non_blocking) for v in batch)
    return batch


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    # Sequences first: isinstance against the Mapping ABC is the slow check, and (x, y) the common batch.
    values = batch if isinstance(batch, (list, tuple)) else batch.values() if isinstance(batch, Mapping) else []
    for v in values:
        n = batch_size_of(v)
        if n:
            return n
    return 0
