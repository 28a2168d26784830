"""issue 38 items 4 and 6 (local runner): what a kept `.ddpjob` (a cloned repository, a neighbour) may hold
where the runner writes or reads. A link is never written, pruned or appended through; a FIFO is never
opened blocking (the run stays responsive to SIGINT and SIGTERM); a file where a directory belongs is
refused with the path and the fix, never a traceback; a report that is not the trainer's (a FIFO, a link,
huge, nested past any report) is skipped with one warning naming it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from ddpjob_operator import cli
from ddpjob_operator.local.logs import MAX_JSON_DEPTH, JobFiles

from .harness import Run, job_dir, kill_tagged, manifest, write_manifest

JOB = "planted"
KEY = f"local.{JOB}"  # the job's own directory on the checkpoint volume


def _in_thread(call, seconds: float = 30):
    """call() on a thread: a blocking open of a FIFO fails the test instead of hanging it."""
    result: list = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"still blocked after {seconds}s (a FIFO opened for a blocking read or write?)"
    return result[0]


def _plant(kind: str, path: Path, outside: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "file":
        path.write_text("not a directory")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(outside)


# (what is planted, where under the working directory, the words of the refusal, with --resume)
REFUSED = [
    ("file", ".ddpjob", "is a regular file, not a directory", False),
    ("file", f".ddpjob/{JOB}", "is a regular file, not a directory", False),
    ("fifo", f".ddpjob/{JOB}/logs", "is a FIFO, not a directory", False),
    ("link", f".ddpjob/{JOB}/logs/{JOB}-worker-0.log", "is a symbolic link: the local run writes only regular", True),
    ("fifo", f".ddpjob/{JOB}/logs/zygote.log", "is a FIFO: the local run writes only regular files", True),
    ("link", f".ddpjob/{JOB}/checkpoints/{KEY}", "is a symbolic link", True),
    ("link", f".ddpjob/{JOB}/checkpoints/{KEY}/checkpoints", "is a symbolic link", True),
    ("fifo", f".ddpjob/{JOB}/run.lock", "is a FIFO: the local run's lock file must be a regular file", True),
]


@pytest.mark.parametrize("kind, where, words, resume", REFUSED, ids=[f"{k}-{w}" for k, w, _, _ in REFUSED])
def test_a_planted_path_is_refused_with_the_path_and_the_fix(capsys, tmp_path, monkeypatch, kind, where, words,
                                                            resume):
    monkeypatch.chdir(tmp_path)
    path = write_manifest(tmp_path, manifest(JOB))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    target = outside / "keep.txt" if where.endswith((".log", ".lock")) else outside  # a file's link, a directory's
    if resume:  # what a previous run kept
        (job_dir(tmp_path, JOB) / "logs").mkdir(parents=True, exist_ok=True)
    _plant(kind, tmp_path / where, target)

    code = _in_thread(lambda: cli.main(["run", str(path), "--local", *(["--resume"] if resume else [])]))
    err = capsys.readouterr().err
    assert code == cli.EXIT_INVALID, err
    assert f"{where}: {words}" in err and "Fix:" in err and "Traceback" not in err, err
    assert (outside / "keep.txt").read_text() == "mine" and sorted(os.listdir(outside)) == ["keep.txt"]
    assert (tmp_path / where).is_symlink() or (tmp_path / where).exists()  # refused, not "fixed": it is the user's


def test_a_planted_name_is_shown_escaped_and_a_directory_is_moved_away(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logs = job_dir(tmp_path, JOB) / "logs"
    (logs / "fake\n00:00:00 job planted: Succeeded").mkdir(parents=True)  # a name that forges a line of output
    code = cli.main(["run", str(write_manifest(tmp_path, manifest(JOB))), "--local", "--resume"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INVALID and len(err.strip().splitlines()) == 1, err
    assert "fake\\n00:00:00 job planted: Succeeded: is a directory" in err and "move it away (`mv " in err, err


def test_a_checkpoint_dir_that_is_a_file_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    claim = tmp_path / "claim"
    claim.write_text("a file")
    code = cli.main(["run", str(write_manifest(tmp_path, manifest(JOB))), "--local", "--checkpoint-dir", str(claim)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INVALID and f"{claim}: is a regular file, not a directory" in err, err
    assert "give another --checkpoint-dir" in err and claim.read_text() == "a file"


def test_a_checkpoint_dir_that_is_a_link_loop_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    code = cli.main(["run", str(write_manifest(tmp_path, manifest(JOB))), "--local", "--checkpoint-dir", "loop"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INVALID and err.startswith("--checkpoint-dir: loop cannot be resolved"), err
    assert "Traceback" not in err


def _nested(depth: int) -> str:
    return '{"step": ' + "[" * depth + "]" * depth + "}"


CORRUPT = {
    "a FIFO": (lambda p, _: os.mkfifo(p), "is a FIFO"),
    "a link to a good report": (lambda p, o: p.symlink_to(o), "is a symbolic link"),
    "a directory": (lambda p, _: p.mkdir(), "is a directory"),
    "JSON nested past the parser's stack": (lambda p, _: p.write_text(_nested(200_000)), "nests deeper than"),
    "JSON nested past any report": (lambda p, _: p.write_text(_nested(MAX_JSON_DEPTH + 1)), "nests deeper than"),
    "more than a MiB": (lambda p, _: p.write_text(json.dumps({"pad": "x" * (1 << 20)})), "larger than"),
    "not an object": (lambda p, _: p.write_text("[1, 2]"), "holds list, not a JSON object"),
}


@pytest.mark.parametrize("what", list(CORRUPT))
def test_a_report_that_is_not_the_trainers_is_skipped_with_one_warning(tmp_path, what):
    plant, words = CORRUPT[what]
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"step": 7}))
    job = tmp_path / KEY
    job.mkdir()
    plant(job / "progress.json", good)
    warnings: list[str] = []
    files = JobFiles(job, warnings.append)
    assert _in_thread(files.progress) == {} and _in_thread(files.progress) == {}
    assert len(warnings) == 1 and str(job / "progress.json") in warnings[0] and words in warnings[0], warnings


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_fifo_at_a_kept_progress_file_neither_hangs_nor_stops_the_run(tmp_path):
    progress = job_dir(tmp_path, JOB) / "checkpoints" / KEY / "progress.json"
    progress.parent.mkdir(parents=True)
    os.mkfifo(progress)  # before, the runner's first read blocked for ever, deaf to Ctrl-C and SIGTERM
    run = Run(tmp_path, str(write_manifest(tmp_path, manifest(JOB))), "--resume")
    try:
        code, out = run.wait(timeout=180)
        assert code == 0 and f"job {JOB}: Succeeded" in out, out
        assert out.count(f"Warning: {progress.resolve()} is a FIFO: skipped as corrupt") == 1, out
        assert run.leftovers() == []
    finally:
        run.proc.kill()
        kill_tagged(run.tag)
