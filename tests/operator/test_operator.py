"""The real operator (kopf, handlers, kube client over HTTP) against the emulated cluster."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone

import pytest

from ddpjob_operator import model, naming

from .conftest import NAMESPACE, eventually, passes, reconcile_passes, started
from tests.kube_emulator import DDPJOBS, PODS

pytestmark = pytest.mark.timeout(60)


async def test_create_makes_services_store_and_workers(harness, operator):
    job = await harness.apply("digits", checkpoint={"claimTemplate": {"size": "1Gi"}})
    uid = job["metadata"]["uid"]
    workers = await harness.wait_workers("digits", 2)
    assert set(workers) == {"digits-worker-0", "digits-worker-1"}
    store = harness.pods("digits", naming.ROLE_STORE)
    assert set(store) == {"digits-rdzv"}
    for pod in list(workers.values()) + list(store.values()):
        assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
    command = workers["digits-worker-0"]["spec"]["containers"][0]["command"]
    assert f"--rdzv-id={uid}-g0" in command and f"--rdzv-endpoint=digits-rdzv.{NAMESPACE}.svc:29400" in command
    await harness.run_all("digits")
    status = await harness.wait_phase("digits", "Running")
    assert status["readyReplicas"] == 2 and status["worldSize"] == 2 and status["observedGeneration"] == 1
    assert status["selector"] == "elastic.ddp.dev/job-name=digits,elastic.ddp.dev/role=worker"
    assert [r["phase"] for r in status["ranks"]] == ["Running", "Running"]
    await eventually(lambda: any(e["reason"] == "Running" for e in harness.events("digits")), what="event")


FAST_BACKOFF = {"backoff": {"initialSeconds": 0, "maxSeconds": 1}}


async def test_retryable_failure_replaces_only_that_rank(harness, operator):
    await started(harness, "pod-scope", minReplicas=1, failurePolicy={"maxRestarts": 3, **FAST_BACKOFF})
    survivor_uid = harness.pods("pod-scope")["pod-scope-worker-0"]["metadata"]["uid"]
    await harness.exit("pod-scope-worker-1", 137, "OOMKilled")
    await eventually(lambda: harness.pods("pod-scope").get("pod-scope-worker-1", {}).get("metadata", {})
                     .get("labels", {}).get(naming.LABEL_ATTEMPT) == "1", what="the replacement")
    assert harness.pods("pod-scope")["pod-scope-worker-0"]["metadata"]["uid"] == survivor_uid
    status = harness.status("pod-scope")
    # A fresh generation, which the survivor (same pod) joins in place: the status names it by uid.
    assert status["restarts"] == 1 and status["generation"] == 1
    assert (status["ranks"][0]["uid"], status["ranks"][0]["generation"]) == (survivor_uid, 1)
    assert harness.pods("pod-scope")["pod-scope-worker-1"]["metadata"]["labels"][naming.LABEL_GENERATION] == "1"
    rank = status["ranks"][1]
    assert rank["restarts"] == 1 and rank["lastExitCode"] == 137 and rank["lastReason"] == "OOMKilled"
    await harness.run("pod-scope-worker-1")
    await harness.wait_phase("pod-scope", "Running")
    await eventually(lambda: any(e["reason"] == "WorkerFailed" and "exit code 137" in e["message"]
                                 for e in harness.events("pod-scope")), what="a WorkerFailed event")


# test_scenarios' test_user_error_on_all_ranks_fails_at_once_uncharged: every rank fails (the incident, the
# counts); this one: one rank fails while the other runs (cleanPodPolicy stops it, the message's way to the user).
async def test_permanent_failure_fails_the_job(harness, operator):
    await started(harness, "user-error")
    message = "rank 1 (local rank 0) exited with code 2: ValueError: learning rate must be positive"
    await harness.exit("user-error-worker-1", 2, "Error", message)
    status = await harness.wait_phase("user-error", "Failed")
    failed = harness.condition("user-error", "Failed")
    assert failed["reason"] == "PermanentError" and "worker 1" in failed["message"] and "exit code 2" in failed["message"]
    # The launcher's termination message reaches the user: condition, event and the rank's status.
    assert message in failed["message"] and status["ranks"][1]["lastMessage"] == message
    assert status["completionTime"] and status["restarts"] == 0
    # cleanPodPolicy Running: the running worker and the store are stopped, the failed pod is kept.
    await harness.settle("user-error", lambda: set(harness.pods("user-error")) == {"user-error-worker-1"}
                         and harness.pods("user-error", naming.ROLE_STORE) == {}, what="cleanup")
    await eventually(lambda: any(e["type"] == "Warning" and "Failed" in e["message"] and message in e["message"]
                                 for e in harness.events("user-error")), what="a Failed event")


async def test_active_deadline_fails_with_deadline_exceeded(harness, operator):
    await harness.apply("slow", runPolicy={"activeDeadlineSeconds": 1})
    await harness.wait_workers("slow", 2)
    await harness.run_all("slow")
    await harness.wait_phase("slow", "Failed", timeout=8)
    assert harness.condition("slow", "Failed")["reason"] == "DeadlineExceeded"


async def test_a_worker_that_cannot_pull_its_image_fails_the_job(harness, operator):
    await harness.apply("typo", image="trainer:does-not-exist")
    await harness.wait_workers("typo", 2)
    await harness.set_status("typo-worker-0", {"phase": "Pending", "containerStatuses": [
        {"name": naming.TRAINER_CONTAINER, "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": 'Back-off pulling image "trainer:does-not-exist"'}}}]})
    await harness.wait_phase("typo", "Failed", timeout=8)
    failed = harness.condition("typo", "Failed")
    assert failed["reason"] == "ContainerCannotStart" and "spec.image" in failed["message"]
    # Events are posted in the background after the status write.
    await eventually(lambda: any(e["reason"] == "ContainerCannotStart" for e in harness.events("typo")),
                     what="a ContainerCannotStart event")


async def test_success_stops_the_rest_and_honours_ttl(harness, operator):
    await started(harness, "done", runPolicy={"successPolicy": "RankZero", "ttlSecondsAfterFinished": 1})
    await harness.exit("done-worker-0", 0)
    status = await harness.wait_phase("done", "Succeeded")
    assert status["completionTime"]
    await eventually(lambda: harness.job("done") is None, what="TTL deletion")
    await harness.settle("done", lambda: not harness.pods("done") and not harness.pods("done", naming.ROLE_STORE),
                         what="garbage collection (running pods are deleted gracefully)")
    # The operator stopped the running worker 1 before the TTL deleted the job (the API server's order:
    # resourceVersions), not the garbage collector after it; the succeeded worker 0 was left to the TTL.
    def first_rv(resource, name: str, happened) -> int:
        return next(c.rv for c in harness.cluster.history(resource)
                    if c.obj["metadata"]["name"] == name and happened(c))
    deleting = lambda c: c.type == "DELETED" or c.obj["metadata"].get("deletionTimestamp")  # noqa: E731
    job_deleted = first_rv(DDPJOBS, "done", deleting)
    assert first_rv(PODS, "done-worker-1", deleting) < job_deleted
    assert first_rv(PODS, "done-worker-0", deleting) > job_deleted


STATUS_WRITE = (model.GROUP, f"{model.PLURAL}/status", "patch")


@pytest.mark.settings(heartbeat_seconds=1.0)
async def test_the_heartbeat_refreshes_last_reconcile_time_and_leaves_finished_jobs_alone(harness, operator):
    await started(harness, "beat")
    first = await eventually(lambda: harness.status("beat").get("lastReconcileTime"), what="lastReconcileTime")
    # Nothing happens to the job: only the heartbeat (every heartbeat_seconds) writes its status again.
    await eventually(lambda: harness.status("beat").get("lastReconcileTime", "") > first, what="a newer heartbeat")
    for i in range(2):
        await harness.exit(f"beat-worker-{i}", 0)
    await harness.wait_phase("beat", "Succeeded")
    await harness.settle("beat", lambda: not harness.pods("beat", naming.ROLE_STORE), what="the store stopped")
    final, writes = harness.status("beat"), harness.cluster.call_counts[STATUS_WRITE]
    # Reconciled again and again (the 0.5 s resync), more than heartbeat_seconds: the final status stays.
    passes = reconcile_passes(operator)
    await eventually(lambda: reconcile_passes(operator) >= passes + 4 and
                     (datetime.now(timezone.utc) - datetime.fromisoformat(
                         final["lastReconcileTime"].replace("Z", "+00:00"))).total_seconds() > 2.0,
                     what="four more passes, past a heartbeat")
    assert harness.status("beat") == final and harness.cluster.call_counts[STATUS_WRITE] == writes


def _ready(ready: bool) -> dict:
    """A running pod's status as its kubelet writes it, Ready or not (a failing readiness probe)."""
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": c, "state": {"running": {"startedAt": "2026-11-22T00:00:00Z"}}}
                                  for c in (naming.TRAINER_CONTAINER, naming.STORE_CONTAINER)]}


