"""Issue 38 item 9: a progress body is strict UTF-8 JSON, and no way of getting it wrong is a 500.

A UTF-16 body slipped past the nesting check (it counted bytes, and a character whose UTF-16 code unit holds
the byte of `"` turned its string tracking inside out), so json.loads recursed into a RecursionError: a 500
that also held the job's stall clock. Through the real endpoint over loopback: every body below is a 400 or
a 422 naming what is wrong, the stall clock of no job holds, and the endpoint serves the next report."""

from __future__ import annotations

import pytest

from .test_progress_hardening import Endpoint, review_workers

pytestmark = pytest.mark.timeout(60)

FLAT = '{"step": 1}'
# U+2200 is the bytes 00 22 in UTF-16-LE: a byte scan leaves the string early and takes what follows for text.
UTF16_DEEP = ('{"step": 1, "x": "\u2200", "y": ' + "[" * 2000).encode("utf-16")
HUGE = b"9" * 400  # an int no float holds: float() raises OverflowError

BODIES = {
    "UTF-16 nesting 2000 deep": (UTF16_DEEP, 400, "UTF-8"),
    "UTF-16 with a BOM": (FLAT.encode("utf-16"), 400, "UTF-8"),
    "UTF-16-BE without a BOM": (FLAT.encode("utf-16-be"), 400, "UTF-8"),
    "UTF-16-LE without a BOM": (FLAT.encode("utf-16-le"), 400, "UTF-8"),
    "UTF-32": (FLAT.encode("utf-32"), 400, "UTF-8"),
    "UTF-8 with a BOM": (b"\xef\xbb\xbf" + FLAT.encode(), 400, "byte order mark"),
    "Latin-1": ('{"step": 1, "note": "caf\u00e9"}'.encode("latin-1"), 400, "UTF-8"),
    "UTF-8 nesting 2000 deep": (b'{"step": 1, "y": ' + b"[" * 2000, 400, "deeper"),
    "a float field past any float": (b'{"step": 1, "loss": ' + HUGE + b"}", 422, "loss"),
    "a recovery time past any float": (b'{"step": 1, "recovery": {"path": "Restart", "resumed_step": 1, '
                                       b'"rendezvous_time": ' + HUGE + b"}}", 422, "recovery.rendezvous_time"),
    "Infinity": (b'{"step": 1, "samples_per_second": Infinity}', 422, "samples_per_second"),
    "-Infinity as the step": (b'{"step": -Infinity}', 422, "step"),
    "NaN": (b'{"step": 1, "loss": NaN}', 422, "loss"),
    "a number past any float": (b'{"step": 1, "loss": 1e999}', 422, "loss"),
    "a lone surrogate": (b'{"step": 1, "note": "\xed\xa0\x80"}', 400, "UTF-8"),
    "not JSON": (b"step=1", 400, "not JSON"),
}


@pytest.mark.parametrize(("raw", "status", "named"), BODIES.values(), ids=BODIES.keys())
async def test_a_body_that_is_not_a_utf8_report_is_refused_and_holds_no_stall_clock(raw, status, named):
    assert len(raw) <= 4096  # each reaches the parser, not the size limit
    async with Endpoint(review_workers) as endpoint:
        got, text = await endpoint.post("w-0", raw=raw)
        assert (got, named in text) == (status, True), text
        assert endpoint.counts == {"invalid": 1} and endpoint.refusals == []
        assert endpoint.tracker.jobs == {}  # neither a report nor a refusal: no job's stall clock moved
        assert (await endpoint.post("w-0", raw=FLAT.encode()))[0] == 204
