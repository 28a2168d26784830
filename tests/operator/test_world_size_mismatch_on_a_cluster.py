"""Issue 32 item 1 through the real operator against the emulated cluster: a worker's progress report of a
world size no rendezvous of the job has (HF on CPU without use_cpu=True: each rank alone) becomes condition
WorldSizeMismatch and one Warning event, never status.progress; a report that agrees clears it."""

from __future__ import annotations

import pytest

from ddpjob_operator import decisions

from .conftest import NAMESPACE, eventually, started
from .test_progress import AUDIENCE, operator, reporter  # noqa: F401 - fixtures: the operator with its endpoint

pytestmark = pytest.mark.timeout(90)


async def test_a_report_of_a_foreign_world_size_is_a_warning_condition_not_progress(harness, operator, reporter):
    await started(harness, "alone")
    token = harness.cluster.issue_token(NAMESPACE, "alone-worker-0", (AUDIENCE,))
    alone = {"step": 12, "total_steps": 100, "world_size": 1, "rank": 0, "generation": 0, "time": 1.0}
    assert (await reporter.post("alone", token, alone))[0] == 204
    found = await eventually(lambda: harness.condition("alone", decisions.CONDITION_WORLD_SIZE_MISMATCH),
                             what="the WorldSizeMismatch condition")
    assert found["status"] == "True" and "use_cpu=True" in found["message"], found
    warned = await eventually(lambda: [e for e in harness.events("alone")
                                       if e["reason"] == decisions.REASON_WORLD_SIZE_MISMATCH], what="the event")
    assert [e["type"] for e in warned] == ["Warning"]
    assert "progress" not in harness.status("alone")
    agreed = {**alone, "step": 13, "world_size": 2, "time": 2.0}
    assert (await reporter.post("alone", token, agreed))[0] == 204
    await eventually(lambda: (harness.condition("alone", decisions.CONDITION_WORLD_SIZE_MISMATCH) or {}).get(
        "status") == "False", what="the condition cleared")
    progress = await eventually(lambda: harness.status("alone").get("progress"), what="status.progress")
    assert progress["step"] == 13
