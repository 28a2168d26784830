"""`--while-short own-batch` (issue 36's option that trades the same math for speed): the bundled trainer, two
in-process seats, real Gloo and the job's real store. Seat 1 crashes (SIGSEGV) after step KILL_AT and nobody
replaces it; the survivor trains on alone, its own seat's micro-batches only: the missing seat's samples of the
short steps are trained by nobody, no sample twice, the epoch keeps its steps, and a short step's own time is one
seat's micro-batches, not two (each costs MICRO_BATCH_S, whatever the machine's load)."""

from __future__ import annotations

import collections
import statistics
from pathlib import Path

import pytest

from ddp_trainer.runtime import View
from ddp_trainer.runtime.shards import Shards

from inprocess_gang import Gang
from loopback_endpoint import Endpoint

pytestmark = pytest.mark.slow

STEPS, KILL_AT, BATCH, SEATS, MICRO_BATCH_S, LOG_EVERY = 16, 4, 3, 2, 0.25, 4
SAMPLES = STEPS * BATCH * SEATS  # one epoch of exactly STEPS steps
ARGS = ["--workload", "workload_with_a_fixed_cost_per_micro_batch", "--workload-option", f"samples={SAMPLES}",
        "--workload-option", f"micro_batch_seconds={MICRO_BATCH_S}", "--batch-size", str(BATCH), "--epochs", "1",
        "--log-every", str(LOG_EVERY), "--while-short", "own-batch"]


def undisturbed(seat: int) -> list[list[str]]:
    """Per step, the "epoch index" record lines seat `seat` trains in an undisturbed run."""
    steps = Shards(SAMPLES, 0, True, True, BATCH, 1, SEATS, View.whole(1, SEATS).coverage(seat)).steps(0, 0)
    return [[f"0 {i}" for micro in step for i in micro] for step in steps]


def test_a_short_step_trains_the_members_own_seats_only_and_costs_one_seats_time(tmp_path: Path) -> None:
    records = tmp_path / "records"
    gang = Gang(tmp_path, "own-batch", [*ARGS, "--record-samples", str(records)])
    with Endpoint() as endpoint:
        try:
            gang.run_through_a_crash(SEATS, KILL_AT, endpoint.url)
        finally:
            gang.close()
        survivor = gang.text(0, 1)
    assert "recovered in process: generation 1 -> 1" in survivor, gang.logs()
    assert "training short with --while-short own-batch (missing seats 1)" in survivor, gang.logs()

    trained = {seat: Path(f"{records}.rank{seat}").read_text().splitlines() for seat in range(SEATS)}
    assert trained[0] == [line for step in undisturbed(0) for line in step]  # every step, in its own order
    assert trained[1] == [line for step in undisturbed(1)[:KILL_AT] for line in step]  # until it was lost
    assert max(collections.Counter(trained[0] + trained[1]).values()) == 1  # no sample twice
    not_trained = {line for step in undisturbed(1)[KILL_AT:] for line in step}
    assert len(not_trained) == (STEPS - KILL_AT) * BATCH and not not_trained & set(trained[0])
    losses = [int(line.split()[0]) for line in Path(f"{records}.loss").read_text().splitlines()]
    assert losses == list(range(1, STEPS + 1))  # the epoch kept its steps

    # Each report's step_seconds: the survivor's own time per step over the steps since its last report. The
    # first short window also holds the regroup: only the windows after it count.
    reports = {body["step"]: body["step_seconds"] for body in endpoint.bodies
               if body.get("rank") == 0 and body.get("step_seconds") is not None}
    short = [seconds for step, seconds in reports.items() if step >= KILL_AT + 1 + LOG_EVERY]
    print(f"own seconds per step: whole {[reports[s] for s in reports if s <= KILL_AT]}, short {short}")
    assert short, reports
    # Full-batch would sleep two micro-batches a short step (0.5 s at least); one is 0.25 s plus tiny compute.
    assert statistics.median(short) < 1.6 * MICRO_BATCH_S, reports
