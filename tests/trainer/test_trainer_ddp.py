"""Real torchrun runs (Gloo, CPU): accuracy, DDP equivalence with a single process, SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ddp_trainer.config import parse_config
from ddpjob_operator.agent import command, contract
from ddp_trainer.runtime import ResumableDistributedSampler
from ddp_trainer.workloads import load_workload
from trainer_harness import (job_dir, base_env, committed_steps, kill_tree, read_json, run, start, steps_dir, tail,
                             torchrun_cmd, wait_for)

pytestmark = pytest.mark.slow


def test_two_workers_train_digits_to_95_percent(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = ["--workload", "digits", "--epochs", "20", "--lr", "1e-2", "--log-every", "20"]
    rc = run(torchrun_cmd(args, nproc=2), base_env(ckpt), tmp_path / "log", timeout=120)
    log = (tmp_path / "log").read_text()
    assert rc == 0, tail(tmp_path / "log")
    result = read_json(job_dir(ckpt) / "result.json")
    assert result["status"] == "completed" and result["world_size"] == 2 and result["epoch"] == 20
    assert result["eval_accuracy"] >= 0.95, result
    assert "step=20 epoch=0 loss=" in log and "samples_per_s=" in log
    assert log.count("step=20 epoch=0") == 1  # rank 0 only
    progress = read_json(job_dir(ckpt) / "progress.json")
    assert set(progress) == {"step", "epoch", "loss", "samples_per_second", "world_size", "last_checkpoint_step",
                             "time", "total_steps", "rank", "generation", "step_seconds", "step_seconds_by_worker",
                             "desired_world_size", "missing_ranks", "short_since"}
    assert set(progress["step_seconds_by_worker"]) == {"0"}  # one pod here (torchrun's group rank 0), two ranks
    assert progress["total_steps"] == result["step"]
    assert committed_steps(ckpt)[0] == result["step"]  # the final checkpoint


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_ddp_matches_a_single_process_on_the_same_global_batches(tmp_path: Path, grad_accum: int) -> None:
    ckpt, steps, batch = tmp_path / "ckpt", 4, 6
    args = ["--workload", "synthetic", "--workload-option", "samples=96", "--workload-option", "features=12",
            "--workload-option", "hidden=16", "--workload-option", "classes=3", "--optimizer", "sgd", "--lr", "0.1",
            "--schedule", "constant", "--batch-size", str(batch), "--grad-accum", str(grad_accum),
            "--max-steps", str(steps), "--seed", "3"]
    assert run(torchrun_cmd(args, nproc=2), base_env(ckpt), tmp_path / "log", timeout=90) == 0, tail(tmp_path / "log")
    ddp_state = torch.load(steps_dir(ckpt) / f"step-{steps:08d}.pt", weights_only=True)["model"]

    # Reference: one process, plain loss over the union of both ranks' micro-batches of each step.
    cfg = parse_config(args, env={})
    workload = load_workload("synthetic")
    train, _ = workload.build_datasets(cfg)
    torch.manual_seed(cfg.data.seed)
    model = workload.build_model(cfg)
    opt = workload.build_optimizer(model, cfg)
    per_rank = []
    for rank in range(2):
        s = ResumableDistributedSampler(len(train), rank, 2, seed=cfg.data.seed)
        s.set_epoch(0)
        per_rank.append(list(s))
    per_step = batch * grad_accum
    for k in range(steps):
        idx = [i for r in per_rank for i in r[k * per_step:(k + 1) * per_step]]
        x, y = train[idx]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(ddp_state[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_sigterm_to_the_agent_writes_a_final_checkpoint_and_exits_143(tmp_path: Path) -> None:
    """The agent as in a pod: torchrun under the pod's launcher (agent.command), PID 1's role."""
    ckpt, termination_log = tmp_path / "ckpt", tmp_path / "termination-log"
    args = ["--workload", "digits", "--epochs", "500", "--batch-size", "8", "--log-every", "10"]  # runs for minutes
    torchrun = torchrun_cmd(args, nproc=2)
    assert torchrun[1:3] == ["-m", "torch.distributed.run"]
    launcher = [*command("worker", python=torchrun[0]), *torchrun[3:]]
    agent = start(launcher, base_env(ckpt, **{contract.TERMINATION_LOG_ENV: str(termination_log)}), tmp_path / "log")
    try:
        wait_for(lambda: (read_json(job_dir(ckpt) / "progress.json") or {}).get("step", 0) >= 30, "step 30", 60)
        assert committed_steps(ckpt) == []  # no periodic checkpoints configured
        agent.send_signal(signal.SIGTERM)  # what the kubelet sends to the pod's PID 1
        agent.wait(60)
    finally:
        kill_tree(agent, signal.SIGKILL)
    log = (tmp_path / "log").read_text()
    steps = committed_steps(ckpt)
    assert len(steps) == 1 and steps[0] >= 30, tail(tmp_path / "log")
    state = torch.load(steps_dir(ckpt) / f"step-{steps[0]:08d}.pt", weights_only=True)
    assert state["progress"]["step"] == steps[0]
    assert f"stop requested at step {steps[0]}" in log
    # torchrun reports no worker exit codes when it is itself shutting down: the workers log theirs.
    assert "rank0 WARNING __main__: exiting with code 143" in log
    assert "rank1 WARNING __main__: exiting with code 143" in log
    assert agent.returncode == 143, tail(tmp_path / "log")
    assert termination_log.read_text().startswith("torchrun stopped by SIGTERM; exit code 143")
    assert read_json(job_dir(ckpt) / "result.json") is None
