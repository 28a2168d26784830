"""Everything the operator creates is a valid Kubernetes object, for every example and option.

The API server would reject an invalid Pod or Service at create time, leaving a half-created
job; kubernetes-validate checks the builders' output against the real Kubernetes OpenAPI schemas.
"""

from pathlib import Path

import kubernetes_validate
import pytest

from ddpjob_operator import job_manifests, model, naming, validation

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

    # Every pod-level and container-level field a user can add (template.podSpec, template.trainer),
    # hostNetwork (the operator's DNS policy and anti-affinity) and gang scheduling.
    from .test_builders import KUBEFLOW_POD_SPEC, KUBEFLOW_TRAINER
    for policy in ({"gangScheduler": "Volcano", "queue": "q", "priorityClass": "p"},
                   {"gangScheduler": "Coscheduling", "scheduleTimeoutSeconds": 60}):
        yield model.DDPJobSpec.model_validate({
            **wire, "resources": {"cpu": "2", "memory": "4Gi"},
            "template": {"podSpec": {**KUBEFLOW_POD_SPEC, "hostNetwork": True, "schedulerName": None,
                                     "dnsPolicy": "ClusterFirstWithHostNet"},  # ClusterFirst cannot resolve peers
                         "trainer": KUBEFLOW_TRAINER, "volumes": [{"name": "data", "emptyDir": {}}],
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}}},
            "runPolicy": {**wire["runPolicy"], "schedulingPolicy": policy},
        })


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_created_object_matches_the_kubernetes_schema(path):
    job = validation.load_jobs(path)[0]
    ref = naming.JobRef(job.metadata.name, "team-a", "0b6f1f0e-8d6c-4a53-9d1e-3f5a2b7c9d10")
    checked = 0
    for spec in _variants(job):
        for manifest in job_manifests.all_manifests(ref, spec):
            if manifest["kind"] == "PodGroup":
                continue  # not a Kubernetes kind: checked below against the schedulers' own fields
            kubernetes_validate.validate(manifest, VERSION, strict=True)
            checked += 1
    assert checked >= 5 * (3 + job.spec.replicas)


# The PodGroup spec fields of scheduling.volcano.sh/v1beta1 and scheduling.x-k8s.io/v1alpha1 (their CRDs).
POD_GROUP_FIELDS = {"scheduling.volcano.sh/v1beta1": {"minMember", "minTaskMember", "queue", "priorityClassName",
                                                      "minResources", "networkTopology"},
                    "scheduling.x-k8s.io/v1alpha1": {"minMember", "minResources", "scheduleTimeoutSeconds"}}


@pytest.mark.parametrize("gang", ["Volcano", "Coscheduling"])
def test_pod_groups_have_only_their_schedulers_fields(gang):
    job = validation.load_jobs(EXAMPLES[0])[0]
    policy = {"gangScheduler": gang, **({"queue": "q", "priorityClass": "p"} if gang == "Volcano"
                                        else {"scheduleTimeoutSeconds": 30})}
    spec = model.DDPJobSpec.model_validate({**job.spec.wire(), "runPolicy": {"schedulingPolicy": policy}})
    group = job_manifests.pod_group(naming.JobRef("j", "ns", "uid"), spec)
    assert set(group["spec"]) <= POD_GROUP_FIELDS[group["apiVersion"]]
    assert isinstance(group["spec"]["minMember"], int)
    assert all(isinstance(v, str) for v in group["spec"]["minResources"].values())
