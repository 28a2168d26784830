"""runtime.hf: the Hugging Face callback's stop on SIGTERM under real torchrun (two trainers, Gloo), which
checkpoint a resume takes (a partial one, as a worker killed mid-save leaves it, never), a resume at another
world size (two trainers stopped, one resumes: HF's schedule and data order, on the values), and issue 23's
checkpoint promises with HF's own saves: HF's rotation never deletes the last complete checkpoint before the
new one is committed (4), a replaced generation commits nothing (5), a full volume exits 75 (6). The in-process
runs train the example's tiny GPT-2, built from a config, for a few steps."""

from __future__ import annotations

import builtins
import errno
import importlib.util
import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from trainer_harness import (job_dir, PY, base_env, kill_tree, read_json, recorded, run, start, tail,  # noqa: E402
                             trainer_pids, trap_exit, wait_for)
from transformers import GPT2Config, Trainer, TrainerCallback, TrainingArguments, set_seed  # noqa: E402

from ddp_trainer.runtime import frameworks  # noqa: E402
from ddp_trainer.runtime import hf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "hf" / "train.py"


def _example():
    spec = importlib.util.spec_from_file_location("hf_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()  # its TinyLM (GPT-2 from a config) and synthetic Sequences


def _train(out: Path, max_steps: int, *, resume: str | None = None, callbacks: tuple = (), **args) -> None:
    """A single-process HF run of the example's model: DDPJob's callback saves every 2 steps into `out`."""
    set_seed(0)  # the same initial weights in every run
    config = GPT2Config(vocab_size=EXAMPLE.VOCAB, n_positions=EXAMPLE.LENGTH, n_embd=8, n_layer=1, n_head=1)
    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=2,
                             save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0, **args)
    trainer = Trainer(model=EXAMPLE.TinyLM(config), args=args, train_dataset=EXAMPLE.Sequences(32, seed=1),
                      callbacks=[*callbacks, hf.DDPJobCallback(every_steps=2)])
    trainer.train(resume_from_checkpoint=resume)


def _complete(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("checkpoint-*") if frameworks.read_marker(p) is not None)


