"""The Hugging Face (examples/hf) and Lightning (examples/lightning) examples under the local runner: a
worker SIGKILLed mid-training, and the job goes on from the survivor's rescue checkpoint with the
framework's own scheduler and data order.

Real torchrun agents, real Gloo, the real HF Trainer (a tiny GPT-2 from a config: nothing downloaded) and
the real Lightning Trainer (a tiny classifier built in code), both with dropout 0.1 (the examples' default).
The killed run's per-step loss, learning rate and sample indices are compared with an undisturbed run's, bit
for bit: each step's dropout comes from (seed, step, rank) (issue 32).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import validation
from ddpjob_operator.local.processes import marked_pids
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import KILL, FaultInjection, RunOptions

from .harness import TimelineView

ROOT = Path(__file__).resolve().parents[2]
INTERVAL, MAX_STEPS, KILL_AT = 10, 40, 16
STEP = re.compile(r"^step=(\d+) epoch=\d+ loss=(\S+) lr=(\S+) samples=(\[.*\])$", re.MULTILINE)
# framework -> (its manifest, the modules it needs)
EXAMPLES = {"hf": ("examples/hf/hf-tiny-lm.yaml", ("transformers", "accelerate")),
            "lightning": ("examples/lightning/lightning-tiny.yaml", ("lightning",))}
# The examples name no recovery mode: in-process recovery, the default, which a framework's trainer cannot take
# (it owns its DDP wrapper and loop): it takes the restart path by itself and says so once (issue 36).
RESTART_PATH = {"hf": "the Hugging Face Trainer takes the restart path",
                "lightning": "the Lightning Trainer takes the restart path"}

pytestmark = pytest.mark.slow


def example_job(framework: str, name: str) -> dict:
    doc = yaml.safe_load((ROOT / EXAMPLES[framework][0]).read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    assert spec["entrypoint"] == f"examples/{framework}/train.py"
    if framework == "hf":
        assert {"name": "HF_HUB_OFFLINE", "value": "1"} in spec["env"]  # nothing is downloaded
    spec["entrypoint"] = str(ROOT / spec["entrypoint"])  # the same script, wherever pytest runs from
    spec["args"] = ["--max-steps", str(MAX_STEPS), "--batch-size", "8", "--warmup-steps", "5", "--step-sleep", "0.05"]
    spec["checkpoint"]["intervalSteps"] = INTERVAL
    spec["rendezvous"] = {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 3, "readTimeoutSeconds": 30,
                          "keepAliveIntervalSeconds": 2, "keepAliveMaxAttempts": 3}
    spec["failurePolicy"]["backoff"] = {"initialSeconds": 0, "maxSeconds": 1}
    return doc


def run(tmp_path: Path, framework: str, name: str, faults: tuple = ()) -> tuple[LocalRunner, TimelineView, str]:
    job = validation.parse_job(example_job(framework, name))
    view = TimelineView(timeout=300)
    runner = LocalRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob", faults=faults), view)
    try:
        runner.run()
    finally:
        assert marked_pids(runner.run_marker) == [], "the run left processes behind"
    logs = "".join(p.read_text(errors="replace") for p in sorted(runner.log_dir.glob("*-worker-*.log")))
    return runner, view, logs


def steps(logs: str) -> dict[int, tuple[str, str, str]]:
    """Rank 0's (loss, learning rate, sample indices) per optimizer step; a step trained again after a
    resume overwrites the first time."""
    return {int(m.group(1)): (m.group(2), m.group(3), m.group(4)) for m in STEP.finditer(logs)}


@pytest.mark.parametrize("framework", sorted(EXAMPLES))
def test_the_example_survives_a_worker_kill_with_its_schedule_and_data_order(tmp_path: Path, framework: str) -> None:
    for module in EXAMPLES[framework][1]:
        pytest.importorskip(module)
    plain, _, plain_logs = run(tmp_path, framework, f"{framework}-plain")
    assert plain.status.phase == "Succeeded", plain_logs[-3000:]
    reference = steps(plain_logs)
    assert sorted(reference) == list(range(1, MAX_STEPS + 1)), plain_logs[-3000:]

    runner, view, logs = run(tmp_path, framework, f"{framework}-killed",
                             (FaultInjection(index=1, at_step=KILL_AT, kind=KILL),))
    described = f"status {runner.status}\nevents:\n{view.transcript()}\n---- logs (tail)\n{logs[-5000:]}"
    assert runner.status.phase == "Succeeded", described
    assert runner.status.restarts == 1, described
    assert "recovery" not in example_job(framework, "x")["spec"].get("failurePolicy", {})  # the default
    assert logs.count(RESTART_PATH[framework]) == 1, described  # once for the job, not once a generation
    (incident,) = runner.status.incidents
    assert incident.recovery.path == "Restart" and incident.recovery.fallback_reason.startswith(
        RESTART_PATH[framework]), described
    # The survivor saved its replica: the job resumed at most the step in flight behind the kill, not
    # from the periodic checkpoint of step 10.
    assert len(runner.resumes) == 1 and view.step_before_resume, described
    before, resumed = view.step_before_resume[0], runner.resumes[0].step
    # A rescue checkpoint, unless the step in flight was a periodic checkpoint's own (the kill can land
    # there: progress.json trails the trainer by up to 0.1 s): then there was nothing newer to rescue.
    assert "rescue checkpoint: rank" in logs or resumed % INTERVAL == 0, described
    assert before is not None and resumed > INTERVAL and before - 1 <= resumed <= before + 1, described
    assert runner.resumes[0].world_size == 2, described
    # The framework's scheduler and data order went on as if nothing had happened: every step trained on
    # the same samples with the same learning rate, to the same loss, as in the undisturbed run. (The step
    # the survivor completed last may have no line: its logging collective is where the peer's death
    # surfaced; its optimizer step is in the rescue checkpoint, and training went on after it.)
    got = steps(logs)
    assert set(range(1, MAX_STEPS + 1)) - set(got) <= {resumed}, described
    assert {s: v for s, v in reference.items() if s in got} == got, described
    result = runner.summary().result
    assert result and result["status"] == "completed" and result["step"] == MAX_STEPS, described
