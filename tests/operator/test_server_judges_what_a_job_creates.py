"""On a cluster the API server is the judge of what a job may create (issue 31, item 5): the operator has it
dry-run (`dryRun=All`) every object of a new job, and each new generation's pods, before the first is created;
a refusal fails the job quoting the server and naming the DDPJob field, with nothing half-created. Against the
HTTP API emulator, which honours dryRun=All (judges, keeps nothing) and refuses what a test's admission says."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ddpjob_operator import client, kube, model, naming, server_fields

from .conftest import NAMESPACE, Harness, eventually
from tests.kube_emulator import CLAIMS, PODS, SERVICES, api_error
from .test_cli_cluster import ddpjob, kubeconfig, write  # noqa: F401 - kubeconfig is a fixture
from .test_scenarios import creations, nodes, started  # noqa: F401 - nodes is a fixture

pytestmark = pytest.mark.timeout(60)


def _added(harness: Harness, resource: Any, job: str) -> list[str]:
    """Every object of `resource` the server ever stored for the job (ADDED), dry runs never among them."""
    return [c.obj["metadata"]["name"] for c in harness.cluster.history(resource)
            if c.type == "ADDED" and c.obj["metadata"]["name"].startswith(f"{job}-")]


async def test_a_pod_the_server_refuses_fails_the_job_quoting_it_with_nothing_created(harness, operator):
    refusal = ('Pod "judge-worker-1" is invalid: spec.containers[0].image: Invalid value: "trainer:1": images must '
               'come from registry.example.com (admission webhook "images.example.com")')

    def registry_policy(pod: dict[str, Any]) -> Any:
        name = pod["metadata"]["name"]
        return api_error(422, "Invalid", refusal, PODS, name) if name == "judge-worker-1" else None

    harness.cluster.admit_pods = registry_policy
    await harness.apply("judge", checkpoint={"claimTemplate": {"size": "1Gi"}})
    await harness.wait_phase("judge", "Failed")
    failed = harness.condition("judge", "Failed")
    assert failed["reason"] == "PodRejected", failed
    assert refusal in failed["message"] and "(from DDPJob field spec.image)" in failed["message"], failed
    await eventually(lambda: any(refusal[:80] in e.get("message", "") for e in harness.events("judge")),
                     what="an Event quoting the server")
    # Judged whole, created nothing: not the store, not worker 0, not the Services or the checkpoint claim.
    judged = set(harness.cluster.dry_runs)
    assert {("pods", "judge-worker-0"), ("pods", "judge-worker-1"), ("pods", "judge-rdzv"),
            ("persistentvolumeclaims", "judge-checkpoints")} <= judged, judged
    assert not _added(harness, PODS, "judge") and not _added(harness, SERVICES, "judge")
    assert not _added(harness, CLAIMS, "judge")


async def test_a_new_generation_is_judged_before_any_of_its_pods_is_created(harness, operator, nodes):
    refusal = 'Pod "regen-worker-2" is invalid: spec.containers[0].resources.limits: Forbidden: exceeds LimitRange'

    def limit_range(pod: dict[str, Any]) -> Any:
        labels = pod["metadata"]["labels"]
        if labels.get(naming.LABEL_GENERATION) == "1" and labels.get(naming.LABEL_REPLICA_INDEX) == "2":
            return api_error(422, "Invalid", refusal, PODS, pod["metadata"]["name"])
        return None

    await started(harness, nodes, "regen", minReplicas=1, maxReplicas=4)
    harness.cluster.admit_pods = limit_range
    code, body = await harness.scale("regen", 3)
    assert code == 200, body
    # The old generation's kubelets finish their graceful deletions; then generation 1 is judged.
    await eventually(lambda: harness.status("regen").get("phase") == "Failed", what="regen Failed",
                     between=lambda: nodes.confirm("regen"))
    message = harness.condition("regen", "Failed")["message"]
    assert refusal in message and "(from DDPJob field spec.resources (or spec.template.trainer.resources))" in message
    # Generation 1 was judged whole and none of its pods created: workers 0 and 1 only ever of generation 0.
    assert {("pods", f"regen-worker-{i}") for i in range(3)} <= set(harness.cluster.dry_runs[-3:])
    assert creations(harness, "regen") == {"regen-worker-0": 1, "regen-worker-1": 1, "regen-rdzv": 1}


async def test_a_job_the_server_accepts_is_judged_once_per_generation_then_created(harness, operator):
    await harness.apply("fine")
    await harness.wait_workers("fine", 2)
    await eventually(lambda: harness.pods("fine", naming.ROLE_STORE), what="the store pod")
    runs = [name for plural, name in harness.cluster.dry_runs if plural == "pods" and name.startswith("fine-")]
    assert sorted(runs) == ["fine-rdzv", "fine-worker-0", "fine-worker-1"]  # once, not on every reconcile
    assert sorted(_added(harness, PODS, "fine")) == ["fine-rdzv", "fine-worker-0", "fine-worker-1"]


async def test_a_dry_run_is_judged_and_kept_nowhere(harness):
    api = kube.Kube(kube.Connection(harness.url, None, None))
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": NAMESPACE},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        judged = await api.create(pod, dry_run=True)
        assert judged["metadata"]["name"] == "probe" and judged["status"]["phase"] == "Pending"
        assert harness.cluster.get(PODS, NAMESPACE, "probe") is None
        harness.cluster.admit_pods = lambda p: api_error(403, "Forbidden", 'pods "probe" is forbidden: no', PODS,
                                                         "probe")
        with pytest.raises(kube.ApiError, match="forbidden"):
            await api.create(pod, dry_run=True)
    finally:
        await api.close()


@pytest.mark.parametrize("kind, message, field", [
    ("Pod", 'Pod "j-worker-0" is invalid: spec.initContainers[0].image: Required value',
     "spec.template.podSpec.initContainers"),
    ("Pod", 'Pod "j-worker-0" is invalid: spec.containers[0].args[1]: Too long', "spec.args"),
    ("Pod", 'Pod "j-worker-0" is invalid: spec.containers[0].env[0].value: Invalid value', "spec.env"),
    ("Pod", 'Pod "j-worker-0" is invalid: spec.containers[0].ports[0].containerPort: Invalid value',
     "spec.template.trainer"),
    ("Pod", 'Pod "j-worker-0" is invalid: spec.containers[0].volumeMounts[0].subPath: Invalid value',
     "spec.template.volumeMounts"),
    ("Pod", 'Pod "j-worker-0" is invalid: metadata.annotations: Too long: must have at most 262144 bytes',
     "spec.template.annotations"),
    ("Pod", 'Pod "j-worker-0" is invalid: spec.priorityClassName: Invalid value', "spec.template.priorityClassName"),
    ("Pod", 'Pod "j-worker-0" is invalid: spec.dnsConfig.nameservers[0]: Invalid value',
     "spec.template.podSpec.dnsConfig"),
    ("Pod", 'Pod "j-worker-0" is invalid: spec.securityContext.fsGroup: Forbidden', "spec.template.fsGroup"),
    ("PersistentVolumeClaim", 'PersistentVolumeClaim "j-checkpoints" is invalid: spec.storageClassName: Invalid',
     "spec.checkpoint.claimTemplate.storageClassName"),
    ("Pod", 'pods "j-worker-0" is forbidden: exceeded quota: compute', ""),
])
def test_a_refusal_names_the_ddpjob_field_it_came_from(kind, message, field):
    assert server_fields.ddpjob_field(kind, message) == field


async def test_submit_has_the_server_judge_the_job_and_its_pods_before_creating_it(harness, kubeconfig, capsys,
                                                                                   tmp_path):
    refusal = ('admission webhook "policy.example.com" denied the request: '
               'spec.containers[0].securityContext.runAsNonRoot: Required value')
    harness.cluster.admit_pods = lambda pod: api_error(403, "Forbidden", refusal, PODS, pod["metadata"]["name"]) \
        if pod["metadata"]["name"] == "submitted-worker-0" else None
    api = client.Client(namespace=NAMESPACE, connection=kube.Connection(server=harness.url, insecure=True))
    manifest = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": "submitted"},
                "spec": {"replicas": 1, "image": "trainer:1", "entrypoint": "ddp_trainer"}}
    with pytest.raises(client.InvalidManifest) as refused:
        await asyncio.to_thread(api.create, manifest)
    [error] = refused.value.errors
    assert refusal in str(error) and error.path == "ddpjob submitted: spec.template.trainer", error
    assert {("ddpjobs", "submitted"), ("pods", "submitted-rdzv")} <= set(harness.cluster.dry_runs)
    assert harness.job("submitted") is None and not _added(harness, PODS, "submitted")  # nothing created
    # The command says the same, creating none of the file's jobs: the second is judged before the first is made.
    second = {**manifest, "metadata": {"name": "first"}}
    code, _, err = await ddpjob(capsys, "submit", write(tmp_path, second, manifest))
    assert code != 0 and refusal in err and "Traceback" not in err
    assert harness.job("first") is None and harness.job("submitted") is None
    harness.cluster.admit_pods = None
    job = await asyncio.to_thread(api.create, manifest)
    assert job.name == "submitted" and harness.job("submitted") is not None
