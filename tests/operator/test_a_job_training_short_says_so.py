"""Issue 36, "The status tells it", the pure rules: after a lost rank the survivors train on at once in a short
view (their reports keep the generation they started in, older than the operator's while the replacement is
Pending), and the job says so: condition Degraded (TrainingShort, WaitingForRanks, Whole), status.worldSize
below status.desiredWorldSize, never Running while nobody trains, the stall clock on the survivors' steps, and
the incident's timeline with the shrink and the join as two steps, neither charged."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest

from ddpjob_operator import decisions as d
from ddpjob_operator import model, progress

from .test_decisions import T0, decide, failed, job, of, running_status, seen, spec, w

SHORT = spec(replicas=3, minReplicas=1, failurePolicy={"backoff": {"initialSeconds": 0, "maxSeconds": 0}})
NODES_FULL = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def live_view(step: int, seconds: float, *, world: int = 2, missing=(2,), kind: str | None = "Shrink",
              generation: int = 0, waiting: int | None = None, advanced: float | None = None,
              recoveries: tuple[d.RecoveryReport, ...] = ()) -> d.ProgressObservation:
    """Rank 0's newest report as the tracker publishes it: the survivors' view, of the generation they started in."""
    return d.ProgressObservation(
        generation=generation, step=step, last_advance=at(seconds if advanced is None else advanced),
        world_size=world, desired_world_size=3, missing_ranks=tuple(missing), waiting_for_ranks=waiting,
        short_since=at(1) if missing else None, in_place=kind is not None or bool(missing), updated_at=at(seconds),
        recoveries=recoveries)


def running(s, replicas: int) -> model.DDPJobStatus:
    """The status of a job whose workers all run (its ranks listed, as every pass after the first has them)."""
    return decide(job(s, running_status()), seen(*(w(i) for i in range(replicas)), now=at(-60))).status


def lost_worker_2():
    """Worker 2 killed at T0: one charged incident, the survivors carried into generation 1, its replacement asked."""
    before = d.ProgressObservation(generation=0, step=12, last_advance=at(0), world_size=3, desired_world_size=3)
    out = decide(job(SHORT, running(SHORT, 3)), d.Observed(workers=(w(0), w(1), failed(2, 137)), store=seen().store,
                                                          now=at(0), progress=before))
    assert (out.status.generation, out.status.restarts) == (1, 1)
    return out.status


def survivors():
    return w(0), w(1)


def replacement(phase: str = "Pending", **kw) -> d.WorkerObservation:
    return w(2, phase, generation=1, attempt=1, **kw)


def unschedulable() -> d.WorkerObservation:
    return replacement(unschedulable=d.Waiting("Unschedulable", NODES_FULL, at(2)))


def degraded(status: model.DDPJobStatus) -> model.Condition | None:
    return next((c for c in status.conditions if c.type == d.CONDITION_DEGRADED), None)


def short_pass(status, progress_seen, *workers, seconds: float = 5, options=None):
    observed = d.Observed(workers=tuple(workers), store=seen().store, now=at(seconds), progress=progress_seen)
    return decide(job(SHORT, status), observed, *(options,) if options else ())


def test_the_survivors_training_short_is_degraded_and_named_with_why():
    status = lost_worker_2()
    out = short_pass(status, live_view(12, 5), *survivors(), unschedulable())
    st = out.status
    cond = degraded(st)
    assert (cond.status, cond.reason) == ("True", d.REASON_TRAINING_SHORT)
    assert cond.message == (f"2 of 3 ranks training; missing rank 2 (worker 2) since {d.rfc3339(at(1))}: its "
                            f"replacement pod j-worker-2 is Pending: {NODES_FULL}")
    assert (st.phase, st.world_size, st.desired_world_size) == ("Running", 2, 3)  # WORLD below DESIRED
    assert st.progress.step == 12 and st.restarts == 1  # the survivors' steps are the job's; nothing more charged
    [event] = [e for e in of(out, d.Event) if e.reason == d.REASON_TRAINING_SHORT]
    assert (event.type, event.message) == ("Normal", cond.message)
    # Written only when it changes: the same facts later keep the condition as it is, time included, and tell
    # no event again.
    again = short_pass(st, live_view(30, 9), *survivors(), unschedulable(), seconds=9)
    assert degraded(again.status) == cond and not [e for e in of(again, d.Event) if e.reason == cond.reason]


@pytest.mark.parametrize("pod, why", [
    (None, "its replacement pod j-worker-2 is being created"),
    (replacement(waiting=d.Waiting("ImagePullBackOff", "pulling trainer:1", at(2))),
     "its replacement pod j-worker-2 is Pending: ImagePullBackOff (pulling trainer:1)"),
    (replacement("Running"), "its replacement pod j-worker-2 is Running; its trainer has not joined yet"),
    (w(2, "Pending", generation=1), "its pod j-worker-2 is Pending"),  # a scale-up's first pod: no replacement
])
def test_the_message_says_why_the_missing_worker_is_not_there(pod, why):
    out = short_pass(lost_worker_2(), live_view(12, 5), *survivors(), *([pod] if pod else []))
    assert degraded(out.status).message.endswith(f": {why}")


def test_whole_again_turns_it_false_and_a_job_never_short_gets_no_condition():
    short = short_pass(lost_worker_2(), live_view(12, 5), *survivors(), unschedulable()).status
    raised = degraded(short)
    joined = short_pass(short, live_view(40, 20, world=3, missing=(), kind="Join"), *survivors(),
                        replacement("Running"), seconds=20)
    whole = joined.status
    cond = degraded(whole)
    assert (cond.status, cond.reason, cond.message) == ("False", d.REASON_WHOLE, "all 3 ranks training")
    assert [(e.type, e.message) for e in of(joined, d.Event) if e.reason == d.REASON_WHOLE] == [
        ("Normal", "all 3 ranks training")]
    assert cond.last_transition_time == d.rfc3339(at(20)) != raised.last_transition_time
    assert (whole.world_size, whole.desired_world_size, whole.phase) == (3, 3, "Running")
    # An undisturbed job that reports its whole world has no Degraded condition at all.
    calm = d.ProgressObservation(generation=0, step=5, last_advance=at(1), world_size=3, desired_world_size=3)
    out = short_pass(running(SHORT, 3), calm, w(0), w(1), w(2))
    assert degraded(out.status) is None and out.status.world_size == 3


def test_below_min_replicas_and_not_training_is_never_running():
    s = spec(replicas=2, minReplicas=2, failurePolicy={"backoff": {"initialSeconds": 0, "maxSeconds": 0}})
    lost = decide(job(s, running(s, 2)), seen(w(0), failed(1, 137), now=at(0))).status
    # The replacement's pod runs (so every pod counts as running) but its trainer is still being built: rank 0
    # says it waits for one more rank and trains nothing (no group: every rank missing, as the runtime sends it).
    waiting = d.ProgressObservation(generation=0, step=12, last_advance=at(0), world_size=0, desired_world_size=2,
                                    missing_ranks=(0, 1), waiting_for_ranks=1, in_place=True, updated_at=at(4),
                                    short_since=at(1))
    observed = d.Observed(workers=(w(0), w(1, "Running", generation=1, attempt=1)), store=seen().store, now=at(5),
                          progress=waiting)
    out = decide(job(s, lost), observed)
    st, cond = out.status, degraded(out.status)
    assert (cond.status, cond.reason) == ("True", d.REASON_WAITING_FOR_RANKS)
    assert cond.message == (f"not training: waiting for 1 more rank to reach minReplicas=2 since {d.rfc3339(at(1))}: "
                            "every worker's pod runs; a trainer has not joined yet")
    assert st.phase != "Running" and st.world_size == 0
    assert st.message == cond.message  # the phase says why
    assert not any(c.type == d.CONDITION_WORLD_SIZE_MISMATCH for c in st.conditions)  # world 0: short, not foreign
    # With the replacement Pending, the message says what it waits on.
    pending = dataclasses.replace(observed, workers=(w(0), w(1, "Pending", generation=1, attempt=1)))
    assert degraded(decide(job(s, lost), pending).status).message.endswith(
        ": its replacement pod j-worker-1 is Pending")


def test_the_stall_clock_runs_on_the_survivors_steps_while_short():
    s = spec(replicas=3, minReplicas=1, runPolicy={"progressDeadlineSeconds": 60},
             failurePolicy={"backoff": {"initialSeconds": 0, "maxSeconds": 0}})
    lost = decide(job(s, running(s, 3)), seen(w(0), w(1), failed(2, 137), now=at(0))).status
    # Advancing: no verdict however long the replacement is Pending.
    fresh = d.Observed(workers=(*survivors(), unschedulable()), store=seen().store, now=at(3600),
                       progress=live_view(9000, 3600, advanced=3590))
    out = decide(job(s, lost), fresh)
    assert out.status.restarts == 1 and not any(i.reason == d.REASON_STALLED for i in out.status.incidents)
    # The survivors' step stops: a stall of the short world, charged once like any other.
    stuck = d.Observed(workers=(*survivors(), unschedulable()), store=seen().store, now=at(3700),
                       progress=live_view(9000, 3700, advanced=3590))
    out = decide(job(s, out.status), stuck)
    assert out.status.incidents[-1].reason == d.REASON_STALLED and out.status.restarts == 2


def test_an_old_generations_report_that_does_not_train_in_place_is_still_left_behind():
    status = lost_worker_2()
    stopping = d.ProgressObservation(generation=0, step=12, last_advance=at(0), world_size=2, desired_world_size=3,
                                     updated_at=at(4))  # no missing ranks, no regroup: a trainer stopping
    out = short_pass(status, stopping, *survivors(), unschedulable())
    assert degraded(out.status) is None and out.status.world_size == 2 * 1  # the pods' count, as before


def regroup(kind: str, seconds: float, world: int, step: int) -> d.RecoveryReport:
    return d.RecoveryReport(generation=0, path="InProcess", kind=kind, resumed_step=step,
                            rendezvous_time=at(seconds), first_step_time=at(seconds + 0.5), world_size=world)


def test_the_shrink_and_the_join_are_two_steps_of_the_incidents_timeline_and_cost_nothing():
    status = lost_worker_2()
    shrink = regroup("Shrink", 1.2, 2, 12)
    short = short_pass(status, live_view(14, 5, recoveries=(shrink,)), *survivors(), unschedulable())
    [incident] = short.status.incidents
    timeline = incident.recovery
    assert [(s.kind, s.time, s.world_size) for s in timeline.steps] == [("Shrink", "2026-11-22T12:00:01.200Z", 2)]
    # The shrink is the recovery: training went on from it, before the replacement exists.
    assert (timeline.path, timeline.steps_lost, timeline.first_step_time) == ("InProcess", 0, "2026-11-22T12:00:01.700Z")
    [event] = [e for e in of(short, d.Event) if e.reason == d.REASON_RECOVERED]
    assert "the survivors trained on short (2 ranks)" in event.message

    join = regroup("Join", 600, 3, 3000)
    joined = short_pass(short.status, live_view(3001, 601, world=3, missing=(), kind="Join", recoveries=(shrink, join)),
                        *survivors(), replacement("Running"), seconds=601)
    [incident] = joined.status.incidents
    assert [(s.kind, s.world_size) for s in incident.recovery.steps] == [("Shrink", 2), ("Join", 3)]
    assert incident.recovery.steps[1].time == "2026-11-22T12:10:00.000Z"
    assert (joined.status.restarts, joined.status.disruptions) == (1, 0)  # the pod's failure, nothing more
    # Each step once: the same reports again change nothing.
    again = short_pass(joined.status, live_view(3002, 602, world=3, missing=(), kind="Join",
                                                recoveries=(shrink, join)),
                       *survivors(), replacement("Running"), seconds=602)
    assert again.status.incidents == joined.status.incidents and not any(
        e.reason == d.REASON_RECOVERED for e in of(again, d.Event))


def test_a_second_loss_while_short_gets_its_own_shrink_and_the_joins_close_them_in_order():
    short = short_pass(lost_worker_2(), live_view(14, 5, recoveries=(regroup("Shrink", 1, 2, 12),)),
                       *survivors(), unschedulable()).status
    # Worker 1 is lost too while short: a second incident (generation 1), the survivor shrinks again.
    second = decide(job(SHORT, short), d.Observed(workers=(w(0), failed(1, 137, at=at(20)), unschedulable()),
                                                  store=seen().store, now=at(20)))
    shrinks = (regroup("Shrink", 1, 2, 12), regroup("Shrink", 21, 1, 30))
    later = short_pass(second.status, live_view(40, 25, world=1, missing=(1, 2), recoveries=shrinks[1:]),
                       w(0), replacement(), w(1, "Pending", generation=2, attempt=1), seconds=25).status
    assert [[s.kind for s in i.recovery.steps] for i in later.incidents] == [["Shrink"], ["Shrink"]]
    joins = (regroup("Join", 100, 2, 200),)
    joined = short_pass(later, live_view(210, 101, world=2, missing=(1,), kind="Join", recoveries=joins),
                        w(0), replacement("Running"), w(1, "Pending", generation=2, attempt=1), seconds=101).status
    assert [[s.kind for s in i.recovery.steps] for i in joined.incidents] == [["Shrink", "Join"], ["Shrink"]]
    assert joined.restarts == 2  # one per lost pod


# ---------------------------------------------------------------- the report and the tracker

LIVE = {"desired_world_size": 3, "world_size": 2, "missing_ranks": [2], "short_since": 1764000000.5}


def test_the_live_view_fields_are_parsed():
    report = progress.parse_report(json.dumps({"step": 7, **LIVE, "waiting_for_ranks": 0, "other": 1,
                                               "recovery": {"path": "InProcess", "kind": "Shrink", "resumed_step": 6,
                                                            "rendezvous_time": 1764000000.0}}).encode())
    assert (report.desired_world_size, report.world_size, report.missing_ranks, report.short_since,
            report.waiting_for_ranks, report.recovery.kind) == (3, 2, (2,), 1764000000.5, 0, "Shrink")
    assert report.in_place
    assert not progress.parse_report(b'{"step": 7, "desired_world_size": 3, "missing_ranks": []}').in_place


@pytest.mark.parametrize("fields, named", [
    ({"desired_world_size": -1}, "desired_world_size"), ({"desired_world_size": "3"}, "desired_world_size"),
    ({"desired_world_size": 0}, "desired_world_size"),
    ({"desired_world_size": True}, "desired_world_size"), ({"waiting_for_ranks": 1.5}, "waiting_for_ranks"),
    ({"missing_ranks": 2}, "missing_ranks"), ({"missing_ranks": [1, "2"]}, "missing_ranks"),
    ({"missing_ranks": [-1]}, "missing_ranks"), ({"missing_ranks": [True]}, "missing_ranks"),
    ({"missing_ranks": [2, 2]}, "missing_ranks"), ({"missing_ranks": list(range(5000))}, "missing_ranks"),
    ({"missing_ranks": [[1]]}, "missing_ranks"), ({"missing_ranks": [2**60]}, "missing_ranks"),
    ({"desired_world_size": 3, "missing_ranks": [3]}, "missing_ranks"),
    ({"short_since": "yesterday"}, "short_since"), ({"short_since": -5}, "short_since"),
    ({"short_since": 1e300}, "short_since"), ({"short_since": 10**400}, "short_since"),
    ({"recovery": {"path": "InProcess", "kind": "Grow", "resumed_step": 1, "rendezvous_time": 1.0}}, "recovery.kind"),
    ({"recovery": {"path": "InProcess", "kind": ["Join"], "resumed_step": 1, "rendezvous_time": 1.0}},
     "recovery.kind"),
])
def test_a_bad_live_view_field_is_refused_naming_it(fields, named):
    with pytest.raises(progress.BadReport) as bad:
        progress.report_from({"step": 7, **fields})
    assert bad.value.status == 422 and str(bad.value).startswith(named)


def record(tracker, index: int, served: int, seconds: float, **body):
    report = progress.report_from(body)
    worker = progress.Worker("uid", index, served)
    tracker.record("uid", ("ns", "j"), index, progress.attributed_generation(worker, report), report, at(seconds))


def test_the_tracker_takes_the_survivors_reports_of_their_old_generation_as_the_jobs():
    tracker = progress.ProgressTracker(write_seconds=0.0)
    for step in (10, 11):
        record(tracker, 0, 0, step, step=step, rank=0, generation=0, world_size=3, desired_world_size=3)
    # The replacement's pod has reported already (generation 1): a stopping trainer of generation 0 is ignored...
    record(tracker, 2, 1, 12, step=0, rank=2, generation=1)
    record(tracker, 0, 1, 13, step=12, rank=0, generation=0, world_size=3, desired_world_size=3)
    assert tracker.observation("uid", at(13)).step == 0
    # ...but survivors training on in place (short, their generation the one they started in) are the job.
    shrink = {"path": "InProcess", "kind": "Shrink", "resumed_step": 12, "rendezvous_time": at(14).timestamp()}
    for step in (13, 14):
        record(tracker, 0, 1, 14 + step, step=step, rank=0, generation=0, recovery=shrink, **LIVE)
    seen_now = tracker.observation("uid", at(28))
    assert (seen_now.step, seen_now.world_size, seen_now.desired_world_size, seen_now.missing_ranks) == (14, 2, 3, (2,))
    assert seen_now.in_place and seen_now.short_since.timestamp() == 1764000000.5
    assert [(r.generation, r.kind) for r in seen_now.recoveries] == [(0, "Shrink")]
    # The join is kept beside the shrink, not over it.
    join = {**shrink, "kind": "Join", "rendezvous_time": at(40).timestamp()}
    record(tracker, 0, 1, 41, step=30, rank=0, generation=0, recovery=join, desired_world_size=3, world_size=3,
           missing_ranks=[])
    assert [r.kind for r in tracker.observation("uid", at(41)).recoveries] == ["Join", "Shrink"]


def test_a_restarted_gangs_rank_0_makes_an_old_in_place_report_stale():
    tracker = progress.ProgressTracker(write_seconds=0.0)
    shrink = {"path": "InProcess", "kind": "Shrink", "resumed_step": 40, "rendezvous_time": at(1).timestamp()}
    record(tracker, 0, 0, 2, step=50, rank=0, generation=0, recovery=shrink, **LIVE)
    # The whole gang restarted (a stall, a lost store): generation 2's rank 0 resumed from a checkpoint at 45.
    restart = {"path": "Restart", "resumed_step": 45, "rendezvous_time": at(9).timestamp()}
    record(tracker, 0, 2, 10, step=46, rank=0, generation=2, recovery=restart)
    # The old trainer's last report arrives late: it is not the job's, and its higher step holds no stall clock.
    record(tracker, 0, 2, 11, step=60, rank=0, generation=0, recovery=shrink, **LIVE)
    now = tracker.observation("uid", at(11))
    assert (now.generation, now.step, now.last_advance, now.in_place) == (2, 46, at(10), False)


def test_a_missing_rank_beyond_the_replicas_is_said_so():
    # The trainers still count a world of 5 (before a scale down to 3 in place), ranks 2 and 4 not there.
    beyond = dataclasses.replace(live_view(12, 5, missing=(2, 4)), desired_world_size=5)
    out = short_pass(lost_worker_2(), beyond, *survivors(), unschedulable())
    assert degraded(out.status).message.endswith("; worker 4: beyond spec.replicas=3")


def test_a_scale_ups_ranks_joining_in_place_are_a_step_of_the_scale():
    scaled = model.Incident(generation=0, time=d.rfc3339(at(0)), cause="ScaledInPlace", reason="ScaledInPlace",
                            recovery=model.IncidentRecovery(failure_seen_time="2026-11-22T12:00:00.000Z"))
    old = model.Incident(generation=0, time=d.rfc3339(at(-900)), cause="Retryable", reason="WorkerFailed",
                         recovery=model.IncidentRecovery(failure_seen_time="2026-11-22T11:45:00.000Z"))
    # Scaled 3 -> 4 in place: the survivors were carried into generation 1, worker 3 was created for it.
    four = spec(replicas=4, minReplicas=1)
    status = running(four, 4).model_copy(update={"incidents": [old, scaled], "generation": 1})
    for rank in status.ranks:
        if rank.index < 3:
            rank.generation = 1
    join = regroup("Join", 30, 4, 100)
    observed = d.Observed(workers=(w(0), w(1), w(2), w(3, generation=1)), store=seen().store, now=at(31),
                          progress=live_view(101, 31, world=4, missing=(), kind="Join", recoveries=(join,)))
    out = decide(job(four, status), observed)
    assert [[s.kind for s in i.recovery.steps] for i in out.status.incidents] == [[], ["Join"]]


def test_an_in_process_recovery_loses_no_step_however_late_the_failure_was_seen():
    """The survivors train on at once: by the time the operator records the pod's failure their reports may be
    hundreds of steps past the step they shrank at. Nothing was lost: the steps they trained are the job's."""
    late = d.ProgressObservation(generation=0, step=300, last_advance=at(0), world_size=2, desired_world_size=3)
    status = decide(job(SHORT, running(SHORT, 3)), d.Observed(workers=(w(0), w(1), failed(2, 137)),
                                                              store=seen().store, now=at(0), progress=late)).status
    short = short_pass(status, live_view(310, 5, recoveries=(regroup("Shrink", 1.2, 2, 12),)), *survivors(),
                       unschedulable())
    [incident] = short.status.incidents
    assert (incident.recovery.path, incident.recovery.steps_lost) == ("InProcess", 0)
    [event] = [e for e in of(short, d.Event) if e.reason == d.REASON_RECOVERED]
    assert "0 steps lost" in event.message
