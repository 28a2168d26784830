"""Workers forked from the local runner's zygote (processes.Zygote, agent.command("zygote")): a real
torchrun agent and trainer each, behaving like a worker started as a new interpreter."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ddpjob_operator.agent import command, contract
from ddpjob_operator.local.processes import LocalProcess, Zygote, kill_marked, marked_pids, marker_for

from ..support import wait_for
from .harness import SPAWNS_DETACHED_CHILD, alive, exit_code, wait_for_file

pytestmark = pytest.mark.slow  # one zygote importing torch, a torchrun agent per test

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
RUN = "zygote-test"
BASE_ENV = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}

REPORTS = """
import os, sys
import numpy
print("who", os.environ["WHO"], "random", numpy.random.random(),
      "optimizer imports done", "torch._dynamo" in sys.modules, flush=True)
sys.exit(int(os.environ["EXIT_WITH"]))
"""
SLEEPS = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
open(sys.argv[1], "w").write("up")
time.sleep(600)
"""

PRINTS_THEN_WAITS = """
import pathlib, sys, time
print("printed without a flush")
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    started = Zygote(python=sys.executable, env=BASE_ENV, marker=marker_for(RUN, "zygote"),
                     log_path=tmp_path_factory.mktemp("zygote") / "zygote.log")
    yield started
    kill_marked(marker_for(RUN))
    started.close()


def worker(tmp_path: Path, zygote: Zygote, name: str, body: str, *args: str, **env: str) -> LocalProcess:
    script = tmp_path / f"{name}.py"
    script.write_text(body)
    argv = [*command("worker", python=sys.executable), "--standalone", "--nnodes=1", "--nproc-per-node=1",
            "--shutdown-timeout=5", str(script), *args]
    process = LocalProcess(name=name, marker=marker_for(RUN, name, 0), argv=argv, zygote=zygote,
                           env={**BASE_ENV, contract.TERMINATION_LOG_ENV: str(tmp_path / f"{name}.termination-log"),
                                **env},
                           log_path=tmp_path / "logs" / f"{name}.log")
    process.start(NOW)
    return process


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_forked_workers_run_with_their_own_environment_log_and_exit_code(tmp_path, zygote):
    first = worker(tmp_path, zygote, "job-worker-0", REPORTS, WHO="zero", EXIT_WITH="0")
    second = worker(tmp_path, zygote, "job-worker-1", REPORTS, WHO="one", EXIT_WITH="3")
    assert first.popen is None and parent_of(first.pid) == zygote.popen.pid, "not forked from the zygote"
    assert exit_code(first, NOW) == 0 and exit_code(second, NOW) == 3
    logs = [p.log_path.read_text() for p in (first, second)]
    assert logs[0].startswith("---- job-worker-0:") and "who zero random" in logs[0]
    assert all("optimizer imports done True" in log for log in logs), "the zygote imported torch._dynamo for them"
    assert "who one random" in logs[1] and "who zero" not in logs[1]
    assert "exited with code 3" in (tmp_path / "job-worker-1.termination-log").read_text()
    draws = [log.split("random ")[1].split()[0] for log in logs]
    assert draws[0] != draws[1], "forked workers must not share numpy's random state"


def test_pythonunbuffered_holds_for_a_forked_worker_as_for_a_new_interpreter(tmp_path, zygote):
    go = tmp_path / "go"
    process = worker(tmp_path, zygote, "job-worker-6", PRINTS_THEN_WAITS, str(go), PYTHONUNBUFFERED="1")
    def printed() -> bool:
        if "printed without a flush" in process.log_path.read_text():
            return True
        assert process.poll(NOW) is None, "the worker ended and the line never reached the log"
        return False
    try:
        wait_for(printed, "the unflushed line in the worker's log", 120, interval=0.05,
                 explain=lambda: process.log_path.read_text()[-2000:])
    finally:
        go.write_text("go")
    assert exit_code(process, NOW) == 0


def test_kill_takes_a_forked_pods_whole_tree(tmp_path, zygote):
    pid_file = tmp_path / "child.pid"
    process = worker(tmp_path, zygote, "job-worker-2", SPAWNS_DETACHED_CHILD, str(pid_file), "stay")
    child = int(wait_for_file(pid_file))
    tree = marked_pids(process.marker, sessions=(process.pid,))
    assert {process.pid, child} <= set(tree) and len(tree) >= 3, "root, trainer and its detached child"
    process.kill()
    assert not any(alive(pid) for pid in tree)
    assert process.poll(NOW) == 137
    assert alive(zygote.popen.pid), "killing a pod leaves the zygote serving"


def test_terminate_reaches_a_forked_pods_agent(tmp_path, zygote):
    up = tmp_path / "up"
    process = worker(tmp_path, zygote, "job-worker-3", SLEEPS, str(up))
    wait_for_file(up)
    process.terminate(NOW)
    assert exit_code(process, NOW) == 143
    assert marked_pids(process.marker, sessions=(process.pid,)) == []


def test_a_zygote_that_cannot_import_leaves_workers_to_start_as_new_interpreters(tmp_path):
    broken = tmp_path / "broken"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('no torch in this image')\n")
    env = {**BASE_ENV, "PYTHONPATH": str(broken)}
    failed = Zygote(python=sys.executable, env=env, marker=marker_for(RUN, "broken-zygote"),
                    log_path=tmp_path / "zygote.log")
    try:
        process = worker(tmp_path, failed, "job-worker-4", REPORTS, PYTHONPATH=str(broken))
        assert process.popen is not None, "started as a new interpreter"
        assert exit_code(process, NOW) == 1
        assert "no torch in this image" in process.log_path.read_text()
        assert "no torch in this image" in (tmp_path / "zygote.log").read_text()
        again = worker(tmp_path, failed, "job-worker-5", REPORTS, PYTHONPATH=str(broken))
        assert failed.failed and again.popen is not None and exit_code(again, NOW) == 1, "not tried again"
    finally:
        kill_marked(marker_for(RUN, "broken-zygote"))
        failed.close()
