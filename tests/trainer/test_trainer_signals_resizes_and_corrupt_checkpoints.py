"""Edge cases of the trainer under signals, resizes, restarts and corrupt checkpoints (found in the issue-11 review): each failed before its fix.

Process-free where the finding is in the checkpoint manager; real torchrun (Gloo, CPU) where it is
in the trainer's behaviour under signals, resizes and restarts: launched as a pod launches it (the worker agent,
torchrun inside, forking its trainers: one torch import per launch, not one per process), except test 1, which
is about plain torchrun signalling its spawned trainers' process groups.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from ddp_trainer.runtime import CheckpointManager
from ddpjob_operator.agent import command, contract
from trainer_harness import (job_dir, base_env, committed_steps, kill_tree, read_json, run, start, steps_dir, tail,
                             torchrun_cmd, wait_for)

TINY = ["--workload", "synthetic", "--workload-option", "samples=512", "--workload-option", "features=8",
        "--workload-option", "hidden=16", "--workload-option", "classes=3", "--workload-option", "eval_samples=64"]
LR_LINE = re.compile(r"^step=(\d+) .* lr=([0-9.e+-]+)$", re.MULTILINE)


def _state(value: float) -> dict:
    return {"w": torch.full((4,), value)}


def pod_command(trainer_args: list[str], *, nproc: int = 1) -> list[str]:
    """The pod's command: the worker agent with the launch contract's torchrun flags."""
    torchrun = torchrun_cmd(trainer_args, nproc=nproc)
    return [*command("worker", python=torchrun[0]), *torchrun[3:]]


def pod_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """base_env, with the agent's termination message in `tmp_path` (not the container's /dev/termination-log)."""
    return base_env(tmp_path / "ckpt", **{contract.TERMINATION_LOG_ENV: str(tmp_path / "termination-log")}, **extra)


# ---- 1. SIGTERM with DataLoader workers -------------------------------------------------------

@pytest.mark.slow
def test_1_sigterm_with_dataloader_workers_still_writes_the_final_checkpoint(tmp_path: Path) -> None:
    """torchrun signals each trainer's process group, DataLoader workers included: they must not die
    before the trainer has finished its step and written the final checkpoint."""
    ckpt = tmp_path / "ckpt"
    args = [*TINY, "--epochs", "5000", "--batch-size", "8", "--log-every", "5", "--num-workers", "2"]
    agent = start(torchrun_cmd(args, nproc=2), base_env(ckpt), tmp_path / "log")
    try:
        wait_for(lambda: (read_json(job_dir(ckpt) / "progress.json") or {}).get("step", 0) >= 20, "step 20", 90)
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
    finally:
        kill_tree(agent, signal.SIGKILL)
    log = (tmp_path / "log").read_text()
    steps = committed_steps(ckpt)
    assert len(steps) == 1 and steps[0] >= 20, tail(tmp_path / "log")
    assert "is killed by signal" not in log, tail(tmp_path / "log")
    assert "rank0 WARNING __main__: exiting with code 143" in log, tail(tmp_path / "log")
    assert "rank1 WARNING __main__: exiting with code 143" in log, tail(tmp_path / "log")


# ---- 2. pruning and corrupt checkpoints -------------------------------------------------------

def test_2_a_corrupt_newest_checkpoint_does_not_count_towards_keep(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    for step in (10, 20, 30):
        m.save(step, _state(step))
    p = m.path(30)
    p.write_bytes(p.read_bytes()[:100])  # the newest is torn
    restarted = CheckpointManager(tmp_path, keep=2)
    step, _ = restarted.load_latest()
    assert step == 20
    restarted.save(21, _state(21))
    restarted.save(22, _state(22))
    assert restarted.committed_steps() == [22, 21]  # two good ones kept; the corrupt 30 is gone
    m.path(22).write_bytes(b"garbage")  # and the newest good one breaks too: 21 is still there
    step, state = CheckpointManager(tmp_path, keep=2).load_latest()
    assert step == 21 and torch.equal(state["w"], torch.full((4,), 21.0))


# ---- 3. LR schedule across a resize, first and last step --------------------------------------

def _lrs(log: Path) -> dict[int, float]:
    return {int(s): float(lr) for s, lr in LR_LINE.findall(log.read_text())}


@pytest.mark.slow
def test_3_max_steps_lr_schedule_is_continuous_across_a_resize_and_never_zero(tmp_path: Path) -> None:
    """--max-steps 20 with cosine: 2 workers fail after step 9 (checkpoint at 8), 1 worker resumes.
    Every step's LR must be lr * cos-schedule((step - 0.5) / 20), whatever the world size."""
    max_steps, lr = 20, 0.1
    args = [*TINY, "--epochs", "1000", "--batch-size", "8", "--max-steps", str(max_steps), "--lr", str(lr),
            "--schedule", "cosine", "--log-every", "1", "--checkpoint-every", "8", "--fault-at-step", "9",
            "--fault-exit-code", "3"]
    # Without the survivor's rescue checkpoint (of step 9), so that step 9 is trained again at world size 1.
    assert run(pod_command([*args, "--no-rescue-checkpoint"], nproc=2), pod_env(tmp_path), tmp_path / "a.log", 90) != 0
    env = pod_env(tmp_path, DDPJOB_GENERATION="1")  # the fault strikes in generation 0 only
    assert run(pod_command(args), env, tmp_path / "b.log", 90) == 0, tail(tmp_path / "b.log")
    assert "resumed from checkpoint step=8" in (tmp_path / "b.log").read_text()
    before, after = _lrs(tmp_path / "a.log"), _lrs(tmp_path / "b.log")
    assert sorted(before) == list(range(1, 10)) and sorted(after) == list(range(9, 21)), (before, after)
    for step, got in [*before.items(), *after.items()]:
        want = lr * 0.5 * (1 + math.cos(math.pi * (step - 0.5) / max_steps))
        assert got == pytest.approx(want, rel=1e-4), f"step {step}: lr {got}, want {want}"
    assert after[20] > 0  # the last step trains too


