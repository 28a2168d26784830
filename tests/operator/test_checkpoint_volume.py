"""A full or failing checkpoint volume is the infrastructure's, never the user's bug (issue 23: 6).

The trainer runtime exits 75 with a message starting `checkpoint volume full:` (or `unreadable:`); the
operator charges it as a retryable failure with its own reason, so the budget still ends a job whose
volume stays full, with the volume named in the Failed condition."""

import pytest

from ddpjob_operator import decisions as d
from ddpjob_operator.agent import contract

from .test_decisions import decide, failed, job, running_status, seen, spec, w

FULL = ("rank 0 (local rank 0) exited with code 75: checkpoint volume full: /checkpoints/j/checkpoints: "
        "No space left on device while writing step-300.pt (1048576 bytes) [generation 0] [rendezvous closed]")
UNREADABLE = ("rank 0 (local rank 0) exited with code 75: checkpoint volume unreadable: /checkpoints/j/checkpoints: "
              "[Errno 5] Input/output error [generation 0] [rendezvous closed]")


def test_the_operator_and_the_runtime_agree_on_the_exit():
    runtime = pytest.importorskip("ddp_trainer.runtime", reason="the trainer package is not on the path")
    assert contract.CHECKPOINT_VOLUME_EXIT_CODE == runtime.CHECKPOINT_VOLUME_FULL_EXIT_CODE \
        == runtime.CHECKPOINT_VOLUME_UNREADABLE_EXIT_CODE
    assert contract.CHECKPOINT_VOLUME_PREFIXES == (runtime.CHECKPOINT_VOLUME_FULL_PREFIX,
                                                   runtime.CHECKPOINT_VOLUME_UNREADABLE_PREFIX)


@pytest.mark.parametrize("message", [FULL, UNREADABLE], ids=["full", "unreadable"])
def test_a_checkpoint_volume_failure_is_retried_and_charged_with_its_own_reason(message):
    out = decide(job(status=running_status()), seen(w(1), failed(0, 75, message=message)))
    st = out.status
    assert st.phase == "Restarting" and st.restarts == 1
    assert (st.incidents[-1].cause, st.incidents[-1].reason) == (d.RETRYABLE, d.REASON_CHECKPOINT_VOLUME)


@pytest.mark.parametrize("code, message, policy, expected", [
    (75, "rank 0 (local rank 0) exited with code 75: ValueError: bad batch", {}, d.PERMANENT),  # the user's 75
    (75, FULL, {"permanentExitCodes": [75]}, d.PERMANENT),  # an explicit list wins
    (1, FULL.replace("code 75", "code 1"), {}, d.PERMANENT),  # only the runtime's own exit code counts
    (75, FULL, {}, d.RETRYABLE),
])
def test_only_the_runtimes_exit_is_taken_for_the_volumes(code, message, policy, expected):
    assert d.classify_exit(code, "Error", False, spec(failurePolicy=policy).failure_policy, message) == expected


def test_a_volume_that_stays_full_ends_in_the_budget_naming_it():
    s = spec(failurePolicy={"maxRestarts": 0})
    out = decide(job(s, running_status()), seen(w(1), failed(0, 75, message=FULL)))
    failed_condition = next(c for c in out.status.conditions if c.type == "Failed")
    assert failed_condition.reason == d.REASON_BUDGET_EXHAUSTED
    assert "checkpoint volume full: /checkpoints/j/checkpoints" in failed_condition.message
