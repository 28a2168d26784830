"""bench/recovery.py --fault kill-store (issue 36's target: a SIGKILLed rendezvous store costs at most 10 s, no worker
restarted): the bench's timeline reads the store's return and every agent's and trainer's reconnect from their own
lines, and each store kill's numbers come from rank 0's step lines around it. The bench's real run is in
docs/benchmarks.md; here its reading of the lines, in seconds, with no process started."""

from __future__ import annotations

import time
from pathlib import Path

from .test_the_recovery_bench_holds_a_replacement_for_the_seconds_asked import recovery

PORT = 40123
STEP_S = 0.1  # one undisturbed step
CHECKPOINT_EVERY = 20  # the example's interval: a gap across a checkpoint is left out


def stamped(at: float, rank: int, level: str, text: str) -> str:
    """A line in the bundled trainer's logging format (ddp_trainer/__main__.py): time, rank, level, logger."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))},{int(at % 1 * 1000):03d} rank{rank} {level} {text}"


def step(at: float, n: int) -> str:
    return stamped(at, 0, "INFO", f"ddp_trainer.trainer: step={n} epoch=0 loss=0.5 samples_per_s=100.0 lr=0.05")


def test_the_store_and_every_agents_and_trainers_reconnect_line_are_read(tmp_path: Path) -> None:
    at = float(int(time.time()) - 60)  # whole seconds: the stamps carry milliseconds
    lost = f"the job's rendezvous store 127.0.0.1:{PORT} was lost (Connection reset by peer)"
    (tmp_path / "job-rdzv.log").write_text(f"ddpjob rendezvous store listening on port {PORT}\n")
    (tmp_path / "job-worker-0.log").write_text("\n".join([
        step(at, 7),
        stamped(at + 1, 0, "WARNING", "ddp_trainer.runtime.regroup: the job's rendezvous store cannot be read (Failed "
                                      "to recv): training on in view 0:0; joiners wait until it answers"),
        stamped(at + 2, 0, "WARNING", f"ddp_trainer.runtime.store_client: {lost}; reconnected after 1.5 s"),
        f"{lost}; reconnected after 1.6 s; generation 0 (1:2 nodes) published again",  # the agent's print
    ]) + "\n")
    (tmp_path / "job-worker-1.log").write_text(
        stamped(at + 3, 1, "WARNING", f"ddp_trainer.runtime.store_client: {lost}; reconnected after 2.5 s") + "\n")
    timeline = recovery.Timeline(tmp_path)
    timeline.poll()
    kinds = [kind for _, kind, _ in timeline.sorted()]
    assert kinds.count("store up") == 1 and kinds.count("step") == 1, kinds
    assert kinds.count("reconnected") == 3, kinds  # rank 0's trainer, its agent, rank 1's trainer
    assert [round(t - at, 3) for t, kind, _ in timeline.sorted() if kind == "reconnected"][:2] == [2.0, 3.0]


def entries_around_a_kill(t0: float, killed_after: int, pauses: dict[int, float], store_back: float,
                          reconnected: float, steps: int) -> list[tuple[float, str, int]]:
    """Rank 0's step lines every STEP_S from `t0` with longer gaps (`pauses`: after that step, its seconds), a store
    kill just after step `killed_after`, the new store up and a reconnect line that many seconds after the kill."""
    entries, at = [], t0
    for n in range(1, steps + 1):
        at += pauses.get(n - 1, STEP_S)
        entries.append((at, "step", n))
        if n == killed_after:
            killed_at = at + STEP_S / 2
            entries += [(killed_at, "store kill", 0), (killed_at + store_back, "store up", 0),
                        (killed_at + reconnected, "reconnected", 0)]
    return sorted(entries)


def test_a_store_kill_that_training_goes_through_is_measured_from_rank_0s_steps() -> None:
    t0, killed_after, pause, store_back, reconnected = 1000.0, 25, (27, 1.5), 3.0, 3.4
    # A longer gap once the store is back and met is the machine's, not the fault's: left out.
    later = (75, 2.0)
    entries = entries_around_a_kill(t0, killed_after, dict([pause, later]), store_back, reconnected, steps=80)
    killed_at = next(t for t, kind, _ in entries if kind == "store kill")
    asked = []
    [fault] = recovery.store_faults(entries, {}, CHECKPOINT_EVERY,
                                    lambda faulted, over: asked.append((faulted, over)) or True)
    assert fault.last_step == killed_after and fault.steps_lost == 0 and fault.resumed is None
    assert abs(fault.next_step - STEP_S / 2) < 1e-9
    assert abs(fault.longest_gap - pause[1]) < 1e-9 and abs(fault.median_gap - STEP_S) < 1e-9
    assert abs(fault.store_back - store_back) < 1e-9 and [round(r, 9) for r in fault.reconnects] == [reconnected]
    # Every worker's processes are compared from the kill to the first step after the reconnect.
    assert fault.workers_kept is True and asked[0][0] == killed_at
    first_after = min(t for t, kind, _ in entries if kind == "step" and t > killed_at + reconnected)
    assert asked[0][1] == first_after


def test_each_store_kill_has_its_own_window_and_a_restart_counts_the_steps_trained_again() -> None:
    first = entries_around_a_kill(1000.0, 25, {27: 1.5}, 3.0, 3.4, steps=60)
    # The restart path: a second kill moves every worker, which resume from step 50 (10 steps trained again).
    killed_at, t = first[-1][0] + STEP_S / 2, first[-1][0] + 8.0
    second = [(killed_at, "store kill", 0), (t, "resume", 50)] + [(t + i * STEP_S, "step", 50 + i) for i in range(1, 20)]
    faults = recovery.store_faults(first + second, {}, CHECKPOINT_EVERY)
    assert [f.fault for f in faults] == [1, 2] and faults[0].longest_gap < 2 and faults[0].steps_lost == 0
    assert faults[1].last_step == 60 and faults[1].steps_lost == 10 and abs(faults[1].resumed - (t - killed_at)) < 1e-9
    assert abs(faults[1].next_step - (t + STEP_S - killed_at)) < 1e-9
    assert faults[1].store_back is None and faults[1].reconnects == () and faults[1].workers_kept is None
