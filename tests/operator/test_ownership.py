"""Issue 23 (item 3): only pods whose controller ownerReference is the job (uid match, `controller: true`)
are ever counted, reported or charged, as Kubernetes' Job controller decides; labels are anyone's to copy."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import aiohttp
import pytest

from ddpjob_operator import model, naming, observations, progress
from ddpjob_operator.settings import AUTO_PORT

from .conftest import FAST, NAMESPACE, eventually, operator_fixture, started
from tests.kube_emulator import PODS

pytestmark = pytest.mark.timeout(90)
AUDIENCE = progress.DEFAULT_AUDIENCE

operator = operator_fixture(replace(FAST, progress_port=AUTO_PORT, progress_write_seconds=0.2, bind_address="127.0.0.1",
                                    progress_url="http://ddpjob-progress.ddpjob-system.svc:8090"))


def impostor(job: dict, name: str, role: str = naming.ROLE_WORKER, owner: dict | None = None) -> dict:
    """A plain Pod carrying every label of the job's worker 0 (or its store)."""
    meta = job["metadata"]
    labels = {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, naming.LABEL_JOB_UID: meta["uid"],
              naming.LABEL_JOB_NAME: meta["name"], naming.LABEL_ROLE: role,
              naming.LABEL_REPLICA_INDEX: "0", naming.LABEL_GENERATION: "0", naming.LABEL_ATTEMPT: "0"}
    metadata = {"name": name, "namespace": NAMESPACE, "labels": labels}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": naming.TRAINER_CONTAINER, "image": "evil:1"}]}}


async def test_a_pod_the_operator_did_not_create_is_never_a_worker(harness, operator):
    job = await started(harness, "victim", minReplicas=1,
                        failurePolicy={"maxRestarts": 3, "backoff": {"initialSeconds": 0, "maxSeconds": 1}})
    uid = job["metadata"]["uid"]
    # One with the labels only; one that names the job as a non-controlling owner.
    not_controller = {"apiVersion": model.API_VERSION, "kind": model.KIND, "name": "victim", "uid": uid,
                      "controller": False}
    for pod in (impostor(job, "plain"), impostor(job, "adopted", owner=not_controller)):
        await harness.cluster.create(PODS, NAMESPACE, pod)
        await harness.run(pod["metadata"]["name"])
    # A real worker's retryable failure after that: once it is handled, the operator has seen the
    # impostors too (one watch, in order).
    await harness.exit("victim-worker-1", 137, "OOMKilled")
    await eventually(lambda: harness.status("victim").get("restarts") == 1, what="the real failure handled")
    port = operator.controller.progress_server.port
    url = f"http://127.0.0.1:{port}/v1/namespaces/{NAMESPACE}/ddpjobs/victim/progress"
    async with aiohttp.ClientSession() as session:
        for name in ("plain", "adopted"):
            token = harness.cluster.issue_token(NAMESPACE, name, (AUDIENCE,))
            async with session.post(url, json={"step": 5, "rank": 0},
                                    headers={"Authorization": f"Bearer {token}"}) as response:
                assert response.status == 403, (name, await response.text())
    assert harness.status("victim").get("progress") is None
    # Their exit 1 (a permanent error for a worker) charges nothing and fails nothing.
    await harness.exit("plain", 1)
    await harness.exit("adopted", 1)
    await eventually(lambda: harness.pods("victim").get("victim-worker-1", {}).get("status", {}).get("phase")
                     == "Pending", what="the replacement of worker 1")
    await harness.run("victim-worker-1")
    await eventually(lambda: (s := harness.status("victim")).get("phase") == "Failed" or (
        s.get("phase") == "Running" and s.get("readyReplicas") == 2), what="Running again (or Failed)")
    status = harness.status("victim")
    assert status["phase"] == "Running", status.get("conditions")
    assert status["restarts"] == 1 and [i["ranks"] for i in status["incidents"]] == [[1]]
    assert [r["index"] for r in status["ranks"]] == [0, 1] and status["ranks"][0]["restarts"] == 0
    # The operator never touched them: they are not its pods to delete either.
    assert {"plain", "adopted"} <= {p["metadata"]["name"] for p in harness.cluster.live(PODS, NAMESPACE)}


def summary(name: str, role: str, owner: str, phase: str = "Running") -> observations.PodSummary:
    return observations.PodSummary(name=name, uid=f"uid-{name}", role=role, index=0, generation=0, attempt=0,
                                   phase=phase, ready=phase == "Running", exit_code=None, reason=None, message=None,
                                   disruption=False, terminating_since=None, node=None, started_at=None,
                                   finished_at=None, controller_uid=owner)


def test_observations_and_the_progress_lookup_take_only_controlled_pods():
    now = datetime(2026, 11, 25, tzinfo=timezone.utc)
    pods = (summary("job-worker-0", naming.ROLE_WORKER, "job-uid"),
            summary("job-rdzv", naming.ROLE_STORE, "job-uid"),
            summary("fake-worker", naming.ROLE_WORKER, ""),
            summary("fake-store", naming.ROLE_STORE, "other", phase="Failed"))
    observed = observations.observe(pods, now, job_uid="job-uid")
    assert [w.name for w in observed.workers] == ["job-worker-0"]
    assert observed.store is not None and observed.store.phase == "Running"  # not the failed impostor store
    jobs = {("ns", "job"): {"metadata": {"uid": "job-uid"}}}
    index = {("ns", "job-uid"): pods}
    find = lambda name: progress.find_worker_in(index, jobs, "ns", "job", progress.Identity("ns", name, f"uid-{name}"),
                                                naming.ROLE_WORKER)  # noqa: E731
    assert find("job-worker-0") is not None and find("fake-worker") is None
    body = {"metadata": {"name": "p", "labels": {}, "ownerReferences": [
        {"apiVersion": model.API_VERSION, "kind": model.KIND, "name": "job", "uid": "job-uid", "controller": True}]}}
    assert observations.summarize_pod(body).controller_uid == "job-uid"
    body["metadata"]["ownerReferences"][0]["kind"] = "Job"
    assert observations.summarize_pod(body).controller_uid == ""
