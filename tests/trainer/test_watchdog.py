"""The stall watchdog (runtime/watchdog.py, issue 25): a trainer blocked in a collective on a silent peer
obeys SIGTERM at once, and leaves with a peer failure when the collective itself never times out, after
writing its rescue checkpoint where the abort of its process groups gets it out of the collective.

Real processes and a real Gloo group: rank 1 stops taking part after a few steps with its sockets open
(a frozen process, a node that went silent) while rank 0 waits in an all_reduce whose own timeout is far
away (300 s)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_trainer.runtime.watchdog import SILENT_MARGIN_S, StallWatchdog
from trainer_harness import base_env, committed_steps

# ---------------------------------------------------------------- the rules (pure)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watchdog(steady: float = 0.0, **kw) -> tuple[StallWatchdog, Clock]:
    clock = Clock()
    dog = StallWatchdog(lambda: steady, clock=clock, exit=lambda code: None, **kw)
    dog.close()  # the rules only: no thread
    return dog, clock


def steps(dog: StallWatchdog, clock: Clock, seconds: float, n: int = 5) -> None:
    for _ in range(n):
        clock.now += seconds
        dog.step()


def test_a_stop_with_no_step_after_it_exits_after_the_grace():
    dog, clock = watchdog()
    dog.stop_requested()
    clock.now += 4.9
    assert dog.check(clock.now) is None
    clock.now += 0.2
    code, message = dog.check(clock.now)
    assert code == 143 and "stopped by SIGTERM while blocked" in message


def test_a_step_after_the_stop_means_the_trainer_is_not_blocked():
    dog, clock = watchdog()
    dog.stop_requested()
    clock.now += 1
    dog.step()  # it reached the step boundary: the stop is being handled (final checkpoint)
    clock.now += 60
    assert dog.check(clock.now) is None


def test_the_grace_grows_with_slow_steps():
    dog, clock = watchdog()
    steps(dog, clock, 10)
    dog.stop_requested()
    clock.now += 29
    assert dog.check(clock.now) is None  # 3 steps' time
    clock.now += 2
    assert dog.check(clock.now)[0] == 143


def test_a_silent_peer_is_a_peer_failure_only_while_the_steady_timeout_is_in_force():
    relaxed, clock = watchdog(steady=0.0)
    clock.now += 3600
    assert relaxed.check(clock.now) is None  # start-up, a save, an evaluation: no limit
    dog, clock = watchdog(steady=30.0)
    clock.now += 30 + SILENT_MARGIN_S - 1  # the steady timeout and a margin, no more
    assert dog.check(clock.now) is None
    clock.now += 1
    code, message = dog.check(clock.now)
    contract = pytest.importorskip("ddpjob_operator.agent.contract", reason="the operator package is not on the path")
    assert code == 1 and re.search(contract.PEER_FAILURE_PATTERN, message)  # the launcher waits in place


def test_a_silent_peer_is_given_this_ranks_own_work_for_the_step_on_top():
    """The collective's timeout runs from when it started, after the rank's own work (the longest recent step)."""
    steady = [0.0]
    dog, clock = watchdog()
    dog.steady_s = lambda: steady[0]
    steps(dog, clock, 600, n=1)  # an evaluation, under the relaxed timeout: says nothing of the steps
    steady[0] = 30.0
    steps(dog, clock, 8)
    clock.now += 30 + 8 + SILENT_MARGIN_S - 1
    assert dog.check(clock.now) is None
    clock.now += 1
    assert dog.check(clock.now)[0] == 1


# ---------------------------------------------------------------- real ranks, real Gloo

RANK = Path(__file__).with_name("watchdog_rank.py")
ABORTED_RANK = Path(__file__).with_name("watchdog_aborted_rank.py")


def free_port() -> int:
    import socket
    with socket.socket() as s:  # only the store's port: held by rank 0's TCPStore at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(tmp_path: Path, script: Path, args: list[str], env: dict[str, str] | None = None
                ) -> list[subprocess.Popen]:
    """Two ranks of `script` (argv: the rank, then `args`), each with its own torchrun error file."""
    procs = []
    for rank in (0, 1):
        rank_env = {**(env or os.environ), "TORCHELASTIC_ERROR_FILE": str(tmp_path / f"error-{rank}.json"),
                    "OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": "0"}
        procs.append(subprocess.Popen([sys.executable, str(script), str(rank), *args], env=rank_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def start_pair(tmp_path: Path, mode: str) -> list[subprocess.Popen]:
    return start_ranks(tmp_path, RANK, [str(free_port()), mode])


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"never printed {text!r} (exit {proc.poll()})")


def error_message(tmp_path: Path) -> str:
    return json.loads((tmp_path / "error-0.json").read_text())["message"]["message"]


@pytest.mark.parametrize("mode", ["stop", "silent"])
def test_a_rank_blocked_on_a_silent_peer_leaves_long_before_the_collective_timeout(tmp_path, mode):
    procs = start_pair(tmp_path, mode)
    try:
        wait_for_line(procs[1], "frozen")
        wait_for_line(procs[0], "step 4")
        if mode == "stop":
            procs[0].send_signal(signal.SIGTERM)  # blocked in the all_reduce: Python's handler cannot run
        # The group's own timeout is 300 s: without the watchdog, rank 0 would still be waiting then.
        code = procs[0].wait(timeout=120)
        if mode == "stop":
            assert code == 143 and "stopped by SIGTERM while blocked" in error_message(tmp_path)
        else:
            assert code == 1 and error_message(tmp_path).startswith("TrainerStalled: Timed out")
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_rank_the_abort_gets_out_of_its_collective_saves_its_replica_then_exits_with_the_verdict(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    env = base_env(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = start_ranks(tmp_path, ABORTED_RANK, [str(checkpoints)], env)
    try:
        wait_for_line(procs[1], "frozen")
        code = procs[0].wait(timeout=120)
        out = procs[0].stdout.read()
        assert code == 1 and "collective failed" in out, out
        # The verdict, not the collective's own error, reaches the launcher: it waits in place on it.
        assert error_message(tmp_path).startswith("TrainerStalled: Timed out"), out
        assert committed_steps(checkpoints) == [4], out  # the replica after the last step, saved before the exit
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_closing_the_watchdog_does_not_wait_for_its_threads_next_look():
    """Every trainer's exit closes it: the thread is woken at once, not at its next look (every 0.5 s)."""
    dog = StallWatchdog(lambda: 0.0, exit=lambda code: None)
    time.sleep(0.05)  # the thread is in its select now
    started = time.monotonic()
    dog.close()
    assert time.monotonic() - started < 0.25  # joined its thread: out of its select at once
