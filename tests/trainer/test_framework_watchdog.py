"""The Hugging Face and Lightning callbacks get `Job`'s stall watchdog and steady collective timeout
(runtime/watchdog.py through `frameworks.StallGuard`, issue 25): a survivor blocked in a collective on a
frozen peer leaves with a `Timed out` peer failure where the collective never times out by itself, and
obeys SIGTERM within seconds; the steady timeout is set after the first steps and relaxed around an
evaluation and a checkpoint save, which then trip nothing however long they take.

Real torchrun, two trainers, Gloo, CPU, the examples' tiny models (from a config: nothing downloaded).
Rank 1 freezes itself with SIGSTOP after a step (alive, its sockets open: a node that went silent), so rank 0
waits in its next collective; the process group's own timeout is 600 s there (or the framework's 1800 s),
so a rank 0 that leaves at all was got out by the watchdog. Time limits: the test timeout's only."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from trainer_harness import PY, base_env, failures, kill_tree, process_state, start, tail, wait_for, worker_ranks

from ddp_trainer.runtime.distributed import is_peer_failure
from ddp_trainer.runtime.frameworks import StallGuard
from ddp_trainer.runtime.watchdog import StallWatchdog

ROOT = Path(__file__).resolve().parents[2]
UNBOUNDED = 600  # pytest.ini's timeout: the waits below have no bound of their own
FROZEN, SILENT_S, STEADY_S, STOP_GRACE_S = 22, 4.0, 600.0, 1.0
EVAL_AT, SAVE_AT = 12, 16  # an evaluation and a save, each longer than SILENT_S, under the steady timeout

# ---------------------------------------------------------------- the rules (pure)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_evaluation_batches_after_a_stop_keep_it_waiting_for_the_next_step_and_a_blocked_one_still_exits():
    clock = Clock()
    dog = StallWatchdog(lambda: 0.0, clock=clock, exit=lambda code: None)
    dog.close()  # the rules only: no thread
    dog.stop_requested()  # SIGTERM during an evaluation
    for _ in range(20):
        clock.now += 1
        dog.alive()  # an evaluation batch: not blocked, the stop waits for the next step's checkpoint
        assert dog.check(clock.now) is None
    clock.now += 5  # the evaluation's collective blocks
    code, message = dog.check(clock.now)
    assert code == 143 and "stopped by SIGTERM while blocked" in message


def test_a_stop_during_a_save_waits_for_it_and_counts_its_grace_from_its_end():
    clock = Clock()
    dog = StallWatchdog(lambda: 0.0, clock=clock, exit=lambda code: None)
    dog.close()  # the rules only: no thread
    dog.busy()  # a framework's synchronous save starts
    dog.stop_requested()  # SIGTERM during it
    clock.now += 60  # a save far longer than the stop's grace: the process is not ended in its middle
    assert dog.check(clock.now) is None
    dog.alive()  # saved
    clock.now += 4
    assert dog.check(clock.now) is None
    clock.now += 1  # then blocked (a collective) for the grace: it exits
    code, message = dog.check(clock.now)
    assert code == 143 and "stopped by SIGTERM while blocked" in message
    later = StallWatchdog(lambda: 0.0, clock=clock, exit=lambda code: None)
    later.close()
    later.busy()
    clock.now += 65
    later.step()  # a step ends the busy work too
    later.stop_requested()  # a SIGTERM after it, then blocked past the grace (3 x the recent step here)
    clock.now += 3 * 65 - 1
    assert later.check(clock.now) is None
    clock.now += 2
    assert later.check(clock.now)[0] == 143


def test_the_guard_relaxes_without_shortening_the_first_steps():
    guard = StallGuard(30.0)
    guard.close()
    guard.relax()  # a sanity-check validation before training
    for _ in range(9):
        guard.step()
    assert not guard.timeouts.steady  # still the first 10 steps' long timeout
    guard.step()
    assert guard.timeouts.steady and guard.watchdog.steady_s() == 30.0
    guard.relax()  # an evaluation
    assert guard.watchdog.steady_s() == 0.0  # the silent-peer rule waits meanwhile
    guard.step()
    guard.step()
    assert guard.watchdog.steady_s() == 30.0
    with pytest.raises(ValueError):
        StallGuard(-1.0)


# ---------------------------------------------------------------- real torchrun, real frameworks

RANK_SCRIPT = Path(__file__).with_name("framework_watchdog_rank.py")
FRAMEWORKS = {"hf": ("transformers", "accelerate"), "lightning": ("lightning",)}  # what each needs installed
STEP = re.compile(r"rank=0 step=(\d+) timeout=(\d+)")  # (both ranks write to one log: lines may run together)


def launch(tmp_path: Path, framework: str, mode: str, frozen: int):
    for module in FRAMEWORKS[framework]:
        pytest.importorskip(module)
    log = tmp_path / "torchrun.log"
    env = base_env(tmp_path / "ck", DDPJOB_CHECKPOINT_INTERVAL_STEPS=str(SAVE_AT), HF_HUB_OFFLINE="1")
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "--monitor-interval=0.2", f"--log-dir={tmp_path / 'torchrun'}",  # the trainers' error files
           str(RANK_SCRIPT), framework, str(ROOT / "examples" / framework / "train.py"), mode, str(frozen),
           str(SILENT_S), str(STEADY_S), str(STOP_GRACE_S), str(EVAL_AT)]
    proc = start(cmd, env, log)
    try:
        ranks = wait_for(lambda: (lambda found: found if len(found) == 2 else None)(worker_ranks(proc.pid)),
                         "both trainers", UNBOUNDED, explain=lambda: tail(log))
    except BaseException:
        kill_tree(proc, signal.SIGKILL)
        raise
    return proc, log, ranks


def rank0_steps(log: Path) -> dict[int, float]:
    """Rank 0's collective timeout in force after each step it finished."""
    return {int(step): float(timeout) for step, timeout in STEP.findall(log.read_text(errors="replace"))}


