"""Everything the operator creates is a valid Kubernetes object, for every example and option.

The API server would reject an invalid Pod or Service at create time, leaving a half-created
job; kubernetes-validate checks the builders' output against the real Kubernetes OpenAPI schemas.
"""

from pathlib import Path

import kubernetes_validate
import pytest

from ddpjob_operator import builders, model, validation

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
VERSION = kubernetes_validate.latest_version()


def _variants(job: model.DDPJob):
    yield job.spec
    wire = job.spec.wire()
    yield model.DDPJobSpec.model_validate({
        **wire, "replicas": 2, "minReplicas": 2, "maxReplicas": 2,  # static job
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        "template": {"tolerations": [{"key": "team", "operator": "Exists"}],
                     "nodeSelector": {"pool": "train"}, "serviceAccountName": "trainer",
                     "priorityClassName": "high", "labels": {"team": "a"}, "annotations": {"a": "b"},
                     "volumes": [{"name": "data", "emptyDir": {}}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        "nprocPerNode": 2, "resources": {"gpu": True, "gpuCount": 2, "cpu": "8", "memory": "32Gi"},
        "rendezvous": {"storeImage": "pytorch/pytorch:latest"},
    })
    # The user's own node-loss toleration, a short node-loss timeout and a store template of every field.
    yield model.DDPJobSpec.model_validate({
        **wire, "failurePolicy": {**wire["failurePolicy"], "nodeLossTimeoutSeconds": 5},
        "template": {"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                      "effect": "NoExecute", "tolerationSeconds": 900}],
                     "priorityClassName": "high"},
        "rendezvous": {"storeTemplate": {
            "nodeSelector": {"pool": "cpu"}, "priorityClassName": "critical",
            "resources": {"cpu": "250m", "memory": "512Mi"},
            "tolerations": [{"key": "cpu-only", "operator": "Equal", "value": "yes", "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 30},
                            {"operator": "Exists", "effect": "PreferNoSchedule"}]}},
    })


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_created_object_matches_the_kubernetes_schema(path):
    job = validation.load_jobs(path)[0]
    ref = builders.JobRef(job.metadata.name, "team-a", "0b6f1f0e-8d6c-4a53-9d1e-3f5a2b7c9d10")
    checked = 0
    for spec in _variants(job):
        for manifest in builders.all_manifests(ref, spec):
            kubernetes_validate.validate(manifest, VERSION, strict=True)
            checked += 1
    assert checked >= 3 * (3 + job.spec.replicas)
