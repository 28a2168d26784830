#!/usr/bin/env python3
"""Soak: one DDPJob on the local runner (`ddpjob run --local`, in-process) through a seeded mix of faults,
then the invariants the operator promises, checked on what the run did.

Faults, one at a time, each at a training step (seeded: the same seed, the same schedule):
    kill        SIGKILL a worker's whole process tree (a crashed node): one charged restart
    delete      graceful delete behind the runner's back (SIGTERM, the trainer checkpoints): not charged
    kill-store  SIGKILL the rendezvous store process: recreated on its port, the workers train on, not charged
    pause       SIGSTOP a worker's process tree for a few seconds, then SIGCONT (a node that hiccups):
                nothing at all
The runner's own fault injection (FaultInjection) does the first three; `pause` is this script's.

Invariants, checked at the end (exit status 1 and the reason when one fails):
    - the job Succeeded and the trainer finished at its last step (result.json);
    - restarts charged == SIGKILLs of workers that fired; no stall incident (nothing else charged);
    - every resume is at most one checkpoint interval behind the step training had reached;
    - nothing is left behind: no live process carrying the run's marker.

    .venv/bin/python hack/soak.py --seed 31 --faults 8          # a few minutes on 2 cores
    .venv/bin/python hack/soak.py --seed 31 --faults 2 --json soak.json
Results of a run: docs/testing.md ("The soak").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "trainer-image")]

from ddpjob_operator import decisions, validation  # noqa: E402
from ddpjob_operator.local.processes import marked_pids  # noqa: E402
from ddpjob_operator.local.options import DELETE, KILL, KILL_STORE, FaultInjection, RunOptions  # noqa: E402
from ddpjob_operator.local.runner import LocalRunner  # noqa: E402

PAUSE = "pause"
KINDS = {KILL: 3, DELETE: 2, KILL_STORE: 1, PAUSE: 2}  # seeded draw weights
INTERVAL = 10  # checkpoint.intervalSteps
REPLICAS = 2
RESUMED_EVENT = "training resumed from the checkpoint of step"
# The bundled trainer on its synthetic workload: nothing to import beyond torch, tens of steps a second.
WORKLOAD = ["--workload", "synthetic", "--workload-option", "samples=2048", "--workload-option", "eval_samples=256",
            "--workload-option", "features=32", "--workload-option", "hidden=64", "--batch-size", "32",
            "--lr", "0.05", "--log-every", "1"]


@dataclass(frozen=True)
class Fault:
    kind: str
    index: int
    at_step: int
    pause_seconds: float = 0.0


def schedule(seed: int, faults: int, steps_between: int) -> tuple[list[Fault], int]:
    """`faults` faults, one every ~`steps_between` steps (so each strikes after the last one's recovery),
    and the job's last step."""
    rng = random.Random(seed)
    kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=faults)
    plan, step = [], 0
    for kind in kinds:
        step += steps_between + rng.randrange(-steps_between // 4, steps_between // 4 + 1)
        plan.append(Fault(kind, rng.randrange(REPLICAS), step, round(rng.uniform(1.0, 4.0), 1) if kind == PAUSE else 0))
    return plan, step + steps_between


def job_manifest(name: str, max_steps: int, max_restarts: int, recovery: str | None = None) -> dict:
    """`recovery`: failurePolicy.recovery; None leaves it to the job's default (in process with restartScope Pod)."""
    policy = {"maxRestarts": max_restarts, "backoff": {"initialSeconds": 0, "maxSeconds": 1},
              **({"recovery": recovery} if recovery else {})}
    return {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": name},
            "spec": {"replicas": REPLICAS, "image": "ghcr.io/ddpjob/ddp-trainer:0.1.0", "entrypoint": "ddp_trainer",
                     "args": [*WORKLOAD, "--epochs", "100000", "--max-steps", str(max_steps)],
                     "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
                     "rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 1, "readTimeoutSeconds": 30},
                     "checkpoint": {"claimTemplate": {"size": "1Gi"}, "intervalSteps": INTERVAL, "keep": 3},
                     "failurePolicy": policy,
                     "template": {"terminationGracePeriodSeconds": 30}}}


class SoakView:
    """Keeps the events and, for each resume, the last step training had reached before it."""

    def __init__(self, deadline_s: float, echo: bool):
        self.deadline = time.monotonic() + deadline_s
        self.echo, self.step, self.events = echo, None, []
        self.step_before_resume: list[int | None] = []
        self.summary = None
        self._raised = False

    def update(self, snap) -> None:
        if snap.step is not None:
            self.step = snap.step
        if time.monotonic() > self.deadline and not self._raised:
            self._raised = True
            raise TimeoutError("the soak's job did not finish within its deadline")

    def event(self, text: str) -> None:
        if RESUMED_EVENT in text:
            self.step_before_resume.append(self.step)
        self.events.append(text)
        if self.echo:
            print(f"  {text}", flush=True)

    def log_line(self, pod: str, line: str) -> None:
        pass

    def close(self, summary) -> None:
        self.summary = summary


class SoakRunner(LocalRunner):
    """The local runner, plus `pause` faults (SIGSTOP a worker's tree, SIGCONT it later) in its own loop."""

    def __init__(self, *args, pauses: list[Fault], **kwargs):
        super().__init__(*args, **kwargs)
        self.pending_pauses = list(pauses)
        self.paused: tuple[list[int], datetime] | None = None
        self.pauses_done = 0

    def inject_faults(self, now: datetime) -> None:
        super().inject_faults(now)
        if self.paused is not None:
            pids, until = self.paused
            if now >= until:
                self._signal(pids, signal.SIGCONT)
                self.paused = None
            return
        step = self.files.progress().get("step") or 0
        for fault in list(self.pending_pauses):
            target = self.workers.get(self.pod_of(fault.index))
            if step < fault.at_step or target is None or target.deleted or target.held or target.process.poll(now) \
                    is not None or not target.process.started:
                continue
            pids = marked_pids(target.process.marker, sessions=(target.process.pid,))
            self._signal(pids, signal.SIGSTOP)
            self.paused = (pids, now + timedelta(seconds=fault.pause_seconds))
            self.pending_pauses.remove(fault)
            self.pauses_done += 1
            self.view.event(f"soak: {target.process.name} paused (SIGSTOP) for {fault.pause_seconds:g}s")
            break

    def stop_all(self) -> None:
        if self.paused is not None:  # never leave a stopped tree behind
            self._signal(self.paused[0], signal.SIGCONT)
            self.paused = None
        super().stop_all()

    @staticmethod
    def _signal(pids: list[int], sig: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def soak(seed: int, faults: int, steps_between: int, state_dir: Path, deadline_s: float, echo: bool,
         recovery: str | None = None) -> dict:
    plan, max_steps = schedule(seed, faults, steps_between)
    kills = sum(f.kind == KILL for f in plan)
    job = validation.parse_job(job_manifest(f"soak-{seed}", max_steps, kills + 2, recovery))
    injected = tuple(FaultInjection(index=f.index, at_step=f.at_step, kind=f.kind) for f in plan if f.kind != PAUSE)
    view = SoakView(deadline_s, echo)
    runner = SoakRunner(job, RunOptions(state_dir=state_dir, faults=injected), view,
                        pauses=[f for f in plan if f.kind == PAUSE])
    started = time.monotonic()
    error = None
    try:
        runner.run()
    except TimeoutError as e:
        error = str(e)
    elapsed = time.monotonic() - started
    fired = [f for f in injected if f not in runner.pending_faults]
    kills_fired = sum(f.kind == KILL for f in fired)
    status, summary = runner.status, view.summary
    result = (summary.result if summary else None) or {}
    leftovers = marked_pids(runner.run_marker)
    stalls = sum(1 for i in status.incidents if i.reason == decisions.REASON_STALLED)
    resumes = [{"step": r.step, "step_before": before, "world_size": r.world_size}
               for r, before in zip(runner.resumes, view.step_before_resume)]
    behind = [r for r in resumes if r["step_before"] is not None and r["step"] < r["step_before"] - INTERVAL]
    checks = {
        "succeeded_at_last_step": status.phase == "Succeeded" and result.get("step") == max_steps,
        "every_fault_fired": len(fired) == len(injected) and not runner.pending_pauses,
        "restarts_charged_equal_sigkills": status.restarts == kills_fired,
        "no_stall_incident": stalls == 0,
        "no_resume_behind_the_last_checkpoint_interval": not behind,
        "nothing_left_behind": not leftovers,
    }
    return {"seed": seed, "faults": [asdict(f) for f in plan], "max_steps": max_steps, "elapsed_s": round(elapsed, 1),
            "phase": status.phase, "final_step": result.get("step"), "restarts": status.restarts,
            "sigkills_fired": kills_fired, "disruptions": status.disruptions, "stalls": stalls,
            "pauses": runner.pauses_done, "resumes": resumes, "leftover_pids": leftovers, "error": error,
            "checks": checks, "ok": error is None and all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--faults", type=int, default=8, help="how many faults (default 8)")
    parser.add_argument("--steps-between", type=int, default=60, help="training steps between faults (default 60)")
    parser.add_argument("--deadline", type=float, default=900, help="seconds before the soak gives up (default 900)")
    parser.add_argument("--state-dir", type=Path, help="the runner's .ddpjob directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--quiet", action="store_true", help="do not print the runner's events")
    parser.add_argument("--recovery", choices=("Restart", "InProcess"),
                        help="failurePolicy.recovery (default: unset, the job's default: in process)")
    args = parser.parse_args(argv)
    if args.faults < 1 or args.steps_between < 2 * INTERVAL:
        parser.error(f"--faults must be >= 1 and --steps-between >= {2 * INTERVAL} (two checkpoint intervals)")
    with tempfile.TemporaryDirectory(prefix="ddpjob-soak-") as tmp:
        report = soak(args.seed, args.faults, args.steps_between, args.state_dir or Path(tmp) / ".ddpjob",
                      args.deadline, not args.quiet, args.recovery)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    failed = [name for name, ok in report["checks"].items() if not ok]
    print("soak: OK" if report["ok"] else f"soak: FAILED {', '.join(failed) or report['error']}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