# ---- 4. resume under another data order ------------------------------------------------------

@pytest.mark.slow
def test_4_resume_with_another_seed_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    args = [*TINY, "--epochs", "2", "--batch-size", "8", "--log-every", "1"]
    assert run(pod_command([*args, "--max-steps", "3"]), pod_env(tmp_path), tmp_path / "a.log", 90) == 0
    rc = run(pod_command([*args, "--seed", "1"]), pod_env(tmp_path), tmp_path / "b.log", 90)
    log = (tmp_path / "b.log").read_text()
    assert rc != 0, tail(tmp_path / "b.log")
    assert "cannot resume: the checkpoint of step 3 was written with seed=0 (this run: 1)" in log, log
    assert not re.search(r"^step=", log, re.MULTILINE)  # refused before training a single step
    assert "ConfigError" not in log, log  # the user's configuration: the trainer's one line, not its stack
    assert "written with seed=0 (this run: 1)" in (tmp_path / "termination-log").read_text()


# ---- 5. unwritable checkpoint directory ------------------------------------------------------

@pytest.mark.slow
def test_5_an_unwritable_checkpoint_directory_fails_at_start_naming_path_and_fix(tmp_path: Path) -> None:
    """The pod's case: the volume's checkpoints/ is not writable by the trainer (uid 1000, no fsGroup)
    while progress.json still is. Without periodic checkpoints the old trainer trained to the end,
    then failed at its final save with a traceback."""
    ckpt = tmp_path / "ckpt"
    locked = steps_dir(ckpt)  # the job's own checkpoints/ on the volume
    locked.mkdir(parents=True)
    if os.getuid() == 0:  # root writes through permissions: make the directory immutable instead
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(locked)]).returncode != 0:
            pytest.skip("running as root and chattr +i is not available: cannot make a directory unwritable")
    else:
        os.chmod(locked, 0o555)
    args = [*TINY, "--epochs", "3", "--batch-size", "8", "--log-every", "5"]
    try:
        rc = run(pod_command(args), pod_env(tmp_path), tmp_path / "log", 90)
    finally:
        if os.getuid() == 0:
            subprocess.run(["chattr", "-i", str(locked)])
        os.chmod(locked, 0o755)
    log = (tmp_path / "log").read_text()
    assert rc != 0
    assert f"checkpoint directory {locked} is not writable by uid" in log, log
    assert "fsGroup" in log
    assert not re.search(r"^step=", log, re.MULTILINE), "it trained before noticing"
    # and the pod's termination message says the same (what `kubectl describe pod` shows)
    assert f"checkpoint directory {locked} is not writable by uid" in (tmp_path / "termination-log").read_text()