def test_resume_takes_the_newest_complete_checkpoint_and_says_so(tmp_path: Path, capsys, caplog) -> None:
    out = tmp_path / "hf"
    for step in (10, 20, 30, 40):
        d = out / f"checkpoint-{step}"
        d.mkdir(parents=True)
        if step != 40:  # 40: committed without weights, as a rescue by rank 1 was before issue 32
            (d / "model.safetensors").write_bytes(b"x" * 100)
        (d / "trainer_state.json").write_text("{}")
        (d / "rng_state_1.pth").write_bytes(b"r")  # another rank's: not waited for
        if step != 20:  # 20: its writer died before the marker
            frameworks.commit(d, step=step, world_size=2, skip=hf.OTHER_RANKS_FILES)
    (out / "checkpoint-30" / "model.safetensors").write_bytes(b"x" * 10)  # 30: truncated after its commit
    assert hf.resume_from_checkpoint(str(out)) == str(out / "checkpoint-10")  # (the old code: 40, then HF failed)
    assert "resumed from checkpoint step=10 (saved at world_size=2, now 1)" in capsys.readouterr().err
    assert f"skipping checkpoint {out / 'checkpoint-40'}: the framework cannot load it (no model weights)" \
        in caplog.text
    assert hf.resume_from_checkpoint(str(tmp_path / "none")) is None


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_step_with_a_complete_checkpoint_and_exit_143(tmp_path: Path) -> None:
    ck, log = tmp_path / "ck", tmp_path / "torchrun.log"
    env = base_env(ck, HF_HUB_OFFLINE="1", DDPJOB_CHECKPOINT_INTERVAL_STEPS="0")
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "--monitor-interval=0.2", str(SCRIPT), "--max-steps", "500", "--step-sleep", "0.05"]
    proc = start(cmd, env, log)
    try:
        wait_for(lambda: ((read_json(job_dir(ck) / "progress.json") or {}).get("step") or 0) >= 5, "step 5", 180,
                 explain=lambda: tail(log))
        for pid in trainer_pids(proc.pid):
            os.kill(pid, signal.SIGTERM)  # as torchrun forwards the pod's SIGTERM to every trainer
        proc.wait(120)
    finally:
        kill_tree(proc, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert sorted(re.findall(r"exitcode\s*: (\d+) \(pid", text)) == ["143", "143"], tail(log)  # both trainers
    stops = {int(s) for s in re.findall(r"stop requested \(signal 15\) at step (\d+)", text)}
    assert len(stops) == 1, tail(log)  # both ranks, the same step
    step = stops.pop()
    assert hf.resume_from_checkpoint(str(ck / "local.test" / "hf")) == str(ck / "local.test" / "hf" / f"checkpoint-{step}")
    assert frameworks.read_marker(ck / "local.test" / "hf" / f"checkpoint-{step}")["world_size"] == 2
    assert not (job_dir(ck) / "result.json").exists()  # stopped, not finished



STEP = re.compile(r"^step=(\d+) epoch=\d+ loss=\S+ lr=(\S+) samples=(\[.*\])$", re.MULTILINE)
RESIZE_STEPS, RESIZE_BATCH = 24, 4


def _torchrun(nproc: int, *extra: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
            "--monitor-interval=0.2", str(SCRIPT), "--max-steps", str(RESIZE_STEPS), "--batch-size",
            str(RESIZE_BATCH), "--warmup-steps", "4", *extra]


def _steps(log: Path) -> dict[int, tuple[str, list[int]]]:
    """Rank 0's (learning rate, sample indices) by optimizer step, from the example's step lines."""
    text = log.read_text(errors="replace")
    return {int(m.group(1)): (m.group(2), json.loads(m.group(3))) for m in STEP.finditer(text)}


@pytest.mark.slow
def test_a_resume_at_another_world_size_goes_on_from_the_checkpoints_step_with_its_schedule(tmp_path: Path) -> None:
    """Scale-down, as the operator does it: two trainers stop on SIGTERM at step N with a checkpoint, the next
    generation has one. It resumes from step N (the first step it trains is N+1), every step's learning rate
    is the undisturbed run's, and it finishes at max_steps. The data order is HF's (docs/hf-and-lightning.md):
    one seeded permutation per epoch, whatever the world size, dealt in per-device batches to the ranks in
    turn; the resumed run skips N steps' batches of its own sharding, so from step N+1 on it trains exactly
    what an undisturbed one-process run trains at that step, and samples N*b .. 2N*b-1 of the permutation
    (b = per-device batch), which the two trainers had consumed, are trained a second time."""
    env = base_env(tmp_path / "reference", HF_HUB_OFFLINE="1", DDPJOB_CHECKPOINT_INTERVAL_STEPS="0")
    reference_log = tmp_path / "reference.log"
    assert run(_torchrun(1), env, reference_log, 300) == 0, tail(reference_log)
    reference = _steps(reference_log)
    assert sorted(reference) == list(range(1, RESIZE_STEPS + 1)), tail(reference_log)
    b = RESIZE_BATCH
    order = [i for s in sorted(reference) for i in reference[s][1]]  # the epoch's permutation (first samples)
    assert len(set(order)) == len(order) == RESIZE_STEPS * b

    ck = tmp_path / "ck"
    env = base_env(ck, HF_HUB_OFFLINE="1", DDPJOB_CHECKPOINT_INTERVAL_STEPS="0")
    two_log, one_log = tmp_path / "two.log", tmp_path / "one.log"
    proc = start(_torchrun(2, "--step-sleep", "0.25"), env, two_log)
    try:
        wait_for(lambda: ((read_json(job_dir(ck) / "progress.json") or {}).get("step") or 0) >= 5, "step 5", 180,
                 explain=lambda: tail(two_log))
        for pid in trainer_pids(proc.pid):
            os.kill(pid, signal.SIGTERM)  # a scale-down: the operator's SIGTERM, forwarded by torchrun
        proc.wait(120)
    finally:
        kill_tree(proc, signal.SIGKILL)
    text = two_log.read_text(errors="replace")
    assert sorted(re.findall(r"exitcode\s*: (\d+) \(pid", text)) == ["143", "143"], tail(two_log)
    stops = {int(s) for s in re.findall(r"stop requested \(signal 15\) at step (\d+)", text)}
    assert len(stops) == 1, tail(two_log)
    n = stops.pop()
    assert 5 <= n < RESIZE_STEPS, tail(two_log)
    two = _steps(two_log)
    assert sorted(two) == list(range(1, n + 1)), tail(two_log)
    for s in two:  # rank 0 of two: batches 0, 2, 4, ... of the permutation; the same learning rate per step
        assert two[s] == (reference[s][0], order[(2 * s - 2) * b:(2 * s - 1) * b]), (s, two[s], tail(two_log))

    assert run(_torchrun(1), env, one_log, 300) == 0, tail(one_log)
    text = one_log.read_text(errors="replace")
    assert f"resumed from checkpoint step={n} (saved at world_size=2, now 1)" in text, tail(one_log)
    one = _steps(one_log)
    assert min(one) == n + 1 and sorted(one) == list(range(n + 1, RESIZE_STEPS + 1)), tail(one_log)
    assert {s: lr for s, (lr, _) in one.items()} == {s: reference[s][0] for s in one}  # the schedule went on
    assert {s: seen for s, (_, seen) in one.items()} == {s: reference[s][1] for s in one}  # HF's skip: N batches
    twice = min(2 * n, RESIZE_STEPS)
    again = {i for s in range(n + 1, twice + 1) for i in one[s][1]}
    assert again == set(order[n * b:twice * b])  # consumed by the two trainers (rank 1: odd batches), trained again
    result = read_json(job_dir(ck) / "result.json")
    assert result["status"] == "completed" and result["step"] == RESIZE_STEPS and result["world_size"] == 1
    recovery = read_json(job_dir(ck) / "progress.json")["recovery"]  # the callback's timeline: the restart path (issue 29)
    assert (recovery["path"], recovery["reason"], recovery["resumed_step"]) == ("Restart", "", n)
    assert recovery["rendezvous_time"] <= recovery["first_step_time"]

# ---- issue 23, items 4-6, with HF's own saves -----------------------------------------------------------

def test_4_hfs_rotation_never_deletes_the_last_complete_checkpoint_before_the_new_one_is_committed(tmp_path):
    """HF's `save_total_limit` rotation runs inside HF's save, before `on_save` commits the new checkpoint, and
    counts partial checkpoints: with checkpoint-7 left partial (a rescue killed mid-write), saving 6 deleted
    2 and 4, so a crash before the commit of 6 left nothing to resume from. Now the callback prunes, after it."""
    out = tmp_path / "hf"
    _train(out, 4, save_total_limit=2)
    assert _complete(out) == ["checkpoint-2", "checkpoint-4"]
    partial = out / "checkpoint-7"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"x")
    seen = []

    class BeforeTheCommit(TrainerCallback):  # on_save runs before DDPJob's: HF wrote checkpoint-6, no marker yet
        def on_save(self, args, state, control, **kwargs):
            seen.append(_complete(out))

    _train(out, 6, resume=hf.resume_from_checkpoint(str(out)), callbacks=(BeforeTheCommit(),), save_total_limit=2)
    assert seen == [["checkpoint-2", "checkpoint-4"]]  # the old code: [] (HF's rotation had removed both)
    assert _complete(out) == ["checkpoint-4", "checkpoint-6"]  # then pruned to `save_total_limit`, after the commit
    assert partial.is_dir()  # newer than the verified one: not this trainer's to judge


