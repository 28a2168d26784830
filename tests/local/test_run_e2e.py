"""`ddpjob run --local` end to end: real runner, real torchrun agents and trainers on Gloo, real signals."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from .harness import (TINY_DIGITS, Run, job_dir, job_files, kill_tagged, manifest, read_json, script,
                      tagged_processes, write_manifest)

pytestmark = pytest.mark.slow
RESTART = {**TINY_DIGITS["failurePolicy"], "recovery": "Restart"}  # not the in-process default


@pytest.fixture
def runs():
    """Every Run of a test; whatever a failing test leaves behind is killed, not leaked."""
    started: list[Run] = []
    yield started
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
        kill_tagged(run.tag)


def start(runs: list[Run], cwd: Path, *args: str) -> Run:
    run = Run(cwd, *args)
    runs.append(run)
    return run


def test_success_with_fewer_replicas_ends_with_metrics_and_checkpoint_path(tmp_path, runs):
    path = write_manifest(tmp_path, manifest("ok"))
    code, out = start(runs, tmp_path, str(path), "--replicas", "1").wait(timeout=240)
    assert code == 0, out
    result = read_json(job_files(tmp_path, "ok") / "result.json")
    assert result and result["status"] == "completed" and result["world_size"] == 1, out
    assert result["epoch"] == 3 and result["eval_accuracy"] > 0.85, result
    assert "job ok: Succeeded" in out
    assert f"checkpoints: {job_dir(tmp_path, 'ok') / 'checkpoints'}" in out
    assert re.search(r"final metrics: step \d+, epoch 3, .*eval_accuracy \d+\.\d+%", out), out
    assert "ok-worker-1" not in out, "--replicas 1 must start one worker only"
    logs = job_dir(tmp_path, "ok") / "logs"
    assert "step=" in (logs / "ok-worker-0.log").read_text()
    assert (logs / "ok-rdzv.log").exists()


def test_killed_worker_is_replaced_and_training_resumes_from_its_checkpoint(tmp_path, runs):
    doc = manifest("kill", failurePolicy=RESTART)  # the restart path: resumed from the volume
    doc["spec"]["args"] = ["--workload", "digits", "--epochs", "12", "--batch-size", "32", "--lr", "0.05",
                           "--log-every", "5"]
    path = write_manifest(tmp_path, doc)
    code, out = start(runs, tmp_path, str(path), "--kill-worker", "1", "--kill-at-step", "45").wait(timeout=300)
    assert code == 0, out
    assert re.search(r"fault injection: killed kill-worker-1 .* trainer step \d+", out), out
    assert "WorkerFailed: worker 1 (pod kill-worker-1) failed with exit code 137" in out
    assert "restarts charged to the budget: 1" in out and "kill-worker-1: 1" in out
    # Rank 0 may live in either worker: in each log, what precedes its first resume is pre-kill.
    before, resumed = [], []
    for log in (job_dir(tmp_path, "kill") / "logs").glob("kill-worker-*.log"):
        head, found, _ = log.read_text().partition("resumed from checkpoint step=")
        before += [int(s) for s in re.findall(r"^step=(\d+) ", head, re.MULTILINE)]
        if found:
            resumed.append(int(re.search(r"resumed from checkpoint step=(\d+)", log.read_text()).group(1)))
    assert before and resumed, out
    # Logged every 5 steps, checkpointed every 10, and the survivor saves the step it reached (a rescue
    # checkpoint): at most one interval behind the last logged step, at most one log interval past it.
    assert min(resumed) >= 10, "a replacement must not start from scratch"
    assert max(before) - 10 <= min(resumed) <= max(before) + 5, (max(before), resumed)
    result = read_json(job_files(tmp_path, "kill") / "result.json")
    assert result and result["status"] == "completed" and result["epoch"] == 12, out


def test_permanent_error_fails_the_job_with_the_reason(tmp_path, runs):
    entry = script(tmp_path, "config_error.py", "import sys\nprint('bad learning rate', flush=True)\nsys.exit(2)\n")
    path = write_manifest(tmp_path, manifest("perm", entrypoint=str(entry), args=[], replicas=1, minReplicas=1,
                                             failurePolicy={"maxRestarts": 0}))
    code, out = start(runs, tmp_path, str(path)).wait(timeout=120)
    assert code == 1, out
    # The launcher passes the trainer's own exit code on (torchrun alone would say 1), with its message.
    assert "job perm: Failed" in out
    assert ("PermanentError: worker 0 (pod perm-worker-0) failed with exit code 2, reason Error "
            "(rank 0 (local rank 0) exited with code 2 [generation 0] [rendezvous closed])") in out
    assert "bad learning rate" in (job_dir(tmp_path, "perm") / "logs" / "perm-worker-0.log").read_text()


def test_retryable_failures_exhaust_the_restart_budget(tmp_path, runs):
    entry = script(tmp_path, "flaky.py", "import sys\nsys.exit(1)\n")
    path = write_manifest(tmp_path, manifest(
        "budget", entrypoint=str(entry), args=[], replicas=1, minReplicas=1,
        failurePolicy={"maxRestarts": 1, "retryableExitCodes": [1], "backoff": {"initialSeconds": 0}}))
    code, out = start(runs, tmp_path, str(path), "--logs").wait(timeout=120)
    assert code == 1, out
    assert "[budget-worker-0] ---- budget-worker-0:" in out, "--logs prints worker lines with their pod"
    assert ("WorkerFailed: worker 0 (pod budget-worker-0) failed with exit code 1, reason Error "
            "(rank 0 (local rank 0) exited with code 1 [generation 0] [rendezvous closed]); "
            "restarting (restart 1 of 1)") in out
    assert "RestartBudgetExhausted" in out and "failurePolicy.maxRestarts=1 is spent" in out
    assert "restarts charged to the budget: 1" in out
    log = (job_dir(tmp_path, "budget") / "logs" / "budget-worker-0.log").read_text()
    assert log.count("---- budget-worker-0:") == 2, "one replacement, then the budget is spent"


def test_ctrl_c_stops_workers_gracefully_leaves_no_process_and_resume_continues(tmp_path, runs):
    doc = manifest("stop")
    doc["spec"]["args"] = ["--workload", "digits", "--epochs", "25", "--batch-size", "32", "--log-every", "5"]
    path = write_manifest(tmp_path, doc)
    run = start(runs, tmp_path, str(path))
    progress = job_files(tmp_path, "stop") / "progress.json"
    run.wait_for_step(progress, 20)
    assert len(run.leftovers()) >= 5, run.leftovers()  # store + 2 agents + 2 trainers
    run.interrupt()
    code, out = run.wait(timeout=120)
    assert code == 130, out
    assert run.leftovers() == [], out
    assert "job stop: Interrupted" in out and "workers checkpointed" in out
    log0 = (job_dir(tmp_path, "stop") / "logs" / "stop-worker-0.log").read_text()
    stopped = re.search(r"stop requested at step (\d+): writing a final checkpoint", log0)
    assert stopped, log0[-3000:]
    steps = job_files(tmp_path, "stop") / "checkpoints"
    final = steps / f"step-{int(stopped.group(1)):08d}.committed"
    assert final.exists(), sorted(p.name for p in final.parent.iterdir())

    code, out = start(runs, tmp_path, str(path), "--resume").wait(timeout=240)
    assert code == 0, out
    assert f"training resumed from the checkpoint of step {stopped.group(1)}" in out
    result = read_json(job_files(tmp_path, "stop") / "result.json")
    assert result and result["status"] == "completed" and result["epoch"] == 25, out


def test_lost_store_moves_the_job_to_a_new_generation_without_charging_the_budget(tmp_path, runs):
    # The restart path: every worker resumes. Static (2:2): generation 1 forms once both agents are back, not first
    # at 1 then grown by a restart. 20 epochs (about 450 steps): generation 0 stops 10-20 steps after the kill.
    doc = manifest("store", failurePolicy=RESTART, minReplicas=2)
    doc["spec"]["args"] = ["--workload", "digits", "--epochs", "20", "--batch-size", "32", "--log-every", "5"]
    run = start(runs, tmp_path, str(write_manifest(tmp_path, doc)))
    progress = job_files(tmp_path, "store") / "progress.json"
    run.wait_for_step(progress, 30)
    store = [pid for pid, cmdline in tagged_processes(run.tag) if "bootstrap.py store " in cmdline]
    assert len(store) == 1, run.leftovers()
    os.kill(store[0], signal.SIGKILL)
    code, out = run.wait(timeout=240)
    assert code == 0, out
    # Who sees the loss first is a race: the runner sees the store process exit, or an agent's own store
    # call (its monitor loop asks the store every interval) fails first and its exit opens an incident of
    # the generation. Either way one disruption, nothing charged, and every worker in generation 1.
    assert ("RendezvousStoreLost: rendezvous store lost (Failed); moving every worker to rendezvous generation 1" in out
            or re.search(r"RendezvousConnectionError.*: disrupted .*restarting all workers in rendezvous generation 1",
                         out, re.DOTALL)), out
    assert "restarts charged to the budget: 0, disruptions: 1" in out
    # The old generation was deleted gracefully: its trainers saved on SIGTERM and training went on from there.
    logs = "".join(p.read_text() for p in (job_dir(tmp_path, "store") / "logs").glob("store-worker-*.log"))
    stopped = re.search(r"stop requested at step (\d+)", logs)
    assert stopped and f"resumed from checkpoint step={stopped.group(1)} " in logs, logs[-3000:]
    assert "--rdzv-id=" in logs and len(set(re.findall(r"--rdzv-id=(\S+)", logs))) == 2, "one id per generation"
    assert run.leftovers() == []