async def _idle(operator, harness, name: str) -> bool:
    """The operator holds the job as the server does now (the echo of its last write delivered) and runs
    no pass: read in the operator's own loop, where its events are handled."""
    async def check() -> bool:
        held = operator.controller.cache.get((NAMESPACE, name))
        return bool(held) and held["metadata"]["resourceVersion"] == \
            harness.job(name)["metadata"]["resourceVersion"] and operator.controller.queue.idle()
    return await operator.in_operator(check())


@pytest.mark.settings(resync_seconds=3600.0)  # no periodic pass: every pass below has a trigger
async def test_the_echo_of_its_own_status_write_triggers_nothing_and_a_burst_is_one_more_pass(harness, operator):
    await started(harness, "echo")
    controller = operator.controller
    passes: list[str] = []
    pod_events: list[str] = []
    gate = threading.Event()
    gate.set()
    reconcile, pod_changed = controller.reconciler.reconcile, controller.pod_changed

    async def counted(key):
        passes.append(key[1])
        while not gate.is_set():  # held: the test sends events meanwhile
            await asyncio.sleep(0.01)
        await reconcile(key)

    def seen(namespace, job_name):
        pod_events.append(job_name)
        pod_changed(namespace, job_name)
    controller.reconciler.reconcile, controller.pod_changed = counted, seen

    async def idle() -> bool:
        return await _idle(operator, harness, "echo")
    await eventually(idle, what="the operator idle")
    passes.clear()

    # One kubelet change: one pass, whose status write (readyReplicas 1) comes back as an event, ignored.
    await harness.set_status("echo-worker-1", _ready(False))
    await eventually(lambda: harness.status("echo").get("readyReplicas") == 1, what="readyReplicas 1")
    await eventually(idle, what="the echo delivered and the operator idle")
    assert passes == ["echo"], passes

    # A burst of events while a pass runs: one more pass covers them all, not one each.
    passes.clear()
    pod_events.clear()
    gate.clear()
    await harness.set_status("echo-worker-1", _ready(True))
    await eventually(lambda: passes == ["echo"], what="a pass under way")
    for i in range(10):  # worker 0 flaps (not ready, ready, ...): ten changes the informer reports
        await harness.set_status("echo-worker-0", _ready(i % 2 == 1))
    await eventually(lambda: len(pod_events) >= 11, what="the operator to receive every event of the burst")
    gate.set()
    await eventually(lambda: harness.status("echo").get("readyReplicas") == 2, what="readyReplicas 2")
    await eventually(idle, what="the operator idle again")
    assert passes == ["echo", "echo"], passes


