"""runtime.hf: the Hugging Face callback's stop on SIGTERM under real torchrun (two trainers, Gloo), and
which checkpoint a resume takes (a partial one, as a worker killed mid-save leaves it, never)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from trainer_harness import (PY, base_env, kill_tree, read_json, start, tail,  # noqa: E402
                             trainer_pids, wait_for)

from ddp_trainer.runtime import frameworks  # noqa: E402
from ddp_trainer.runtime import hf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "hf" / "train.py"


def test_resume_takes_the_newest_complete_checkpoint_and_says_so(tmp_path: Path, capsys) -> None:
    out = tmp_path / "hf"
    for step in (10, 20, 30):
        d = out / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 100)
        (d / "rng_state_1.pth").write_bytes(b"r")  # another rank's: not waited for
        if step != 20:  # 20: its writer died before the marker
            frameworks.commit(d, step=step, world_size=2, skip=hf.OTHER_RANKS_FILES)
    (out / "checkpoint-30" / "model.safetensors").write_bytes(b"x" * 10)  # 30: truncated after its commit
    assert hf.resume_from_checkpoint(str(out)) == str(out / "checkpoint-10")
    assert "resumed from checkpoint step=10 (saved at world_size=2, now 1)" in capsys.readouterr().err
    assert hf.resume_from_checkpoint(str(tmp_path / "none")) is None


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_step_with_a_complete_checkpoint_and_exit_143(tmp_path: Path) -> None:
    ck, log = tmp_path / "ck", tmp_path / "torchrun.log"
    env = base_env(ck, HF_HUB_OFFLINE="1", DDPJOB_CHECKPOINT_INTERVAL_STEPS="0")
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
    assert hf.resume_from_checkpoint(str(ck / "test" / "hf")) == str(ck / "test" / "hf" / f"checkpoint-{step}")
    assert frameworks.read_marker(ck / "test" / "hf" / f"checkpoint-{step}")["world_size"] == 2
    assert not (ck / "result.json").exists()  # stopped, not finished
