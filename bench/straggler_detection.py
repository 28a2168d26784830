"""Straggler detection (issue 22): what the per-rank step timing costs, how soon a slowed rank is named,
and whether a noisy machine raises a false straggler.

    .venv/bin/python bench/straggler_detection.py overhead                # 2 ranks, Gloo, CPU: timed vs not
    .venv/bin/python bench/straggler_detection.py micro                   # the timer's own CPU cost per step
    .venv/bin/python bench/straggler_detection.py detect --window 30       # a rank slowed 2x, ddpjob run --local
    .venv/bin/python bench/straggler_detection.py soak --seconds 600       # no slow rank, a noisy neighbour

overhead: in the same torchrun workers, the same MLP under two DDP wrappers, interleaved rounds of steps:
plain DDP, and DDP with runtime.timing.StepTimer (its communication hook, a boundary and a timed stop-flag
all_reduce every step, and the all_gather of own times every --log-every steps, as the bundled trainer does).
Both loops do the same stop all_reduce, so the difference is the timing alone. Medians of the time between
optimizer steps.

detect: the bundled trainer under `ddpjob run --local` (2 workers), rank 1 slowed --factor x; the time from
the first progress report to the `Warning Straggler` line (expected: about the window plus one log interval).

soak: the same job without a slow rank for --seconds, while a noisy neighbour (one process burning a core in
random bursts of 0.2-3 s) runs beside it; counts `Straggler` events (expected: none).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def overhead_launch(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.nproc}",
               __file__, "overhead-worker", "--out", str(out), "--hidden", str(a.hidden), "--rounds", str(a.rounds),
               "--steps", str(a.steps), "--log-every", str(a.log_every)] + (["--noise-floor"] if a.noise_floor else [])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}
        subprocess.run(cmd, env=env, check=True)
        r = json.loads(out.read_text())
    plain, timed = r["plain"], r["timed"]
    print(f"per-step median wall: plain DDP {plain * 1e3:.3f} ms, with step timing {timed * 1e3:.3f} ms "
          f"({100 * (timed / plain - 1):+.2f}%); main-thread CPU: {r['plain_cpu'] * 1e3:.3f} ms vs "
          f"{r['timed_cpu'] * 1e3:.3f} ms ({100 * (r['timed_cpu'] / r['plain_cpu'] - 1):+.2f}%) "
          f"({a.nproc} ranks, hidden {a.hidden}, {a.rounds} rounds x {a.steps} steps each)")


def overhead_worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(ROOT / "trainer-image"))
    from ddp_trainer.runtime.timing import StepTimer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(256, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(),
                             nn.Linear(a.hidden, 10))
    plain, timed = DDP(model()), DDP(model())
    timer = StepTimer(torch.device("cpu"))
    if not a.noise_floor:
        timer.watch(timed)
    opts = {id(plain): torch.optim.AdamW(plain.parameters()), id(timed): torch.optim.AdamW(timed.parameters())}
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    flag = torch.zeros(1, dtype=torch.int32)

    def steps(m: DDP, n: int, with_timer: bool) -> list[tuple[float, float]]:
        gaps, last, last_cpu = [], time.perf_counter(), time.thread_time()
        opt = opts[id(m)]
        for i in range(n):
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if with_timer:
                timer.boundary()
                with timer.waiting():
                    dist.all_reduce(flag)
                if (i + 1) % a.log_every == 0:
                    own = timer.take()
                    row = torch.tensor([-1.0 if own is None else own, float(rank)], dtype=torch.float64)
                    rows = [torch.empty_like(row) for _ in range(world)]
                    with timer.waiting():
                        dist.all_gather(rows, row)
            else:
                dist.all_reduce(flag)
            now, cpu = time.perf_counter(), time.thread_time()
            gaps.append((now - last, cpu - last_cpu))
            last, last_cpu = now, cpu
        return gaps[1:]
    steps(plain, 20, False)
    steps(timed, 20, True)  # warm up both
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "timed": []}
    for r in range(a.rounds):
        order = [("plain", plain, False), ("timed", timed, not a.noise_floor)]
        for name, m, t in (order if r % 2 == 0 else order[::-1]):
            times[name] += steps(m, a.steps, t)
    if rank == 0:
        Path(a.out).write_text(json.dumps({k: statistics.median(w for w, _ in v) for k, v in times.items()} | {
            f"{k}_cpu": statistics.median(c for _, c in v) for k, v in times.items()}))
    dist.destroy_process_group()


def micro(a: argparse.Namespace) -> None:
    """The timer's own cost per step, measured where the load of other processes cannot hide it: CPU time of
    this thread for one step of a small MLP (forward, backward, AdamW) with and without the timer (its
    per-parameter hooks and end-of-backward callbacks, a boundary and a timed wait), interleaved, medians."""
    import torch
    from torch import nn

    sys.path.insert(0, str(ROOT / "trainer-image"))
    from ddp_trainer.runtime.timing import StepTimer

    torch.set_num_threads(1)
    torch.manual_seed(0)

    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(256, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(),
                             nn.Linear(a.hidden, 10))
    plain, timed = model(), model()
    timer = StepTimer(torch.device("cpu"))
    timer.watch(timed)
    opts = {id(m): torch.optim.AdamW(m.parameters()) for m in (plain, timed)}
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step(m: nn.Module, with_timer: bool) -> float:
        start = time.thread_time_ns()
        nn.functional.cross_entropy(m(x), y).backward()
        opts[id(m)].step()
        opts[id(m)].zero_grad(set_to_none=True)
        if with_timer:
            timer.boundary()
            with timer.waiting():
                pass
        return (time.thread_time_ns() - start) / 1e9
    for _ in range(50):
        step(plain, False), step(timed, True)
    times: dict[str, list[float]] = {"plain": [], "timed": []}
    for _ in range(a.steps * a.rounds):
        times["plain"].append(step(plain, False))
        times["timed"].append(step(timed, True))
    p, t = statistics.median(times["plain"]), statistics.median(times["timed"])
    print(f"one step of a {a.hidden}-wide MLP (CPU time, median of {len(times['plain'])}): {p * 1e3:.3f} ms "
          f"without the timer, {t * 1e3:.3f} ms with it: +{(t - p) * 1e6:.1f} us per step ({100 * (t / p - 1):+.2f}%)")


MANIFEST = """apiVersion: elastic.ddp.dev/v1alpha1
kind: DDPJob
metadata: {{name: {name}}}
spec:
  replicas: 2
  image: local
  entrypoint: ddp_trainer
  args: {args}
  env: [{{name: OMP_NUM_THREADS, value: "1"}}]
  rendezvous: {{joinTimeoutSeconds: 60, lastCallTimeoutSeconds: 1}}
  checkpoint: {{claimTemplate: {{size: 1Gi}}, intervalSteps: 200}}
  failurePolicy: {{maxRestarts: 0, stragglerWindowSeconds: {window}}}
