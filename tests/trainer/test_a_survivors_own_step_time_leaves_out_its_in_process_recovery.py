"""A survivor's own time per step (runtime/timing.py: the step minus its waits for the others) leaves out an
in-process recovery: the recovery waits for the lost seat to leave (SETTLE_S), forms the next view and hands over
the state, none of it this rank's work. Counted as own time, it made the survivor's first step after a loss look
seconds long (to the straggler measure), and a 60x straggler fault (`--fault-slow-rank`) slept a minute on it. Two
in-process seats of the bundled trainer, real Gloo and the job's real store; every micro-batch costs MICRO_BATCH_S,
whatever the machine's load."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_trainer.runtime.membership import SETTLE_S

from inprocess_gang import Gang
from loopback_endpoint import Endpoint

pytestmark = pytest.mark.slow

# A short step trains both seats' micro-batches (full-batch): 1.2 s, longer than the reporter's 1 s pacing of
# POSTs, so that no report of a short step is replaced by the next one before it is sent.
STEPS, KILL_AT, BATCH, SEATS, MICRO_BATCH_S = 4, 2, 3, 2, 0.6
ARGS = ["--workload", "workload_with_a_fixed_cost_per_micro_batch", "--workload-option",
        f"samples={STEPS * BATCH * SEATS}", "--workload-option", f"micro_batch_seconds={MICRO_BATCH_S}",
        "--batch-size", str(BATCH), "--epochs", "1", "--log-every", "1"]


def test_the_first_step_after_a_recovery_reports_its_training_time_only(tmp_path: Path) -> None:
    gang = Gang(tmp_path, "recovery-time", ARGS)
    with Endpoint() as endpoint:
        try:
            gang.run_through_a_crash(SEATS, KILL_AT, endpoint.url)
        finally:
            gang.close()
    assert "recovered in process: generation 1 -> 1" in gang.text(0, 1), gang.logs()
    # A report's step_seconds covers the steps whose ends (should_stop) came since the last report: the one made
    # during step KILL_AT + 2 covers step KILL_AT + 1 alone, the first short step, which the recovery preceded.
    own = {body["step"]: body["step_seconds"] for body in endpoint.bodies if body.get("rank") == 0}
    print(f"own seconds per step, by the step that reported them: {own}")
    first_short = own.get(KILL_AT + 2)
    assert first_short is not None, own
    # Its own work: the failed attempt's micro-batch (its gradients' all_reduce met the lost peer) and the step
    # trained again, short, with both seats' micro-batches. The recovery between them waited SETTLE_S at least.
    assert 2 * MICRO_BATCH_S <= first_short < 3 * MICRO_BATCH_S + SETTLE_S / 2, own
