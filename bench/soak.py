"""No false positives: the digits job trained for a while on a machine whose every core is also busy.

Runs examples/cpu-digits.yaml with the local runner (real torchrun agents, the operator's decision
layer, the same settings as bench/recovery.py measures) for `--minutes`, while one busy-looping
process per core competes for the CPU, and reports what a spurious failure detection would leave:
restarts charged, disruptions, incidents, generations, and the steps trained. The job is ended by
its own `runPolicy.activeDeadlineSeconds` (reason DeadlineExceeded), the only expected condition.

    .venv/bin/python bench/soak.py [--minutes 10] [--burners N (default: cores)]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from ddpjob_operator import validation
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import RunOptions
from ddpjob_operator.local.view import Snapshot, Summary

ROOT = Path(__file__).resolve().parents[1]


class QuietView:
    def __init__(self) -> None:
        self.last: Snapshot | None = None
        self.events: list[str] = []

    def update(self, snap: Snapshot) -> None:
        self.last = snap

    def event(self, text: str) -> None:
        self.events.append(text)

    def log_line(self, pod: str, line: str) -> None:
        pass

    def close(self, summary: Summary) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="busy-looping processes")
    args = parser.parse_args(argv)
    job = validation.load_jobs(ROOT / "examples" / "cpu-digits.yaml")[0]
    spec = job.spec
    seconds = int(args.minutes * 60)
    spec = spec.model_copy(update={
        "args": [*spec.args, "--epochs", "1000000"],  # never finishes: the deadline ends it
        "run_policy": spec.run_policy.model_copy(update={"active_deadline_seconds": seconds}),
    })
    job = job.model_copy(update={"spec": spec})
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    view = QuietView()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="ddpjob-soak-") as tmp:
            runner = LocalRunner(job, RunOptions(state_dir=Path(tmp)), view)
            phase = runner.run()
            status = runner.status
    finally:
        for b in burners:
            b.kill()
    wall = time.monotonic() - started
    reason = next((c.reason for c in status.conditions if c.type == "Failed" and c.status == "True"), None)
    step = view.last.step if view.last else None
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {args.burners} busy-looping processes, "
          f"python {platform.python_version()}, {datetime.now().isoformat(timespec='minutes')}")
    print(f"{wall / 60:.1f} min: phase {phase} ({reason}), steps trained {step}, restarts {status.restarts}, "
          f"disruptions {status.disruptions}, generation {status.generation}, incidents {len(status.incidents)}")
    for incident in status.incidents:
        print(f"  incident: {incident.cause} {incident.reason}: {incident.message}")
    clean = reason == "DeadlineExceeded" and status.restarts == 0 and status.disruptions == 0 and not status.incidents
    print("no false positive" if clean else "SPURIOUS FAILURE DETECTION")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
