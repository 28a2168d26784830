"""One in-process job for the trainer tests (issue 29): its rendezvous store and its trainers, each started as
the launcher starts one for a generation (the seat and generation in its environment, the generation published
in the store)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import torch.distributed as dist

from ddp_trainer.runtime.inprocess import GENERATION_KEY, NNODES_KEY
from trainer_harness import PY, StoreServer, base_env, kill_tree, start, tail, wait_for

UID = "uid-inprocess"


class Gang:
    """One job: its rendezvous store and the trainers of each generation, by (replica index, generation)."""

    def __init__(self, tmp_path: Path, name: str, args: list[str], store=None) -> None:
        """`store`: one with `port`, `endpoint` and `close()` (default a StoreServer of its own)."""
        self.dir, self.name = tmp_path, name
        self.ckpt = tmp_path / f"{name}-ckpt"
        self.store = store if store is not None else StoreServer()
        self.connect()
        self.procs: dict[tuple[int, int], subprocess.Popen] = {}
        self.extra_env: dict[str, str] = {}
        self.args = args  # the trainer's arguments in every generation

    def connect(self) -> None:
        """A client of the store (again, once a lost one was started anew on its port)."""
        self.client = dist.TCPStore("127.0.0.1", self.store.port, is_master=False)

    def publish(self, generation: int, nodes: int, fewest: int | None = None) -> None:
        """What the launcher of a generation's first new pod does (operator's launcher.Generations.publish):
        `--nnodes=fewest:nodes` (minReplicas:replicas; default nodes:nodes, no rank may be missing)."""
        self.client.set(NNODES_KEY.format(uid=UID, generation=generation), f"{fewest or nodes}:{nodes}")
        self.client.set(GENERATION_KEY.format(uid=UID), str(generation))

    def start(self, replica: int, generation: int, nodes: int, args: list[str] = (),
              command: list[str] | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
        env = base_env(self.ckpt, DDPJOB_INPROCESS="1", PET_RDZV_ENDPOINT=self.store.endpoint,
                       TORCHELASTIC_RUN_ID=f"{UID}-g{generation}", DDPJOB_GENERATION=str(generation),
                       DDPJOB_REPLICA_INDEX=str(replica), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       RANK=str(replica), WORLD_SIZE=str(nodes), DDPJOB_REJOIN_TIMEOUT_SECONDS="60",
                       **self.extra_env, **(env or {}))
        command = command or [PY, "-m", "ddp_trainer", *self.args, *args]
        proc = start(command, env, self.log(replica, generation))
        self.procs[replica, generation] = proc
        return proc

    def run_through_a_crash(self, seats: int, at_step: int, progress_url: str) -> None:
        """Seats 0..seats-1 of generation 1 (down to 1 rank), seat 1's trainer crashing (SIGSEGV) after step
        `at_step`; returns once the others finished. The workloads of this folder are importable, the reports go to
        `progress_url`."""
        here = str(Path(__file__).parent)
        self.extra_env = {"DDPJOB_PROGRESS_URL": progress_url,
                          "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
        self.publish(1, seats, fewest=1)
        crash = ["--fault-at-step", str(at_step), "--fault-rank", "1", "--fault-generation", "1",
                 "--fault-exit-code", str(128 + signal.SIGSEGV)]
        procs = {seat: self.start(seat, 1, seats, args=crash) for seat in range(seats)}
        assert self.wait(procs.pop(1)) == -signal.SIGSEGV, self.logs()
        for proc in procs.values():
            assert self.wait(proc, timeout=120) == 0, self.logs()

    def log(self, replica: int, generation: int) -> Path:
        return self.dir / f"{self.name}-r{replica}-g{generation}.log"

    def text(self, replica: int, generation: int) -> str:
        return self.log(replica, generation).read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {r}/g{g}\n{tail(self.log(r, g), 25)}" for r, g in self.procs)

    def wait(self, proc: subprocess.Popen, timeout: float = 60) -> int:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"trainer still running after {timeout} s:\n{self.logs()}") from None

    def saw(self, replica: int, generation: int, text: str, timeout: float = 60) -> None:
        wait_for(lambda: text in self.text(replica, generation), f"{text!r} in {replica}/g{generation}", timeout,
                 explain=self.logs)

    def close(self) -> None:
        for proc in self.procs.values():
            kill_tree(proc, signal.SIGKILL)
            proc.wait(10)
        self.store.close()
