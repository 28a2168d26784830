"""What the DDPJob callbacks cost per optimizer step: the HF `Trainer` and Lightning examples' tiny
models, two trainers under torchrun (Gloo, CPU), each run with the callback and without it.

Two measurements per framework, on rank 0:
- in the hook: the time spent inside the callback's per-step hook (HF `on_step_end`, Lightning
  `on_train_batch_end`: the progress report and the stop agreement, whose all-reduce is asynchronous
  and read a step later), per step, against the median step time: the callback's own cost;
- end to end: the median step time with the callback against without (alternating runs; on a shared
  machine this difference is noise of the same order as the cost itself).
No checkpoint is written in either run (the interval is 0): checkpoints are the framework's own writes.

    .venv/bin/python bench/callback_overhead.py [--steps 150] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(framework: str, steps: int, with_callback: bool, out: Path) -> None:
    """One training run inside torchrun; rank 0 writes its step times and hook times to `out`."""
    sys.path.insert(0, str(ROOT / "examples" / framework))
    import importlib

    example = importlib.import_module("train")
    hook_times: list[float] = []
    step_times: list[float] = []
    if framework == "hf":
        from transformers import Trainer, TrainerCallback, TrainingArguments

        from ddp_trainer.runtime import hf

        class Clock(TrainerCallback):
            last = None

            def on_step_end(self, args, state, control, **kwargs):
                now = time.perf_counter()
                if self.last is not None:
                    step_times.append(now - self.last)
                self.last = now

        cb = hf.DDPJobCallback()
        original = cb.on_step_end

        def timed(*a, **k):
            t = time.perf_counter()
            result = original(*a, **k)
            hook_times.append(time.perf_counter() - t)
            return result

        cb.on_step_end = timed
        import torch
        config = example.GPT2Config(vocab_size=example.VOCAB, n_positions=example.LENGTH, n_embd=32, n_layer=2,
                                    n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=8,
                                 logging_steps=10, save_strategy="no", report_to="none", disable_tqdm=True,
                                 use_cpu=True, ddp_find_unused_parameters=False)
        trainer = Trainer(model=example.TinyLM(config), args=args, train_dataset=example.Sequences(2048, 1234),
                          callbacks=[Clock(), *([cb] if with_callback else [])])
        torch.manual_seed(0)
        trainer.train()
    else:
        import lightning as L
        from torch.utils.data import DataLoader

        from ddp_trainer.runtime import ResumableDistributedSampler
        from ddp_trainer.runtime import lightning as ddpjob

        class Clock(L.Callback):
            last = None

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                now = time.perf_counter()
                if self.last is not None:
                    step_times.append(now - self.last)
                self.last = now

        cb = ddpjob.DDPJobCallback()
        original = cb.on_train_batch_end

        def timed(*a, **k):
            t = time.perf_counter()
            original(*a, **k)
            hook_times.append(time.perf_counter() - t)

        cb.on_train_batch_end = timed
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        data = example.Points(2048, seed=1234)
        loader = DataLoader(data, batch_size=8, sampler=ResumableDistributedSampler(len(data), rank, world))
        trainer = L.Trainer(max_steps=steps, callbacks=[Clock(), *([cb] if with_callback else [])],
                            use_distributed_sampler=False, enable_checkpointing=False, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, **ddpjob.trainer_kwargs())
        print_off = open(os.devnull, "w")
        stdout, sys.stdout = sys.stdout, print_off  # the example prints a line per step
        try:
            trainer.fit(example.Tiny(1e-2, 10, steps, 0.0), loader)
        finally:
            sys.stdout = stdout
    if int(os.environ.get("RANK", "0")) == 0:
        warm = len(step_times) // 5  # the first fifth: warm-up
        out.write_text(json.dumps({"step_s": step_times[warm:], "hook_s": hook_times[warm:]}))
    os._exit(0)


def one_run(framework: str, steps: int, with_callback: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DDPJOB_CHECKPOINT_DIR": tmp,
               "DDPJOB_NAME": "bench", "DDPJOB_CHECKPOINT_INTERVAL_STEPS": "0", "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(Path(__file__).resolve()), "--worker", framework, "--steps", str(steps),
               *(["--with-callback"] if with_callback else [])]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"{framework} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--frameworks", default="hf,lightning")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--with-callback", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker, a.steps, a.with_callback, Path(os.environ["DDPJOB_CHECKPOINT_DIR"]) / "times.json")
        return 0
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; "
          f"python {platform.python_version()}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print("| framework | median step, off (ms) | median step, on (ms) | on/off | in the hook per step (us) | hook / step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for framework in a.frameworks.split(","):
        off, on, hooks = [], [], []
        for _ in range(a.trials):  # alternating: drift on a shared machine hits both alike
            off.append(statistics.median(one_run(framework, a.steps, False)["step_s"]))
            run = one_run(framework, a.steps, True)
            on.append(statistics.median(run["step_s"]))
            hooks.append(statistics.median(run["hook_s"]))
        step_off, step_on, hook = statistics.median(off), statistics.median(on), statistics.median(hooks)
        print(f"| {framework} | {step_off * 1e3:.2f} | {step_on * 1e3:.2f} | {step_on / step_off:.3f} | "
              f"{hook * 1e6:.0f} | {hook / step_on:.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
