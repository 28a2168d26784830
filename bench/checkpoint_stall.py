"""Training-loop stall caused by checkpoints: asynchronous vs synchronous save (real Trainer, torchrun).

    .venv/bin/python bench/checkpoint_stall.py                   # 2 ranks, Gloo, CPU, ~100 MB checkpoints
    .venv/bin/python bench/checkpoint_stall.py --device cuda --nproc 8

The stall is how long rank 0's training loop is blocked inside CheckpointManager.save() per
checkpoint: serialize + write + fsync for a synchronous save, the CPU snapshot for an async one.
Mean step time over the run (checkpoint every N steps) is reported against a run without checkpoints.
"""

from __future__ import annotations

import argparse
import statistics

from trainer_step import launch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=3)
    a = p.parse_args()
    r = launch("stall", a.nproc, ["--device", a.device, "--rounds", str(a.rounds), "--steps", str(a.steps),
                                  "--checkpoint-every", str(a.checkpoint_every), "--hidden", str(a.hidden),
                                  "--layers", str(a.layers), "--samples", "4096", "--batch-size", "32"])
    params = 256 * a.hidden + (a.layers - 1) * a.hidden * a.hidden + a.hidden * 10
    print(f"world_size={r['world_size']} device={r['device']} params~{params / 1e6:.1f}M "
          f"(checkpoint ~{params * 12 / 1e6:.0f} MB with AdamW state) every {a.checkpoint_every} steps")
    sync_s, async_s = statistics.median(r["sync_save_s"]), statistics.median(r["async_save_s"])
    print(f"stall per checkpoint: sync median {sync_s * 1e3:.1f} ms, async median {async_s * 1e3:.1f} ms "
          f"({len(r['sync_save_s'])}/{len(r['async_save_s'])} saves) -> async/sync {async_s / sync_s:.3f} "
          f"(goal < 0.10)")
    none = statistics.mean(r["none"])
    for mode in ("sync", "async"):
        m = statistics.mean(r[mode])
        print(f"mean step time {mode:>5}: {m * 1e3:.2f} ms vs {none * 1e3:.2f} ms without checkpoints "
              f"(+{(m / none - 1) * 100:.1f}%)")


if __name__ == "__main__":
    main()
