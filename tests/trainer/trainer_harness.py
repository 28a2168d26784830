"""Helpers to run the trainer the way the operator does: real torchrun agents, Gloo, CPU, 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # this tier is no package: reach tests/support.py
    sys.path.append(str(Path(__file__).resolve().parents[2]))
from tests.support import read_json, wait_for  # noqa: E402,F401 - the trainer tests import them from here
from ddp_trainer.runtime.contract import job_root  # noqa: E402

JOB = {"DDPJOB_NAME": "test", "DDPJOB_NAMESPACE": "local"}  # the job base_env runs

PY = sys.executable

# A standalone rendezvous store, as the operator runs it (a dedicated pod / local process).
STORE_CODE = """
import sys, time, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
print("store ready", store.port, flush=True)  # the port the kernel picked
while True:
    time.sleep(3600)
"""


def base_env(checkpoint_dir: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in [k for k in env if k.startswith(("PET_", "TORCHELASTIC_", "DDPJOB_"))]:
        del env[k]
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **JOB)
    if checkpoint_dir is not None:
        env["DDPJOB_CHECKPOINT_DIR"] = str(checkpoint_dir)
    env.update(extra)
    return env


def job_dir(checkpoint_dir: Path) -> Path:
    """Where base_env's job keeps its own files under `checkpoint_dir` (progress.json, result.json): local.test."""
    return job_root(checkpoint_dir, JOB)


class StoreServer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([PY, "-c", STORE_CODE], stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        line = self.proc.stdout.readline()  # blocks until the server is listening
        assert line.startswith("store ready "), f"store failed to start: {line!r}"
        self.port = int(line.split()[-1])

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        kill_tree(self.proc, signal.SIGKILL)
        self.proc.wait(10)


def torchrun_cmd(trainer_args: list[str], *, nproc: int = 1, nnodes: str = "1", endpoint: str | None = None,
                 run_id: str = "test", max_restarts: int = 0, local_addr: str | None = None,
                 rdzv_conf: str = "") -> list[str]:
    """The launch contract's command line; `endpoint=None` uses --standalone (single node); `rdzv_conf`: more
    c10d rendezvous settings (`KEY=VALUE,...`, e.g. the keep-alive a DDPJob's spec.rendezvous sets)."""
    cmd = [PY, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
           "--monitor-interval=0.2"]
    if endpoint is None:
        cmd += ["--standalone"]
    else:
        cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
                "--rdzv-conf=is_host=false,join_timeout=60,last_call_timeout=1,read_timeout=30"
                + (f",{rdzv_conf}" if rdzv_conf else "")]
        if local_addr:  # the node's address in the rendezvous; rank 0's agent serves the workers' store there
            cmd += [f"--local-addr={local_addr}"]
    return cmd + ["-m", "ddp_trainer", *trainer_args]


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A new session per agent, so a test can kill one "node" (agent + workers) as a whole."""
    return subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def run(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> int:
    proc = start(cmd, env, log)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc, signal.SIGKILL)
        raise AssertionError(f"timed out after {timeout}s:\n{tail(log)}")


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def trainer_pids(agent: int) -> list[int]:
    """The agent's trainer processes: its children running the script."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if ppid == agent and b"torch.distributed.run" not in cmdline:
            found.append(int(stat.parent.name))
    return found


def kill_tree(proc: subprocess.Popen, sig: int) -> None:
    """Signal an agent's whole tree. torchrun starts every worker in its own session
    (start_new_session=True), so killing the agent's process group alone orphans the workers."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        for kill in (os.killpg, os.kill):  # a worker's group is its own pid; a plain child is in ours
            try:
                kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else "<no log>"


def steps_dir(checkpoint_dir: Path, job: str = "test") -> Path:
    """Where a job's checkpoints are: a directory of its own on the volume, `<namespace>.<name>` (base_env's job
    is "test" in namespace "local")."""
    return checkpoint_dir / f"local.{job}" / "checkpoints"


def committed_steps(checkpoint_dir: Path) -> list[int]:
    d = steps_dir(checkpoint_dir)
    return sorted((int(p.stem.split("-")[1]) for p in d.glob("step-*.committed")), reverse=True) if d.is_dir() else []


def trap_exit(monkeypatch, tmp_path: Path) -> Path:
    """For code that ends the trainer with the runtime's `exit_process(code)` (no interpreter teardown: it
    would end pytest), run in-process: it raises SystemExit(code) instead. Returns torchrun's error file
    ($TORCHELASTIC_ERROR_FILE), where `CheckpointVolumeError.record()` puts the message; `recorded()` reads it."""
    from ddp_trainer.runtime import frameworks

    def exit_process(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(frameworks, "exit_process", exit_process)  # the callbacks' failure paths call it there
    error_file = tmp_path / "torchelastic-error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    return error_file


def recorded(error_file: Path) -> str:
    """The message a trainer handed torchrun (what the pod's termination message quotes)."""
    return read_json(error_file)["message"]["message"]


def worker_ranks(agent: int) -> dict[int, int]:
    """The agent's trainer processes by global rank (the RANK torchrun put into each one's environment)."""
    ranks = {}
    for pid in trainer_pids(agent):
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"RANK="):
                ranks[int(entry[5:])] = pid
    return ranks


def process_state(pid: int) -> str | None:
    """`pid`'s state letter in /proc (R, S, D; T: stopped, as by SIGSTOP; Z: exited, not yet reaped), None
    once it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


# One worker in the summary torchrun prints when a worker failed (torch.distributed.elastic's
# _FAILURE_FORMAT_TEMPLATE): its rank, exit code (negative: the signal that killed it) and error file.
FAILURE = re.compile(r"rank\s*: (\d+) \(local_rank: \d+\)\s+exitcode\s*: (-?\d+) \(pid: \d+\)[^\n]*\n"
                     r"\s*error_file: ([^\n]*)")


def failures(log: Path) -> dict[int, tuple[int, str | None]]:
    """From an agent's log: (exit code, message) of each failed worker, by global rank; the message is what
    the worker wrote to its TORCHELASTIC_ERROR_FILE (what the pod's termination message quotes), None if
    nothing."""
    found = {}
    for rank, code, error_file in FAILURE.findall(log.read_text(errors="replace")):
        path = Path(error_file.strip())
        found[int(rank)] = (int(code), recorded(path) if path.is_file() else None)
    return found
