"""The bring-your-own-script example (examples/byo) under the local runner: a worker SIGKILLed, then a
scale-down, and the plain script on ddp_trainer.runtime resumes from its checkpoints every time.

The manifest is examples/byo/byo-text.yaml as shipped, made short: fewer steps, short rendezvous
timeouts, no backoff. Real torchrun agents, real Gloo, the runner's own decision layer, in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ddpjob_operator import validation
from ddpjob_operator.local.processes import marked_pids
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import KILL, FaultInjection, RunOptions, SpecChange

from .harness import TimelineView

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "examples" / "byo" / "byo-text.yaml"
INTERVAL, MAX_STEPS = 20, 200

pytestmark = pytest.mark.slow


def byo_job() -> dict:
    doc = yaml.safe_load(MANIFEST.read_text())
    spec = doc["spec"]
    assert spec["entrypoint"] == "examples/byo/train.py" and spec["checkpoint"]["intervalSteps"] == INTERVAL
    spec["entrypoint"] = str(ROOT / spec["entrypoint"])  # the same script, wherever pytest runs from
    spec["args"] = ["--max-steps", str(MAX_STEPS), "--batch-size", "16", "--log-every", "1", "--num-workers", "1",
                    "--step-sleep", "0.01"]
    spec["rendezvous"] = {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 3, "readTimeoutSeconds": 30,
                          "keepAliveIntervalSeconds": 2, "keepAliveMaxAttempts": 3}
    spec["failurePolicy"]["backoff"] = {"initialSeconds": 0, "maxSeconds": 1}
    spec["failurePolicy"]["recovery"] = "Restart"  # resumed from the volume every time (the default: in process)
    return doc


def test_byo_example_survives_a_worker_kill_and_a_scale_down(tmp_path: Path) -> None:
    job = validation.parse_job(byo_job())
    view = TimelineView(timeout=240)
    # The kill lands between two periodic checkpoints (every 20 steps): on a checkpoint's own step the
    # survivor has nothing newer to rescue.
    runner = LocalRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob",
                                         faults=(FaultInjection(index=1, at_step=45, kind=KILL),),
                                         changes=(SpecChange(replicas=1, at_step=100, world_size=2),)), view)
    try:
        runner.run()
    finally:
        assert marked_pids(runner.run_marker) == [], "the run left processes behind"
    logs = "".join(p.read_text(errors="replace") for p in runner.log_dir.glob("*-worker-*.log"))
    described = f"status {runner.status}\nevents:\n{view.transcript()}\n---- logs (tail)\n{logs[-4000:]}"
    assert runner.status.phase == "Succeeded", described
    assert runner.status.restarts == 1, described  # the kill; the scale-down is not a failure
    # Resumed after the kill at world size 2, after the scale-down at world size 1. After the kill the
    # survivor's rescue checkpoint loses at most the step in flight; after the scale-down the SIGTERM
    # checkpoint loses nothing. (The last step seen before a resume comes from progress.json, which may
    # lag a step behind what the trainers completed.)
    assert [r.world_size for r in runner.resumes][-1] == 1 and 2 in [r.world_size for r in runner.resumes], described
    assert "rescue checkpoint: rank" in logs, described
    for resume, before in zip(runner.resumes, view.step_before_resume):
        assert before is not None and before - 1 <= resume.step <= before + 1, described
    # The scale-down stopped the trainers with SIGTERM: they finished the step and saved, DataLoader
    # workers and all, and training went on from that very step.
    assert "stop requested at step" in logs and "is killed by signal" not in logs, described
    result = runner.summary().result
    assert result and result["status"] == "completed" and result["step"] == MAX_STEPS, described
    assert result["world_size"] == 1 and result["eval_accuracy"] > 0.7, described
