"""issue 38 item 8: two local jobs sharing `--checkpoint-dir` each read only their own files, in the job's own
directory the trainer writes them to (`<checkpoint-dir>/local.<name>/`: progress.json, result.json,
checkpoints/). Before, both read `<checkpoint-dir>/progress.json`: job A showed job B's progress, B fed A's
stall clock, and A's `--kill-at-step` fired at B's step."""

from __future__ import annotations

import re

import pytest
from ddp_trainer.runtime import contract

from ddpjob_operator.local.logs import job_directory_name
from ddpjob_operator.local.pods import NAMESPACE

from ..support import wait_for
from .harness import Run, job_dir, kill_tagged, manifest, write_manifest

STEP = re.compile(r"\bstep=(\d+) epoch=")


@pytest.mark.parametrize("name, namespace", [("digits", "local"), ("a", "team-b"), ("x1", None), (None, "local"),
                                             ("", "local")])
def test_the_runner_names_the_job_directory_as_the_trainer_does(name, namespace):
    assert job_directory_name(name, namespace) == contract.job_directory_name(name, namespace)


def _args(epochs: int) -> list[str]:
    return ["--workload", "digits", "--epochs", str(epochs), "--batch-size", "32", "--lr", "0.05", "--log-every", "5"]


def _newest_logged_step(log) -> int:
    return max((int(s) for s in STEP.findall(log.read_text(errors="replace"))), default=0) if log.exists() else 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_jobs_sharing_a_checkpoint_dir_see_only_their_own_progress(tmp_path):
    claim = tmp_path / "claim"
    one_worker = {"replicas": 1, "minReplicas": 1, "maxReplicas": 1}
    long = Run(tmp_path, str(write_manifest(tmp_path, manifest("long", args=_args(60), **one_worker))),
               "--checkpoint-dir", str(claim))
    short = None
    try:
        log = job_dir(tmp_path, "long") / "logs" / "long-worker-0.log"
        wait_for(lambda: long.proc.poll() is None and _newest_logged_step(log) >= 200, "job long to pass step 200",
                 180, interval=0.2)
        # The short job has about 45 steps: a kill at step 200 can only fire on the other job's progress.
        short = Run(tmp_path, str(write_manifest(tmp_path, manifest("short", args=_args(1), **one_worker))),
                    "--checkpoint-dir", str(claim), "--kill-worker", "0", "--kill-at-step", "200")
        code, out = short.wait(timeout=180)
        assert long.proc.poll() is None, "job long ended before job short: they did not share the directory"
        assert code == 0 and "job short: Succeeded" in out, out
        assert "fault injection" not in out and "--kill-at-step 200 never fired" in out, out
        progress = re.search(r"progress: step (\d+) of (\d+)", out)
        assert progress and progress.group(1) == progress.group(2), out  # its own steps, all of them
        assert f"newest checkpoint: step {progress.group(1)} ({claim / f'{NAMESPACE}.short'}" in out, out
        assert (claim / f"{NAMESPACE}.short" / "result.json").exists() and (claim / f"{NAMESPACE}.long").is_dir()
    finally:
        for run in (long, short):
            if run is not None:
                run.proc.kill()
                kill_tagged(run.tag)