def test_5_a_replaced_generation_commits_and_prunes_nothing(tmp_path, monkeypatch):
    out = tmp_path / "hf"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)  # (HF would take the process for torchrun's)
    monkeypatch.setenv("DDPJOB_GENERATION", "1")
    _train(out, 4, save_total_limit=2)
    monkeypatch.setenv("DDPJOB_GENERATION", "2")
    assert hf.resume_from_checkpoint(str(out)) == str(out / "checkpoint-4")  # generation 2's rank 0 starts
    monkeypatch.setenv("DDPJOB_GENERATION", "1")
    _train(out, 8, resume=str(out / "checkpoint-4"), save_total_limit=2)  # left behind, and further along
    monkeypatch.setenv("DDPJOB_GENERATION", "2")
    assert hf.resume_from_checkpoint(str(out)) == str(out / "checkpoint-4")  # the old code: checkpoint-8
    assert _complete(out) == ["checkpoint-2", "checkpoint-4"]  # and its rotation had removed both


def test_6_a_full_volume_while_hf_saves_exits_75_naming_the_directory(tmp_path, monkeypatch):
    out = tmp_path / "hf"
    error_file = trap_exit(monkeypatch, tmp_path)
    real_open = builtins.open

    def full_at_step_4(file, mode="r", *args, **kwargs):  # HF writes checkpoint-4's trainer_state.json
        if "w" in mode and str(file).endswith(os.path.join("checkpoint-4", "trainer_state.json")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full_at_step_4)
    with pytest.raises(SystemExit) as exited:
        _train(out, 6)  # the old code: the OSError left trainer.train(), exit 1 (the script's bug)
    assert exited.value.code == 75
    assert recorded(error_file).startswith(
        f"checkpoint volume full: {out}: No space left on device while writing checkpoint-4: "), recorded(error_file)
    monkeypatch.setattr(builtins, "open", real_open)
    assert _complete(out) == ["checkpoint-2"]
    assert hf.resume_from_checkpoint(str(out)) == str(out / "checkpoint-2")


