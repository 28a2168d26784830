"""The whole pod template, gang scheduling and Kueue-style admission on a real cluster (issue 13).

- a job with an init container, a native sidecar, imagePullSecrets and a restricted security context runs to
  Succeeded (the sidecar does not keep the job Running);
- on nodes that are all tainted, the store pod schedules with the workers' tolerations;
- with a PodGroup CRD installed, the operator creates the job's PodGroup and the pods reference it;
- created suspended with the kueue.x-k8s.io/queue-name label, the job starts when admitted (suspend false),
  checkpoints when preempted (suspend true) and resumes from the checkpoint (suspend false), as Kueue drives it.

Needs `make kind-up kind-load helm-install` (an operator and chart with this change); skipped with the reason
when no cluster is reachable.
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from ddpjob_operator import model, naming

from . import cluster
from .scenario import Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

SIGTERM_EXITS = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nwhile True: time.sleep(1)"


def _server_minor() -> int:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    return int("".join(c for c in version["minor"] if c.isdigit()))


def test_init_container_sidecar_pull_secret_and_security_context_run_to_succeeded(namespace, operator):
    if _server_minor() < 29:
        pytest.skip("native sidecars (init containers with restartPolicy: Always) need Kubernetes 1.29+")
    cluster.kubectl("create", "secret", "docker-registry", "regcred", "-n", namespace,
                    "--docker-server=registry.invalid", "--docker-username=ddpjob", "--docker-password=e2e")
    manifest = digits_job("template-full", max_steps=300)
    image = manifest["spec"]["image"]
    manifest["spec"]["template"] = {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "podSpec": {
            "imagePullSecrets": [{"name": "regcred"}],
            "initContainers": [
                {"name": "fetch-data", "image": image, "imagePullPolicy": "IfNotPresent",
                 "command": ["python", "-c", "open('/data/ready', 'w').write('ok')"],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "log-shipper", "image": image, "imagePullPolicy": "IfNotPresent", "restartPolicy": "Always",
                 "command": ["python", "-c", SIGTERM_EXITS]},
            ],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
        },
        "trainer": {"securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}},
    }
    training = Training(namespace, manifest).start()
    training.wait(lambda: any(p["spec"].get("initContainers") for p in training.pods), "worker pods", 300)
    pod = training.pods[0]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-data", "log-shipper"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert cluster.store_pod(namespace, "template-full")["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    phase, reason, message = training.wait_terminal(timeout=1200)
    assert (phase, reason) == ("Succeeded", "Succeeded"), message
    # The sidecar was running beside the trainer and did not hold the pods (or the job) in Running.
    for pod in cluster.job_pods(namespace, "template-full"):
        assert pod["status"]["phase"] == "Succeeded", pod["metadata"]["name"]
        sidecar = next(s for s in pod["status"].get("initContainerStatuses", []) if s["name"] == "log-shipper")
        assert sidecar.get("started") is not None or "terminated" in sidecar.get("state", {})


def test_the_store_pod_schedules_on_nodes_that_are_all_tainted(namespace, operator):
    taint = f"ddpjob-e2e-{uuid.uuid4().hex[:6]}"
    nodes = [n["metadata"]["name"] for n in cluster.schedulable_nodes()]
    assert nodes, "no schedulable node"
    try:
        for node in nodes:
            cluster.kubectl("taint", "nodes", node, f"{taint}=ml:NoSchedule")
        manifest = digits_job("tainted", max_steps=200, template={
            "tolerations": [{"key": taint, "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]})
        training = Training(namespace, manifest).start()
        store = cluster.wait_for(lambda: (cluster.store_pod(namespace, "tainted") or {}).get("spec", {}).get("nodeName"),
                                 "the store pod to be scheduled on a tainted node", timeout=300,
                                 explain=training.describe)
        assert store in nodes
        training.wait(lambda: training.status.get("phase") == "Running", "the job to run", 600)
    finally:
        for node in nodes:
            cluster.kubectl("taint", "nodes", node, f"{taint}-", check=False)


COSCHEDULING_CRD = "podgroups.scheduling.x-k8s.io"
# The scheduler-plugins PodGroup CRD, reduced to what the API server needs to serve the kind.
MINIMAL_COSCHEDULING_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": COSCHEDULING_CRD},
    "spec": {"group": "scheduling.x-k8s.io", "scope": "Namespaced",
             "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup", "shortNames": ["pg"]},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_with_a_pod_group_crd_the_operator_creates_the_pod_group_and_pods_reference_it(namespace, operator):
    installed_here = cluster.kubectl("get", "crd", COSCHEDULING_CRD, check=False).returncode != 0
    if installed_here:
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(MINIMAL_COSCHEDULING_CRD))
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{COSCHEDULING_CRD}", "--timeout=60s")
    try:
        # No coscheduling scheduler needed to check the wiring: the default scheduler runs the pods.
        manifest = digits_job("gang", max_steps=200, run_policy={
            "activeDeadlineSeconds": 1500, "schedulingPolicy": {"gangScheduler": "Coscheduling",
                                                                "schedulerName": "default-scheduler"}})
        training = Training(namespace, manifest).start()
        job = cluster.job(namespace, "gang")
        group = cluster.wait_for(lambda: cluster.get_json(COSCHEDULING_CRD, "-n", namespace)["items"],
                                 "the job's PodGroup", timeout=120, explain=training.describe)[0]
        assert group["metadata"]["name"] == naming.pod_group_name("gang")
        assert group["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert group["spec"]["minMember"] == 1  # minReplicas of digits_job
        training.wait(lambda: len(training.pods) == 2, "2 worker pods", 300)
        for pod in training.pods:
            assert pod["metadata"]["labels"][model.COSCHEDULING_GROUP_LABEL] == "gang"
        training.wait(lambda: training.status.get("phase") == "Running", "the job to run", 600)
    finally:
        if installed_here:
            cluster.kubectl("delete", "crd", COSCHEDULING_CRD, "--wait=false", check=False)


def test_kueue_admission_and_preemption_through_suspend(namespace, operator):
    """Kueue creates the job suspended, admits it (suspend false), preempts it (suspend true) and admits it again."""
    manifest = digits_job("queued", run_policy={"suspend": True, "activeDeadlineSeconds": 1500,
                                                "cleanPodPolicy": "Running", "successPolicy": "AllWorkers"})
    manifest["metadata"]["labels"] = {model.KUEUE_QUEUE_LABEL: "team-a"}
    training = Training(namespace, manifest).start()
    training.wait(lambda: training.status.get("phase") == "Suspended", "the job to wait suspended", 120)
    assert not training.pods, "a suspended (not yet admitted) job creates no worker"

    cluster.set_suspend(namespace, "queued", False)  # admitted
    reached = training.wait_training()
    cluster.set_suspend(namespace, "queued", True)  # preempted: the workers checkpoint on SIGTERM
    training.wait(lambda: training.status.get("phase") == "Suspended" and not cluster.live_workers(namespace, "queued"),
                  "the workers to be gone", 300)
    claims = [o for o in cluster.owned_objects(namespace, training.job["metadata"]["uid"])
              if o.startswith("persistentvolumeclaims/")]
    assert claims, "suspend keeps the checkpoint volume"

    cluster.set_suspend(namespace, "queued", False)  # admitted again
    resumed = training.wait(lambda: [int(s) for s in cluster.RESUMED_LINE.findall(
        cluster.worker_logs(namespace, "queued"))], "training to resume from the checkpoint", 600)
    assert max(resumed) >= reached - training.interval, (resumed, reached)
