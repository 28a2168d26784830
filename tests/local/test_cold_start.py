"""`ddpjob run --local --cold-start` (RunOptions.cold_start): every worker starts as its pod's container does, a
new `python -c <agent>` interpreter with the pod's argv and env and nothing preloaded, not a fork of the run's
zygote; with `gpu-node` each trainer is a new interpreter too, as the agent starts it where it sees a GPU.
A SIGKILLed worker is recovered on that path as on the zygote's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ddpjob_operator import validation
from ddpjob_operator.agent import command, contract
from ddpjob_operator.local.processes import MARKER_ENV, marked_pids
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import COLD_GPU_NODE, KILL, FaultInjection, RunOptions

from .harness import TimelineView
from .test_semantics import Outcome, expect, expect_completed, expect_resumed, spec

pytestmark = pytest.mark.slow


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


class ProcessRecordingRunner(LocalRunner):
    """At every pass, for each running worker pod: its root's parent, argv and start-time environment, and the
    argv of every other process of the pod (its trainers)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.roots: dict[int, tuple[str, int, list[str], dict[str, str]]] = {}
        self.trainers: dict[int, tuple[str, list[str]]] = {}

    def reconcile(self):
        decision = super().reconcile()
        for name, w in self.workers.items():
            if not w.process.started or w.process.poll(self.clock()) is not None:
                continue
            root = w.process.pid
            try:
                if root not in self.roots:
                    self.roots[root] = (name, _parent(root), _argv(root), _environ(root))
                for pid in marked_pids(w.process.marker, sessions=(root,)):
                    if pid != root and pid not in self.trainers:
                        self.trainers[pid] = (name, _argv(pid))
            except OSError:
                pass  # it ended meanwhile
        return decision


def test_cold_start_starts_every_worker_as_its_pod_does_and_recovers_a_killed_worker(tmp_path):
    job = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                "metadata": {"name": "cold"}, "spec": spec(failurePolicy={"restartScope": "Pod"})})
    runner = ProcessRecordingRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob", cold_start=COLD_GPU_NODE,
                                                    faults=(FaultInjection(index=1, at_step=43, kind=KILL),)),
                                    TimelineView(timeout=240))
    try:
        runner.run()
    finally:
        assert marked_pids(runner.run_marker) == [], "the run left processes behind"
    o = Outcome(runner, runner.view, runner.log_dir)
    described = f"{o.describe()}\nroots {[(pid, r[:2]) for pid, r in runner.roots.items()]}\ntrainers {runner.trainers}"
    expect(o, phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    expect_resumed(o, world_size=2, lost=1)
    expect_completed(o)
    assert runner.zygote is None and not (o.log_dir / "zygote.log").exists(), "a zygote was started"
    # Three pods ran (two workers, then worker 1's replacement), each a new interpreter this runner started
    # with the pod's own command and environment, not a fork of a zygote (whose marker a fork would show).
    assert sorted(r[0] for r in runner.roots.values()) == ["cold-worker-0", "cold-worker-1", "cold-worker-1"], described
    for pid, (name, parent, argv, env) in runner.roots.items():
        assert parent == os.getpid(), f"{name} ({pid}) is a child of {parent}, not of the runner\n{described}"
        assert argv[:3] == command("worker", python=sys.executable), described
        assert env[MARKER_ENV].split("/")[1] == name and contract.PRELOAD_ENV not in env, described
        assert env[contract.FORK_TRAINER_ENV] == "0", described
    # gpu-node: every trainer is a new interpreter running the entrypoint, not a fork of its agent (whose
    # argv, `python <agent>/bootstrap.py worker`, a fork keeps). One per pod per generation it trained in: at least three.
    assert len(runner.trainers) >= 3, described
    for pid, (name, argv) in runner.trainers.items():
        assert argv[:3] != command("worker", python=sys.executable) and "ddp_trainer" in argv, f"{name}'s process {pid}: {argv[:4]}\n{described}"
