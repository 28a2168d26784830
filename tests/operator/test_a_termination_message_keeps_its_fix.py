"""The pod's termination message (4,096 bytes at most, kept by the kubelet) is where a cluster's failure
message comes from: the agent's cut keeps the end, where the trainer's fix is, and never splits a character,
so the operator's one shortener (decisions.common.short_message) still finds the fix whole (issue 38, item 18)."""

from __future__ import annotations

import pytest

from ddpjob_operator.agent import contract, worker
from ddpjob_operator.decisions.common import short_message

FIX = "Fix: pass TrainingArguments(use_cpu=True) (without it, HF on CPU runs each process alone)."


@pytest.mark.parametrize("cause", [
    "ValueError: " + "x" * 9000,                 # a long quoted detail
    "RuntimeError: " + "é" * 5000,               # two bytes a character: a cut must not split one
    "RuntimeError: " + "訓練" * 3000 + " after", # three bytes a character
], ids=["ascii", "two-byte", "three-byte"])
def test_the_agents_cut_keeps_the_fix_and_whole_characters(tmp_path, monkeypatch, cause):
    log = tmp_path / "termination-log"
    monkeypatch.setenv(contract.TERMINATION_LOG_ENV, str(log))
    worker.report(f"rank 1 (local rank 0) exited with code 1: {cause} {FIX}", closed=True, generation=3)

    data = log.read_bytes()
    assert len(data) <= contract.TERMINATION_MESSAGE_LIMIT
    text = data.decode("utf-8")  # strict: a split character raises here
    assert text.startswith("rank 1 (local rank 0) exited with code 1: ")
    assert text.endswith(f"{FIX} {contract.GENERATION_MARK.format(generation=3)} {contract.RENDEZVOUS_CLOSED_MARK}")
    assert FIX in short_message(text)


def test_a_message_within_the_limit_is_written_as_it_is(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    monkeypatch.setenv(contract.TERMINATION_LOG_ENV, str(log))
    worker.report(f"rank 0 exited with code 1: ValueError: bad {FIX}", closed=False)
    assert log.read_text() == f"rank 0 exited with code 1: ValueError: bad {FIX}"


@pytest.mark.parametrize("limit", [0, 3, 5, 6, 7, 50])
def test_any_limit_is_kept_in_bytes(limit):
    fitted = worker.fit_message("ü" * 100, limit)
    assert len(fitted.encode()) <= limit
