"""progress/reports.py: a report body is parsed or refused with the field named (400 or 422)."""

from __future__ import annotations

import json

import pytest

from ddpjob_operator import progress


@pytest.mark.parametrize("raw, status, field", [
    (b"", 400, "JSON"), (b"{", 400, "JSON"), (b'"x"', 400, "object"), (b"{}", 422, "step"),
    (b'{"step": true}', 422, "step"), (b'{"step": 1.5}', 422, "step"), (b'{"step": -3}', 422, "step"),
    (b'{"step": 1, "loss": "x"}', 422, "loss"), (b'{"step": 1, "loss": Infinity}', 422, "loss"),
    (b'{"step": 1, "total_steps": -1}', 422, "total_steps"), (b'{"step": 1, "samples_per_second": -2}', 422,
                                                               "samples_per_second"),
    (b'\xff\xfe', 400, "JSON"),
])
def test_bad_reports_are_refused_naming_the_field(raw, status, field):
    with pytest.raises(progress.BadReport) as bad:
        progress.parse_report(raw)
    assert bad.value.status == status and field in str(bad.value)


def test_a_report_keeps_known_fields_and_ignores_others():
    report = progress.parse_report(json.dumps({"step": 5, "total_steps": 10, "loss": 1, "rank": 0, "x": [1]}).encode())
    assert report == progress.Report(step=5, total_steps=10, loss=1.0, rank=0)