def leaves_while_frozen(ranks: dict[int, int], log: Path) -> None:
    """Rank 0 exits while rank 1 is still frozen; then rank 1 is ended, as the node controller's verdict
    would (the agent's own SIGTERM waits for it to thaw, then its SIGKILL comes 30 s later)."""
    wait_for(lambda: process_state(ranks[0]) in (None, "Z"), "rank 0 to exit", UNBOUNDED, explain=lambda: tail(log))
    assert process_state(ranks[1]) == "T", tail(log)
    os.kill(ranks[1], signal.SIGKILL)


def frozen_first(log: Path, frozen: int) -> None:
    """Rank 1 froze after `frozen`, and rank 0 never finished a step after it: it was blocked on rank 1."""
    text = log.read_text(errors="replace")
    assert "rank=1 frozen" in text, tail(log)
    assert max(rank0_steps(log)) == frozen, tail(log)


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_survivor_blocked_on_a_frozen_peer_leaves_with_a_peer_failure(tmp_path: Path, framework: str) -> None:
    proc, log, ranks = launch(tmp_path, framework, "silent", FROZEN)
    try:
        leaves_while_frozen(ranks, log)
        code = proc.wait(UNBOUNDED)
    finally:
        kill_tree(proc, signal.SIGKILL)
    assert code != 0, tail(log)
    frozen_first(log, FROZEN)
    failed = failures(log)
    assert 0 in failed, tail(log, 120)
    rank0_code, message = failed[0]
    # The watchdog's verdict, not the collective's own error (its 600 s never passed): a peer failure, on
    # which the launcher waits in place for the next generation.
    assert rank0_code == 1 and (message or "").startswith("TrainerStalled: Timed out"), failed
    assert is_peer_failure(RuntimeError(message)), message
    # The steady timeout: after the first 10 steps; relaxed around the evaluation and the save (each longer
    # than the silent limit: neither tripped the watchdog), the step that took them not counted as steady.
    timeouts = rank0_steps(log)
    relaxed = {"hf": {EVAL_AT + 1, SAVE_AT + 1}, "lightning": {EVAL_AT + 1, SAVE_AT}}[framework]
    expected = {step: 1800.0 if step < 10 or step in relaxed else STEADY_S for step in range(1, FROZEN + 1)}
    assert timeouts == expected, timeouts


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_sigterm_to_a_survivor_blocked_in_a_collective_exits_143(tmp_path: Path, framework: str) -> None:
    frozen = 6
    proc, log, ranks = launch(tmp_path, framework, "stop", frozen)  # the defaults: no steady timeout
    try:
        wait_for(lambda: "rank=1 frozen" in log.read_text(errors="replace")
                 and frozen in rank0_steps(log), "rank 1 frozen, rank 0 past its last step", UNBOUNDED,
                 explain=lambda: tail(log))
        os.kill(ranks[0], signal.SIGTERM)  # as torchrun forwards the pod's SIGTERM; rank 0 waits for rank 1
        leaves_while_frozen(ranks, log)
        code = proc.wait(UNBOUNDED)
    finally:
        kill_tree(proc, signal.SIGKILL)
    assert code != 0, tail(log)
    frozen_first(log, frozen)
    failed = failures(log)
    assert 0 in failed, tail(log, 120)
    assert failed[0][0] == 143 and "stopped by SIGTERM while blocked" in (failed[0][1] or ""), failed
