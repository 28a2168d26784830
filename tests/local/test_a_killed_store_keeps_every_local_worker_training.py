"""Issue 36, "a lost rendezvous store is not a lost gang", end to end on this machine: `ddpjob run --local` of
the bundled trainer with in-process recovery, its store SIGKILLed mid-run. The runner recreates the store on the
same port (as a pod's successor keeps its Service); every agent and trainer keeps its process and training
goes on. Then worker 1 is SIGKILLed: worker 0 meets its replacement at the new store and recovers in process
(its agent and trainer keep their processes); one restart charged, no disruption, the job succeeds."""

from __future__ import annotations

import os
import signal
import time

import pytest

from .harness import Run, alive, job_files, kill_tagged, manifest, read_json, tagged_processes, wait_for, \
    write_manifest

pytestmark = pytest.mark.slow


WORKER_KILLED_AT = 100  # of about 180 steps; the store is killed at step 20 and back within seconds


def store_pids(tag: str) -> list[int]:
    return [pid for pid, cmdline in tagged_processes(tag) if "bootstrap.py store " in cmdline]


def writes_to(pid: int) -> str:
    """The file a process's stdout goes to: each pod's processes (its agent and the trainers it forks) write its log."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return ""


def test_a_killed_store_keeps_every_worker_process_and_training_goes_on(tmp_path):
    doc = manifest("keep", failurePolicy={"maxRestarts": 2, "recovery": "InProcess",
                                          "backoff": {"initialSeconds": 0, "maxSeconds": 1}})
    # Rank 0 works 100x as long per step in generation 0 (a straggler: no number changes), so that the store is
    # back well before step WORKER_KILLED_AT however fast the machine trains; the replacement's generation is fast.
    doc["spec"]["args"] = ["--workload", "digits", "--epochs", "8", "--batch-size", "32", "--log-every", "5",
                           "--fault-slow-rank", "0", "--fault-slow-factor", "100"]
    run = Run(tmp_path, str(write_manifest(tmp_path, doc)), "--kill-worker", "1", "--kill-at-step",
              str(WORKER_KILLED_AT))
    try:
        progress = job_files(tmp_path, "keep") / "progress.json"
        run.wait_for_step(progress, 20)
        [store] = store_pids(run.tag)
        workers = {pid for pid, _ in tagged_processes(run.tag) if pid != store}
        worker_0 = {pid for pid in workers if writes_to(pid).endswith("/keep-worker-0.log")}
        assert len(worker_0) >= 2, "worker 0's agent and trainer"
        step = read_json(progress)["step"]
        os.kill(store, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: (read_json(progress) or {}).get("step", 0) > step, "a step after the kill", 20, interval=0.05)
        to_next_step = time.monotonic() - killed
        wait_for(lambda: store_pids(run.tag) not in ([], [store]), "the store recreated", 60, interval=0.1)
        assert read_json(progress)["step"] < WORKER_KILLED_AT, "the store came back before the worker's kill"
        assert all(alive(pid) for pid in workers), "every agent and trainer keeps its process"
        run.wait_for_step(progress, WORKER_KILLED_AT + 30)
        assert all(alive(pid) for pid in worker_0), "worker 0 met its new peer at the new store, in process"
        code, out = run.wait(timeout=300)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        kill_tagged(run.tag)
    assert code == 0, out
    assert "RendezvousStoreLost: rendezvous store lost; recreating it under its Service" in out, out
    assert "moving every worker" not in out and "restarts charged to the budget: 1, disruptions: 0" in out, out
    print(f"SIGKILLed store: {to_next_step:.2f} s to the next reported step")
    assert to_next_step < 10, f"{to_next_step:.1f} s from the store's kill to the next step"
