"""A silent peer under load: the default steady collective timeout gives no false verdict, and catches a frozen peer.

The bundled trainer (2 Gloo ranks under torchrun, the default `--dist-steady-timeout`, a parameter block that makes
the state `--state-mb` MiB, a checkpoint every `--checkpoint-every` steps and an evaluation every epoch, both of which
relax the timeout) while `--burners` busy processes (`yes`, default: one per core) keep every core saturated:

- load: trained for `--minutes`, then stopped with SIGTERM. A false verdict is any peer failure, collective
  timeout, stall-watchdog exit or rescue checkpoint before the stop. Also reported: the longest gap between two
  of rank 0's step lines where the steady timeout is in force (not within 10 steps of the start, 2 of a save or
  of an evaluation). A collective waits only for the slowest rank to reach it, and every step has one, so no
  rank waited longer than that gap: the headroom the timeout has.
- freeze: `--freezes` runs in which rank 1 freezes itself (SIGSTOP, sockets open, as a node gone silent) at a
  step where the timeout is in force; seconds from its freeze line to rank 0's peer failure (its rescue line,
  written once the rescue checkpoint is: these runs train the digits model alone, so that it follows at once).

    .venv/bin/python bench/silent_peer.py [--minutes 5] [--freezes 5] [--state-mb 64] [--burners 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

STEP = re.compile(r"^step=(\d+) epoch=(\d+) ")
EVALUATED = re.compile(r"eval epoch=\d+ step=(\d+) ")
# What a survivor logs when it takes a peer for failed: a collective's error (its rescue checkpoint), the stall
# watchdog's exit, or the in-process path's regroup.
VERDICT = re.compile(r"rescue checkpoint: rank|Timed out|TrainerStalled|exiting with code|a peer (?:failed|stopped)")
FROZEN = re.compile(r"fault injection: rank 1 at step \d+: hanging \(SIGSTOP\)")
CAUGHT = re.compile(r"rescue checkpoint: rank 0 saved step \d+ after a peer failed")
RELAXED_STEPS = 2  # CollectiveTimeout.relax(): long until this many more steps completed
FIRST_STEADY_STEP = 10  # CollectiveTimeout(after_steps=10)
FREEZE_AT = 15  # steady: past the first 10 steps, and the checkpoints of --checkpoint-every 10 relax 11-12 only


class Burners:
    """`count` busy processes, one core each (the `yes` command into /dev/null: no interpreter, no memory)."""

    def __init__(self, count: int) -> None:
        self.procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(count)]

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (torchrun starts every trainer in a session of its own)."""
    found, todo = [pid], [pid]
    while todo:
        for children in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = [int(c) for c in children.read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


class Trainers:
    """One torchrun agent with 2 trainer processes; its output in `log`, read as it grows with arrival times."""

    def __init__(self, trainer_args: list[str], log: Path, checkpoint_dir: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "DDPJOB_CHECKPOINT_DIR": str(checkpoint_dir),
               "DDPJOB_NAME": "bench", "DDPJOB_NAMESPACE": "local"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
               "--monitor-interval=0.2", "--shutdown-timeout=2", "-m", "ddp_trainer", *trainer_args]
        self.log, self.offset, self.partial = log, 0, ""
        self.lines: list[tuple[float, str]] = []  # (time.monotonic() when read, line)
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def read(self) -> list[tuple[float, str]]:
        now = time.monotonic()
        with open(self.log, errors="replace") as f:
            f.seek(self.offset)
            chunk = f.read()
            self.offset = f.tell()
        *complete, self.partial = (self.partial + chunk).split("\n")
        new = [(now, line) for line in complete]
        self.lines += new
        return new

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> float | None:
        """time.monotonic() when a line matching `pattern` was read (every 20 ms), None past `timeout`."""
        deadline = time.monotonic() + timeout
        seen = next((t for t, line in self.lines if pattern.search(line)), None)
        while seen is None and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.02)
            seen = next((t for t, line in self.read() if pattern.search(line)), None)
        return seen

    def stop(self, grace: float = 60.0) -> None:
        """SIGTERM (torchrun forwards it: the trainers save and exit), SIGKILL to the tree after `grace`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        for pid in tree(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def steady_gaps(lines: list[tuple[float, str]], every: int) -> list[float]:
    """Seconds between rank 0's consecutive step lines at the steps where the steady timeout is in force."""
    relaxed_after: set[int] = set()  # steps after which the timeout is long for RELAXED_STEPS more
    steps: list[tuple[float, int]] = []
    for at, line in lines:
        if m := STEP.match(line):
            steps.append((at, int(m.group(1))))
        elif m := EVALUATED.search(line):
            relaxed_after.add(int(m.group(1)))
    relaxed_after |= {s for _, s in steps if every and s % every == 0}
    gaps = []
    for (t0, s0), (t1, s1) in zip(steps, steps[1:]):
        near_relax = any(s1 - r in range(1, RELAXED_STEPS + 2) for r in relaxed_after)
        if s1 == s0 + 1 and s0 >= FIRST_STEADY_STEP + 1 and not near_relax:
            gaps.append(t1 - t0)
    return gaps


