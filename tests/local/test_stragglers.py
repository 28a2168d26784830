"""Issue 22 with the local runner and real torchrun agents: a rank slowed 2x (`--fault-slow-rank`) is named a
straggler within the window (the same decision code as the operator, fed from progress.json's per-worker own
step times), and the same job without the slowdown raises nothing."""

from __future__ import annotations

import pytest

from .harness import Run, job_dir, job_files, manifest, read_json, write_manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# About 20 ms a step on 2 cores: long enough that the 2x sleep dominates scheduling noise, and about 30 s
# of training, three windows of 10 s.
ARGS = ["--workload", "synthetic", "--workload-option", "hidden=1024", "--workload-option", "samples=4096",
        "--epochs", "8", "--batch-size", "32", "--log-every", "5"]


def run_job(tmp_path, name: str, extra: list[str]) -> str:
    doc = manifest(name, args=ARGS + extra, replicas=2, minReplicas=2, maxReplicas=2,
                   failurePolicy={"maxRestarts": 0, "stragglerWindowSeconds": 10})
    code, out = Run(tmp_path, str(write_manifest(tmp_path, doc))).wait(280)
    assert code == 0, out
    assert f"job {name}: Succeeded" in out, out
    return out


def test_a_rank_slowed_2x_is_named_within_the_window(tmp_path):
    out = run_job(tmp_path, "slow", ["--fault-slow-rank", "1", "--fault-slow-factor", "2"])
    named = [line for line in out.splitlines() if "Warning Straggler:" in line]
    assert len(named) == 1, out  # named once, not once per pass
    # The rendezvous decides which worker holds global rank 1: the one whose trainer says so.
    logs = job_dir(tmp_path, "slow") / "logs"
    slow = next(i for i in (0, 1) if "fault injection: rank 1: working 2x as long per step" in
                (logs / f"slow-worker-{i}.log").read_text())
    assert f"worker {slow} (pod slow-worker-{slow}, node 127.0.0.1) is a straggler" in named[0], named
    ratio = float(named[0].split("x the median of its peers")[0].rsplit(" ", 1)[1])
    assert ratio > 1.5, named
    progress = read_json(job_files(tmp_path, "slow") / "progress.json")
    times = progress["step_seconds_by_worker"]
    assert times[str(slow)] > 1.5 * times[str(1 - slow)], progress


def test_a_run_without_a_slow_rank_raises_nothing(tmp_path):
    out = run_job(tmp_path, "even", [])
    assert "Straggler" not in out, out
    progress = read_json(job_files(tmp_path, "even") / "progress.json")
    assert set(progress["step_seconds_by_worker"]) == {"0", "1"}, progress  # timings were there to judge
