"""Invalid manifests are rejected by the model and by the CRD schema, naming the field."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import cli, crd, model

from .schema_checks import RuleDoesNotCompile, api_server_errors, independent_cel, independent_program

ROOT = Path(__file__).resolve().parents[2]
INVALID = sorted((Path(__file__).parent / "invalid").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _expectation(path: Path) -> tuple[str, str]:
    header = path.read_text().splitlines()[0]
    assert header.startswith("# expect: "), f"{path.name} lacks its '# expect: FIELD | TEXT' line"
    field, _, text = header[len("# expect: "):].partition(" | ")
    return field.strip(), text.strip()


def _crd_schema() -> dict:
    return crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_corpus_is_large_enough():
    assert len(INVALID) >= 35


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_ddpjob_validate_names_field_and_fix(path, capsys):
    field, text = _expectation(path)
    assert cli.main(["validate", str(path)]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if f": {field}: " in line]
    assert lines, f"no error for {field} in:\n{err}"
    assert any(text in line for line in lines), f"{text!r} not in {lines}"
    assert "Traceback" not in err


def _crd_rules(node) -> list[str]:
    if isinstance(node, dict):
        return [r["rule"] for r in node.get("x-kubernetes-validations", [])] + \
            [rule for value in node.values() for rule in _crd_rules(value)]
    return [rule for value in node for rule in _crd_rules(value)] if isinstance(node, list) else []


def test_every_crd_rule_compiles_in_the_models_and_an_independent_cel_implementation():
    refused = []
    for rule in _crd_rules(_crd_schema()):
        try:
            independent_program(rule)
        except RuleDoesNotCompile:
            refused.append(("independent", rule))
        try:
            model.base._cel_program(rule)
        except Exception:  # noqa: BLE001 - the library raises plain exceptions for parse errors
            refused.append(("model", rule))
    assert refused == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_crd_schema_rejects_the_same_field(path):
    """The CRD's rules judged by another CEL implementation (celpy) than the model's own."""
    field, _ = _expectation(path)
    errors = api_server_errors(_crd_schema(), yaml.safe_load(path.read_text()), independent_cel)
    assert any(e.startswith(field + ":") or e.startswith(field + "[") or e.startswith(field + ".")
               for e in errors), f"CRD did not reject {field}: {errors}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_valid(path, capsys):
    assert cli.main(["validate", str(path)]) == 0
    assert api_server_errors(_crd_schema(), yaml.safe_load(path.read_text()), independent_cel) == []


def test_examples_cover_cpu_and_gpu():
    jobs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    gpu_flags = {bool(j["spec"].get("resources", {}).get("gpu")) for j in jobs}
    assert gpu_flags == {True, False}


@pytest.mark.parametrize("content, expected", [
    ("spec: [unclosed", "not valid YAML at line 1"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "apiVersion"),
    ("- just\n- a list\n", "a manifest must be a YAML mapping"),
    ("", "no DDPJob in file"),
])
def test_unusable_files_get_a_message_not_a_traceback(tmp_path, content, expected):
    path = tmp_path / "job.yaml"
    path.write_text(content)
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "validate", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == cli.EXIT_INVALID
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_file_is_reported():
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "validate", "/nonexistent.yaml"],
                            capture_output=True, text=True)
    assert result.returncode == cli.EXIT_INVALID
    assert "cannot read /nonexistent.yaml" in result.stderr and "Traceback" not in result.stderr


def test_multi_document_file_reports_each_document(tmp_path):
    good = (ROOT / "examples" / "cpu-digits.yaml").read_text()
    bad = (Path(__file__).parent / "invalid" / "replicas-zero.yaml").read_text()
    path = tmp_path / "both.yaml"
    path.write_text(good + "\n---\n" + bad)
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "validate", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == cli.EXIT_INVALID
    assert "valid DDPJob digits-cpu" in result.stdout
    assert f"{path}#1 (bad-job): spec.replicas: must be >= 1" in result.stderr


def test_a_read_write_once_claim_for_several_workers_is_a_warning_not_an_error(tmp_path):
    job = yaml.safe_load((ROOT / "examples" / "cpu-digits.yaml").read_text())
    job["spec"]["checkpoint"]["claimTemplate"]["accessModes"] = ["ReadWriteOnce"]
    job["spec"]["checkpoint"]["claimTemplate"]["storageClassName"] = "gp2"  # block storage: one node at a time
    path = tmp_path / "rwo.yaml"
    path.write_text(yaml.safe_dump(job))
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "validate", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "valid DDPJob digits-cpu" in result.stdout
    assert f"{path} (digits-cpu): warning: spec.checkpoint.claimTemplate.accessModes: " in result.stderr
    for text in ("Multi-Attach", "ReadWriteMany", "docs/install.md"):
        assert text in result.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_validate_without_warnings(path):
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "validate", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr


def test_the_launchers_fork_switch_is_the_one_ddpjob_variable_users_may_set(tmp_path):
    """DDPJOB_* is the operator's, except DDPJOB_FORK_TRAINER (docs/launch-contract.md)."""
    doc = yaml.safe_load((ROOT / "examples" / "cpu-digits.yaml").read_text())
    doc["spec"]["env"] = [{"name": "DDPJOB_FORK_TRAINER", "value": "0"}]
    path = tmp_path / "fork-off.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", str(path)]) == 0
    assert api_server_errors(_crd_schema(), doc) == []
