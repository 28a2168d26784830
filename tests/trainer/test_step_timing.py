"""Issue 22: each rank's own time per step, apart from the time it waited for the others in collectives
(runtime/timing.py). The arithmetic with a fake clock, then real torchrun agents with Gloo: a node slowed 3x
(`--fault-slow-rank`/`--fault-node`) reports about 3x the own time of its peer, whose own time stays well
below the step's wall time (it spends the rest waiting for the slow one in DDP's all_reduce)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ddp_trainer.config import ConfigError, parse_config
from ddp_trainer.fault import due, slow_due
from ddp_trainer.runtime.timing import StepTimer
from trainer_harness import job_dir, StoreServer, base_env, kill_tree, read_json, start, tail, torchrun_cmd


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_own_time_is_the_step_minus_the_waits():
    clock = Clock()
    timer = StepTimer(clock=clock)
    assert timer.take() is None  # no whole step yet
    timer.boundary()  # t=0: the first step starts
    clock.t = 1.0
    with timer.waiting():  # e.g. Job.mean's all_reduce
        clock.t = 3.0
    clock.t = 5.0
    assert timer.own_so_far() == pytest.approx(3.0)
    timer.boundary()  # step 1: 5 s of wall time, 2 s waiting: 3 s own
    # Step 2: DDP's last bucket ready at 6, its all_reduce done at 9 (the wait at the end of backward).
    clock.t, timer._ready = 6.0, 6.0
    clock.t, timer._done = 9.0, 9.0
    clock.t = 10.0
    timer.boundary()  # 5 s of wall time, 3 s waiting for the all_reduce: 2 s own
    assert timer.take() == pytest.approx(2.5)
    assert timer.take() is None  # the window was reset


def test_slow_fault_flags_are_validated_and_follow_the_node():
    cfg = parse_config(["--fault-slow-rank", "1", "--fault-slow-factor", "3", "--fault-generation", "-1"])
    assert slow_due(cfg.fault, 1, {}) and not slow_due(cfg.fault, 0, {})
    with pytest.raises(ConfigError, match="fault.slow_factor"):
        parse_config(["--fault-slow-rank", "1", "--fault-slow-factor", "0.5"])
    node = parse_config(["--fault-slow-rank", "0", "--fault-node", "node-b"]).fault
    # On the named node every rank is slow; elsewhere none is (the fault follows the node, not the rank).
    assert slow_due(node, 0, {"NODE_NAME": "node-b"}) and slow_due(node, 3, {"NODE_NAME": "node-b"})
    assert not slow_due(node, 0, {"NODE_NAME": "node-a"}) and not slow_due(node, 0, {})


NODE_CRASH = ["--fault-at-step", "5", "--fault-exit-code", "137", "--fault-node", "node-b"]


@pytest.mark.parametrize("what, argv, rank, step, environ, fires", [
    ("on the named node", NODE_CRASH, 0, 5, {"NODE_NAME": "node-b"}, True),
    ("whatever the rank there (--fault-rank is ignored)", NODE_CRASH + ["--fault-rank", "0"], 3, 5,
     {"NODE_NAME": "node-b"}, True),
    ("past the step too (a generation that resumed past it)", NODE_CRASH, 1, 9, {"NODE_NAME": "node-b"}, True),
    ("on another node never", NODE_CRASH, 0, 5, {"NODE_NAME": "node-a"}, False),
    ("without NODE_NAME never", NODE_CRASH, 0, 5, {}, False),
    ("not before the step", NODE_CRASH, 0, 4, {"NODE_NAME": "node-b"}, False),
    ("only in --fault-generation (0)", NODE_CRASH, 0, 5, {"NODE_NAME": "node-b", "DDPJOB_GENERATION": "1"}, False),
    ("in every generation with --fault-every-generation", NODE_CRASH + ["--fault-every-generation"], 0, 5,
     {"NODE_NAME": "node-b", "DDPJOB_GENERATION": "3"}, True),
    ("without --fault-node: the rank, wherever it runs", ["--fault-at-step", "5", "--fault-rank", "1"], 1, 5,
     {"NODE_NAME": "node-a"}, True),
    ("without --fault-node: no other rank", ["--fault-at-step", "5", "--fault-rank", "1"], 0, 5,
     {"NODE_NAME": "node-b"}, False),
])
def test_a_node_crash_fault_fires_only_where_node_name_matches(what, argv, rank, step, environ, fires):
    fault = parse_config(argv).fault
    assert due(fault, rank, step, environ) is fires, what


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_slowed_node_reports_its_own_time_and_its_peer_does_not_count_the_wait(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    # The last report's window, steps 41-50, holds no epoch's end (32 steps an epoch) and so no evaluation.
    args = ["--workload", "synthetic", "--workload-option", "hidden=512", "--workload-option", "samples=2048",
            "--epochs", "100", "--max-steps", "50", "--batch-size", "32", "--log-every", "10",
            "--fault-slow-rank", "0", "--fault-slow-factor", "3", "--fault-node", "node-b"]
    store = StoreServer()
    logs = [tmp_path / "node-a.log", tmp_path / "node-b.log"]
    agents = []
    try:
        for i, node in enumerate(("node-a", "node-b")):
            env = base_env(ckpt, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", DDPJOB_REPLICA_INDEX=str(i), NODE_NAME=node)
            cmd = torchrun_cmd(args, nnodes="2:2", endpoint=store.endpoint, run_id="timing",
                               local_addr=f"127.0.0.{i + 2}")
            agents.append(start(cmd, env, logs[i]))
        rcs = [a.wait(200) for a in agents]
    finally:
        for a in agents:
            kill_tree(a, signal.SIGKILL)
        store.close()
    assert rcs == [0, 0], "\n".join(tail(p) for p in logs)
    progress = read_json(job_dir(ckpt) / "progress.json")
    by_worker = {int(k): v for k, v in progress["step_seconds_by_worker"].items()}
    assert set(by_worker) == {0, 1}, progress
    fast, slow = by_worker[0], by_worker[1]
    assert slow >= 2.0 * fast, progress  # 3x injected: the slow node's own work, not its waits
    # The wall time of a step (both ranks wait for the slow one): the fast rank's own time is well below it.
    wall = progress["world_size"] * 32 / progress["samples_per_second"]
    assert fast <= 0.6 * wall, (fast, wall, progress)
    assert progress["step_seconds"] in (fast, slow)  # rank 0's own pod, whichever node it landed on
