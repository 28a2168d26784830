"""The bundled trainer (`torchrun -m ddp_trainer`) on a checkpoint directory it refuses (a CheckpointDirError: a
link planted at the job's directory, a job name that is no path component, a directory it cannot write) ended
with a traceback. It is the user's configuration: one ERROR line naming the path and the fix, a permanent
failure exit (1, not 75: 75 says "the volume's fault, retry"), and that message in torchrun's error file (what
the pod's termination message quotes). Real torchrun, one worker, Gloo on CPU."""

from __future__ import annotations

import re

from trainer_harness import base_env, failures, job_dir, run, tail, torchrun_cmd

ARGS = ["--workload", "synthetic", "--max-steps", "2"]


def _run(tmp_path, **env: str):
    log = tmp_path / "log"
    code = run(torchrun_cmd(ARGS), base_env(tmp_path / "ckpt", **env), log, timeout=120)
    return code, log.read_text(errors="replace"), failures(log)


def _trainer_traceback(output: str) -> bool:
    """A frame of the trainer's, or its exception's name (torchrun's agent prints a traceback of its own for any
    failed worker: that one is torch's, not ours)."""
    return bool(re.search(r'File "[^"]*ddp_trainer', output)) or "CheckpointDirError" in output


def test_a_link_at_the_jobs_directory_is_one_line_and_a_permanent_failure(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = job_dir(tmp_path / "ckpt")
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere, target_is_directory=True)

    code, output, failed = _run(tmp_path)

    assert code != 0, output
    assert not _trainer_traceback(output), tail(tmp_path / "log")
    exit_code, message = failed[0]
    assert exit_code == 1, output  # a permanent failure: not 75 (the volume's fault, retried)
    assert f"{link} is a symbolic link" in message, message
    assert "real directory" in message, message  # the fix
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and str(link) in errors[0], output
    assert list(elsewhere.iterdir()) == []  # nothing written through the link


def test_a_job_name_that_is_no_path_component_is_one_line(tmp_path):
    code, output, failed = _run(tmp_path, DDPJOB_NAME="..")

    assert code != 0 and not _trainer_traceback(output), tail(tmp_path / "log")
    exit_code, message = failed[0]
    assert exit_code == 1 and "DDPJOB_NAME" in message, (exit_code, message)
