"""One progress model: the same trainer reports give the same percent, ETA, stall clock and recovery timeline
whether they reach the operator's endpoint (parse_report -> ProgressTracker) or the local runner's
progress.json (ProgressFile), across a rate change, a new generation and a survivor's late report."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from ddpjob_operator import decisions, progress
from ddpjob_operator.local.logs import PROGRESS_FILE, JobFiles
from ddpjob_operator.local.progress_file import ProgressFile

T0 = datetime(2026, 11, 22, 12, tzinfo=timezone.utc)


def reports() -> list[tuple[float, int, dict]]:
    """(seconds after T0, the generation the pod serves, the trainer's report): 1 step/s for 150 s, then
    1.5 steps/s (the ETA follows the recent rate), a restart into generation 1 resuming at step 100 with its
    recovery timeline, and a late report of the old generation's trainer."""
    out = []
    for second in range(0, 150, 2):
        out.append((second, 0, {"step": second, "total_steps": 2000, "loss": 2.0 - second / 200, "rank": 0,
                                "generation": 0}))
    for i, second in enumerate(range(150, 300, 2)):
        out.append((second, 0, {"step": 150 + 3 * (i + 1), "total_steps": 2000, "rank": 0, "generation": 0}))
    out.append((300, 0, {"step": 375, "total_steps": 2000, "rank": 0, "generation": 0}))  # a heartbeat
    recovery = {"path": "Restart", "reason": "", "resumed_step": 100, "rendezvous_time": T0.timestamp() + 320,
                "first_step_time": None}
    out.append((330, 1, {"step": 100, "total_steps": 2000, "rank": 0, "generation": 1, "recovery": recovery}))
    out.append((331, 1, {"step": 380, "total_steps": 2000, "rank": 0, "generation": 0}))  # the old trainer, late
    for second in range(332, 360, 2):
        stepped = {**recovery, "first_step_time": T0.timestamp() + 331}
        out.append((second, 1, {"step": 100 + second - 330, "total_steps": 2000, "rank": 0, "generation": 1,
                                "recovery": stepped}))
    return out


def seen(observation: decisions.ProgressObservation | None) -> tuple:
    if observation is None:
        return (None,)
    shown = decisions.progress_status(observation, finished=False)
    return (shown.step, shown.percent, shown.eta, shown.loss, observation.generation, observation.last_advance,
            observation.steps_per_second, observation.recoveries)


def test_the_same_reports_give_the_same_eta_and_stall_clock_locally_and_on_a_cluster(tmp_path):
    tracker = progress.ProgressTracker(write_seconds=0.0)
    local = ProgressFile(JobFiles(tmp_path, print), "uid", ("local", "job"), T0 - timedelta(seconds=1))
    etas = {}
    for second, served, body in reports():
        now = T0 + timedelta(seconds=second)
        report = progress.parse_report(json.dumps(body).encode())
        tracker.record("uid", ("ns", "job"), 0, progress.attributed_generation(progress.Worker("uid", 0, served),
                                                                               report), report, now)
        (tmp_path / PROGRESS_FILE).write_text(json.dumps({**body, "time": now.timestamp()}))
        on_cluster, here = seen(tracker.observation("uid", now)), seen(local.observe(served, now))
        assert here == on_cluster, (second, body)
        etas[second] = on_cluster[2]
    # 1 step/s: 1852 steps left; then 1.5 steps/s over the last 120 s: 1625 left. The ETA follows the recent rate.
    assert (etas[148], etas[298]) == ("30m52s", "18m3s")
    final = local.observe(1, T0 + timedelta(seconds=400))
    assert (final.generation, final.step, final.last_advance) == (1, 128, T0 + timedelta(seconds=358))
    assert final.ranks == ()  # progress.json is the job's, no pod's
    assert [(r.generation, r.first_step_time) for r in final.recoveries] == [(1, T0 + timedelta(seconds=331))]


def test_a_report_the_endpoint_would_refuse_is_not_progress_locally_and_is_warned_of_once(tmp_path):
    warnings: list[str] = []
    local = ProgressFile(JobFiles(tmp_path, warnings.append), "uid", ("local", "job"), T0)
    for second, loss in ((1, 0.5), (2, float("nan")), (3, float("nan"))):
        (tmp_path / PROGRESS_FILE).write_text(json.dumps({"step": second, "loss": loss,
                                                          "time": T0.timestamp() + second}))
        observed = local.observe(0, T0 + timedelta(seconds=second))
    assert observed.step == 1 and observed.last_advance == T0 + timedelta(seconds=1)
    assert len(warnings) == 1 and "loss must be a finite number" in warnings[0], warnings
    # A file an earlier run left (its time before this run started) is not news; nor is a file rewritten unchanged.
    (tmp_path / PROGRESS_FILE).write_text(json.dumps({"step": 90, "time": T0.timestamp() - 5}))
    assert local.observe(0, T0 + timedelta(seconds=9)).step == 1


def test_every_workers_step_time_gathered_by_rank_zero_reaches_straggler_detection(tmp_path):
    local = ProgressFile(JobFiles(tmp_path, print), "uid", ("local", "job"), T0)
    for second in (1, 2):
        (tmp_path / PROGRESS_FILE).write_text(json.dumps({
            "step": 10 * second, "time": T0.timestamp() + second, "rank": 0, "step_seconds_by_worker": {
                "0": 0.1, "1": 0.4 * second, "x": 1.0, "²": 1.0, "9" * 5000: 1.0, "2": float("inf"), "3": True}}))
        observed = local.observe(0, T0 + timedelta(seconds=second))
    timings = {r.index: [s.seconds for s in r.samples] for r in observed.timings}
    assert timings == {0: [0.1, 0.1], 1: [0.4, 0.8]}
