"""Issue 23 (item 1), decision layer: a stall is never charged while the operator has been refusing (429,
503) or unable to take a job's reports; the deadline counts again from the last refusal (pure, table)."""

from datetime import timedelta

import pytest

from .test_decisions import T0, decide, job, running_status
from .test_progress_decisions import DEADLINE, observed, report, stall_spec


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
