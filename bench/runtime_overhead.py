"""Per-step cost of ddp_trainer.runtime in a user's own loop: the same script with and without it.

    .venv/bin/python bench/runtime_overhead.py                                   # 2 ranks, Gloo, CPU
    python bench/runtime_overhead.py --device cuda --nproc 1 --precision bf16 --hidden 4096   # GPU

Both loops are the examples/byo pattern (dict batches, DataLoader, DDP, AdamW, the mean loss over
ranks logged every --log-every steps). "library" adds what the guide asks for: Job.should_stop()
every step (an async all_reduce on a CPU tensor), sampler.advance(), job.should_save(), and
job.report() at each log step (to a real progress.json). They run in the same torchrun workers, in
interleaved rounds, on the same data; the time between consecutive optimizer steps is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def launch(a: argparse.Namespace, passthrough: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.nproc}",
               __file__, "--worker", "--out", str(out), "--ckpt", str(Path(d) / "ckpt"), *passthrough]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "LOGLEVEL": "WARNING"}
        subprocess.run(cmd, env=env, check=True)
        return json.loads(out.read_text())


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    from ddp_trainer.runtime import (Job, JobEnv, ProgressReporter, ResumableDistributedSampler, StopRequest,
                                     init_process_group, move_to, select_device)

    env = JobEnv.from_env()
    Path(a.ckpt).mkdir(parents=True, exist_ok=True)  # progress.json goes here: the write cost is measured
    device = select_device(a.device, env)
    init_process_group(env, device)
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(a.samples, 256, generator=g)
    ys = (xs @ torch.randn(256, 10, generator=g)).argmax(1)

    class Dicts(Dataset):
        def __len__(self):
            return a.samples

        def __getitem__(self, i):
            return {"x": xs[i], "labels": ys[i]}

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(256, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(),
                                     nn.Linear(a.hidden, 10))

        def forward(self, x, labels):
            return {"loss": F.cross_entropy(self.net(x), labels)}

    amp = a.precision == "bf16"

    def loop(use_library: bool) -> list[float]:
        torch.manual_seed(0)
        model = Net().to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if use_library:
            job = Job(env, device, StopRequest(), checkpoint_dir=None,
                      reporter=ProgressReporter(a.ckpt, enabled=env.is_main))
            sampler = ResumableDistributedSampler(a.samples, env.rank, env.world_size, seed=0)
        else:
            job, sampler = None, DistributedSampler(Dicts(), env.world_size, env.rank, seed=0, drop_last=True)
        loader = DataLoader(Dicts(), batch_size=a.batch_size, sampler=sampler, pin_memory=device.type == "cuda")
        stamps: list[float] = []
        step, epoch = 0, 0
        while step < a.steps:
            sampler.set_epoch(epoch)
            for batch in loader:
                stamps.append(time.perf_counter())
                batch = move_to(batch, device) if use_library else {k: v.to(device, non_blocking=True)
                                                                    for k, v in batch.items()}
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                    loss = ddp(**batch)["loss"]
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if step % a.log_every == 0:  # both: the mean loss over ranks, like the example
                    t = loss.detach().float().reshape(1)
                    dist.all_reduce(t)
                    mean = t.item() / env.world_size
                    if use_library:
                        job.report(step=step, total_steps=a.steps, loss=mean)
                if use_library:
                    sampler.advance(len(batch["labels"]))
                    if job.should_save(step):
                        pass
                    if job.should_stop():
                        break
                if step >= a.steps:
                    break
            epoch += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        if job is not None:
            job.close()
        return [b - x for x, b in zip(stamps[a.warmup:], stamps[a.warmup + 1:])]

    results: dict[str, list[float]] = {"plain": [], "library": []}
    for r in range(a.rounds):  # interleaved, alternating which goes first
        for use in ((False, True) if r % 2 == 0 else (True, False)):
            results["library" if use else "plain"] += loop(use)
    # The library's own per-step calls alone, timed, with 5 ms of (untimed) sleep standing in for a
    # step's compute between them: the stop all_reduce started at one call completes meanwhile.
    job = Job(env, device, StopRequest(), checkpoint_dir=None, reporter=ProgressReporter(a.ckpt, enabled=env.is_main))
    sampler = ResumableDistributedSampler(a.samples, env.rank, env.world_size, seed=0)
    calls, stops, reports = [], [], []
    for i in range(1, 1001):
        time.sleep(0.005)
        dist.barrier()  # DDP's gradient all_reduce keeps ranks in step; so does this, untimed
        t = time.perf_counter()
        sampler.advance(a.batch_size)
        job.should_save(i)
        t1 = time.perf_counter()
        job.should_stop()
        t2 = time.perf_counter()
        if i % a.log_every == 0:
            job.report(step=i, total_steps=1000, loss=0.5)
            reports.append(time.perf_counter() - t2)
        calls.append(time.perf_counter() - t)
        stops.append(t2 - t1)
    job.close()
    results["library_calls"], results["stop_calls"], results["report_calls"] = calls[100:], stops[100:], reports[10:]
    if env.is_main:
        Path(a.out).write_text(json.dumps({"world_size": env.world_size, "device": str(device), **results}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--ckpt", help=argparse.SUPPRESS)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--log-every", type=int, default=10)
    a, _ = p.parse_known_args()
    if a.worker:
        worker(a)
        return
    argv = sys.argv[1:]
    passthrough = [v for i, v in enumerate(argv) if not (v.startswith("--nproc") or (i and argv[i - 1] == "--nproc"))]
    r = launch(a, passthrough)
    plain, lib = statistics.median(r["plain"]), statistics.median(r["library"])
    q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))]  # noqa: E731
    print(f"world_size={r['world_size']} device={r['device']} precision={a.precision} hidden={a.hidden} "
          f"batch/rank={a.batch_size} steps measured per loop={len(r['library'])}")
    for name, xs in (("without the library", r["plain"]), ("with ddp_trainer.runtime", r["library"])):
        print(f"{name:26s} median {statistics.median(xs) * 1e3:.3f} ms/step "
              f"(p10 {q(xs, 0.1) * 1e3:.3f}, p90 {q(xs, 0.9) * 1e3:.3f})")
    print(f"ratio library/plain: {lib / plain:.3f} (goal <= 1.01)")
    calls = statistics.median(r["library_calls"])
    print(f"the library's per-step calls alone (5 ms apart): median {calls * 1e6:.1f} us (p90 {q(r['library_calls'], 0.9) * 1e6:.1f}), "
          f"{calls / plain * 100:.2f}% of the plain step; should_stop() median "
          f"{statistics.median(r['stop_calls']) * 1e6:.1f} us, report() median {statistics.median(r['report_calls']) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
