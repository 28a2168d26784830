"""A manifest that names no `failurePolicy.recovery` trains in process where survivors keep their pods
(restartScope Pod, the default) and restarts with restartScope All (issue 36, "The default"). A CRD default cannot
depend on another field, so the field is optional and the model resolves it (`FailurePolicy.effective_recovery`);
`ddpjob validate`, `ddpjob render` (the workers' DDPJOB_INPROCESS), the CRD's schema and its CEL rule must agree.

Before: the field defaulted to Restart everywhere, in the model and in the CRD, so every example and `make demo`
took the restart path unless the user found `recovery: InProcess`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import crd, launch, validation

from .schema_checks import api_server_errors

ROOT = Path(__file__).resolve().parents[2]
INPROCESS_ENV = "DDPJOB_INPROCESS"


def manifest(**failure_policy) -> dict:
    spec = {"replicas": 2, "image": "img", "entrypoint": "ddp_trainer"}
    if failure_policy:
        spec["failurePolicy"] = failure_policy
    return {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "j"}, "spec": spec}


def worker_env(doc: dict) -> dict[str, str]:
    spec = validation.parse_job(doc).spec
    return launch.worker_env(spec, job_name="j", namespace="default", index=0, generation=0, endpoint="s:29400",
                             rdzv_id="uid-g0", local_addr="10.0.0.1", master_addr="j-worker-0")


def rendered_inprocess(tmp_path: Path, doc: dict) -> set[str]:
    """DDPJOB_INPROCESS of every worker pod `ddpjob render` prints."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "render", str(path)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    pods = [d for d in yaml.safe_load_all(done.stdout) if d and d.get("kind") == "Pod"
            and "-worker-" in d["metadata"]["name"]]
    assert pods, done.stdout[:2000]
    return {e.get("value") for p in pods for c in p["spec"]["containers"] for e in c.get("env", [])
            if e["name"] == INPROCESS_ENV}


@pytest.mark.parametrize("policy, effective, env, nccl_errors", [
    ({}, "InProcess", "1", "2"),
    ({"restartScope": "Pod"}, "InProcess", "1", "2"),
    ({"restartScope": "All"}, "Restart", "", "1"),
    ({"recovery": "Restart"}, "Restart", "", "1"),
    ({"recovery": "Restart", "restartScope": "All"}, "Restart", "", "1"),
    ({"recovery": "InProcess", "restartScope": "Pod"}, "InProcess", "1", "2"),
])
def test_the_effective_mode_is_resolved_in_one_place_and_reaches_every_worker(policy, effective, env, nccl_errors):
    doc = manifest(**policy)
    assert validation.parse_job(doc).spec.failure_policy.effective_recovery == effective
    got = worker_env(doc)
    assert (got[INPROCESS_ENV], got["TORCH_NCCL_ASYNC_ERROR_HANDLING"]) == (env, nccl_errors)


@pytest.mark.parametrize("policy, valid", [
    ({}, True), ({"restartScope": "All"}, True), ({"recovery": "Restart", "restartScope": "All"}, True),
    ({"recovery": "InProcess"}, True), ({"recovery": "InProcess", "restartScope": "All"}, False),
])
def test_validate_and_the_crd_schema_agree_on_an_omitted_mode(policy, valid):
    doc = manifest(**policy)
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    errors = api_server_errors(schema, doc)
    assert (errors == []) == valid, errors
    if valid:
        validation.parse_job(doc)
        return
    assert any("failurePolicy.recovery" in e and "restartScope: Pod" in e for e in errors), errors
    with pytest.raises(validation.InvalidJob, match="failurePolicy.recovery InProcess needs restartScope: Pod"):
        validation.parse_job(doc)


def test_the_crd_stores_no_default_mode():
    """The API server stores what the user wrote: an omitted mode stays omitted, so a later change of
    restartScope changes the effective mode with it."""
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    policy = schema["properties"]["spec"]["properties"]["failurePolicy"]
    assert "default" not in policy["properties"]["recovery"]
    assert "recovery" not in policy.get("default", {})


def test_render_shows_the_effective_mode(tmp_path: Path):
    assert rendered_inprocess(tmp_path, manifest()) == {"1"}
    assert rendered_inprocess(tmp_path, manifest(restartScope="All")) == {""}


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("examples/**/*.yaml")))
def test_every_example_runs_in_process(path):
    """The examples name no mode: each gets the in-process path (a Hugging Face or Lightning trainer then takes
    the restart path by itself, docs/hf-and-lightning.md)."""
    for doc in yaml.safe_load_all((ROOT / path).read_text()):
        if doc and doc.get("kind") == "DDPJob":
            assert worker_env(doc)[INPROCESS_ENV] == "1", path
