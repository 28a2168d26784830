"""In-process recovery on NCCL (issue 29). Needs CUDA (skipped otherwise).

A rank dies; the survivor's NCCL group is aborted (its collective would otherwise wait for the dead peer until
the steady timeout, and torch's watchdog ends the process unless TORCH_NCCL_ASYNC_ERROR_HANDLING is 2), it joins
the next generation's NCCL group in the same process and sends the state to the replacement by NCCL broadcast.
Two ranks on one GPU where NCCL allows it (a NCCL_HOSTID per rank); a GPU per rank with two GPUs."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from inprocess_gang import Gang

pytestmark = [pytest.mark.slow, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS, KILL_AT = 40, 25  # the kill well past the first steps, where the steady timeout applies
ARGS = ["--workload", "digits", "--batch-size", "16", "--max-steps", str(STEPS), "--checkpoint-every", "10",
        "--log-every", "5", "--epochs", "5", "--device", "cuda", "--backend", "nccl", "--dist-steady-timeout", "10"]
FAULT = ["--fault-at-step", str(KILL_AT), "--fault-rank", "1", "--fault-exit-code", "139", "--fault-generation", "1"]


def rank_env(replica: int, gpus: int) -> dict[str, str]:
    if gpus == 2:
        return {"CUDA_VISIBLE_DEVICES": str(replica)}
    # One GPU for both: NCCL takes two host ids for two hosts (it refuses two ranks of one host on one GPU).
    return {"NCCL_HOSTID": f"ddpjob-test-host-{replica}", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


@pytest.mark.parametrize("gpus", [
    pytest.param(2, marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")),
    1,
], ids=["a GPU per rank", "two ranks on one GPU"])
def test_the_nccl_survivor_rebuilds_its_group_in_process_and_feeds_the_replacement(tmp_path: Path, gpus: int) -> None:
    gang = Gang(tmp_path, "nccl", ARGS)
    try:
        gang.publish(1, 2)
        survivor = gang.start(0, 1, 2, FAULT, env=rank_env(0, gpus))
        lost = gang.start(1, 1, 2, FAULT, env=rank_env(1, gpus))
        lost_code = gang.wait(lost, timeout=240)
        if gpus == 1 and "Duplicate GPU detected" in gang.logs():
            pytest.skip("this NCCL refuses two ranks on one GPU even as two hosts (a NCCL_HOSTID per rank): "
                        "'Duplicate GPU detected'; the variant with a GPU per rank needs 2 GPUs")
        assert lost_code == -signal.SIGSEGV, gang.logs()
        gang.saw(0, 1, f"at step {KILL_AT}: a peer failed in generation 1", timeout=120)
        assert survivor.poll() is None, gang.logs()  # the NCCL error was raised in it, not the end of it
        gang.publish(2, 2)
        replacement = gang.start(1, 2, 2, env=rank_env(1, gpus))
        assert gang.wait(survivor, timeout=240) == 0, gang.logs()
        assert gang.wait(replacement, timeout=240) == 0, gang.logs()
        assert "recovered in process: generation 1 -> 2, rank 0 of 2, state kept" in gang.text(0, 1), gang.logs()
        text = gang.text(1, 2)
        assert f"resumed from peer rank 0 by broadcast step={KILL_AT}" in text, gang.logs()
        assert "resumed from checkpoint" not in text, gang.logs()
        assert f"step={STEPS} epoch=" in gang.text(0, 1), gang.logs()  # trained on to the end in the same process
    finally:
        gang.close()