# ---- 6. stop agreement without a device sync: tests/trainer/test_gpu.py (needs CUDA) ----------

# ---- 7. small things --------------------------------------------------------------------------

def test_7a_a_checksum_mismatch_says_so_instead_of_printing_equal_sizes(tmp_path: Path, caplog) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    m.save(1, _state(1))
    m.save(2, _state(2))
    data = bytearray(m.path(2).read_bytes())
    data[-30] ^= 0xFF  # same size, other bytes
    m.path(2).write_bytes(bytes(data))
    assert CheckpointManager(tmp_path, keep=2).load_latest()[0] == 1
    assert "SHA-256" in caplog.text and "expected" not in caplog.text


def test_7b_a_data_file_without_its_marker_is_pruned(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    m.save(1, _state(1))
    m.path(5).write_bytes(b"torn: the writer died before the marker")  # and another one, older
    m.path(0).write_bytes(b"orphan")
    m.save(2, _state(2))
    m.save(3, _state(3))
    assert sorted(p.name for p in m.dir.iterdir()) == ["step-00000002.committed", "step-00000002.pt",
                                                       "step-00000003.committed", "step-00000003.pt"]


def test_7c_stray_temp_files_are_cleaned_once_stale(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    stale = [tmp_path / (".progress.json.tmp-" + "a" * 32), m.dir / (".step-00000007.pt.tmp-" + "b" * 32),
             m.dir / ".step-00000007.pt.tmp4242"]
    fresh = m.dir / (".step-00000008.pt.tmp-" + "c" * 32)  # another writer may be writing it right now
    for p in [*stale, fresh]:
        p.write_bytes(b"x")
    for p in stale:
        os.utime(p, (time.time() - 3600, time.time() - 3600))
    m.save(1, _state(1))
    assert [p for p in stale if p.exists()] == [] and fresh.exists()


EVAL_COUNTING_WORKLOAD = '''
import json, os
import torch
from torch import nn

class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.evals = 0
    def forward(self, x):
        if not self.training:
            self.evals += 1
            with open(os.environ["EVAL_COUNT_FILE"], "a") as f:
                f.write("eval\\n")
        return self.net(x)

def build_datasets(cfg):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] > 0).long()
    return torch.utils.data.TensorDataset(x[:48], y[:48]), torch.utils.data.TensorDataset(x[48:], y[48:])

def build_model(cfg):
    return Counting()
'''


@pytest.mark.slow
def test_7d_evaluation_runs_once_per_epoch_not_twice_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "counting_task.py").write_text(EVAL_COUNTING_WORKLOAD)
    count = tmp_path / "evals"
    env = pod_env(tmp_path, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                  EVAL_COUNT_FILE=str(count))
    args = ["--workload", "counting_task", "--epochs", "3", "--batch-size", "8", "--eval-batch-size", "16"]
    assert run(pod_command(args), env, tmp_path / "log", 90) == 0, tail(tmp_path / "log")
    assert count.read_text().count("eval") == 3  # 16 eval samples in one batch, once per epoch
    assert read_json(job_dir(tmp_path / "ckpt") / "result.json")["eval_accuracy"] is not None
