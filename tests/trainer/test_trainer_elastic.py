"""Elastic behaviour with real torchrun agents: a node killed and restarted, resume at another world size."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from trainer_harness import (job_dir, StoreServer, base_env, failures, kill_tree, process_state, read_json, run, start,
                             tail, torchrun_cmd, wait_for, worker_ranks)

pytestmark = pytest.mark.slow


def test_killed_node_restarts_and_training_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    """Two agents ("nodes") on a dedicated rendezvous store, as the operator runs them; the node
    holding global rank 0 loses its whole process tree and comes back under the same address."""
    ckpt, epochs = tmp_path / "ckpt", 6  # 45 steps an epoch: the kill comes at step 50-110, the rest trains after
    args = ["--workload", "digits", "--workload-option", "hidden=512", "--epochs", str(epochs), "--lr", "3e-3",
            "--batch-size", "16", "--checkpoint-every", "25", "--log-every", "25"]
    # Sharing the agent's store with the workers is broken for a node that rejoins with its old rank
    # (torch 2.13 keeps the dead rank-0 agent's MASTER_PORT on the survivors); see docs/trainer.md.
    env = base_env(ckpt, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    store = StoreServer()
    # The killed node's agent is taken for dead once its keep-alive is 5 s old (spec.rendezvous
    # keepAliveIntervalSeconds 1, keepAliveMaxAttempts 5), not 15 s (5 x 3, the defaults): the next round waits for it.
    cmds = [torchrun_cmd(args, nnodes="2:2", endpoint=store.endpoint, run_id="kill", max_restarts=3,
                         local_addr=f"127.0.0.{i + 2}", rdzv_conf="keep_alive_interval=1,keep_alive_max_attempt=5")
            for i in range(2)]
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = [start(cmd, env, log) for cmd, log in zip(cmds, logs)]
    try:
        wait_for(lambda: ((read_json(job_dir(ckpt) / "progress.json") or {}).get("last_checkpoint_step") or 0) >= 50,
                 "a checkpoint at step >= 50", 90)
        victim = next(i for i in range(2) if "rank=0 world_size=2" in logs[i].read_text())
        kill_tree(nodes[victim], signal.SIGKILL)
        nodes[victim].wait(10)
        killed_at = read_json(job_dir(ckpt) / "progress.json")["step"]
        assert killed_at < epochs * 45, "training finished before the kill"
        nodes[victim] = start(cmds[victim], env, tmp_path / "node-restarted.log")
        rcs = [n.wait(150) for n in nodes]
    finally:
        for n in nodes:
            kill_tree(n, signal.SIGKILL)
        store.close()
    all_logs = "\n".join(tail(p, 400) for p in tmp_path.glob("*.log"))
    assert rcs == [0, 0], all_logs
    resumed = [line for line in all_logs.splitlines() if "resumed from checkpoint step=" in line]
    assert len(resumed) == 1, all_logs
    step = int(resumed[0].split("step=")[1].split()[0])
    # The survivor saved its replica (a rescue checkpoint): at most the step in flight is lost, not
    # the 25 steps of the checkpoint interval (progress.json may lag the last step by a little).
    assert step >= killed_at - 1, all_logs
    assert "rescue checkpoint: rank" in all_logs or step % 25 == 0, all_logs
    result = read_json(job_dir(ckpt) / "result.json")
    assert result["status"] == "completed" and result["epoch"] == epochs and result["eval_accuracy"] >= 0.95


def records(path: Path) -> dict[int, list[int]]:
    by_epoch: dict[int, list[int]] = {}
    for f in sorted(path.parent.glob(path.name + ".rank*")):
        for line in f.read_text().split("\n"):
            if line:
                epoch, index = map(int, line.split())
                by_epoch.setdefault(epoch, []).append(index)
    return by_epoch


@pytest.mark.parametrize("world_before,world_after,stop_step", [(2, 1, 5), (1, 2, 7)])
def test_resume_at_another_world_size_repeats_and_skips_no_sample(tmp_path: Path, world_before: int,
                                                                   world_after: int, stop_step: int) -> None:
    ckpt, rec, n = tmp_path / "ckpt", tmp_path / "samples", 192
    args = ["--workload", "synthetic", "--workload-option", f"samples={n}", "--workload-option", "features=8",
            "--workload-option", "hidden=16", "--workload-option", "classes=3", "--batch-size", "8",
            "--epochs", "2", "--record-samples", str(rec), "--log-every", "1"]
    env = base_env(ckpt)
    first = run(torchrun_cmd(args + ["--max-steps", str(stop_step)], nproc=world_before), env, tmp_path / "a.log", 90)
    assert first == 0, tail(tmp_path / "a.log")
    assert read_json(job_dir(ckpt) / "progress.json")["world_size"] == world_before
    assert run(torchrun_cmd(args, nproc=world_after), env, tmp_path / "b.log", 90) == 0, tail(tmp_path / "b.log")
    log = (tmp_path / "b.log").read_text()
    assert f"resumed from checkpoint step={stop_step} epoch=0" in log
    assert f"saved at world_size={world_before}, now {world_after}" in log
    seen = records(rec)
    assert sorted(seen) == [0, 1]
    for epoch, indices in seen.items():
        repeated = [i for i, c in Counter(indices).items() if c > 1]
        assert not repeated, f"epoch {epoch} repeated {repeated}"
        assert sorted(indices) == list(range(n)), f"epoch {epoch} skipped {set(range(n)) - set(indices)}"
    assert seen[0] != seen[1]  # reshuffled
    assert read_json(job_dir(ckpt) / "result.json")["world_size"] == world_after


def test_a_hung_peer_fails_the_survivors_collective_within_the_steady_timeout(tmp_path: Path) -> None:
    """A frozen rank (SIGSTOP: its sockets stay open, nothing resets them, as with a lost node or a
    wedged process) would hold the survivor in its next collective for Gloo's 30 minutes (NCCL's 10).
    Once the first steps ran, the collective timeout is --dist-steady-timeout: the survivor's
    collective fails after it, and the survivor saves its replica before exiting."""
    ckpt = tmp_path / "ckpt"
    args = ["--workload", "digits", "--epochs", "50", "--batch-size", "16", "--checkpoint-every", "1000",
            "--log-every", "10", "--dist-steady-timeout", "5", "--fault-hang-at-step", "30", "--fault-rank", "1"]
    log = tmp_path / "log"
    agent = start(torchrun_cmd(args, nproc=2), base_env(ckpt), log)
    try:
        wait_for(lambda: "rank 1 at step 30: hanging" in log.read_text(errors="replace"), "the hang", 90,
                 explain=lambda: tail(log))
        workers = worker_ranks(agent.pid)
        wait_for(lambda: process_state(workers[0]) in (None, "Z"), "the survivor's exit", 60,
                 explain=lambda: tail(log, 80))
        # torchrun would now wait 30 s (its default, whatever --shutdown-timeout says) for the frozen rank to
        # heed SIGTERM before it SIGKILLs it: that is torch's teardown, not the behaviour under test.
        os.kill(workers[1], signal.SIGKILL)
        assert agent.wait(30) != 0, tail(log)
    finally:
        kill_tree(agent, signal.SIGKILL)
    assert failures(log).get(0, (None,))[0] == 1, tail(log, 80)  # the survivor's own failure, not the SIGKILL's
    assert "rescue checkpoint: rank 0 saved step 30 after a peer failed" in log.read_text(), tail(log, 80)
