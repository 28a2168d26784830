"""issue 38 item 3: a second `ddpjob run --local` of a job whose run is still going (same working directory, or
another one sharing its --checkpoint-dir) would empty the live run's checkpoints and logs. It is refused at
once, before anything is emptied or written, naming the directory, the holder's PID and the fix; the first
run finishes untouched. The lock dies with its holder: a crashed run leaves nothing stale."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from ddpjob_operator import cli, validation
from ddpjob_operator.local.options import RunOptions
from ddpjob_operator.local.runner import LocalRunner

from ..support import wait_for
from .harness import Run, TimelineView, job_dir, kill_tagged, manifest, write_manifest


def _runner(name: str, cwd: Path, checkpoint_dir: Path | None = None) -> LocalRunner:
    return LocalRunner(validation.parse_job(manifest(name)), RunOptions(state_dir=cwd / ".ddpjob",
                                                                         checkpoint_dir=checkpoint_dir),
                       TimelineView(timeout=60))


def _committed(directory: Path) -> list[Path]:
    return sorted(directory.rglob("step-*.committed"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_run_in_the_same_directory_is_refused_and_the_first_finishes(tmp_path):
    # Long enough that the second run starts while the first trains (about 20 s of training on 2 busy cores).
    args = ["--workload", "digits", "--epochs", "20", "--batch-size", "32", "--lr", "0.05", "--log-every", "5"]
    path = write_manifest(tmp_path, manifest("busy", args=args))
    first = Run(tmp_path, str(path))
    second = None
    try:
        checkpoints = job_dir(tmp_path, "busy") / "checkpoints"
        wait_for(lambda: first.proc.poll() is None and _committed(checkpoints), "the first run's first checkpoint",
                 180, interval=0.2)
        log = job_dir(tmp_path, "busy") / "logs" / "busy-worker-0.log"
        log_before = log.read_bytes()
        second = Run(tmp_path, str(path))
        code, out = second.wait(timeout=60)
        assert code == cli.EXIT_INVALID, out
        assert f".ddpjob/busy: is in use by another local run (PID {first.proc.pid})" in out, out
        assert "wait for that run to end" in out and "Traceback" not in out, out
        assert len(out.strip().splitlines()) == 1, out
        assert first.proc.poll() is None, "the first run ended before the second was refused: not a live run"
        assert second.leftovers() == []  # it started nothing
        assert log.read_bytes().startswith(log_before)  # the live run's log was not emptied

        code, out = first.wait(timeout=240)
        assert code == 0 and "job busy: Succeeded" in out, out
        kept = _committed(checkpoints)
        assert kept and all(p.with_name(p.name.replace(".committed", ".pt")).exists() for p in kept), kept
        assert first.leftovers() == []
    finally:
        for run in (first, second):
            if run is not None:
                run.proc.kill()
                kill_tagged(run.tag)


def test_a_run_sharing_another_runs_checkpoint_dir_is_refused_until_that_run_ends(tmp_path, capsys, monkeypatch):
    shared = tmp_path / "claim"
    holder = _runner("shared", tmp_path / "a", checkpoint_dir=shared)
    holder._prepare_dirs()  # the other working directory's run of the job has taken its directories
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b").mkdir()
    path = write_manifest(tmp_path / "b", manifest("shared"))
    try:
        monkeypatch.chdir(tmp_path / "b")
        code = cli.main(["run", str(path), "--local", "--checkpoint-dir", str(shared)])
        err = capsys.readouterr().err
        assert code == cli.EXIT_INVALID, err
        assert f"{shared}: is in use by another local run (PID {os.getpid()})" in err, err
        assert "give another --checkpoint-dir" in err and "Traceback" not in err, err
        assert not (tmp_path / "b" / ".ddpjob" / "shared" / "logs").exists()  # refused before anything was written
    finally:
        holder.stop_all()
    _runner("shared", tmp_path / "b", checkpoint_dir=shared)._prepare_dirs()  # ended: the claim is free


def _hold_and_wait(cwd: Path, ready: multiprocessing.Event) -> None:
    _runner("crash", cwd)._prepare_dirs()
    ready.set()
    signal.pause()


def test_a_crashed_run_leaves_no_stale_lock(tmp_path):
    ready = multiprocessing.get_context("fork").Event()
    crashed = multiprocessing.get_context("fork").Process(target=_hold_and_wait, args=(tmp_path, ready))
    crashed.start()
    try:
        assert ready.wait(30)
        with pytest.raises(validation.InvalidJob, match=rf"in use by another local run \(PID {crashed.pid}\)"):
            _runner("crash", tmp_path)._prepare_dirs()
    finally:
        crashed.kill()
        crashed.join()
    _runner("crash", tmp_path)._prepare_dirs()  # the kernel dropped the dead holder's lock
