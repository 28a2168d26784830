"""One trainer of tests/trainer/test_framework_watchdog.py: the Hugging Face or Lightning example's tiny model under
DDPJob's callback (from a config: nothing downloaded), rank 1 freezing itself with SIGSTOP after a step (alive,
its sockets open: a node that went silent), an evaluation and a save each longer than the silent limit.

argv: the framework (hf or lightning), the example's path, the mode ("silent": a steady timeout, the watchdog's
silent limit; "stop": the steady timeout off, as by default, the stop's grace), the step after which rank 1
freezes, the silent limit, the steady timeout, the stop's grace, the evaluation's step (seconds as floats)."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

framework, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
frozen, silent_s, steady_s, stop_grace_s = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
eval_at = int(sys.argv[8])
spec = importlib.util.spec_from_file_location("example", path)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
rank = int(os.environ["RANK"])
steady = steady_s if mode == "silent" else 0.0


def step_end(step: int) -> None:
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    print(f"rank={rank} step={step} timeout={backend.options._timeout.total_seconds():g}", flush=True)
    if rank == 1 and step == frozen:
        print("rank=1 frozen", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # alive, sockets open, never answering again


def guarded(callback):
    if mode == "silent":  # the collective (steady_s) must not time out by itself: only the watchdog acts
        callback.guard.watchdog.silent_s = silent_s
    else:  # rank 0 is blocked for good once rank 1 froze: waiting out the default grace (5 s) shows nothing more
        callback.guard.watchdog.stop_grace_s = stop_grace_s
    return callback


def hf_main() -> None:
    from transformers import GPT2Config, Trainer, TrainerCallback, TrainingArguments

    from ddp_trainer.runtime import hf

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step_end(state.global_step)

        def on_prediction_step(self, args, state, control, **kwargs):
            time.sleep(1)  # 6 batches: an evaluation longer than the silent limit

        def on_save(self, args, state, control, **kwargs):
            time.sleep(silent_s + 2)  # a save longer than the silent limit

    config = GPT2Config(vocab_size=example.VOCAB, n_positions=example.LENGTH, n_embd=8, n_layer=1, n_head=1)
    args = TrainingArguments(output_dir=hf.output_dir("out"), max_steps=200, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=eval_at,
                             save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
                             logging_steps=1000, ddp_find_unused_parameters=False)
    trainer = Trainer(model=example.TinyLM(config), args=args, train_dataset=example.Sequences(2048, seed=1),
                      eval_dataset=example.Sequences(48, seed=2),
                      callbacks=[guarded(hf.DDPJobCallback(steady_timeout_s=steady)), Probe()])
    trainer.train()


def lightning_main() -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    from ddp_trainer.runtime import ResumableDistributedSampler
    from ddp_trainer.runtime import lightning as ddpjob

    class Tiny(example.Tiny):
        def validation_step(self, batch, batch_idx):
            time.sleep(1)  # 6 batches: a validation longer than the silent limit

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            step_end(trainer.global_step)

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            time.sleep(silent_s + 2)  # a save longer than the silent limit

    data = example.Points(4096, seed=1)
    loader = DataLoader(data, batch_size=8, sampler=ResumableDistributedSampler(len(data), rank, 2, seed=0))
    trainer = L.Trainer(max_steps=200, callbacks=[guarded(ddpjob.DDPJobCallback(steady_timeout_s=steady)), Probe()],
                        val_check_interval=eval_at, limit_val_batches=6, num_sanity_val_steps=0,
                        use_distributed_sampler=False, enable_checkpointing=False, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, **ddpjob.trainer_kwargs("cpu"))
    trainer.fit(Tiny(1e-2, 1, 200, 0.0), loader, DataLoader(example.Points(48, seed=2), batch_size=8))


{"hf": hf_main, "lightning": lightning_main}[framework]()
