"""Each incident's recovery timeline (status.incidents[].recovery, issue 29): filled by the decision layer as it
sees each point (decisions/recovery.py), from its own passes and the trainer's sticky `recovery` report, never
rewritten; hostile times ignored; the Recovered event once; an incident that ended the job has none."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from ddpjob_operator import decisions as d, model, naming
from ddpjob_operator.decisions.recovery import CLOCK_SKEW_SECONDS, FALLBACK_REASON_LIMIT, precise_time

from .test_decisions import T0, failed, job, of, running_status, spec, w

OPTIONS = d.Options(incident_settle_seconds=0)
POD = {"maxRestarts": 3, "restartScope": "Pod", "backoff": {"initialSeconds": 0, "maxSeconds": 1}}


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def ranks(n):
    return [{"index": i, "pod": f"j-worker-{i}", "phase": "Running"} for i in range(n)]


def progress(generation, step, *recoveries, now=T0, rank_steps=()):
    return d.ProgressObservation(
        generation=generation, step=step, last_advance=now, updated_at=now,
        ranks=tuple(d.RankReport(i, generation, s, now) for i, s in rank_steps),
        recoveries=tuple(recoveries))


def report(generation, path="InProcess", resumed=100, rendezvous=None, first_step=None, reason=""):
    return d.RecoveryReport(generation=generation, path=path, reason=reason, resumed_step=resumed,
                            rendezvous_time=rendezvous, first_step_time=first_step)


def decide(view, observed):
    return d.decide(view, observed, OPTIONS)


def observed(*workers, now=T0, p=None, spares=()):
    return d.Observed(workers=tuple(workers), store=d.StoreObservation("Running", ready=True), now=now,
                      progress=p, spares=tuple(spares))


def killed_rank_2(s=None, p=None):
    """Three workers training at step 100 of generation 0; worker 2 is SIGKILLed."""
    s = s or spec(replicas=3, failurePolicy=POD)
    p = p or progress(0, 100)
    return s, decide(job(s, running_status(ranks=ranks(3))), observed(w(0), w(1), failed(2, 137), p=p))


def recovery(decision) -> model.IncidentRecovery:
    rec = decision.status.incidents[-1].recovery
    assert rec is not None
    return rec


# ---------------------------------------------------------------- each point, in the pass that sees it

def test_the_failure_and_the_replacement_are_seen_in_the_pass_that_records_the_incident():
    _, out = killed_rank_2()
    rec = recovery(out)
    assert rec.failure_seen_time == precise_time(T0) == "2026-11-22T12:00:00.000Z"
    # No backoff (the job trained since): the replacement is created in the same pass.
    assert of(out, d.CreateWorker) == [d.CreateWorker(2, 1, 1)]
    assert rec.replacement_time == rec.failure_seen_time and rec.spare is False
    assert (rec.path, rec.rendezvous_time, rec.first_step_time, rec.seconds, rec.steps_lost) == ("", None, None, None,
                                                                                                   None)
    assert not [e for e in of(out, d.Event) if e.reason == d.REASON_RECOVERED]


def test_the_replacement_time_waits_for_the_pass_that_creates_it():
    s = spec(replicas=3, failurePolicy={**POD, "backoff": {"initialSeconds": 10, "maxSeconds": 60}})
    # No step reported: a crash loop's backoff holds the replacement for 10 s.
    first = decide(job(s, running_status(ranks=ranks(3))), observed(w(0), w(1), failed(2, 137)))
    assert recovery(first).replacement_time is None and not of(first, d.CreateWorker)
    later = decide(job(s, first.status), observed(w(0), w(1), failed(2, 137), now=at(10)))
    assert of(later, d.CreateWorker) == [d.CreateWorker(2, 1, 1)]
    assert recovery(later).replacement_time == precise_time(at(10))
    assert recovery(later).failure_seen_time == precise_time(T0)  # never rewritten


def test_the_trainers_report_fills_the_rest_as_it_arrives_and_the_event_says_it_once():
    s, out = killed_rank_2()
    survivors = (w(0), w(1), w(2, generation=1, attempt=1))
    # Rank 0 of generation 1: the group is complete, no step yet.
    p = progress(1, 100, report(1, rendezvous=at(2.25)), now=at(3))
    second = decide(job(s, out.status), observed(*survivors, now=at(3), p=p))
    rec = recovery(second)
    assert (rec.path, rec.fallback_reason, rec.rendezvous_time, rec.steps_lost) == (
        "InProcess", "", precise_time(at(2.25)), 0)
    assert rec.first_step_time is None and rec.seconds is None
    assert not [e for e in of(second, d.Event) if e.reason == d.REASON_RECOVERED]
    # Its first step: the timeline is complete, told once.
    p = progress(1, 101, report(1, rendezvous=at(2.25), first_step=at(4.5)), now=at(5))
    third = decide(job(s, second.status), observed(*survivors, now=at(5), p=p))
    rec = recovery(third)
    assert (rec.first_step_time, rec.seconds) == (precise_time(at(4.5)), 4.5)
    [event] = [e for e in of(third, d.Event) if e.reason == d.REASON_RECOVERED]
    assert event.type == "Normal"
    assert "in 4.5s" in event.message and "path InProcess" in event.message and "0 steps lost" in event.message
    assert d.recovered(second.status, third.status) == [rec]
    # The same observation again: nothing changes, nothing is told again, nothing is observed again.
    again = decide(job(s, third.status), observed(*survivors, now=at(6), p=p))
    assert again.status.incidents == third.status.incidents
    assert not [e for e in of(again, d.Event) if e.reason == d.REASON_RECOVERED]
    assert d.recovered(third.status, again.status) == []


def test_a_restart_says_why_and_counts_the_steps_trained_again():
    s = spec(replicas=3, failurePolicy=POD)
    # The freshest step is a worker's own report (120), newer than the published job value (100).
    s, out = killed_rank_2(s, progress(0, 100, rank_steps=[(0, 120), (1, 119)]))
    assert out.status.incidents[-1].step == 120
    reason = "the process group of generation 0 could not be left within 2 s\n" + "x" * 2000
    p = progress(1, 111, report(1, path="Restart", resumed=110, rendezvous=at(3), first_step=at(6), reason=reason),
                 now=at(7))
    later = decide(job(s, out.status), observed(w(0), w(1), w(2, generation=1, attempt=1), now=at(7), p=p))
    rec = recovery(later)
    assert rec.path == "Restart" and rec.steps_lost == 10 and rec.seconds == 6
    assert rec.fallback_reason.startswith("the process group of generation 0 could not be left within 2 s x")
    assert len(rec.fallback_reason) == FALLBACK_REASON_LIMIT and "\n" not in rec.fallback_reason
    [event] = [e for e in of(later, d.Event) if e.reason == d.REASON_RECOVERED]
    assert "path Restart (the process group" in event.message and "10 steps lost" in event.message


def test_a_warm_spare_taking_the_place_is_the_replacement():
    s = spec(replicas=3, failurePolicy={**POD, "spares": 1})
    spare = d.WorkerObservation(index=-1, name=naming.spare_name("j", 0), generation=0, phase="Running",
                                ready=True, uid="spare-0")
    out = decide(job(s, running_status(ranks=ranks(3))),
                 observed(w(0), w(1), failed(2, 137), p=progress(0, 100), spares=(spare,)))
    assert out.status.ranks[2].pod == spare.name
    rec = recovery(out)
    assert rec.spare is True and rec.replacement_time == precise_time(T0)


def test_a_gang_restart_is_replaced_once_the_old_generation_is_gone():
    s = spec(replicas=2, failurePolicy={**POD, "restartScope": "All"})
    view = job(s, running_status(ranks=ranks(2)))
    first = decide(view, observed(w(0), failed(1, 137), p=progress(0, 50)))
    assert recovery(first).replacement_time is None  # worker 0 is still stopping
    gone = decide(job(s, first.status), observed(now=at(2), p=progress(0, 50)))
    assert {a.generation for a in of(gone, d.CreateWorker)} == {1}
    assert recovery(gone).replacement_time == precise_time(at(2)) and recovery(gone).spare is False


# ---------------------------------------------------------------- what is ignored

@pytest.mark.parametrize("rendezvous, first_step, filled", [
    (at(-CLOCK_SKEW_SECONDS - 1), at(4), ("first",)),  # a rendezvous before the failure, beyond the skew
    (at(2), at(10 + CLOCK_SKEW_SECONDS + 1), ("rendezvous",)),  # a first step in the future (now is 10 s)
    (at(-30), at(-1), ("rendezvous", "first")),  # within the skew: kept, the seconds at least 0
    (None, None, ()),
])
def test_times_off_the_operators_clock_are_ignored(rendezvous, first_step, filled):
    s, out = killed_rank_2()
    p = progress(1, 101, report(1, rendezvous=rendezvous, first_step=first_step), now=at(10))
    rec = recovery(decide(job(s, out.status), observed(w(0), w(1), w(2, generation=1, attempt=1), now=at(10), p=p)))
    assert (rec.rendezvous_time is not None, rec.first_step_time is not None) == \
        ("rendezvous" in filled, "first" in filled)
    assert rec.path == "InProcess"
    if "first" in filled:
        assert rec.seconds == max(0.0, (first_step - T0).total_seconds())
    else:
        assert rec.seconds is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -5.0, 0.0, 1e300, True, "1700000000", None])
def test_a_hostile_unix_time_is_no_time(value):
    assert d.unix_time(value) is None


def test_a_plausible_unix_time_is_kept_to_the_millisecond():
    assert precise_time(d.unix_time(T0.timestamp() + 0.25)) == "2026-11-22T12:00:00.250Z"


@pytest.mark.parametrize("stale", [
    report(0, first_step=at(4)),  # the incident's own generation: from before it
    report(1, path="Sideways", first_step=at(4)),  # not a path the contract knows
])
def test_reports_that_do_not_tell_this_recovery_are_ignored(stale):
    s, out = killed_rank_2()
    p = progress(1, 101, stale, now=at(5))
    rec = recovery(decide(job(s, out.status), observed(w(0), w(1), w(2, generation=1, attempt=1), now=at(5), p=p)))
    assert rec.path == "" and rec.seconds is None and rec.first_step_time is None


def test_a_status_edited_by_hand_is_left_alone():
    s, out = killed_rank_2()
    status = out.status.model_copy(deep=True)
    status.incidents[-1].recovery.failure_seen_time = "yesterday"
    p = progress(1, 101, report(1, rendezvous=at(2), first_step=at(4)), now=at(5))
    rec = recovery(decide(job(s, status), observed(w(0), w(1), w(2, generation=1, attempt=1), now=at(5), p=p)))
    assert rec.failure_seen_time == "yesterday" and rec.seconds is None and rec.path == ""


# ---------------------------------------------------------------- two incidents, and incidents that end the job

def test_a_second_failure_during_the_hand_over_leaves_both_open_until_training_resumes():
    s, first = killed_rank_2()
    assert first.status.generation == 1
    # The replacement fails before generation 1 ever trains: a second incident, ending generation 1.
    second = decide(job(s, first.status),
                    observed(w(0), w(1), failed(2, 137, generation=1, attempt=1, at=at(3)), now=at(3)))
    assert second.status.generation == 2 and len(second.status.incidents) == 2
    a, b = second.status.incidents
    assert a.recovery.failure_seen_time == precise_time(T0) and a.recovery.seconds is None
    assert b.recovery.failure_seen_time == precise_time(at(3))
    # Generation 2 trains: both incidents end there, each counted from its own failure.
    p = progress(2, 101, report(2, rendezvous=at(5), first_step=at(6)), now=at(7))
    third = decide(job(s, second.status), observed(w(0), w(1), w(2, generation=2, attempt=2), now=at(7), p=p))
    a, b = third.status.incidents
    assert (a.recovery.seconds, b.recovery.seconds) == (6, 3)
    assert a.recovery.first_step_time == b.recovery.first_step_time == precise_time(at(6))
    assert len([e for e in of(third, d.Event) if e.reason == d.REASON_RECOVERED]) == 2
    assert sorted(r.seconds for r in d.recovered(second.status, third.status)) == [3, 6]


@pytest.mark.parametrize("code, max_restarts, phase", [
    (1, 3, "Failed"),  # the user's error: nothing recovers
    (137, 0, "Failed"),  # the restart budget is spent
])
def test_an_incident_that_ended_the_job_has_no_recovery(code, max_restarts, phase):
    s = spec(replicas=2, failurePolicy={**POD, "maxRestarts": max_restarts})
    out = decide(job(s, running_status(ranks=ranks(2))), observed(failed(0, code), failed(1, code), p=progress(0, 9)))
    assert out.status.phase == phase and out.status.incidents[-1].recovery is None


def test_a_stall_is_recovered_like_any_incident_with_its_step():
    s = spec(replicas=2, failurePolicy=POD, runPolicy={"progressDeadlineSeconds": 60})
    p = progress(0, 40, now=T0)
    out = decide(job(s, running_status(ranks=ranks(2))), observed(w(0), w(1), now=at(61), p=p))
    incident = out.status.incidents[-1]
    assert incident.reason == d.REASON_STALLED and incident.step == 40
    assert incident.recovery.failure_seen_time == precise_time(at(61))


def test_the_histogram_observes_a_timeline_once_also_after_an_operator_restart():
    s, out = killed_rank_2()
    p = progress(1, 101, report(1, rendezvous=at(2), first_step=at(4)), now=at(5))
    done = decide(job(s, out.status), observed(w(0), w(1), w(2, generation=1, attempt=1), now=at(5), p=p))
    assert [r.seconds for r in d.recovered(out.status, done.status)] == [4]
    # A restarted operator reads the stored status (seconds already there): nothing to observe.
    stored = model.DDPJobStatus.model_validate(done.status.wire())
    assert stored.incidents[-1].recovery.seconds == 4
    again = decide(job(s, stored), observed(w(0), w(1), w(2, generation=1, attempt=1), now=at(9), p=p))
    assert d.recovered(stored, again.status) == []


def test_an_incident_whose_timeline_fills_in_is_not_counted_again():
    s = spec(replicas=2, failurePolicy=POD, runPolicy={"progressDeadlineSeconds": 60})
    before = running_status(ranks=ranks(2))
    stalled = decide(job(s, before), observed(w(0), w(1), now=at(61), p=progress(0, 40)))
    assert [i.reason for i in d.new_incidents(before, stalled.status)] == [d.REASON_STALLED]
    p = progress(1, 41, report(1, path="Restart", resumed=40, rendezvous=at(70), first_step=at(75)), now=at(76))
    resumed = decide(job(s, stalled.status), observed(w(0, generation=1), w(1, generation=1), now=at(76), p=p))
    assert resumed.status.incidents[-1].recovery.seconds == 14
    assert d.new_incidents(stalled.status, resumed.status) == []