# ---- issue 32, item 2: HF's logged loss after a resume --------------------------------------------------------

class _Losses(TrainerCallback):
    """Every loss HF logs, by step; with `stop_at`, training stops there (as the callback's stop does)."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.logged: dict[int, float] = {}
        self.stop_at = stop_at

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logged[state.global_step] = logs["loss"]

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.stop_at:
            control.should_save = control.should_training_stop = True


def test_hfs_running_loss_and_dropout_resume_exactly_between_logging_steps(tmp_path: Path) -> None:
    """logging_steps=3 and a checkpoint at step 4: HF starts its running loss afresh on resume, so its log at
    step 6 averaged steps 5-6 instead of 4-6 (and dropout drew other masks: the model has GPT-2's 0.1); the
    running loss now travels with the checkpoint and each step's draws come from (seed, step, rank)."""
    settings = {"logging_steps": 3, "lr_scheduler_type": "constant"}
    undisturbed, stopped, resumed = _Losses(), _Losses(stop_at=4), _Losses()
    _train(tmp_path / "a", 9, callbacks=(undisturbed,), **settings)
    _train(tmp_path / "b", 9, callbacks=(stopped,), **settings)
    assert _complete(tmp_path / "b")[-1] == "checkpoint-4"
    _train(tmp_path / "b", 9, resume=hf.resume_from_checkpoint(str(tmp_path / "b")), callbacks=(resumed,), **settings)
    assert sorted(undisturbed.logged) == [3, 6, 9] and stopped.logged == {3: undisturbed.logged[3]}
    assert resumed.logged == {6: undisturbed.logged[6], 9: undisturbed.logged[9]}


def test_a_rescue_of_a_plain_module_with_tied_weights_is_what_hfs_loader_resumes_from(tmp_path: Path) -> None:
    """The rescue writes HF's layout itself (it may run on any rank, without a collective): for a model that is no
    `PreTrainedModel` (a plain nn.Module whose weights are tied, which safetensors refuses), its state dict as
    `pytorch_model.bin`; HF then resumes from the directory, weights and step included."""

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(EXAMPLE.VOCAB, 8)
            self.head = torch.nn.Linear(8, EXAMPLE.VOCAB, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, input_ids=None, labels=None, idx=None):
            logits = self.head(self.embed(input_ids))
            return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()), "logits": logits}

    def trainer(out: Path, steps: int, callback: hf.DDPJobCallback) -> Trainer:
        set_seed(0)
        args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=2, save_strategy="no",
                                 report_to="none", disable_tqdm=True, use_cpu=True, seed=0)
        return Trainer(model=Tied(), args=args, train_dataset=EXAMPLE.Sequences(32, seed=1), callbacks=[callback])

    callback = hf.DDPJobCallback(every_steps=0)
    first = trainer(tmp_path / "out", 3, callback)
    first.train()
    rescue = tmp_path / "out" / "checkpoint-3"
    callback._write_replica(rescue, first.args, first.state)
    assert hf.unloadable(rescue) is None and (rescue / "pytorch_model.bin").is_file()
    second = trainer(tmp_path / "again", 4, hf.DDPJobCallback(every_steps=0))
    second.train(resume_from_checkpoint=str(rescue))
    assert second.state.global_step == 4
    resumed = trainer(tmp_path / "check", 3, hf.DDPJobCallback(every_steps=0))
    resumed._load_from_checkpoint(str(rescue))
    assert torch.equal(resumed.model.embed.weight, first.model.embed.weight)
