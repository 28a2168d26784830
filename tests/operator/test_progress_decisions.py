"""Decision layer, issue 12: status.progress from reports, and hang detection (decisions/progress.py)."""

from datetime import timedelta

import pytest

from ddpjob_operator import decisions as d
from ddpjob_operator import model

from .test_decisions import STORE, T0, decide, job, of, running_status, spec, w

DEADLINE = 60


def stall_spec(**kw):
    return spec(runPolicy={"progressDeadlineSeconds": DEADLINE}, **kw)


def report(step=100, generation=0, advanced=T0, ranks=((0, T0), (1, T0)), **kw) -> d.ProgressObservation:
    kw.setdefault("total_steps", 400)
    kw.setdefault("steps_per_second", 2.0)
    return d.ProgressObservation(
        generation=generation, step=step, last_advance=advanced, updated_at=advanced,
        ranks=tuple(d.RankReport(i, generation, step, seen) for i, seen in ranks), **kw)


def observed(progress, now, *workers):
    workers = workers or (w(0), w(1))
    return d.Observed(workers=tuple(workers), store=STORE, now=now, progress=progress)


def test_progress_block_percent_and_eta():
    decision = decide(job(stall_spec(), running_status()), observed(report(loss=0.5, epoch=2), T0))
    p = decision.status.progress
    assert (p.step, p.total_steps, p.percent, p.eta, p.loss, p.epoch) == (100, 400, 25, "2m30s", 0.5, 2)
    assert p.updated_time == d.rfc3339(T0)


def test_progress_is_kept_without_a_report_and_after_the_end():
    status = running_status(progress={"step": 7, "loss": 1.0})
    assert decide(job(spec(), status), observed(None, T0)).status.progress.step == 7
    done = running_status(phase="Succeeded", progress={"step": 7})
    final = decide(job(spec(), done), observed(report(step=400), T0)).status.progress
    assert final.step == 400 and final.percent == 100 and final.eta is None


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (59, "59s"), (60, "1m"), (750, "12m30s"),
                                           (7500, "2h5m"), (7200, "2h"), (93600, "1d2h")])
def test_format_eta(seconds, text):
    assert d.format_eta(seconds) == text


def test_same_observation_same_status():
    """ETA depends on the observation only: reconciling again writes nothing new."""
    first = decide(job(stall_spec(), running_status()), observed(report(), T0 + timedelta(seconds=5)))
    again = decide(job(stall_spec(), first.status), observed(report(), T0 + timedelta(seconds=30)))
    assert not again.status_changed(first.status)


def test_no_deadline_no_stall():
    decision = decide(job(spec(), running_status()), observed(report(), T0 + timedelta(hours=5)))
    assert decision.status.phase == "Running" and decision.status.restarts == 0


def test_clock_wakes_at_the_deadline():
    decision = decide(job(stall_spec(), running_status()), observed(report(), T0 + timedelta(seconds=20)))
    assert decision.status.phase == "Running" and decision.requeue_after == pytest.approx(40)


def test_nothing_reported_in_this_generation_is_not_a_stall():
    """The clock starts at the first step a generation reports: loading and compiling are not hangs."""
    status = running_status(generation=1)
    decision = decide(job(stall_spec(), status), observed(report(generation=0), T0 + timedelta(hours=1),
                                                            w(0, generation=1), w(1, generation=1)))
    assert decision.status.phase == "Running" and decision.status.generation == 1


