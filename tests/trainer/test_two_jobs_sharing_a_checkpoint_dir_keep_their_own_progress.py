"""Issue 38 item 8, the trainer's side: two jobs whose workers share one checkpoint directory (two local runs given
one --checkpoint-dir, two DDPJobs of one name in two namespaces on shared storage) each write progress.json and
result.json in their own directory, `<dir>/<namespace>.<name>/` (contract.job_root): one job's stall clock and
--kill-at-step are never fed by the other's steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_trainer.runtime import CheckpointDirError, ProgressReporter
from ddp_trainer.runtime.contract import PROGRESS_FILE, RESULT_FILE
from ddp_trainer.runtime.progress import job_directory
from trainer_harness import PY, base_env, read_json, start, tail

SCRIPT = Path(__file__).parent / "scripts" / "job_reports_steps.py"


def test_two_jobs_on_one_directory_write_their_own_progress_and_result(tmp_path: Path) -> None:
    shared = tmp_path / "ckpt"
    runs = {"a": 3, "b": 5}  # job -> its steps
    procs = {}
    for name, steps in runs.items():
        env = base_env(shared, DDPJOB_NAME=name)
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "--max-restarts=0",
               str(SCRIPT), str(steps)]
        procs[name] = start(cmd, env, tmp_path / f"{name}.log")
    for name, proc in procs.items():
        assert proc.wait(120) == 0, tail(tmp_path / f"{name}.log")
    for name, steps in runs.items():
        own = shared / f"local.{name}"
        assert read_json(own / PROGRESS_FILE)["step"] == steps
        assert read_json(own / RESULT_FILE) == {"status": "completed", "world_size": 1, "step": steps}
    assert not (shared / PROGRESS_FILE).exists() and not (shared / RESULT_FILE).exists()


def test_one_name_in_two_namespaces_and_a_plain_script_each_have_their_own_file(tmp_path: Path) -> None:
    envs = {"ns1.job": {"DDPJOB_NAME": "job", "DDPJOB_NAMESPACE": "ns1"},
            "ns2.job": {"DDPJOB_NAME": "job", "DDPJOB_NAMESPACE": "ns2"},
            "": {}}  # a script outside DDPJob that names no job: the directory itself, as before
    for step, (directory, env) in enumerate(envs.items(), start=1):
        reporter = ProgressReporter.from_env({**env, "DDPJOB_CHECKPOINT_DIR": str(tmp_path)})
        reporter.report(step=step)
        reporter.close()
        assert read_json(tmp_path / directory / PROGRESS_FILE)["step"] == step


def test_a_job_name_that_is_no_path_component_writes_no_file_and_says_why(tmp_path: Path, caplog) -> None:
    """Progress is advisory: a name such as "../x" (it would put the file beside another job's) is one warning
    naming the variable, and no progress.json anywhere; result.json is refused with the same error."""
    shared = tmp_path / "ckpt"
    for name in ("../x", "a/b", ".."):
        caplog.clear()
        env = {"DDPJOB_CHECKPOINT_DIR": str(shared), "DDPJOB_NAME": name, "DDPJOB_NAMESPACE": "local"}
        reporter = ProgressReporter.from_env(env)
        reporter.report(step=1)
        reporter.close()
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "DDPJOB_NAME" in warnings[0] and "progress.json is not written" in warnings[0]
        with pytest.raises(CheckpointDirError, match="DDPJOB_NAME"):
            job_directory(shared, env)
    assert list(tmp_path.rglob(PROGRESS_FILE)) == []
