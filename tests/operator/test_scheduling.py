"""Gang scheduling, the whole pod template and the checkpoint volume, through the real operator against the
emulated cluster: the PodGroup is created (and owned) before any pod, pods reference it, a cluster without
the scheduler's CRD fails the job with a clear message and no pod, and a ReadWriteOnce claim is flagged."""

from __future__ import annotations

import pytest

from ddpjob_operator import model, naming

from .conftest import NAMESPACE, eventually

pytestmark = pytest.mark.timeout(60)

GANGS = {
    "Volcano": ("scheduling.volcano.sh", "v1beta1", "volcano"),
    "Coscheduling": ("scheduling.x-k8s.io", "v1alpha1", "scheduler-plugins-scheduler"),
}


def pod_groups(harness, group: str, version: str) -> dict[str, dict]:
    import kmock
    return {g["metadata"]["name"]: g for g in harness.cluster.live(kmock.resource(group, version, "podgroups"),
                                                                   NAMESPACE)}


@pytest.mark.parametrize("gang", sorted(GANGS))
async def test_pod_group_is_created_owned_and_referenced_by_every_worker(harness, operator, gang):
    harness.cluster.register_pod_groups()
    group, version, scheduler = GANGS[gang]
    job = await harness.apply("gang", replicas=3, minReplicas=2, resources={"cpu": "2", "memory": "4Gi"},
                              runPolicy={"schedulingPolicy": {"gangScheduler": gang}})
    workers = await harness.wait_workers("gang", 3)
    created = pod_groups(harness, group, version)
    assert set(created) == {"gang"}
    assert created["gang"]["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert created["gang"]["spec"]["minMember"] == 2  # minAvailable defaults to minReplicas
    assert created["gang"]["spec"]["minResources"] == {"cpu": "4", "memory": "8Gi"}
    for pod in workers.values():
        assert pod["spec"]["schedulerName"] == scheduler
        if gang == "Volcano":
            assert pod["metadata"]["annotations"][model.VOLCANO_GROUP_ANNOTATION] == "gang"
        else:
            assert pod["metadata"]["labels"][model.COSCHEDULING_GROUP_LABEL] == "gang"
    await harness.run_all("gang")
    await harness.wait_phase("gang", "Running")
    # Owned: deleting the job garbage-collects the PodGroup with the pods.
    await harness.delete_job("gang")
    await eventually(lambda: not pod_groups(harness, group, version), what="the PodGroup to be collected")


@pytest.mark.parametrize("gang", sorted(GANGS))
async def test_a_gang_scheduler_that_is_not_installed_fails_the_job_before_any_pod(harness, operator, gang):
    group, version, _ = GANGS[gang]  # no register_pod_groups(): the cluster has no such CRD
    await harness.apply("nogang", runPolicy={"schedulingPolicy": {"gangScheduler": gang}})
    status = await harness.wait_phase("nogang", "Failed")
    failed = harness.condition("nogang", "Failed")
    assert failed["reason"] == "GangSchedulerNotInstalled"
    for text in (f"gangScheduler is {gang}", f"{group}/{version} PodGroups", "HTTP 404",
                 "remove spec.runPolicy.schedulingPolicy"):
        assert text in failed["message"], failed["message"]
    assert status["message"] == failed["message"]
    await eventually(lambda: any(e["reason"] == "GangSchedulerNotInstalled" and e["type"] == "Warning"
                                 for e in harness.events("nogang")), what="the Warning event")
    # Never a half-created job: neither the store nor any worker was created.
    assert not harness.pods("nogang") and not harness.pods("nogang", naming.ROLE_STORE)


async def test_every_template_field_reaches_the_pods_the_operator_creates(harness, operator):
    from .test_builders import KUBEFLOW_POD_SPEC, KUBEFLOW_TRAINER
    await harness.apply("full", resources={"cpu": "4", "memory": "16Gi"},
                        template={"podSpec": KUBEFLOW_POD_SPEC, "trainer": KUBEFLOW_TRAINER,
                                  "volumes": [{"name": "data", "emptyDir": {}}]})
    workers = await harness.wait_workers("full", 2)
    pod_spec = workers["full-worker-0"]["spec"]
    for key, value in KUBEFLOW_POD_SPEC.items():
        if key != "securityContext":
            assert pod_spec[key] == value, key
    assert pod_spec["securityContext"]["runAsNonRoot"] is True and pod_spec["securityContext"]["fsGroup"] == 1000
    container = pod_spec["containers"][0]
    for key, value in KUBEFLOW_TRAINER.items():
        if key != "resources":
            assert container[key] == value, key
    assert container["resources"]["limits"]["rdma/hca"] == 1
    store = await eventually(lambda: harness.pods("full", naming.ROLE_STORE), what="store pod")
    assert store["full-rdzv"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


@pytest.mark.parametrize("modes, replicas, shared, reason", [
    (["ReadWriteOnce"], 2, "False", "ReadWriteOnce"),
    (["ReadWriteMany"], 2, "True", "ReadWriteMany"),
    (["ReadWriteOnce"], 1, "True", "OneWorker"),
])
async def test_checkpoint_volume_shared_condition(harness, operator, modes, replicas, shared, reason):
    await harness.apply("ckpt", replicas=replicas, checkpoint={"claimTemplate": {"size": "1Gi", "accessModes": modes}})
    found = await eventually(lambda: harness.condition("ckpt", "CheckpointVolumeShared"), what="the condition")
    assert (found["status"], found["reason"]) == (shared, reason)
    if shared == "False":
        assert "Multi-Attach" in found["message"] and "ReadWriteMany" in found["message"]
        await eventually(lambda: any(e["reason"] == "ReadWriteOnce" and e["type"] == "Warning"
                                     for e in harness.events("ckpt")), what="the Warning event")
    await harness.wait_workers("ckpt", replicas)  # a warning, never a failure: the workers are created


def test_init_containers_that_cannot_start_or_fail_are_reported():
    from ddpjob_operator import observations
    pod = {"metadata": {"name": "j-worker-0", "uid": "u", "creationTimestamp": "2026-11-22T00:00:00Z",
                        "labels": {naming.LABEL_ROLE: naming.ROLE_WORKER}},
           "spec": {}, "status": {"phase": "Pending", "startTime": "2026-11-22T00:00:01Z",
                                  "initContainerStatuses": [{"name": "fetch-data", "state": {"waiting": {
                                      "reason": "ImagePullBackOff", "message": "Back-off pulling image \"x\""}}}],
                                  "containerStatuses": [{"name": "trainer", "state": {"waiting": {
                                      "reason": "PodInitializing"}}}]}}
    waiting = observations.summarize_pod(pod).waiting
    assert waiting.reason == "ImagePullBackOff" and waiting.message.startswith("init container fetch-data")
    pod["status"] = {"phase": "Failed", "initContainerStatuses": [{"name": "fetch-data", "state": {
        "terminated": {"exitCode": 3, "reason": "Error"}}}]}
    summary = observations.summarize_pod(pod)
    assert summary.message == "init container fetch-data exited with code 3 (Error)" and summary.exit_code is None