"""


def local_run(name: str, args: list[str], window: int, seconds: float | None, noisy: bool) -> tuple[str, float]:
    """`ddpjob run --local`; returns its output and when training first reported (seconds after start)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{name}.yaml"
        path.write_text(MANIFEST.format(name=name, args=json.dumps(args), window=window))
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "ddpjob_operator.cli", "run", str(path), "--local"], cwd=d,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        neighbour = subprocess.Popen([sys.executable, "-c", NOISE]) if noisy else None
        lines, first_report = [], None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if first_report is None and "progress: step" in line:
                    first_report = time.monotonic() - start
                if "Warning Straggler" in line:
                    lines.append(f"@{time.monotonic() - start:.1f}s\n")
                if seconds is not None and time.monotonic() - start > seconds:
                    proc.send_signal(2)
                    seconds = None
        finally:
            proc.wait()
            if neighbour is not None:
                neighbour.kill()
        return "".join(lines), first_report or 0.0


NOISE = """
import random, time
while True:
    end = time.monotonic() + random.uniform(0.2, 3.0)
    while time.monotonic() < end:
        pass
    time.sleep(random.uniform(0.2, 3.0))
"""

WORKLOAD = ["--workload", "synthetic", "--workload-option", "hidden=1024", "--workload-option", "samples=4096",
            "--batch-size", "32", "--log-every", "5"]


def detect(a: argparse.Namespace) -> None:
    out, first = local_run("detect", WORKLOAD + ["--epochs", "1000", "--fault-slow-rank", "1", "--fault-slow-factor",
                                                 str(a.factor)], a.window, a.window * 4 + 60, False)
    named = [line for line in out.splitlines() if "Warning Straggler" in line]
    at = re.search(r"@([\d.]+)s", out)
    if not named or at is None:
        print(out[-3000:])
        raise SystemExit("no straggler was named")
    print(f"rank slowed {a.factor}x named {float(at.group(1)) - first:.1f} s after the first progress report "
          f"(window {a.window} s): {named[0].split('Warning Straggler: ')[1]}")


def soak(a: argparse.Namespace) -> None:
    out, first = local_run("soak", WORKLOAD + ["--epochs", "100000"], a.window, a.seconds, True)
    named = [line for line in out.splitlines() if "Straggler" in line]
    steps = [int(m.group(1)) for m in re.finditer(r"progress: step (\d+)", out)]
    print(f"soak {a.seconds:.0f} s with a noisy neighbour (window {a.window} s): {len(named)} straggler events, "
          f"trained to step {max(steps) if steps else 0}")
    for line in named:
        print("  " + line.strip())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["overhead", "overhead-worker", "micro", "detect", "soak"])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--out")
    p.add_argument("--noise-floor", action="store_true", help="overhead: no timer on either side (the harness's noise)")
    p.add_argument("--window", type=int, default=30)
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=600)
    a = p.parse_args()
    random.seed(0)
    {"overhead": overhead_launch, "overhead-worker": overhead_worker, "micro": micro, "detect": detect,
     "soak": soak}[a.mode](a)


if __name__ == "__main__":
    main()
