"""The Hugging Face and Lightning callbacks report each pod's own time per step (`step_seconds`, issue 22):
what the operator's straggler detection reads, as the bundled trainer and the runtime library report it.
Real torchrun, two trainers, Gloo; the examples' own scripts."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from trainer_harness import job_dir, PY, base_env, kill_tree, read_json, start, tail, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("framework, module", [("hf", "transformers"), ("lightning", "lightning")])
def test_the_callback_reports_its_own_time_per_step(tmp_path: Path, framework: str, module: str) -> None:
    pytest.importorskip(module)
    ck, log = tmp_path / "ck", tmp_path / "torchrun.log"
    env = base_env(ck, HF_HUB_OFFLINE="1", DDPJOB_CHECKPOINT_INTERVAL_STEPS="0")
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "--monitor-interval=0.2", str(ROOT / "examples" / framework / "train.py"), "--max-steps", "40"]
    proc = start(cmd, env, log)
    try:
        report = wait_for(lambda: (lambda r: r if isinstance(r.get("step_seconds"), float) else None)(
            read_json(job_dir(ck) / "progress.json") or {}), "a report with step_seconds", 300, explain=lambda: tail(log))
        proc.wait(300)
    finally:
        kill_tree(proc, signal.SIGKILL)
    assert 0 < report["step_seconds"] < 60, report
