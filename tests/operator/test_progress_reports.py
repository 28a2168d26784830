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


RECOVERY = {"path": "Restart", "reason": "no peer holds the state", "resumed_step": 120,
            "rendezvous_time": 1764000000.5, "first_step_time": None}


def test_a_recovery_timeline_is_carried_on_the_report():
    report = progress.parse_report(json.dumps({"step": 121, "recovery": RECOVERY}).encode())
    assert report.recovery == progress.Recovery(path="Restart", resumed_step=120, rendezvous_time=1764000000.5,
                                                first_step_time=None, reason="no peer holds the state")
    stepped = {**RECOVERY, "path": "InProcess", "first_step_time": 1764000003, "x": 1}
    del stepped["reason"]  # optional, as is first_step_time; unknown keys are ignored
    report = progress.parse_report(json.dumps({"step": 121, "recovery": stepped}).encode())
    assert (report.recovery.path, report.recovery.reason, report.recovery.first_step_time) == ("InProcess", "", 1764000003.0)
    assert progress.parse_report(b'{"step": 1, "recovery": null}').recovery is None
    assert progress.parse_report(b'{"step": 1}').recovery is None


@pytest.mark.parametrize("recovery, field", [
    ("InProcess", "recovery must be an object"), ([1], "recovery must be an object"),
    ({**RECOVERY, "path": "Elsewhere"}, "recovery.path"), ({**RECOVERY, "path": None}, "recovery.path"),
    ({**RECOVERY, "reason": 7}, "recovery.reason"), ({**RECOVERY, "reason": "x" * 513}, "recovery.reason"),
    ({**RECOVERY, "resumed_step": -1}, "recovery.resumed_step"), ({**RECOVERY, "resumed_step": True},
                                                                  "recovery.resumed_step"),
    ({**RECOVERY, "resumed_step": 10**13}, "recovery.resumed_step"), ({**RECOVERY, "resumed_step": 1.5},
                                                                      "recovery.resumed_step"),
    ({k: v for k, v in RECOVERY.items() if k != "rendezvous_time"}, "recovery.rendezvous_time"),
    ({**RECOVERY, "rendezvous_time": "now"}, "recovery.rendezvous_time"),
    ({**RECOVERY, "rendezvous_time": -5}, "recovery.rendezvous_time"),
    ({**RECOVERY, "first_step_time": 1e300}, "recovery.first_step_time"),
    ({**RECOVERY, "first_step_time": False}, "recovery.first_step_time"),
])
def test_a_bad_recovery_timeline_is_refused_naming_the_field(recovery, field):
    with pytest.raises(progress.BadReport) as bad:
        progress.parse_report(json.dumps({"step": 121, "recovery": recovery}).encode())
    assert bad.value.status == 422 and field in str(bad.value) and len(str(bad.value)) < 300


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_recovery_time_must_be_finite(number):
    with pytest.raises(progress.BadReport, match="recovery.rendezvous_time") as bad:
        progress.parse_report(b'{"step": 1, "recovery": {"path": "Restart", "resumed_step": 0, "rendezvous_time": '
                              + number + b"}}")
    assert bad.value.status == 422


def test_a_reason_of_512_characters_fits_in_a_report_under_the_body_limit():
    report = json.dumps({"step": 10**12, "total_steps": 10**12, "loss": 0.123456789, "epoch": 99,
                         "samples_per_second": 123456.789, "world_size": 1024, "last_checkpoint_step": 10**12,
                         "rank": 0, "generation": 12345, "step_seconds": 1.23456789, "time": 1764000000.123456,
                         "recovery": {**RECOVERY, "reason": "é" * 512, "first_step_time": 1764000003.123456}},
                        ensure_ascii=False).encode()
    assert len(report) <= progress.MAX_BODY_BYTES
    assert progress.parse_report(report).recovery.reason == "é" * 512
