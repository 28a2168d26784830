"""A hang is told one way (issue 24): when the survivors' collectives timed out on a peer that still
looks Running and the step also stopped for runPolicy.progressDeadlineSeconds, the incident is `Stalled`
(charged once, the timeouts its evidence), not a race between two detectors."""

from datetime import timedelta

from ddpjob_operator import decisions as d

from .test_decisions import T0, failed, job, running_status, spec, w

TIMED_OUT = ("rank 0 (local rank 0) exited with code 1: RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
             "pair.cc:534] Timed out waiting 30000ms for recv operation to complete [generation 0] [rendezvous closed]")
OPTIONS = d.Options(incident_settle_seconds=10, silent_peer_settle_seconds=60)


def hung(deadline: int | None, now):
    s = spec(failurePolicy={"restartScope": "All"},
             runPolicy={"progressDeadlineSeconds": deadline} if deadline else {})
    progress = d.ProgressObservation(generation=0, step=100, last_advance=T0 - timedelta(seconds=40))
    observed = d.Observed(workers=(failed(0, 1, message=TIMED_OUT, node="node-0"), w(1, node="node-1")),
                          store=d.StoreObservation("Running", ready=True), now=now, progress=progress)
    return d.decide(job(s, running_status()), observed, OPTIONS)


def test_a_hang_past_the_progress_deadline_is_a_stall_even_while_the_timeouts_settle():
    out = hung(30, T0 + timedelta(seconds=5))  # 45 s without a step, the silent-peer wait not over
    last = out.status.incidents[-1]
    assert (last.reason, last.charged) == (d.REASON_STALLED, True) and out.status.restarts == 1
    assert out.status.generation == 1 and len(out.status.incidents) == 1


def test_without_a_progress_deadline_the_timeouts_are_charged_after_the_silent_peer_wait():
    waiting = hung(None, T0 + timedelta(seconds=5))
    assert not waiting.status.incidents and waiting.status.restarts == 0
    out = hung(None, T0 + timedelta(seconds=60))
    last = out.status.incidents[-1]
    assert (last.cause, last.reason, last.charged) == (d.RETRYABLE, d.REASON_WORKER_FAILED, True)
