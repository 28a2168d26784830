"""Per-step time of the ddp_trainer loop vs a minimal hand-written DDP loop, side by side in one run.

    .venv/bin/python bench/trainer_step.py                       # 2 ranks, Gloo, CPU
    .venv/bin/python bench/trainer_step.py --device cuda --nproc 8 --precision bf16   # NCCL on GPUs

Both loops run in the same torchrun workers, in interleaved rounds, with the same model, data,
per-rank batch and world size; the time between consecutive optimizer steps is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def launch(mode: str, nproc: int, worker_args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(HERE / "trainer_bench_worker.py"), mode, "--out", str(out), *worker_args]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "LOGLEVEL": "WARNING"}
        subprocess.run(cmd, env=env, check=True)
        return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    a = p.parse_args()
    r = launch("step", a.nproc, ["--device", a.device, "--precision", a.precision, "--rounds", str(a.rounds),
                                 "--steps", str(a.steps), "--hidden", str(a.hidden), "--batch-size",
                                 str(a.batch_size)])
    base, tr = statistics.median(r["baseline"]), statistics.median(r["trainer"])
    print(f"world_size={r['world_size']} device={r['device']} precision={a.precision} hidden={a.hidden} "
          f"batch/rank={a.batch_size} steps measured per loop={len(r['trainer'])}")
    print(f"hand-written DDP loop: median {base * 1e3:.3f} ms/step (p10 {_q(r['baseline'], 0.1) * 1e3:.3f}, "
          f"p90 {_q(r['baseline'], 0.9) * 1e3:.3f})")
    print(f"ddp_trainer loop:      median {tr * 1e3:.3f} ms/step (p10 {_q(r['trainer'], 0.1) * 1e3:.3f}, "
          f"p90 {_q(r['trainer'], 0.9) * 1e3:.3f})")
    print(f"ratio trainer/baseline: {tr / base:.3f} (goal <= 1.03)")


def _q(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * (len(xs) - 1))]


if __name__ == "__main__":
    main()