def test_stall_is_one_charged_incident_and_a_gang_restart():
    now = T0 + timedelta(seconds=DEADLINE)
    # worker 1 stopped reporting at T0 (SIGSTOPped); worker 0 still heartbeats.
    progress = report(ranks=((0, now - timedelta(seconds=2)), (1, T0)))
    decision = decide(job(stall_spec(), running_status()), observed(progress, now))
    status = decision.status
    assert status.phase == "Restarting" and status.restarts == 1 and status.generation == 1
    incident = status.incidents[-1]
    assert (incident.cause, incident.reason, incident.charged, incident.ranks) == (d.RETRYABLE, "Stalled", True, [1])
    stalled = next(c for c in status.conditions if c.type == "Stalled")
    assert stalled.status == "True" and "worker 1" in stalled.message and "worker 0" not in stalled.message
    assert {a.name for a in of(decision, d.DeleteWorker)} == {"j-worker-0", "j-worker-1"}
    assert not of(decision, d.CreateWorker)  # the new generation waits for the old pods to go
    warning = [e for e in of(decision, d.Event) if e.reason == "Stalled"]
    assert warning and warning[0].type == "Warning" and "stopped reporting: worker 1" in warning[0].message
    # Accounting goes on record before the pods are touched (the handler's rule).
    assert d.accounting(status) != d.accounting(running_status())


def test_every_rank_reporting_names_a_hang_inside_the_step():
    now = T0 + timedelta(seconds=DEADLINE + 1)
    progress = report(ranks=((0, now), (1, now)))
    decision = decide(job(stall_spec(), running_status()), observed(progress, now))
    assert "every worker still reports" in decision.status.incidents[-1].message


def test_a_stall_once_charged_is_not_charged_again():
    now = T0 + timedelta(seconds=DEADLINE)
    first = decide(job(stall_spec(), running_status()), observed(report(), now))
    # Next pass: old pods terminating, the same old-generation reports (heartbeats of the dying pods).
    later = now + timedelta(seconds=30)
    again = decide(job(stall_spec(), first.status),
                   observed(report(), later, w(0, terminating_since=now), w(1, terminating_since=now)))
    assert again.status.restarts == 1 and again.status.generation == 1


def test_stall_with_the_budget_spent_fails_the_job():
    now = T0 + timedelta(seconds=DEADLINE)
    decision = decide(job(stall_spec(), running_status(restarts=3)), observed(report(), now))
    failed = next(c for c in decision.status.conditions if c.type == "Failed")
    assert decision.status.phase == "Failed" and failed.reason == "RestartBudgetExhausted"
    assert "no training progress" in failed.message and decision.status.restarts == 3


@pytest.mark.parametrize(("restarts", "phase"), [(0, "Restarting"), (1, "Restarting"), (2, "Failed")])
def test_the_budget_allows_exactly_max_restarts_for_stalls(restarts, phase):
    """maxRestarts=2: the stalls after 0 and 1 restarts are restarted (the second takes the budget's last
    restart), the one after 2 fails the job with nothing more charged."""
    now = T0 + timedelta(seconds=DEADLINE)
    s = stall_spec(failurePolicy={"maxRestarts": 2})
    decision = decide(job(s, running_status(restarts=restarts)), observed(report(), now))
    status = decision.status
    assert status.phase == phase
    assert status.restarts == min(restarts + 1, 2)
    incident = status.incidents[-1]
    assert (incident.reason, incident.charged) == ("Stalled", phase == "Restarting")
    if phase == "Failed":
        assert next(c for c in status.conditions if c.type == "Failed").reason == "RestartBudgetExhausted"


def test_stalled_condition_clears_when_the_new_generation_advances():
    now = T0 + timedelta(seconds=DEADLINE)
    stalled = decide(job(stall_spec(), running_status()), observed(report(), now)).status
    stalled.phase = "Running"
    resumed = report(step=60, generation=1, advanced=now + timedelta(seconds=40),
                     ranks=((0, now + timedelta(seconds=40)), (1, now + timedelta(seconds=40))))
    decision = decide(job(stall_spec(), stalled),
                      observed(resumed, now + timedelta(seconds=41), w(0, generation=1), w(1, generation=1)))
    condition = next(c for c in decision.status.conditions if c.type == "Stalled")
    assert condition.status == "False" and condition.reason == "Progressing"
    assert decision.status.restarts == 1 and decision.status.phase == "Running"


def test_deadline_is_validated():
    with pytest.raises(Exception, match="greater than or equal to 10"):
        spec(runPolicy={"progressDeadlineSeconds": 0})
    assert model.RunPolicy().progress_deadline_seconds is None  # off by default
