"""bench/recovery.py --chaos SEED N: the loss check through seeded faults. The same seed gives the same faults (a run
that found something can be run again), another seed others; each fault names a worker of the job, comes after the
one before it, and is one of the faults the runner and the bench can give."""

from __future__ import annotations

from .test_the_recovery_bench_holds_a_replacement_for_the_seconds_asked import recovery

KINDS = {recovery.KILL, recovery.DELETE, recovery.STOP, recovery.KILL_STORE}


def test_a_seed_draws_the_same_faults_every_time_and_another_seed_others() -> None:
    faults = recovery.chaos_faults(7, 40, 25, 3)
    assert faults == recovery.chaos_faults(7, 40, 25, 3) != recovery.chaos_faults(8, 40, 25, 3)
    assert len(faults) == 40 and {kind for _, _, kind in faults} == KINDS
    assert all(0 <= worker < 3 for worker, _, _ in faults)
    steps = [step for _, step, _ in faults]
    assert all(1 <= later - earlier <= 25 for earlier, later in zip([0, *steps], steps))
