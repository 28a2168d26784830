"""`ddpjob run --local` refuses bad input before starting anything, with the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpjob_operator import cli

from .harness import manifest, write_manifest

ROOT = Path(__file__).resolve().parents[2]
INVALID = sorted((ROOT / "tests" / "api" / "invalid").glob("*.yaml"))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_bad_manifests_get_exactly_the_errors_of_validate(capsys, path):
    run_code, run_out, run_err = run_cli(capsys, "run", str(path), "--local")
    validate_code, _, validate_err = run_cli(capsys, "validate", str(path))
    assert run_code == validate_code == cli.EXIT_INVALID
    assert run_err == validate_err and run_err.strip()
    assert run_out == ""


def test_missing_file_is_an_error_not_a_traceback(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", str(tmp_path / "nope.yaml"), "--local")
    assert code == cli.EXIT_INVALID and "nope.yaml: cannot read" in err and "Traceback" not in err


@pytest.mark.parametrize("replicas", ["0", "3"])
def test_replicas_outside_the_elastic_bounds_is_refused(capsys, tmp_path, replicas):
    path = write_manifest(tmp_path, manifest("scale"))  # minReplicas 1, maxReplicas 2
    code, _, err = run_cli(capsys, "run", str(path), "--local", "--replicas", replicas)
    assert code == cli.EXIT_INVALID
    assert f"--replicas: must be within minReplicas..maxReplicas (1..2), got {replicas}" in err and "Fix:" in err
    assert not (tmp_path / ".ddpjob").exists()


@pytest.mark.parametrize("argv, flag, fix", [
    (["--kill-worker", "1"], "--kill-worker", "--kill-after SECONDS or --kill-at-step STEP"),
    (["--kill-after", "5"], "--kill-after/--kill-at-step", "add --kill-worker I"),
    (["--kill-worker", "2", "--kill-after", "5"], "--kill-worker", "pick 0..1"),
])
def test_half_a_fault_injection_is_refused(capsys, tmp_path, argv, flag, fix):
    path = write_manifest(tmp_path, manifest("fault"))
    code, _, err = run_cli(capsys, "run", str(path), "--local", *argv)
    assert code == cli.EXIT_INVALID and err.startswith(f"{flag}:") and fix in err


def test_env_from_secrets_cannot_run_locally(capsys, tmp_path):
    doc = manifest("secret", env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
    code, _, err = run_cli(capsys, "run", str(write_manifest(tmp_path, doc)), "--local")
    assert code == cli.EXIT_INVALID
    assert "spec.env[0].valueFrom:" in err and "give TOKEN a literal `value` for local runs" in err


def test_two_jobs_in_one_file_are_refused(capsys, tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(write_manifest(tmp_path, manifest("one")).read_text() + "---\n"
                    + write_manifest(tmp_path, manifest("two")).read_text())
    code, _, err = run_cli(capsys, "run", str(path), "--local")
    assert code == cli.EXIT_INVALID and "holds 2 DDPJobs" in err


def test_a_suspended_job_is_refused_instead_of_waiting_forever(capsys, tmp_path):
    doc = manifest("held", runPolicy={"suspend": True})
    code, _, err = run_cli(capsys, "run", str(write_manifest(tmp_path, doc)), "--local")
    assert code == cli.EXIT_INVALID and err.startswith("spec.runPolicy.suspend:") and "suspend: false" in err
