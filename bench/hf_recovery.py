"""Recovery of a Hugging Face Trainer job from a lost worker, locally, against the bundled trainer's.

Both jobs run under `ddpjob run --local` semantics (LocalRunner: real torchrun agents, the operator's
decision layer, restartScope Pod: the survivor's agent rejoins in place), two workers, worker 1's whole
process tree SIGKILLed at step --kill-at, between two periodic checkpoints:
- hf: examples/hf/hf-tiny-lm.yaml (transformers' Trainer, a tiny GPT-2, `hf.DDPJobCallback`);
- bundled: the bundled trainer (`-m ddp_trainer`) on its small synthetic workload.
Recovery: seconds from the kill to the first training step after the resume, as the runner sees
progress.json (polled every 0.2 s, the same for both), and the steps lost (the step before the kill minus
the step resumed from). Prints a Markdown table (docs/benchmarks.md, "HF and Lightning callbacks").

    .venv/bin/python bench/hf_recovery.py [--repeats 2] [--kill-at 30]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpjob_operator import validation  # noqa: E402
from ddpjob_operator.local.options import KILL, FaultInjection, RunOptions  # noqa: E402
from ddpjob_operator.local.runner import LocalRunner  # noqa: E402
from tests.local.harness import RESUMED_EVENT, TimelineView  # noqa: E402

SYNTHETIC = ["--workload", "synthetic", "--workload-option", "samples=2048", "--workload-option", "eval_samples=256",
             "--workload-option", "features=32", "--workload-option", "hidden=64", "--batch-size", "32",
             "--lr", "0.05", "--log-every", "1", "--epochs", "1000"]
FAST = {"rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 3, "readTimeoutSeconds": 30,
                       "keepAliveIntervalSeconds": 2, "keepAliveMaxAttempts": 3},
        "failurePolicy": {"maxRestarts": 3, "restartScope": "Pod", "backoff": {"initialSeconds": 0, "maxSeconds": 1}}}


def hf_job(max_steps: int) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "hf" / "hf-tiny-lm.yaml").read_text())
    doc["spec"].update(FAST, entrypoint=str(ROOT / "examples" / "hf" / "train.py"),
                       args=["--max-steps", str(max_steps), "--batch-size", "8", "--step-sleep", "0.02"])
    doc["spec"]["checkpoint"]["intervalSteps"] = 20
    return doc


def bundled_job(max_steps: int) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "hf" / "hf-tiny-lm.yaml").read_text())
    doc["metadata"]["name"] = "bundled"
    doc["spec"].update(FAST, entrypoint="ddp_trainer", args=[*SYNTHETIC, "--max-steps", str(max_steps)],
                       env=[{"name": "OMP_NUM_THREADS", "value": "1"}])
    doc["spec"]["checkpoint"]["intervalSteps"] = 20
    return doc


def measure(doc: dict, kill_at: int) -> tuple[float, int]:
    view = TimelineView(timeout=600)
    with tempfile.TemporaryDirectory() as tmp:
        runner = LocalRunner(validation.parse_job(doc), RunOptions(state_dir=Path(tmp), faults=(
            FaultInjection(index=1, at_step=kill_at, kind=KILL),)), view)
        runner.run()
    assert runner.status.phase == "Succeeded" and runner.resumes, view.transcript()
    killed = view.first_event("fault injection: killed")
    resumed_at = view.first_event(RESUMED_EVENT)
    step = runner.resumes[0].step
    after = next(t for t, _, s, _ in view.samples if t > resumed_at[0] and s is not None and s > step)
    return after - killed[0], (view.step_before_resume[0] or 0) - step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--kill-at", type=int, default=30)
    a = p.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs; python {platform.python_version()}; "
          f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    rows = {}
    for _ in range(a.repeats):  # alternating: drift on a shared machine hits both alike
        # Enough steps after the kill for the 0.2 s progress poll to see one past the resume.
        for name, doc in (("hf", hf_job(a.kill_at + 200)), ("bundled", bundled_job(a.kill_at + 400))):
            rows.setdefault(name, []).append(measure(doc, a.kill_at))
    print("| job | recovery, median (s) | each (s) | steps lost |")
    print("| --- | --- | --- | --- |")
    for name, values in rows.items():
        seconds = [s for s, _ in values]
        print(f"| {name} | {statistics.median(seconds):.1f} | {', '.join(f'{s:.1f}' for s in seconds)} | "
              f"{', '.join(str(lost) for _, lost in values)} |")
    hf, bundled = (statistics.median([s for s, _ in rows[k]]) for k in ("hf", "bundled"))
    print(f"\nhf / bundled: {hf / bundled:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
