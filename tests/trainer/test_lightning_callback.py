"""runtime.lightning: the Lightning callback's stop on SIGTERM under real torchrun (two trainers, Gloo), which
checkpoint a resume takes (a partial one, as a worker killed mid-save leaves it, never), and issue 23's
checkpoint promises with Lightning's own saves: a replaced generation commits and prunes nothing (4, 5), a
full volume exits 75 (6). The in-process runs fit the example's tiny classifier for a few steps."""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import signal
from pathlib import Path

import pytest

pytest.importorskip("lightning")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.fabric.plugins import TorchCheckpointIO  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from trainer_harness import (job_dir, PY, base_env, kill_tree, read_json, recorded, start, tail,  # noqa: E402
                             trainer_pids, trap_exit, wait_for)

from ddp_trainer.runtime import ResumableDistributedSampler  # noqa: E402

from ddp_trainer.runtime import frameworks  # noqa: E402
from ddp_trainer.runtime import lightning  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "lightning" / "train.py"


def _example():
    spec = importlib.util.spec_from_file_location("lightning_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()  # its Tiny classifier and synthetic Points


def _fit(directory: Path, max_steps: int, *, ckpt_path: str | None = None, plugins: tuple = ()) -> None:
    """A single-process fit of the example's model: DDPJob's callback saves every 2 steps into `directory`,
    keeping 2."""
    data = EXAMPLE.Points(64, seed=1)
    loader = DataLoader(data, batch_size=4, sampler=ResumableDistributedSampler(len(data), 0, 1, seed=0))
    trainer = L.Trainer(max_steps=max_steps, callbacks=[lightning.DDPJobCallback(every_steps=2, keep=2,
                                                                                 directory=directory)],
                        plugins=list(plugins), use_distributed_sampler=False, enable_checkpointing=False,
                        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        devices=1)
    trainer.fit(EXAMPLE.Tiny(1e-2, 1, max_steps, 0.0), loader, ckpt_path=ckpt_path)


def _complete(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("step-*.ckpt") if frameworks.read_marker(p) is not None)


def test_resume_takes_the_newest_complete_checkpoint_and_says_so(tmp_path: Path, capsys, caplog) -> None:
    out = tmp_path / "lightning"
    out.mkdir()
    for step in (10, 20, 30, 40):
        path = out / f"step-{step:08d}.ckpt"
        if step == 40:  # committed, but nothing torch.load reads
            path.write_bytes(b"x" * 100)
        else:
            torch.save({"step": step, "pad": b"x" * 100}, path)
        if step != 20:  # 20: its writer died before the marker
            frameworks.commit(path, step=step, world_size=2)
    (out / "step-00000030.ckpt").write_bytes(b"x" * 10)  # 30: truncated after its commit
    assert lightning.resume_from_checkpoint(out) == str(out / "step-00000010.ckpt")
    assert f"skipping checkpoint {out / 'step-00000040.ckpt'}: the framework cannot load it (not a torch.save " \
        "archive)" in caplog.text
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
    saved = ck / "local.test" / "lightning" / f"step-{step:08d}.ckpt"
    assert lightning.resume_from_checkpoint(ck / "local.test" / "lightning") == str(saved)
    assert frameworks.read_marker(saved)["world_size"] == 2
    assert not (job_dir(ck) / "result.json").exists()  # stopped, not finished


# ---- issue 23, items 4-6, with Lightning's own saves ----------------------------------------------------

def test_5_a_replaced_generation_commits_and_prunes_nothing(tmp_path, monkeypatch):
    """Generation 2 started (and resumed from step 4); a trainer of generation 1 left behind goes on saving.
    Its steps 6 and 8 used to be committed, 8 became generation 2's next resume point, and its pruning (keep
    2) removed step 2 and then 4, the newer generation's own resume point."""
    ck = tmp_path / "lightning"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)  # (Lightning would take the process for torchrun's)
    monkeypatch.setenv("DDPJOB_GENERATION", "1")
    _fit(ck, 4)
    monkeypatch.setenv("DDPJOB_GENERATION", "2")
    assert lightning.resume_from_checkpoint(ck) == str(ck / "step-00000004.ckpt")  # generation 2's rank 0 starts
    monkeypatch.setenv("DDPJOB_GENERATION", "1")
    _fit(ck, 8, ckpt_path=str(ck / "step-00000004.ckpt"))
    monkeypatch.setenv("DDPJOB_GENERATION", "2")
    assert lightning.resume_from_checkpoint(ck) == str(ck / "step-00000004.ckpt")  # the old code: step 8
    assert _complete(ck) == ["step-00000002.ckpt", "step-00000004.ckpt"]


class FullVolumeAt(TorchCheckpointIO):
    """Lightning's own checkpoint writer, on a volume that is full when `step`'s checkpoint is written."""

    def __init__(self, step: int) -> None:
        self.name = f"step-{step:08d}.ckpt"

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if Path(path).name == self.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        super().save_checkpoint(checkpoint, path, storage_options)


def test_6_a_full_volume_while_lightning_saves_exits_75_naming_the_directory(tmp_path, monkeypatch):
    ck = tmp_path / "lightning"
    error_file = trap_exit(monkeypatch, tmp_path)
    with pytest.raises(SystemExit) as exited:
        _fit(ck, 6, plugins=(FullVolumeAt(4),))  # the old code: the OSError left fit(), exit 1 (the script's bug)
    assert exited.value.code == 75
    assert recorded(error_file).startswith(
        f"checkpoint volume full: {ck}: No space left on device while writing step-00000004.ckpt: "), \
        recorded(error_file)
    assert _complete(ck) == ["step-00000002.ckpt"]
    assert lightning.resume_from_checkpoint(ck) == str(ck / "step-00000002.ckpt")