async def test_stuck_terminating_pod_is_force_deleted_and_replaced(harness, operator):
    await started(harness, "unreachable", minReplicas=1)
    # Both run (Running comes with minReplicas=1 already): an unbound pod would be deleted at once.
    await eventually(lambda: harness.status("unreachable").get("readyReplicas") == 2, what="both workers ready")
    stuck = harness.pods("unreachable")["unreachable-worker-1"]["metadata"]["uid"]
    # The node died: the pod is marked for deletion (here with a 1 s grace period), and its kubelet
    # never confirms. 2 s (FAST.stuck_terminating_seconds) after the grace period it is force-deleted
    # (its replacement may take the name at once: the uid tells them apart).
    code, _ = await harness.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/unreachable-worker-1",
                                    {"gracePeriodSeconds": 1}, "application/json")
    assert code == 200
    await eventually(lambda: harness.pods("unreachable").get("unreachable-worker-1", {}).get("metadata", {})
                     .get("uid") != stuck, timeout=8, what="the stuck worker 1 to be force-deleted")
    await harness.wait_workers("unreachable", 1, generation="1")  # the replacement; the survivor stays
    assert set(harness.pods("unreachable")) == {"unreachable-worker-0", "unreachable-worker-1"}
    assert harness.status("unreachable")["disruptions"] == 1 and harness.status("unreachable")["restarts"] == 0


