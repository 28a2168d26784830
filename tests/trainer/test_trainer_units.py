"""Fast, process-free tests: sampler sharding, config validation, checkpoint manager crash safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from ddp_trainer.runtime import CheckpointManager
from ddp_trainer.config import ConfigError, OptimConfig, parse_config
from ddp_trainer.runtime import ResumableDistributedSampler, is_peer_failure


def shards(n: int, world: int, epoch: int = 0, consumed: int = 0, **kw) -> list[list[int]]:
    out = []
    for rank in range(world):
        s = ResumableDistributedSampler(n, rank, world, seed=7, **kw)
        s.set_epoch(epoch, consumed)
        out.append(list(s))
        assert len(s) == len(out[-1])
    return out


@pytest.mark.parametrize("n,world", [(100, 1), (100, 2), (100, 4), (101, 3)])
def test_shards_are_disjoint_equal_and_cover_the_epoch(n: int, world: int) -> None:
    parts = shards(n, world)
    flat = [i for p in parts for i in p]
    assert len(set(len(p) for p in parts)) == 1  # every rank runs the same number of steps
    assert len(flat) == len(set(flat))  # disjoint
    assert len(flat) == n - n % world  # drop_last: only the < world tail is left out
    assert set(flat) <= set(range(n))


def test_padding_repeats_only_the_tail() -> None:
    parts = shards(101, 3, drop_last=False)
    flat = [i for p in parts for i in p]
    assert set(flat) == set(range(101)) and len(flat) == 102  # one sample seen twice


def test_order_changes_every_epoch_and_is_reproducible() -> None:
    e0, e1 = shards(100, 2, epoch=0), shards(100, 2, epoch=1)
    assert e0 != e1
    assert sorted(e0[0] + e0[1]) == sorted(e1[0] + e1[1]) == list(range(100))
    assert shards(100, 2, epoch=1) == e1


@pytest.mark.parametrize("world_before,world_after", [(2, 1), (1, 2), (2, 3), (4, 2)])
def test_resume_reshards_the_remaining_samples_at_a_new_world_size(world_before: int, world_after: int) -> None:
    n, batch, steps = 96, 4, 3
    before = shards(n, world_before)
    consumed_sets = [p[: steps * batch] for p in before]
    consumed = sum(len(c) for c in consumed_sets)
    after = shards(n, world_after, consumed=consumed)
    seen = [i for c in consumed_sets for i in c] + [i for p in after for i in p]
    assert sorted(seen) == list(range(n))  # nothing repeated, nothing skipped


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="optim.lr"):
        OptimConfig(lr=0)
    with pytest.raises(ConfigError, match="checkpoint.keep"):
        parse_config(["--checkpoint-keep", "1"], env={})
    with pytest.raises(ConfigError, match="DDPJOB_CHECKPOINT_INTERVAL_STEPS"):
        parse_config([], env={"DDPJOB_CHECKPOINT_INTERVAL_STEPS": "often"})


def test_checkpoint_settings_come_from_the_contract_env_unless_flags_override() -> None:
    env = {"DDPJOB_CHECKPOINT_DIR": "/ckpt", "DDPJOB_CHECKPOINT_INTERVAL_STEPS": "50", "DDPJOB_CHECKPOINT_KEEP": "3"}
    c = parse_config([], env=env).checkpoint
    assert (c.dir, c.every_steps, c.keep) == ("/ckpt", 50, 3)
    c = parse_config(["--checkpoint-every", "7", "--checkpoint-dir", "/other"], env=env).checkpoint
    assert (c.dir, c.every_steps, c.keep) == ("/other", 7, 3)


def _state(value: float) -> dict:
    return {"w": torch.full((4,), value), "progress": {"step": int(value)}}


@pytest.mark.parametrize("async_save", [False, True])
def test_keeps_newest_k_and_skips_a_truncated_newest(tmp_path: Path, async_save: bool, caplog) -> None:
    m = CheckpointManager(tmp_path, keep=2, async_save=async_save)
    for step in (1, 2, 3):
        m.save(step, _state(step))
    m.wait()
    assert m.committed_steps() == [3, 2]
    p = m.path(3)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])  # torn write of the newest
    step, state = CheckpointManager(tmp_path, keep=2).load_latest()
    assert step == 2 and torch.equal(state["w"], torch.full((4,), 2.0))
    assert "skipping unreadable checkpoint step 3" in caplog.text


def test_async_save_snapshots_before_training_mutates(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2, async_save=True)
    w = torch.zeros(1000)
    m.save(1, {"w": w})
    w.add_(1)  # the next optimizer step, while the write may still be running
    m.wait()
    assert torch.equal(m.load(1)["w"], torch.zeros(1000))


WRITER = """
import sys, torch
from ddp_trainer.runtime import CheckpointManager
m = CheckpointManager(sys.argv[1], keep=2)
m.save(1, {"w": torch.ones(10)})
print("saved 1", flush=True)
m.save(2, {"w": torch.zeros(64 * 1024 * 1024)})  # 256 MiB: the test kills it mid-write
print("saved 2", flush=True)
"""


def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one_loadable(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "saved 1"
    ckpt = tmp_path / "checkpoints"
    deadline = time.monotonic() + 60
    while not list(ckpt.glob(".step-00000002.pt.tmp*")):  # the temp file of step 2 exists: mid-write
        assert proc.poll() is None and time.monotonic() < deadline, "writer finished before it could be killed"
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    m = CheckpointManager(tmp_path, keep=2)
    step, state = m.load_latest()
    assert step == 1 and torch.equal(state["w"], torch.ones(10))
    stray = list(ckpt.glob(".step-*"))
    assert stray  # fresh: it could be another live writer's, so it stays until stale
    for p in stray:
        os.utime(p, (time.time() - 301, time.time() - 301))
    CheckpointManager(tmp_path, keep=2)  # a new writer removes temp files untouched for 5 minutes
    assert not list(ckpt.glob(".step-*"))


# ---- rescue checkpoints: any survivor writes, exactly one per step, never over newer work ----------

def test_survivors_racing_to_rescue_the_same_step_write_it_exactly_once(tmp_path: Path) -> None:
    CheckpointManager(tmp_path, keep=2).save(10, _state(10))  # the last periodic checkpoint
    survivors = [CheckpointManager(tmp_path, keep=2, is_writer=False, generation=3) for _ in range(8)]
    barrier = threading.Barrier(len(survivors))

    def rescue(m: CheckpointManager) -> bool:
        barrier.wait()
        return m.save_rescue(13, _state(13))

    with ThreadPoolExecutor(len(survivors)) as pool:
        written = list(pool.map(rescue, survivors))
    assert written.count(True) == 1
    step, state = CheckpointManager(tmp_path, keep=2).load_latest()
    assert step == 13 and torch.equal(state["w"], torch.full((4,), 13.0))


@pytest.mark.parametrize("existing, rescued", [(13, 13), (13, 12)], ids=["same-step", "older-step"])
def test_a_rescue_never_rewrites_a_step_nor_goes_back(tmp_path: Path, existing: int, rescued: int) -> None:
    CheckpointManager(tmp_path, keep=2).save(existing, _state(existing))
    before = (tmp_path / "checkpoints" / f"step-{existing:08d}.pt").read_bytes()
    assert not CheckpointManager(tmp_path, is_writer=False).save_rescue(rescued, _state(99))
    assert (tmp_path / "checkpoints" / f"step-{existing:08d}.pt").read_bytes() == before
    assert CheckpointManager(tmp_path).committed_steps() == [existing]


def test_a_worker_of_a_replaced_generation_cannot_commit_a_rescue(tmp_path: Path) -> None:
    """Fencing: a partitioned worker of generation 1 wakes up after generation 2 has committed."""
    CheckpointManager(tmp_path, keep=2, generation=2).save(5, _state(5))
    stale = CheckpointManager(tmp_path, keep=2, is_writer=False, generation=1)
    assert not stale.save_rescue(9, _state(9))
    assert CheckpointManager(tmp_path).committed_steps() == [5]
    assert CheckpointManager(tmp_path, keep=2, is_writer=False, generation=2).save_rescue(9, _state(9))


def test_claims_of_pruned_steps_are_removed(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    assert CheckpointManager(tmp_path, is_writer=False).save_rescue(3, _state(3))
    for step in (4, 5, 6):
        m.save(step, _state(step))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000005.committed", "step-00000005.pt", "step-00000006.committed", "step-00000006.pt"]


@pytest.mark.parametrize("error, peer", [
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:65236"), True),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer"), True),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv"), True),
    (torch.distributed.DistNetworkError("failed to recv, got 0 bytes"), True),
    (RuntimeError("Application timeout caused pair closure"), True),  # Gloo, after the collective timeout
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x10 and 12x10)"), False),
    (ValueError("Connection closed by peer"), False),  # not from a collective
])
def test_peer_failures_are_told_from_the_ranks_own_errors(error: BaseException, peer: bool) -> None:
    assert is_peer_failure(error) is peer


def test_the_shipped_digits_split_is_sklearns() -> None:
    """digits.npz spares every trainer start the sklearn import; it must hold exactly sklearn's split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from ddp_trainer.workloads import digits

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    train, test = digits.build_datasets(None)
    for (xs, ys), (images, labels) in (((x_train, y_train), train.tensors), ((x_test, y_test), test.tensors)):
        assert torch.equal(images, torch.tensor(xs / 16.0, dtype=torch.float32))
        assert torch.equal(labels, torch.tensor(ys, dtype=torch.long))


def test_the_trainer_and_the_operator_tell_peer_failures_by_the_same_words() -> None:
    """The trainer rescues on these errors; the operator classifies the exit they cause by them."""
    contract = pytest.importorskip("ddpjob_operator.agent.contract", reason="the operator package is not on the path")
    from ddp_trainer.runtime import distributed

    assert distributed.PEER_FAILURE_PATTERN == contract.PEER_FAILURE_PATTERN
