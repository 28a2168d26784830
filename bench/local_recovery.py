"""Recovery in local mode: seconds from a worker kill to the first training step after it, steps lost.

Runs the bundled digits DDPJob (examples/cpu-digits.yaml, 2 workers) with `ddpjob run --local`
semantics, SIGKILLs workers 1, 0, 1, ... at spread-out training steps, and reads the trainer's
logs as they grow: for each kill, the last step trained before it, the checkpoint step training
resumed from, and the delay until the next step. Prints one Markdown table row per kill and the
medians (docs/benchmarks.md, "Local runner").

    .venv/bin/python bench/local_recovery.py [--kills 5] [--every 150]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddpjob_operator import validation
from ddpjob_operator.local.logs import RESUME_LINE, STEP_LINE, LogTail
from ddpjob_operator.local.runner import FaultInjection, LocalRunner, RunOptions
from ddpjob_operator.local.view import Snapshot, Summary

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Timeline:
    """(monotonic time read, kind, value) for kills, step lines and resume lines, in read order."""

    log_dir: Path
    entries: list[tuple[float, str, int]] = field(default_factory=list)
    tails: dict[str, LogTail] = field(default_factory=dict)

    def poll(self) -> None:
        for path in sorted(self.log_dir.glob("*-worker-*.log")):
            tail = self.tails.setdefault(path.name, LogTail(path))
            for line in tail.read_new_lines():
                now = time.monotonic()
                if match := RESUME_LINE.search(line):
                    self.entries.append((now, "resume", int(match.group(1))))
                elif match := STEP_LINE.search(line):
                    self.entries.append((now, "step", int(match.group(1))))


class RecordingView:
    """Reads the logs at every reconcile pass and timestamps the runner's fault injections."""

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self.summary: Summary | None = None

    def update(self, snap: Snapshot) -> None:
        self.timeline.poll()

    def event(self, text: str) -> None:
        if text.startswith("fault injection: killed"):
            self.timeline.poll()  # steps written before the kill belong before it
            self.timeline.entries.append((time.monotonic(), "kill", int(text.split("-worker-")[1].split()[0])))
        print(text, flush=True)

    def log_line(self, pod: str, line: str) -> None:
        pass

    def close(self, summary: Summary) -> None:
        self.summary = summary
        for line in summary.lines():
            print(line, flush=True)


@dataclass(frozen=True)
class Recovery:
    worker: int
    last_step: int
    resumed_from: int
    seconds: float

    @property
    def steps_lost(self) -> int:
        return self.last_step - self.resumed_from


def recoveries(entries: list[tuple[float, str, int]]) -> list[Recovery]:
    out = []
    kills = [i for i, (_, kind, _) in enumerate(entries) if kind == "kill"]
    for i in kills:
        killed_at, _, worker = entries[i]
        last_step = max((v for _, kind, v in entries[:i] if kind == "step"), default=0)
        after = entries[i + 1:]
        resume = next(((t, v) for t, kind, v in after if kind == "resume"), None)
        if resume is None:
            continue
        first_step = next((t for t, kind, _ in after if kind == "step" and t >= resume[0]), None)
        if first_step is not None:
            out.append(Recovery(worker, last_step, resume[1], first_step - killed_at))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5, help="workers to kill, alternating 1, 0, 1, ...")
    parser.add_argument("--every", type=int, default=150, help="training steps between kills")
    args = parser.parse_args(argv)

    job = validation.load_jobs(ROOT / "examples" / "cpu-digits.yaml")[0]
    spec = job.spec
    epochs = 2 + (args.every * (args.kills + 1)) // 22  # ~22 optimizer steps per epoch at 2 workers
    spec = spec.model_copy(update={
        "args": [*spec.args, "--epochs", str(epochs), "--log-every", "1"],  # later --epochs wins
        "failure_policy": spec.failure_policy.model_copy(update={"max_restarts": args.kills + 2}),
    })
    job = job.model_copy(update={"spec": spec})
    interval = spec.checkpoint.interval_steps if spec.checkpoint else None
    faults = tuple(FaultInjection(index=(k + 1) % 2, at_step=args.every * (k + 1)) for k in range(args.kills))
    with tempfile.TemporaryDirectory(prefix="ddpjob-bench-") as tmp:
        state = Path(tmp)
        timeline = Timeline(state / job.metadata.name / "logs")
        view = RecordingView(timeline)
        started = time.monotonic()
        phase = LocalRunner(job, RunOptions(state_dir=state, faults=faults), view).run()
        wall = time.monotonic() - started
    results = recoveries(timeline.entries)
    rdzv = spec.rendezvous
    print(f"\nphase {phase}, wall {wall:.0f}s, checkpoint interval {interval} steps, "
          f"lastCallTimeoutSeconds {rdzv.last_call_timeout_seconds}")
    print("| kill | worker | last step | resumed from | steps lost | seconds to next step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n, r in enumerate(results, 1):
        print(f"| {n} | {r.worker} | {r.last_step} | {r.resumed_from} | {r.steps_lost} | {r.seconds:.1f} |")
    if not results:
        print("no recovery measured", file=sys.stderr)
        return 1
    print(f"| median | | | | {statistics.median(r.steps_lost for r in results):g} "
          f"| {statistics.median(r.seconds for r in results):.1f} |")
    worst = max(r.steps_lost for r in results)
    print(f"max steps lost {worst} (goal: <= checkpoint interval {interval}): "
          f"{'met' if interval is None or worst <= interval else 'MISSED'}")
    return 0 if phase == "Succeeded" and (interval is None or worst <= interval) else 1


if __name__ == "__main__":
    sys.exit(main())
