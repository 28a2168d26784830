"""Issue 32, item 1: a framework whose world size is not torchrun's trains replicas, not one job (HF on CPU
without `use_cpu=True`: each process alone on all the data, all writing one checkpoint directory, and the job
Succeeded). The callbacks check it when training starts and stop every process at once, exit 1, with a message
naming the fix, also in torchrun's error file (what the pod's termination message and the job's status quote).
Lightning without `trainer_kwargs()` likewise. Real torchrun, two processes, Gloo."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from trainer_harness import PY, base_env, failures, kill_tree, start, tail

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPT = SCRIPTS / "hf_without_use_cpu.py"


def _torchrun(script: Path, tmp_path: Path) -> str:
    log = tmp_path / "torchrun.log"
    proc = start([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
                  "--monitor-interval=0.2", str(script), str(tmp_path / "out")],
                 base_env(tmp_path / "ck", HF_HUB_OFFLINE="1"), log)
    try:
        assert proc.wait(120) != 0, tail(log)
    finally:
        kill_tree(proc, signal.SIGKILL)
    return log.read_text(errors="replace")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="HF without use_cpu is right on a GPU machine")
def test_hf_without_use_cpu_on_cpu_stops_every_rank_at_once_naming_use_cpu(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    log = tmp_path / "torchrun.log"
    text = _torchrun(SCRIPT, tmp_path)
    expected = ("DDPJob: the Hugging Face Trainer runs at world size 1, but torchrun started 2 processes "
                "(WORLD_SIZE=2): each process would train alone on all the data. Fix: TrainingArguments(..., "
                "use_cpu=True)")
    assert text.count(expected) >= 1, tail(log)
    failed = failures(log)
    assert failed and all(code == 1 and message and message.startswith(expected) for code, message in failed.values()), \
        (failed, tail(log))
    assert not re.search(r"^step|'loss'", text, re.MULTILINE), tail(log)  # no step trained
    assert not list((tmp_path / "ck").rglob("checkpoint-*"))  # nothing written
    assert "ddp_trainer/runtime" not in text, tail(log)  # a message, not a trainer's traceback (torchrun's own stays)


def test_lightning_without_trainer_kwargs_stops_naming_them(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    text = _torchrun(SCRIPTS / "lightning_without_trainer_kwargs.py", tmp_path)
    expected = ("DDPJob: the Lightning Trainer runs at world size 1, but torchrun started 2 processes (WORLD_SIZE=2): "
                "each process would train alone on all the data. Fix: L.Trainer(**ddpjob.trainer_kwargs(), ...)")
    assert expected in text, text[-3000:]
    assert not list((tmp_path / "ck").rglob("step-*.ckpt"))