def trainer_args(state_mb: float, every: int, extra: list[str]) -> list[str]:
    state = ["--workload-option", f"state_mb={state_mb:g}"] if state_mb else []
    return ["--workload", "digits", *state, "--epochs", "100000", "--batch-size", "32", "--lr", "0.05",
            "--checkpoint-every", str(every), "--log-every", "1", *extra]


def under_load(minutes: float, state_mb: float, every: int, tmp: Path) -> dict:
    trainers = Trainers(trainer_args(state_mb, every, []), tmp / "load.log", tmp / "load-ckpt")
    until = time.monotonic() + minutes * 60
    try:
        while time.monotonic() < until and trainers.proc.poll() is None:
            time.sleep(0.02)
            trainers.read()
        exited_early = trainers.proc.poll()
    finally:
        trainers.stop()
    trainers.read()
    before_stop = [(t, line) for t, line in trainers.lines if t < until]
    verdicts = [line for _, line in before_stop if VERDICT.search(line)]
    gaps = steady_gaps(before_stop, every)
    steps = max((int(m.group(1)) for _, line in before_stop if (m := STEP.match(line))), default=0)
    evaluations = sum(1 for _, line in before_stop if EVALUATED.search(line))
    return {"steps": steps, "saves": steps // every if every else 0, "evaluations": evaluations,
            "verdicts": verdicts, "exited_early": exited_early, "gaps": gaps}


def frozen_peer(state_mb: float, every: int, tmp: Path, run: int) -> float | None:
    """Seconds from rank 1's freeze to rank 0's peer failure; None: not caught within 60 s."""
    trainers = Trainers(trainer_args(state_mb, every, ["--fault-hang-at-step", str(FREEZE_AT), "--fault-rank", "1"]),
                        tmp / f"freeze-{run}.log", tmp / f"freeze-{run}-ckpt")
    try:
        frozen = trainers.wait_for(FROZEN, 300)
        caught = trainers.wait_for(CAUGHT, 60) if frozen is not None else None
    finally:
        trainers.stop(grace=10)
    return None if frozen is None or caught is None else caught - frozen


def load_average() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5, help="training under load (0: skip)")
    parser.add_argument("--freezes", type=int, default=5, help="runs with a frozen peer, under the same load")
    parser.add_argument("--state-mb", type=float, default=64, help="model + AdamW state, MiB (saves take longer)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoint saves")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="busy processes, one core each")
    parser.add_argument("--keep-logs", metavar="DIR", help="keep the trainers' logs under DIR")
    args = parser.parse_args(argv)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"{datetime.now(timezone.utc).isoformat(timespec='minutes')}; {args.burners} busy processes; state "
          f"{args.state_mb:g} MiB, a checkpoint every {args.checkpoint_every} steps, an evaluation every epoch; "
          f"load average {load_average()}")
    burners = Burners(args.burners)
    failed = False
    try:
        with tempfile.TemporaryDirectory(prefix="ddpjob-silent-peer-") as tmp:
            work = Path(args.keep_logs or tmp)
            work.mkdir(parents=True, exist_ok=True)
            if args.minutes:
                r = under_load(args.minutes, args.state_mb, args.checkpoint_every, work)
                gaps = sorted(r["gaps"])
                print(f"\nload, {args.minutes:g} min: {r['steps']} steps, ~{r['saves']} saves, {r['evaluations']} "
                      f"evaluations; false verdicts: {len(r['verdicts'])}"
                      + (f" (trainers exited early with {r['exited_early']})" if r["exited_early"] is not None else "")
                      + f"; load average {load_average()}")
                for line in r["verdicts"][:5]:
                    print(f"  {line}")
                if gaps:
                    print(f"steady steps: {len(gaps)}, gap between step lines median {statistics.median(gaps):.3f} s, "
                          f"p99 {gaps[int(0.99 * (len(gaps) - 1))]:.3f} s, max {gaps[-1]:.3f} s")
                failed = bool(r["verdicts"]) or r["exited_early"] is not None
            caught = [frozen_peer(0, args.checkpoint_every, work, i) for i in range(args.freezes)]
            if caught:
                known = [c for c in caught if c is not None]
                print(f"\nfrozen peer, {len(caught)} runs: seconds from the freeze to the survivor's peer failure: "
                      + ", ".join("-" if c is None else f"{c:.1f}" for c in caught)
                      + (f"; median {statistics.median(known):.1f}, max {max(known):.1f}" if known else "")
                      + f"; load average {load_average()}")
                failed = failed or len(known) < len(caught) or any(c > 10 for c in known)
    finally:
        burners.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
