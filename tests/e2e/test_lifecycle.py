"""A real operator on a real cluster: run to Succeeded, survive a killed worker, scale, suspend
and resume, and garbage-collect everything on delete. Needs `make kind-up kind-load helm-install`."""

from __future__ import annotations

import json

import pytest

from ddpjob_operator import crd, model

from . import cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

RESOURCE = f"{model.PLURAL}.{model.GROUP}"
CHECKPOINT_EVERY = 20
# Long enough to kill, scale and suspend it mid-run; each test deletes its namespace at the end.
LONG_RUN = {"args": ["--workload", "digits", "--epochs", "1000", "--batch-size", "32", "--lr", "0.05"]}


def _start_long_job(namespace: str, name: str) -> dict:
    manifest = cluster.example("cpu-digits.yaml", spec_overrides=LONG_RUN)
    manifest["metadata"]["name"] = name
    manifest["spec"]["checkpoint"]["intervalSteps"] = CHECKPOINT_EVERY
    cluster.apply(manifest, namespace)
    cluster.wait_for(lambda: len(cluster.running_workers(namespace, name)) == 2,
                     "2 running workers", timeout=600)
    # Several checkpoints exist once rank 0 has logged a few intervals' worth of steps.
    cluster.wait_for(lambda: cluster.latest_step(cluster.worker_logs(namespace, name)) >= 3 * CHECKPOINT_EVERY,
                     f"training past step {3 * CHECKPOINT_EVERY}", timeout=600)
    return cluster.job(namespace, name)


def _resumed_steps(namespace: str, name: str) -> list[int]:
    return [int(s) for s in cluster.RESUMED_LINE.findall(cluster.worker_logs(namespace, name))]


def _set_suspend(namespace: str, name: str, suspend: bool) -> None:
    patch = json.dumps({"spec": {"runPolicy": {"suspend": suspend}}})
    cluster.kubectl("patch", RESOURCE, name, "-n", namespace, "--type=merge", "-p", patch)


def test_cpu_example_runs_to_succeeded(namespace, operator):
    manifest = cluster.example("cpu-digits.yaml")
    name = manifest["metadata"]["name"]
    cluster.apply(manifest, namespace)
    cluster.wait_condition(namespace, name, "Succeeded", timeout=1200)

    job = cluster.job(namespace, name)
    assert job["status"]["phase"] == "Succeeded"
    assert cluster.condition(job, "Failed") in (None, "False")
    table = cluster.kubectl("get", "ddpj", "-n", namespace).stdout
    # The server prints the CRD's columns of priority 0 (the wide ones only with -o wide), in order.
    columns = crd.build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    header = ["NAME"] + [c["name"].upper() for c in columns if not c.get("priority")]
    assert table.splitlines()[0].split() == header, table
    assert header[:6] == ["NAME", "PHASE", "READY", "DESIRED", "WORLD", "RESTARTS"] and header[-1] == "AGE", header
    assert f"{name} " in table and "Succeeded" in table
    described = cluster.kubectl("describe", "ddpj", name, "-n", namespace).stdout
    assert "Succeeded" in described


def test_killed_worker_is_replaced_and_training_resumes_from_the_checkpoint(namespace, operator):
    name = "digits-kill"
    _start_long_job(namespace, name)
    assert _resumed_steps(namespace, name) == [], "a fresh job must start from scratch"
    victim = next(p for p in cluster.running_workers(namespace, name)
                  if p["metadata"]["name"].endswith("-worker-0"))
    cluster.kubectl("delete", "pod", victim["metadata"]["name"], "-n", namespace,
                    "--grace-period=0", "--force")

    def replaced() -> bool:
        pods = cluster.running_workers(namespace, name)
        return len(pods) == 2 and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods}

    cluster.wait_for(replaced, "a replacement for the killed worker", timeout=600)
    resumed = cluster.wait_for(lambda: _resumed_steps(namespace, name),
                               "training to resume from a checkpoint", timeout=600)
    assert max(resumed) >= CHECKPOINT_EVERY
    cluster.wait_for(lambda: cluster.latest_step(cluster.worker_logs(namespace, name)) > max(resumed),
                     "training to continue past the resumed step", timeout=600)
    assert cluster.condition(cluster.job(namespace, name), "Failed") in (None, "False")


