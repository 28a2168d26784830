"""Issue 38 item 18: a failure message is shortened by its log tail and quoted detail, never by its cause or its
fix. The 300-character cut kept the start and the end and dropped the middle: an HF job on CPU without
`use_cpu=True` failed, as it should, with the fix cut out of its condition, its Event and the local summary.

`decisions.short_message` is the one shortener (conditions, Events, the rank status and the local runner's
lines all go through it): table-driven here, then a real local run of the HF script
(tests/trainer/scripts/hf_without_use_cpu.py: torchrun agents, two ranks, the trainer's own refusal)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpjob_operator import decisions, validation
from ddpjob_operator.agent.contract import GENERATION_MARK, RENDEZVOUS_CLOSED_MARK
from ddpjob_operator.local.options import RunOptions
from ddpjob_operator.local.runner import LocalRunner

from ..local.harness import TimelineView

HF_SCRIPT = Path(__file__).resolve().parents[1] / "trainer" / "scripts" / "hf_without_use_cpu.py"
MARKS = f" {GENERATION_MARK.format(generation=3)} {RENDEZVOUS_CLOSED_MARK}"
CAUSE = "rank 0 (local rank 0) exited with code 1: DDPJob: the trainer could not read its data"
FIX = "Fix: mount the dataset at /data (spec.template.podSpec.volumes) or set --data-dir to where it is"
TAIL = " ".join(f"[rank0]: line {i} of the log's tail" for i in range(200))


def parts(short: str) -> tuple[str, str, str]:
    """(what comes before the fix, the fix, the marks) of a shortened message."""
    marks = MARKS if short.endswith(MARKS) else ""
    body = short[: len(short) - len(marks)]
    at = body.rfind("Fix: ")
    return (body[:at].rstrip(), body[at:], marks) if at >= 0 else (body, "", marks)


CASES = {
    # cause + fix + marks within the budget: untouched
    "short": (f"{CAUSE}. {FIX}{MARKS}", f"{CAUSE}. {FIX}{MARKS}"),
    # a log tail without a fix (FallbackToLogsOnError): its middle goes, its start and its last words stay
    "a log tail": (f"Traceback (most recent call last): {TAIL} KeyError: 'lr'", None),
    # the cause quotes a long detail, then the fix: the detail's middle goes, the fix and the marks stay whole
    "a long quoted detail": (f"{CAUSE}: '{'x' * 2000}'. {FIX}{MARKS}", None),
    # a log tail runs on after the fix: what follows the fix is cut in its middle, past FIX_LIMIT
    "a tail after the fix": (f"{CAUSE}. {FIX}. {TAIL} KeyError: 'lr'", None),
    # the detail quotes a fix of its own: the operator's, the last, is the one kept whole
    "two fixes": (f"{CAUSE}: the server said 'Fix: nothing {'y' * 600}'. {FIX}{MARKS}", None),
    "lines become one": ("rank 1 exited with code 3:\n  ValueError: bad lr\n", "rank 1 exited with code 3: ValueError: bad lr"),
}


@pytest.mark.parametrize(("text", "expected"), CASES.values(), ids=CASES.keys())
def test_a_message_is_shortened_by_its_tail_never_by_its_cause_or_fix(text, expected):
    short = decisions.short_message(text)
    assert decisions.short_message(short) == short  # shortening twice changes nothing
    if expected is not None:
        assert short == expected
        return
    line = " ".join(text.split())
    before, fix, marks = parts(short)
    assert len(before) + len(marks) <= decisions.MESSAGE_LIMIT and len(fix) <= decisions.FIX_LIMIT, short
    assert marks == (MARKS if line.endswith(MARKS) else "")
    assert before.startswith(line[:40]) and " ... " in short  # its start names the failure
    if FIX in line:
        assert fix.startswith(FIX)  # the fix, whole
        assert before.endswith(line[: line.rindex(FIX)].rstrip()[-40:])  # and the words just before it
    else:
        assert short.endswith(line[-40:])  # a tail's last words


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_hf_job_without_use_cpu_fails_with_its_cause_and_fix_whole(tmp_path: Path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    the_job = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                    "metadata": {"name": "hf-cpu"}, "spec": {
                                        "replicas": 2, "image": "ghcr.io/ddpjob/ddp-trainer:0.1.0",
                                        "entrypoint": str(HF_SCRIPT), "args": [str(tmp_path / "out")],
                                        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
                                        "rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 1},
                                        "template": {"terminationGracePeriodSeconds": 5}}})
    view = TimelineView(timeout=200)
    runner = LocalRunner(the_job, RunOptions(state_dir=tmp_path / ".ddpjob"), view)
    runner.run()
    described = view.transcript()
    assert runner.status.phase == "Failed", described
    # The trainer's own words, as the pod's termination message carries them.
    raw = next(e.message for e in runner.exits if e.exit_code == 1 and e.message and "Fix: " in e.message)
    said = " ".join(raw.split())
    cause = re.search(r"DDPJob: .*?all the data\.", said).group(0)
    fix = said[said.index("Fix: "):].split(" [generation")[0]
    assert "use_cpu=True" in fix and fix.endswith("GPUs)"), said
    failed = next(c for c in runner.status.conditions if c.type == "Failed")
    events = [text for _, text in view.events if "hf-cpu-worker" in text and "exit" in text]
    summary = view.summary.lines()[0]
    for where, text in [("the Failed condition", failed.message), ("the summary", summary),
                        *((f"the Event {i}", e) for i, e in enumerate(events))]:
        assert cause in text and fix in text, f"{where}: {text}\n{described}"
    assert events, described
