"""Issue 23 (item 1): a stall is never charged while the operator has been refusing (429, 503) or unable to
take a job's reports; the deadline counts again from the last refusal (decision layer, pure, table). And
only reports a worker of the job could have sent are such refusals: made-up tokens held back by a budget
would otherwise let anyone keep a hung job from ever stalling (the real endpoint, loopback, table)."""

from datetime import timedelta

import aiohttp
import pytest

from ddpjob_operator import progress

from .test_decisions import T0, decide, job, running_status
from .test_progress_decisions import DEADLINE, observed, report, stall_spec
from .test_progress_hardening import Endpoint, review_workers


def s(seconds: float):
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize("refused, now, stalled, wake_in", [
    (None, DEADLINE, True, None),  # no refusal: the deadline after the last advance
    (s(-5), DEADLINE, True, None),  # refused before the step advanced: nothing to hold
    (s(30), DEADLINE, False, 30),  # refused within the deadline: held until a deadline after the refusal
    (s(30), DEADLINE + 29, False, 1),
    (s(30), DEADLINE + 30, True, None),  # a whole deadline of reports it could take: stalled
    (s(DEADLINE - 1), DEADLINE * 2 - 2, False, 1),
    (s(DEADLINE + 100), DEADLINE + 100, False, DEADLINE),  # still refusing now
])
def test_refused_reports_hold_the_stall(refused, now, stalled, wake_in):
    decision = decide(job(stall_spec(), running_status()),
                      observed(report(advanced=T0, ranks=((0, s(now)), (1, s(now))), last_refused=refused), s(now)))
    assert (decision.status.phase == "Restarting") is stalled
    assert decision.status.restarts == (1 if stalled else 0)
    if wake_in is not None:
        assert decision.requeue_after == pytest.approx(wake_in)


async def review_or_fail(token, audiences):
    if token == "api-down":
        raise aiohttp.ClientConnectionError("the API server is unreachable")
    return await review_workers(token, audiences)


OPEN = {"reviews_per_second": 1000, "rereviews_per_second": 1000, "source_per_second": 1000, "source_burst": 1000}


# expired: the reviews cached for `before` expire first (the reviewer's clock moves on by the cache time, which
# also refills the budgets: only where the case's budgets do not refill).
@pytest.mark.parametrize("budgets, before, token, code, refused, expired", [
    # A made-up token over the per-source budget (its first one went to review: 401).
    (dict(OPEN, source_per_second=0, source_burst=1), ["junk-1"], "junk-2", 429, False, False),
    # A made-up token over the shared budget of unknown tokens (burst 4 x 0.25 = 1).
    (dict(OPEN, reviews_per_second=0.25), ["junk-1"], "junk-2", 429, False, False),
    # A made-up token the API server refuses: 401, the client's fault.
    (OPEN, [], "junk-1", 401, False, False),
    # The job's worker, whose cached review expired, over the re-review budget: the operator's silence.
    (dict(OPEN, rereviews_per_second=0), ["w-1"], "w-1", 429, True, True),
    # A token once valid, for a pod that is not this job's worker: not the job's report.
    (dict(OPEN, rereviews_per_second=0), ["w-9"], "w-9", 429, False, True),
    # The review itself failed (the API server): nobody's reports can be taken.
    (OPEN, [], "api-down", 503, True, False),
])
async def test_only_reports_a_worker_could_have_sent_hold_the_stall(budgets, before, token, code, refused, expired):
    async with Endpoint(review_or_fail, budgets) as endpoint:
        for earlier in before:
            await endpoint.post(earlier)
        if expired:  # the next one is reviewed again
            endpoint.pass_time(progress.TOKEN_CACHE_SECONDS)
        assert (await endpoint.post(token))[0] == code
        assert endpoint.refusals == ([("ns", "job")] if refused else [])