async def test_deleting_the_job_removes_everything_and_nothing_comes_back(harness, operator):
    await started(harness, "doomed")
    await harness.delete_job("doomed")
    await harness.settle("doomed", lambda: not harness.pods("doomed") and not harness.pods("doomed", naming.ROLE_STORE),
                         what="garbage collection (running pods are deleted gracefully)")
    # The operator forgot the job (its DELETED event) and runs nothing: it cannot recreate anything.
    async def forgotten() -> bool:
        return operator.controller.cache.get((NAMESPACE, "doomed")) is None and operator.controller.queue.idle()
    await eventually(forgotten, what="the operator to forget the job")
    assert not harness.pods("doomed") and not harness.pods("doomed", naming.ROLE_STORE)


async def test_recreating_a_job_while_its_predecessors_pods_terminate_waits_for_them(harness, operator):
    """`kubectl delete ddpj x && kubectl apply -f x.yaml`: the old pods (same names) are still
    terminating, so creating the new ones is a 409 (AlreadyExists, held by an object being deleted):
    not a name conflict that fails the job, a wait; once they are gone the new job's pods come."""
    old = await started(harness, "again")
    await harness.delete_job("again")
    await eventually(lambda: harness.job("again") is None, what="the old job gone")
    await eventually(lambda: len(harness.pods("again")) == 2 and all(
        p["metadata"].get("deletionTimestamp") for p in harness.pods("again").values()),
        what="the old workers terminating (graceful, no kubelet confirmed yet)")
    creates = harness.cluster.call_counts[("", "pods", "create")]
    new = await harness.apply("again")
    # The operator tried (and was refused: the names are held) at least twice; the job waits, unfailed.
    await eventually(lambda: harness.cluster.call_counts[("", "pods", "create")] >= creates + 2,
                     what="the new job's pod creations to be tried again")
    assert harness.status("again").get("phase") in (None, "Pending"), harness.status("again")
    assert harness.condition("again", "Failed") is None
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in harness.pods("again").values()} == \
        {old["metadata"]["uid"]}
    await harness.finish_terminating("again")  # the kubelet confirms: the names are free
    workers = await harness.wait_workers("again", 2)
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in workers.values()} == {new["metadata"]["uid"]}
    await eventually(lambda: harness.pods("again", naming.ROLE_STORE), what="the new store")
    await harness.run_all("again")
    status = await harness.wait_phase("again", "Running")
    assert status["restarts"] == 0 and harness.condition("again", "Failed") is None


