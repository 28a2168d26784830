"""issue 38 item 7: SIGHUP (the terminal or ssh session closed) stops `ddpjob run --local` as SIGTERM does: the
trainers checkpoint, then every process the run started is gone, also when its output went with the
terminal (every write then fails). Before, SIGHUP killed the runner alone, and its store, agents and
trainers, each in a session of its own, trained on owned by nobody."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ..support import wait_for
from .harness import Run, job_dir, kill_tagged, manifest, write_manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# Long enough to still be training when the terminal closes (a few minutes of steps).
ARGS = ["--workload", "digits", "--epochs", "60", "--batch-size", "32", "--lr", "0.05", "--log-every", "5"]


def _start_training(tmp_path: Path, name: str, ignore_sighup: bool = False) -> Run:
    run = Run(tmp_path, str(write_manifest(tmp_path, manifest(name, args=ARGS))), ignore_sighup=ignore_sighup)
    checkpoints = job_dir(tmp_path, name) / "checkpoints"
    wait_for(lambda: run.proc.poll() is None and any(checkpoints.rglob("step-*.committed")),
             "the first checkpoint", 180, interval=0.2)
    return run


@pytest.mark.parametrize("output", ["kept", "gone with the terminal"])
def test_sighup_stops_every_process_the_run_started(tmp_path, output):
    run = _start_training(tmp_path, "hangup")
    try:
        assert run.leftovers(), "the run started no process"
        if output == "kept":
            run.proc.send_signal(signal.SIGHUP)
            code, out = run.wait(timeout=90)
            assert code == 130, out
            assert "SIGHUP: stopping every worker gracefully" in out and "stopped by SIGHUP" in out, out
        else:
            run.proc.stdout.close()  # the terminal is gone: every write of the runner fails from now on
            run.proc.send_signal(signal.SIGHUP)
            run.proc.wait(timeout=90)
        assert run.leftovers() == []
        # The graceful part happened: torchrun forwarded SIGTERM and rank 0 wrote a final checkpoint.
        rank0 = (job_dir(tmp_path, "hangup") / "logs" / "hangup-worker-0.log").read_text(errors="replace")
        assert "writing a final checkpoint" in rank0, rank0[-3000:]
    finally:
        run.proc.kill()
        kill_tagged(run.tag)


def test_a_run_started_with_sighup_ignored_outlives_its_terminal(tmp_path):
    run = _start_training(tmp_path, "nohup", ignore_sighup=True)  # `nohup ddpjob run ...`
    try:
        run.proc.send_signal(signal.SIGHUP)
        log = job_dir(tmp_path, "nohup") / "logs" / "nohup-worker-0.log"
        trained = log.stat().st_size
        wait_for(lambda: log.stat().st_size > trained + 200, "training to go on after SIGHUP", 60, interval=0.2)
        assert run.proc.poll() is None
        run.proc.terminate()
        code, out = run.wait(timeout=90)
        assert code == 130 and "stopped by SIGTERM" in out, out
        assert run.leftovers() == []
    finally:
        run.proc.kill()
        kill_tagged(run.tag)