def test_kubectl_scale_up_and_down_within_bounds(namespace, operator):
    name = "digits-scale"
    _start_long_job(namespace, name)

    cluster.kubectl("scale", RESOURCE, name, "-n", namespace, "--replicas=3")
    cluster.wait_for(lambda: len(cluster.running_workers(namespace, name)) == 3,
                     "3 running workers after scale-up", timeout=600)
    cluster.wait_for(lambda: cluster.job(namespace, name)["status"].get("replicas") == 3,
                     "status.replicas == 3", timeout=120)

    beyond = cluster.kubectl("scale", RESOURCE, name, "-n", namespace, "--replicas=4", check=False)
    assert beyond.returncode != 0 and "maxReplicas" in beyond.stderr

    cluster.kubectl("scale", RESOURCE, name, "-n", namespace, "--replicas=1")
    cluster.wait_for(lambda: len(cluster.live_workers(namespace, name)) == 1,
                     "1 worker after scale-down", timeout=600)
    cluster.wait_for(lambda: cluster.job(namespace, name)["status"].get("replicas") == 1,
                     "status.replicas == 1", timeout=120)
    # The surviving worker re-forms a world of one from the newest checkpoint and keeps training.
    cluster.wait_for(lambda: "now 1)" in cluster.worker_logs(namespace, name),
                     "training to resume at world size 1", timeout=600)


def test_suspend_and_resume_from_the_checkpoint(namespace, operator):
    name = "digits-suspend"
    job = _start_long_job(namespace, name)

    _set_suspend(namespace, name, True)
    cluster.wait_condition(namespace, name, "Suspended", timeout=300)
    cluster.wait_for(lambda: not cluster.live_workers(namespace, name), "all workers gone", timeout=300)
    assert cluster.job(namespace, name)["status"]["phase"] == "Suspended"
    claims = [o for o in cluster.owned_objects(namespace, job["metadata"]["uid"])
              if o.startswith("persistentvolumeclaims/")]
    assert claims, "suspend must keep the checkpoint volume"

    _set_suspend(namespace, name, False)
    cluster.wait_for(lambda: len(cluster.running_workers(namespace, name)) == 2,
                     "2 running workers after resume", timeout=600)
    resumed = cluster.wait_for(lambda: _resumed_steps(namespace, name),
                               "training to resume from a checkpoint", timeout=600)
    assert max(resumed) >= 3 * CHECKPOINT_EVERY - CHECKPOINT_EVERY
    assert cluster.condition(cluster.job(namespace, name), "Suspended") != "True"


def test_delete_garbage_collects_every_owned_object(namespace, operator):
    name = "digits-delete"
    job = _start_long_job(namespace, name)
    uid = job["metadata"]["uid"]
    owned = cluster.owned_objects(namespace, uid)
    kinds = {o.split("/")[0] for o in owned}
    assert kinds == {"pods", "services", "persistentvolumeclaims", "configmaps"}, owned  # the agent's ConfigMap

    cluster.kubectl("delete", RESOURCE, name, "-n", namespace, "--timeout=300s", timeout=360)
    cluster.wait_for(lambda: not cluster.owned_objects(namespace, uid),
                     "every owned pod, service, PVC and ConfigMap to be garbage-collected", timeout=300)
    assert cluster.kubectl("get", RESOURCE, name, "-n", namespace, check=False).returncode != 0


@pytest.mark.gpu
def test_gpu_example_runs_to_succeeded_on_gpu_nodes(namespace, operator):
    gpus = cluster.gpu_nodes()
    if not gpus:
        pytest.skip("no node has allocatable nvidia.com/gpu (use hack/kind/gpu.yaml on a GPU host)")
    # One worker using every GPU of the smallest GPU node: NCCL across GPUs, fits any GPU host.
    per_node = min(4, min(gpus.values()))
    manifest = cluster.example("gpu-synthetic.yaml", spec_overrides={
        "replicas": 1, "minReplicas": 1, "maxReplicas": 1, "nprocPerNode": per_node,
        "args": ["--workload", "synthetic", "--epochs", "1", "--precision", "bf16"],
        "resources": {"gpu": True, "cpu": "2", "memory": "8Gi", "sharedMemory": "2Gi"},
    })
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": manifest["spec"]["checkpoint"]["claimName"]},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    cluster.apply(claim, namespace)
    cluster.apply(manifest, namespace)
    name = manifest["metadata"]["name"]
    cluster.wait_condition(namespace, name, "Succeeded", timeout=1500)
    assert cluster.job(namespace, name)["status"]["worldSize"] in (0, per_node)
