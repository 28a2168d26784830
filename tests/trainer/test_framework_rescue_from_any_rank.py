"""Issue 32: whichever rank dies between periodic checkpoints, the HF and Lightning examples resume from the
survivor's rescue checkpoint, and the resumed run trains, with dropout on, to the same per-step loss (HF's
logged loss included), learning rate and samples as an undisturbed run, bit for bit.

Before: a rescue written by rank 1 after rank 0's death held no weights (transformers 5's `save_pretrained`
writes only on rank 0 of a process group), was committed anyway, and the next generation failed with
`ValueError: Can't find a valid checkpoint`; with dropout the losses after any resume differed (the rescue
held only the survivor's random state). Real torchrun, two trainers, Gloo; the examples' own scripts.

One job loses each rank in turn (rank 0 between the checkpoints of 10 and 20, then, in the run that resumed
from that rescue, rank 1 between those of 20 and 30), so each rank's rescue is resumed once; the undisturbed
run trains beside the first of them (they share nothing): four torchrun runs in three waits, not five in five.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from trainer_harness import job_dir, PY, base_env, kill_tree, read_json, start, tail, wait_for, worker_ranks

ROOT = Path(__file__).resolve().parents[2]
INTERVAL, MAX_STEPS = 10, 30
KILLS = ((0, 13), (1, 23))  # (victim's rank, the step from which it is killed): 3+ steps past a checkpoint, 6 before one
STEP = re.compile(r"^step=(\d+) epoch=\d+ loss=(\S+) lr=(\S+) samples=(\[.*\])$", re.MULTILINE)
MODULES = {"hf": ("transformers", "accelerate"), "lightning": ("lightning",)}

pytestmark = pytest.mark.slow


def _start(framework: str, ck: Path, log: Path) -> subprocess.Popen:
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "--monitor-interval=0.2", str(ROOT / "examples" / framework / "train.py"), "--max-steps", str(MAX_STEPS),
           "--batch-size", "8", "--warmup-steps", "4", "--dropout", "0.1", "--step-sleep", "0.1"]
    return start(cmd, base_env(ck, HF_HUB_OFFLINE="1", DDPJOB_CHECKPOINT_INTERVAL_STEPS=str(INTERVAL)), log)


def _finishes(proc: subprocess.Popen, log: Path) -> None:
    try:
        assert proc.wait(240) == 0, tail(log)
    finally:
        kill_tree(proc, signal.SIGKILL)


def _steps(log: Path) -> dict[int, tuple[str, str, str]]:
    """Rank 0's (loss, learning rate, samples) per step; a step trained again overwrites the first time."""
    return {int(m.group(1)): m.groups()[1:] for m in STEP.finditer(log.read_text(errors="replace"))}


def _resumed_from(log: Path, step: int) -> None:
    text = log.read_text(errors="replace")
    assert f"resumed from checkpoint step={step} (saved at world_size=2, now 2)" in text, tail(log)


def _kill_and_rescue(framework: str, ck: Path, log: Path, victim: int, kill_from: int) -> int:
    """Run the job on `ck` until step `kill_from`, SIGKILL rank `victim`; returns the step the survivor's rescue
    checkpoint (committed, marked as the survivor's) holds, between the periodic checkpoints around the kill."""
    proc = _start(framework, ck, log)
    try:
        wait_for(lambda: proc.poll() is not None
                 or ((read_json(job_dir(ck) / "progress.json") or {}).get("step") or 0) >= kill_from,
                 f"step {kill_from}", 180, explain=lambda: tail(log))
        assert proc.poll() is None, f"the run ended before step {kill_from}: {tail(log)}"  # a resume that failed
        os.kill(worker_ranks(proc.pid)[victim], signal.SIGKILL)
        proc.wait(120)
    finally:
        kill_tree(proc, signal.SIGKILL)
    rescued = re.findall(r"rescue checkpoint: rank (\d+) saved step (\d+)", log.read_text(errors="replace"))
    assert [r for r, _ in rescued] == [str(1 - victim)], tail(log)  # the survivor, whichever it is
    step = int(rescued[0][1])
    last_periodic = kill_from // INTERVAL * INTERVAL
    assert last_periodic < step < last_periodic + INTERVAL, tail(log)
    marker = json.loads((ck / "local.test" / framework / (f"checkpoint-{step}/ddpjob.committed.json" if framework == "hf"
                                                     else f"step-{step:08d}.ckpt.ddpjob.json")).read_text())
    assert marker["rescued_by_rank"] == 1 - victim
    return step


@pytest.mark.parametrize("framework", sorted(MODULES))
def test_a_rescue_by_either_survivor_resumes_bit_identically_with_dropout(tmp_path: Path, framework: str) -> None:
    for module in MODULES[framework]:
        pytest.importorskip(module)
    ck, reference_log = tmp_path / "ck", tmp_path / "reference.log"
    logs = [tmp_path / f"killed{victim}.log" for victim, _ in KILLS] + [tmp_path / "resumed.log"]
    reference_run = _start(framework, tmp_path / "reference", reference_log)
    try:
        rescued = [_kill_and_rescue(framework, ck, logs[0], *KILLS[0])]
    except BaseException:
        kill_tree(reference_run, signal.SIGKILL)
        raise
    _finishes(reference_run, reference_log)
    reference = _steps(reference_log)
    assert sorted(reference) == list(range(1, MAX_STEPS + 1)), tail(reference_log)

    rescued.append(_kill_and_rescue(framework, ck, logs[1], *KILLS[1]))
    _resumed_from(logs[1], rescued[0])
    _finishes(_start(framework, ck, logs[2]), logs[2])
    _resumed_from(logs[2], rescued[1])
    got = {step: line for log in logs for step, line in _steps(log).items()}  # a later run's line wins
    # Every step is there (a rescued step's line may be missing: its logging collective is where the peer's
    # death surfaced), and each is the undisturbed run's: same loss with dropout, same lr, same samples.
    assert set(range(1, MAX_STEPS + 1)) - set(got) <= set(rescued), (rescued, tail(logs[-1]))
    assert got == {s: reference[s] for s in got}, (rescued, tail(logs[-1]))