async def test_invalid_stored_spec_fails_without_pods(harness, operator):
    # Stored before the CRD schema caught it: put straight into the store, past validation.
    harness.cluster.objects[DDPJOBS, NAMESPACE, "broken"] = {
        "apiVersion": model.API_VERSION, "kind": model.KIND,
        "metadata": {"name": "broken", "namespace": NAMESPACE, "uid": "uid-broken", "generation": 1},
        "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer", "minReplicas": 5}}
    await harness.request("PATCH", harness.job_path("broken"), {"metadata": {"labels": {"poke": "1"}}})
    await harness.wait_phase("broken", "Failed")
    failed = harness.condition("broken", "Failed")
    assert failed["reason"] == "InvalidSpec" and "spec.minReplicas" in failed["message"]
    await passes(operator)
    assert harness.pods("broken") == {} and harness.pods("broken", naming.ROLE_STORE) == {}


# test_scenarios' test_operator_killed_*: the operator dies mid-pass, after its charge is on record; this one:
# it stops cleanly and the failure happens while none runs (first seen in the new operator's initial listing).
async def test_operator_restart_mid_job_duplicates_nothing_and_loses_nothing(harness, operator):
    await started(harness, "survivor", minReplicas=1, failurePolicy={"maxRestarts": 5, **FAST_BACKOFF})
    before = {n: p["metadata"]["uid"] for n, p in harness.pods("survivor").items()}
    await operator.stop()
    await harness.exit("survivor-worker-1", 137)  # fails while no operator runs
    await operator.start()
    await eventually(lambda: harness.pods("survivor").get("survivor-worker-1", {}).get("metadata", {})
                     .get("uid", before["survivor-worker-1"]) != before["survivor-worker-1"], what="replacement")
    await passes(operator)
    pods = harness.pods("survivor")
    assert set(pods) == {"survivor-worker-0", "survivor-worker-1"}
    assert pods["survivor-worker-0"]["metadata"]["uid"] == before["survivor-worker-0"]
    assert harness.status("survivor")["restarts"] == 1 and harness.status("survivor")["generation"] == 1
    assert len(harness.pods("survivor", naming.ROLE_STORE)) == 1


async def test_a_name_held_by_another_object_fails_the_job_naming_it(harness, operator):
    """Job `x`'s names must never be taken for ours: a 409 on an object we do not own is the user's to fix."""
    code, body = await harness.request("POST", f"/api/v1/namespaces/{NAMESPACE}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "taken-rdzv"},
        "spec": {"ports": [{"port": 1}]}}, "application/json")
    assert code < 300, body
    await harness.apply("taken")
    status = await harness.wait_phase("taken", "Failed")
    failed = harness.condition("taken", "Failed")
    assert failed["reason"] == "NameConflict" and "Service taken-rdzv" in failed["message"]
    assert status["restarts"] == 0 and not harness.pods("taken")


async def test_a_volume_that_cannot_be_mounted_fails_the_job_with_the_kubelets_words(harness, operator):
    """FailedMount leaves the pod in ContainerCreating with no message: the operator reads the Event."""
    await harness.apply("mountless", replicas=1)
    pod = (await harness.wait_workers("mountless", 1))["mountless-worker-0"]
    await harness.set_status("mountless-worker-0", {"phase": "Pending", "startTime": "2026-01-01T00:00:00Z",
                                                    "containerStatuses": [{"name": naming.TRAINER_CONTAINER,
                                                                           "state": {"waiting": {
                                                                               "reason": "ContainerCreating"}}}]})
    code, body = await harness.request("POST", f"/api/v1/namespaces/{NAMESPACE}/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "mountless-worker-0.1"}, "type": "Warning",
        "reason": "FailedMount", "message": 'MountVolume.SetUp failed for volume "data" : configmap "cfg" not found',
        "involvedObject": {"kind": "Pod", "namespace": NAMESPACE, "name": "mountless-worker-0",
                           "uid": pod["metadata"]["uid"]}}, "application/json")
    assert code < 300, body
    await harness.wait_phase("mountless", "Failed")
    failed = harness.condition("mountless", "Failed")
    assert failed["reason"] == "VolumeUnavailable" and 'configmap "cfg" not found' in failed["message"]
    assert "template.volumes" in failed["message"]
