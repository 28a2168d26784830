"""Review finding 6 (issue 11): agreeing on a stop must not stall the GPU. Needs CUDA (skipped otherwise).

The 0.1 trainer built its per-step stop flag on the training device: a host-to-device copy and an
`.item()` every step, i.e. a full device synchronisation. Now the flag is a CPU tensor on a Gloo
group. Two ranks share one GPU here (Gloo does not mind), and every `should_stop()` runs under
`torch.cuda.set_sync_debug_mode("error")`, which raises on any synchronising CUDA call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer_harness import PY, base_env, run, tail

pytestmark = [pytest.mark.slow, pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SCRIPT = """
import torch, torch.distributed as dist
from ddp_trainer.runtime import Job, JobEnv, StopRequest, init_process_group
env = JobEnv.from_env()
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
init_process_group(env, device, backend="nccl" if env.world_size == 1 else "gloo")
job = Job(env, device, StopRequest())
x = torch.randn(2048, 2048, device=device)
stopped_at = None
torch.cuda.set_sync_debug_mode("error")
for step in range(1, 41):
    x = torch.tanh(x @ x)  # queued GPU work the stop check must not wait for
    if env.rank == 1 and step == 10:
        job.stop.requested = True  # what the SIGTERM handler does
    if job.should_stop():
        stopped_at = step
        break
torch.cuda.set_sync_debug_mode(0)
print(f"rank {env.rank} stopped at {stopped_at}", flush=True)
job.close()
dist.destroy_process_group()
"""


def test_6_agreeing_on_a_stop_never_synchronises_the_device(tmp_path: Path) -> None:
    script = tmp_path / "stop_on_gpu.py"
    script.write_text(SCRIPT)
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    assert run(cmd, base_env(), tmp_path / "log", 120) == 0, tail(tmp_path / "log")
    log = (tmp_path / "log").read_text()
    assert "rank 0 stopped at 11" in log and "rank 1 stopped at 11" in log, tail(tmp_path / "log")


GPU_TRAINER = """
import sys
print("torch preloaded:", "torch" in sys.modules, flush=True)
import torch, torch.distributed as dist
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(4, device="cuda")
dist.all_reduce(x)
print("nccl all_reduce:", x.sum().item(), flush=True)
dist.destroy_process_group()
"""


def test_on_a_gpu_node_the_launcher_starts_the_trainer_as_a_new_interpreter(tmp_path: Path) -> None:
    """Elsewhere the launcher forks the trainer from torchrun's agent (torch already imported), but a
    forked child cannot use CUDA once the agent has touched it: with a GPU visible, the trainer must
    be a fresh interpreter and initialise CUDA and NCCL normally."""
    agent = pytest.importorskip("ddpjob_operator.agent", reason="the operator package is not on the path")
    script = tmp_path / "gpu_trainer.py"
    script.write_text(GPU_TRAINER)
    cmd = [*agent.command("worker", python=PY), "--standalone", "--nproc-per-node=1", str(script)]
    env = {**base_env(), agent.contract.TERMINATION_LOG_ENV: str(tmp_path / "termination-log")}
    assert run(cmd, env, tmp_path / "log", 300) == 0, tail(tmp_path / "log")
    log = (tmp_path / "log").read_text()
    assert "torch preloaded: False" in log and "nccl all_reduce: 4.0" in log, tail(tmp_path / "log")


# Two ranks on one GPU: NCCL (>= 2.5) refuses two ranks of one host on one device ("Duplicate GPU
# detected", ncclInvalidUsage, by host hash and bus id). Each rank gets its own NCCL_HOSTID, so NCCL sees
# two hosts, each with its GPU, joined by its network transport (sockets over loopback); both use cuda:0.
ONE_GPU_RANK = """
import os, runpy, sys
os.environ["NCCL_HOSTID"] = "ddpjob-test-host-" + os.environ["LOCAL_RANK"]
os.environ["LOCAL_RANK"] = "0"  # the trainer's device is cuda:LOCAL_RANK: the one GPU for both
sys.argv = ["ddp_trainer", *sys.argv[1:]]
runpy.run_module("ddp_trainer", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("gpus", [
    pytest.param(2, marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")),
    1,
], ids=["a GPU per rank", "two ranks on one GPU"])
def test_a_hung_peer_fails_the_nccl_job_within_the_steady_timeout(tmp_path: Path, gpus: int) -> None:
    """NCCL waits 10 minutes for a peer by default. A frozen rank (SIGSTOP) must end the job once the
    steady collective timeout passed: the survivor's NCCL watchdog aborts its collective
    (TORCH_NCCL_ASYNC_ERROR_HANDLING, as the operator sets it) and the agent ends the run."""
    from trainer_harness import torchrun_cmd

    ckpt = tmp_path / "ckpt"
    args = ["--workload", "digits", "--epochs", "50", "--batch-size", "16", "--device", "cuda", "--backend", "nccl",
            "--log-every", "10", "--dist-steady-timeout", "10", "--fault-hang-at-step", "30", "--fault-rank", "1"]
    cmd = torchrun_cmd(args, nproc=2)
    cmd.insert(3, "--shutdown-timeout=2")
    env = base_env(ckpt, TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    if gpus == 1:
        wrapper = tmp_path / "one_gpu_rank.py"
        wrapper.write_text(ONE_GPU_RANK)
        at = cmd.index("ddp_trainer")
        assert cmd[at - 1] == "-m"
        cmd[at - 1:at + 1] = [str(wrapper)]
        env.update(NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
    log = tmp_path / "log"
    code = run(cmd, env, log, 150)
    text = log.read_text()
    if gpus == 1 and "Duplicate GPU detected" in text:
        pytest.skip("this NCCL refuses two ranks on one GPU even as two hosts (a NCCL_HOSTID per rank): "
                    "'Duplicate GPU detected'; the variant with a GPU per rank needs 2 GPUs")
    # Training ran (NCCL all-reduces on both ranks) before the hang, then the job ended instead of waiting.
    assert "step=20 epoch=" in text, tail(log, 80)
    assert code != 0 and "hanging (SIGSTOP)" in text, tail(log, 80)
