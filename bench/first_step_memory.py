"""A joiner's first step against its later ones, with and without the scratch a joiner holds through the hand-over
(runtime/layout.py `Prepared.scratch`), each in a fresh interpreter, as a replacement pod's trainer is.

    .venv/bin/python bench/first_step_memory.py [--state-mb 1024] [--steps 5] [--rounds 2]

The model is the bundled workloads' state block (model plus AdamW state about --state-mb MiB) with its optimizer's
moments already in touched memory (as a joiner holds them after receiving into its prepared layout). A publisher
process first trains a few steps and reports its peak resident memory, as a view's rank 0 publishes it; then, per
round and mode, a fresh process: `cold` steps at once; `scratch` holds a touched block up to that peak and frees
it just before its first step (what a joiner does); `scratch-freed-early` frees it --early-s seconds before.
Prints, per mode, the median first step and the median of the later ones. Between processes the bench waits
--settle-s seconds: a replacement starts long after anything on its node freed memory (where freed memory goes back
to the host, as on a VM with free page reporting, a process started right after another's exit finds its pages
still backed and hides the effect).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("cold", "scratch", "scratch-freed-early")


def build(state_mb: float):
    import torch

    from ddp_trainer.workloads.state import WithStateBlock, BYTES_PER_PARAMETER

    torch.set_num_threads(2)
    model = WithStateBlock(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)),
                           int(state_mb * 2**20) // BYTES_PER_PARAMETER)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():  # the moments a joiner received into memory it touched before arriving
        optimizer.state[p].update(step=torch.tensor(1.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    batch = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step() -> float:
        began = time.perf_counter()
        torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - began

    return step


def child(mode: str, state_mb: float, steps: int, scratch_bytes: int, early_s: float) -> dict:
    import torch

    from ddp_trainer.runtime.layout import peak_resident_bytes, resident_bytes

    step = build(state_mb)
    if mode == "publisher":
        for _ in range(3):
            step()
        return {"scratch_bytes": peak_resident_bytes() - resident_bytes()}
    if mode != "cold":
        scratch = torch.zeros(scratch_bytes, dtype=torch.uint8)  # zeros: every page touched
        if mode == "scratch-freed-early":
            del scratch
        time.sleep(early_s)  # the arrival and hand-over a joiner waits through
        scratch = None
    return {"steps": [step() for _ in range(steps)]}


def run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "trainer-image"), "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-mb", type=float, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--early-s", type=float, default=4.0, help="the hand-over's length (seconds held or freed)")
    parser.add_argument("--settle-s", type=float, default=15.0, help="the wait between processes")
    parser.add_argument("--child", nargs=5, metavar=("MODE", "STATE_MB", "STEPS", "SCRATCH", "EARLY_S"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, state_mb, steps, scratch, early_s = args.child
        print(json.dumps(child(mode, float(state_mb), int(steps), int(scratch), float(early_s))))
        return
    common = (str(args.state_mb), str(args.steps))
    scratch = run_child("publisher", *common, "0", "0")["scratch_bytes"]
    print(f"state {args.state_mb:g} MiB; the publisher's step needs {scratch / 2**20:.0f} MiB beyond its state")
    firsts: dict[str, list[float]] = {m: [] for m in MODES}
    laters: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            time.sleep(args.settle_s)
            steps = run_child(mode, *common, str(scratch), str(args.early_s))["steps"]
            firsts[mode].append(steps[0])
            laters[mode].extend(steps[1:])
    print("| mode | first step (median) | later steps (median) | first / later |")
    print("| --- | --- | --- | --- |")
    for mode in MODES:
        first, later = statistics.median(firsts[mode]), statistics.median(laters[mode])
        print(f"| {mode} | {first:.2f} s | {later:.2f} s | {first / later:.2f} |")


if __name__ == "__main__":
    main()
