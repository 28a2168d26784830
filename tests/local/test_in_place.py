"""restartScope Pod replaces the failed rank, not the gang (issue 25), with real torchrun agents.

A SIGKILLed worker is replaced by a new pod (a new process tree); the survivor's pod is the same process
from start to end: its launcher waits for the next generation in place and runs its trainer again from
the agent that already imported torch, resuming from the rescue checkpoint at the same world size.
A worker deleted gracefully (kubectl delete pod, an eviction) is replaced alone too: its peers stop with
it at the step they agree on and save, and keep their pods. With restartScope All every worker is a new pod.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpjob_operator import validation
from ddpjob_operator.local.processes import marked_pids
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import DELETE, KILL, FaultInjection, RunOptions

from .harness import TimelineView
from .test_semantics import MAX_STEPS, Outcome, expect, expect_completed, expect_resumed, spec

pytestmark = pytest.mark.slow


class PidRecordingRunner(LocalRunner):
    """Records the root process of every worker pod at every pass: the pods' identities over time."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pids: dict[str, list[int]] = {}

    def reconcile(self):
        decision = super().reconcile()
        for name, w in self.workers.items():
            if w.process.started:
                seen = self.pids.setdefault(name, [])
                if not seen or seen[-1] != w.process.pid:
                    seen.append(w.process.pid)
        return decision


def run(tmp_path: Path, name: str, job_spec: dict, **options) -> tuple[Outcome, PidRecordingRunner]:
    job = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                "metadata": {"name": name}, "spec": job_spec})
    runner = PidRecordingRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob", **options), TimelineView(timeout=150))
    try:
        runner.run()
    finally:
        assert marked_pids(runner.run_marker) == [], "the run left processes behind"
    outcome = Outcome(runner, runner.view, runner.log_dir)
    print(f"\n[{name}] pids {runner.pids}\n{outcome.describe()}")
    return outcome, runner


def test_pod_scope_keeps_the_survivors_process_and_replaces_only_the_killed_worker(tmp_path):
    o, runner = run(tmp_path, "in-place", spec(failurePolicy={"restartScope": "Pod"}),
                    faults=(FaultInjection(index=1, at_step=43, kind=KILL),))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    # The survivor's pod is one process tree for the whole run; the killed worker's pod was created again.
    assert len(runner.pids["in-place-worker-0"]) == 1 and len(runner.pids["in-place-worker-1"]) == 2, o.describe()
    assert runner.creations == {0: 1, 1: 2}
    # It exited once, at the end, successfully, as the pod of generation 0 that served generation 1 too.
    survivor_exits = [e for e in o.exits if e.pod == "in-place-worker-0"]
    assert [(e.generation, e.exit_code) for e in survivor_exits] == [(0, 0)], o.describe()
    log = (o.log_dir / "in-place-worker-0.log").read_text(errors="replace")
    assert "joining rendezvous generation 1 in place" in log
    # Its trainer resumed from the rescue checkpoint (at most the step in flight lost), at the same size.
    expect_resumed(o, world_size=2, lost=1)
    expect_completed(o)
    assert [r.index for r in o.status.ranks] == [0, 1] and o.status.ranks[1].restarts == 1
    assert o.status.ranks[0].restarts == 0


@pytest.mark.parametrize("deleted", [1, 0])
def test_pod_scope_keeps_the_survivors_process_when_a_peer_is_deleted_gracefully(tmp_path, deleted):
    name = f"delete-{deleted}"
    o, runner = run(tmp_path, name, spec(failurePolicy={"restartScope": "Pod"}),
                    faults=(FaultInjection(index=deleted, at_step=40, kind=DELETE),))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=0, disruptions=1, generation=1)
    survivor, gone = f"{name}-worker-{1 - deleted}", f"{name}-worker-{deleted}"
    # The survivor's pod is one process tree for the whole run; only the deleted worker's was created again.
    assert len(runner.pids[survivor]) == 1 and len(runner.pids[gone]) == 2, o.describe()
    assert runner.creations == {deleted: 2, 1 - deleted: 1}
    # The deleted pod exited 143; the survivor exited once, at the end, as the pod of generation 0.
    assert [(e.generation, e.exit_code) for e in o.exits if e.pod == gone][0] == (0, 143), o.describe()
    assert [(e.generation, e.exit_code) for e in o.exits if e.pod == survivor] == [(0, 0)], o.describe()
    log = (o.log_dir / f"{survivor}.log").read_text(errors="replace")
    assert "joining rendezvous generation 1 in place" in log
    # Both trainers saved at the step they agreed on, and training goes on from that very step.
    stopped = re.search(r"stop requested at step (\d+)", log)
    assert stopped, o.describe()
    assert expect_resumed(o, world_size=2).step == int(stopped.group(1)), o.describe()
    expect_completed(o)


def test_all_scope_replaces_every_worker(tmp_path):
    o, runner = run(tmp_path, "gang", spec(failurePolicy={"restartScope": "All"}),
                    faults=(FaultInjection(index=1, at_step=43, kind=KILL),))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    assert runner.creations == {0: 2, 1: 2}
    assert len(runner.pids["gang-worker-0"]) == 2 and len(runner.pids["gang-worker-1"]) == 2, o.describe()
    expect_completed(o)


def test_a_warm_spare_takes_the_killed_workers_place(tmp_path):
    o, runner = run(tmp_path, "warm", spec(failurePolicy={"restartScope": "Pod", "spares": 1}),
                    faults=(FaultInjection(index=1, at_step=43, kind=KILL),))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    # No worker pod was created again: the spare (one process tree from start to end) became worker 1,
    # and the pool was refilled with a second spare.
    assert runner.creations == {0: 1, 1: 1}, o.describe()
    assert [r.pod for r in o.status.ranks] == ["warm-worker-0", "warm-spare-0"]
    assert len(runner.pids["warm-worker-0"]) == 1 and len(runner.pids["warm-spare-0"]) == 1, runner.pids
    assert "warm-spare-1" in runner.pids
    log = (o.log_dir / "warm-spare-0.log").read_text(errors="replace")
    assert "spare: taking the place of worker 1 in rendezvous generation 1" in log
    expect_resumed(o, world_size=2, lost=1)
    expect_completed(o)
    # The progress followed the generation the spare trains in to the last step (issue 31 item 1).
    progress = o.status.progress
    assert progress is not None and (progress.step, progress.percent) == (MAX_STEPS, 100), o.describe()
