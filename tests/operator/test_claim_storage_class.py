"""issue 31 item 6: `storageClassName: ""` asks for a volume with no class and must reach the claim as "";
left out, the cluster's default class provisions a new, empty volume and the job trains from step 0."""

import pytest
import yaml

from ddpjob_operator import cli, job_manifests, naming
from ddpjob_operator.validation import parse_job

JOB = naming.JobRef("digits", "team-a", "0b9f6d0e-uid")


def manifest(claim_template: dict) -> dict:
    return {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
            "metadata": {"name": "digits", "namespace": "team-a"},
            "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer",
                     "checkpoint": {"claimTemplate": claim_template}}}


@pytest.mark.parametrize("template, expected", [
    ({"size": "1Gi", "storageClassName": ""}, {"storageClassName": ""}),
    ({"size": "1Gi", "storageClassName": "fast"}, {"storageClassName": "fast"}),
    ({"size": "1Gi"}, {}),
])
def test_the_claim_keeps_an_empty_storage_class_and_omits_an_absent_one(template, expected):
    job = parse_job(manifest(template))
    claim = job_manifests.checkpoint_claim(JOB, job.spec)
    assert {k: v for k, v in claim["spec"].items() if k == "storageClassName"} == expected


def test_render_prints_the_empty_storage_class(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest({"size": "1Gi", "storageClassName": ""})))
    assert cli.main(["render", str(path)]) == 0
    claims = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d and d.get("kind") == "PersistentVolumeClaim"]
    assert [c["spec"].get("storageClassName", "<absent>") for c in claims] == [""]
