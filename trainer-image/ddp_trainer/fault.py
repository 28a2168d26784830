"""Test-only fault injection: a trainer that fails on purpose, the way a real one would.

`--fault-at-step N --fault-exit-code CODE --fault-rank R` makes global rank R end its process right
after optimizer step N (before that step's checkpoint), or after the first step of a generation that
resumed at or past N (a rescue checkpoint saves step N itself, so "fails at N in every generation"
still fails every generation): `os._exit(CODE)` for CODE < 128, otherwise
the default action of signal CODE-128 (139: a real SIGSEGV, as a crash in native code). Only while
$DDPJOB_GENERATION equals `--fault-generation` (default 0, so a replacement generation trains on);
`--fault-every-generation` fails in every generation. Nothing is cleaned up, nothing is saved.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping

from .config import FaultConfig
from .runtime.contract import GENERATION_ENV


def _here(fault: FaultConfig, environ: Mapping[str, str]) -> bool:
    """In the generation the fault is for and, with --fault-node, on that node ($NODE_NAME)."""
    if fault.node is not None and environ.get("NODE_NAME") != fault.node:
        return False
    return fault.generation == -1 or environ.get(GENERATION_ENV, "0") == str(fault.generation)


def due(fault: FaultConfig, rank: int, step: int, environ: Mapping[str, str] = os.environ) -> bool:
    if not fault.at_step or step < fault.at_step or (rank != fault.rank and fault.node is None):
        return False
    return _here(fault, environ)


def after_training_due(fault: FaultConfig, rank: int, environ: Mapping[str, str] = os.environ) -> bool:
    """`--fault-after-training`: in the work after the last step (the final evaluation and checkpoint)."""
    return fault.after_training and (rank == fault.rank or fault.node is not None) and _here(fault, environ)


def hang_due(fault: FaultConfig, rank: int, step: int, environ: Mapping[str, str] = os.environ) -> bool:
    if not fault.hang_at_step or step < fault.hang_at_step or (rank != fault.rank and fault.node is None):
        return False
    return _here(fault, environ)


def slow_due(fault: FaultConfig, rank: int, environ: Mapping[str, str] = os.environ) -> bool:
    """`--fault-slow-rank R --fault-slow-factor F`: this rank is a straggler (with --fault-node: every rank on
    that node is)."""
    if fault.slow_rank < 0 or fault.slow_factor <= 1.0 or (rank != fault.slow_rank and fault.node is None):
        return False
    return _here(fault, environ)


_announced = False


def slow_down(fault: FaultConfig, own_seconds: float, rank: int = -1) -> None:
    """Work F times as long: sleep (F - 1) x this step's own time, outside any collective."""
    global _announced
    if not _announced:
        _announced = True
        print(f"fault injection: rank {rank}: working {fault.slow_factor:g}x as long per step (a straggler)",
              file=sys.stderr, flush=True)
    if own_seconds > 0:
        time.sleep((fault.slow_factor - 1.0) * own_seconds)


def hang(rank: int, step: int) -> None:
    """`--fault-hang-at-step`: freeze this whole process (every thread, its progress heartbeat included)
    with SIGSTOP, as a wedged process would; only SIGKILL (or SIGCONT) ends it."""
    print(f"fault injection: rank {rank} at step {step}: hanging (SIGSTOP)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGSTOP)


def strike(fault: FaultConfig, rank: int, step: int) -> None:
    """End this process now, by exit code or by signal; never returns."""
    print(f"fault injection: rank {rank} at step {step}: "
          + (f"killing itself with signal {fault.exit_code - 128}" if fault.exit_code >= 128
             else f"exiting with code {fault.exit_code}"), file=sys.stderr, flush=True)
    sys.stdout.flush()
    if fault.exit_code >= 128:
        signum = fault.exit_code - 128
        signal.signal(signum, signal.SIG_DFL)  # not the trainer's SIGTERM handler, not faulthandler's
        os.kill(os.getpid(), signum)
        time.sleep(5)  # another thread may take the signal; a signal whose default is not to die falls through
    os._exit(fault.exit_code)
