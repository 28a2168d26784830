"""runtime.lightning: the Lightning callback's stop on SIGTERM under real torchrun (two trainers, Gloo), and
which checkpoint a resume takes (a partial one, as a worker killed mid-save leaves it, never)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from trainer_harness import (PY, base_env, kill_tree, read_json, start, tail,  # noqa: E402
                             trainer_pids, wait_for)

from ddp_trainer.runtime import frameworks  # noqa: E402
from ddp_trainer.runtime import lightning  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "lightning" / "train.py"


def test_resume_takes_the_newest_complete_checkpoint_and_says_so(tmp_path: Path, capsys) -> None:
    out = tmp_path / "lightning"
    out.mkdir()
    for step in (10, 20, 30):
        path = out / f"step-{step:08d}.ckpt"
        path.write_bytes(b"x" * 100)
        if step != 20:  # 20: its writer died before the marker
            frameworks.commit(path, step=step, world_size=2)
    (out / "step-00000030.ckpt").write_bytes(b"x" * 10)  # 30: truncated after its commit
    assert lightning.resume_from_checkpoint(out) == str(out / "step-00000010.ckpt")
    assert "resumed from checkpoint step=10 (saved at world_size=2, now 1)" in capsys.readouterr().err
    assert lightning.resume_from_checkpoint(tmp_path / "none") is None


def test_trainer_kwargs_follow_this_generations_world(monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert lightning.trainer_kwargs("cpu") == {"accelerator": "cpu", "devices": 2, "num_nodes": 3, "strategy": "ddp"}


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_step_with_a_complete_checkpoint_and_exit_143(tmp_path: Path) -> None:
    ck, log = tmp_path / "ck", tmp_path / "torchrun.log"
    env = base_env(ck, DDPJOB_CHECKPOINT_INTERVAL_STEPS="0")
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "--monitor-interval=0.2", str(SCRIPT), "--max-steps", "500", "--step-sleep", "0.05"]
    proc = start(cmd, env, log)
    try:
        wait_for(lambda: ((read_json(ck / "progress.json") or {}).get("step") or 0) >= 5, "step 5", 180,
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
    saved = ck / "test" / "lightning" / f"step-{step:08d}.ckpt"
    assert lightning.resume_from_checkpoint(ck / "test" / "lightning") == str(saved)
    assert frameworks.read_marker(saved)["world_size"] == 2
    assert not (ck / "result.json").exists()  # stopped, not finished
