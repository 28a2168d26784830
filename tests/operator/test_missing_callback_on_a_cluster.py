"""Issue 32 item 3 through the real operator against the emulated cluster: a job with a checkpoint interval
whose workers run without ever sending a progress report (the HF/Lightning callback or job.report missing)
gets condition ProgressNotReported and one Warning event naming the likely cause."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddpjob_operator import decisions

from .conftest import FAST, eventually, operator_fixture, started

pytestmark = pytest.mark.timeout(60)

operator = operator_fixture(replace(FAST, unreported_warning_seconds=1.0))


async def test_a_job_whose_trainer_never_reports_is_warned_of_once(harness, operator):
    await started(harness, "forgot", checkpoint={"claimTemplate": {"size": "1Gi", "accessModes": ["ReadWriteMany"]},
                                                 "intervalSteps": 10})
    found = await eventually(lambda: harness.condition("forgot", decisions.CONDITION_NOT_REPORTING),
                             what="the ProgressNotReported condition")
    assert found["status"] == "True" and found["reason"] == decisions.REASON_NO_PROGRESS_REPORTS, found
    assert "callback" in found["message"] and "job.report" in found["message"], found
    warned = await eventually(lambda: [e for e in harness.events("forgot")
                                       if e["reason"] == decisions.REASON_NO_PROGRESS_REPORTS], what="the event")
    assert [e["type"] for e in warned] == ["Warning"] and (warned[0].get("count") or 1) == 1
