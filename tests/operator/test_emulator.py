"""The API double itself (emulator.py), spoken to over HTTP like a client, and held against watch
traces recorded on a real Kubernetes v1.36.2 control plane (../shared/api-traces beside the checkout).

What the real control plane did in the traces (managedFields, timestamps, uids and
resourceVersions aside; "the kubelet" is the recording's test kubelet, whose pod status writes the
traces' README calls plausible, not authoritative):

graceful-delete: `kubectl delete pod` of a Running worker (terminationGracePeriodSeconds 60):
  1. MODIFIED: metadata.deletionTimestamp (now + 60 s), deletionGracePeriodSeconds 60, generation
     1 -> 2, and nothing else: no DisruptionTarget condition, status untouched (Running, Ready).
  2. MODIFIED, the kubelet (status only): phase Failed, Ready and ContainersReady False, the
     container terminated with 143 (SIGTERM).
  3. MODIFIED, the kubelet's own delete with grace 0: deletionGracePeriodSeconds 0,
     deletionTimestamp moved to the present; generation stays 2.
  4. DELETED: the object of 3 with a resourceVersion of its own.
  The replacement then: ADDED (Pending, generation 1, a new uid), MODIFIED (the scheduler:
  spec.nodeName and PodScheduled in one write), MODIFIED (the kubelet: Running).
evict: POST pods/NAME/eviction on a Running worker:
  1. MODIFIED: a DisruptionTarget condition {status True, reason EvictionByEvictionAPI, message
     "Eviction API: evicting", lastProbeTime null, lastTransitionTime} and nothing else.
  2. MODIFIED: deletionTimestamp, deletionGracePeriodSeconds 60, generation 2 (a graceful delete).
  3-5. as graceful-delete 2-4; the condition stays to the end.
node-down: the node of a Running worker stops answering:
  1. MODIFIED (the node lifecycle controller, ~40 s later): only the Ready condition: status False,
     a new lastTransitionTime; no reason or message; ContainersReady stays True, phase Running.
     No DisruptionTarget and no deletion: every pod tolerates node.kubernetes.io/unreachable and
     not-ready NoExecute for 300 s (DefaultTolerationSeconds admission put that in every pod spec).
  2. MODIFIED, 4 min later, the node back, the kubelet: phase Failed, the container terminated 137
     ContainerStatusUnknown "The container could not be located when the pod was terminated".
  3. MODIFIED: the operator deletes the Failed pod without a grace period: deletionTimestamp now,
     deletionGracePeriodSeconds 0, generation 2: a finished pod is deleted at once...
  4. DELETED ...but still through the MODIFIED of 3, as every deletion in the traces.
kill-two: two workers SIGKILLed: each: MODIFIED (the kubelet: Failed, 137), MODIFIED (the
  operator's delete: grace 0, generation 2), DELETED.
ddpjobs (all four): every MODIFIED changes status fields only (and resourceVersion); generation
  stays 1; managedFields show the operator writes status through the status subresource (manager
  ddpjob-operator, subresource status). The stored spec carries the CRD's structural defaults
  (failurePolicy.backoff.factor, rendezvous.port, template, ...) that the applied manifest
  (last-applied-configuration) left out.
The test kubelet wrote reason PodCompleted into Ready/ContainersReady of Failed pods; a real
kubelet writes PodFailed (kubelet/status/generate.go), so comparisons leave kubelet-written
fields but the phase out.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from ddpjob_operator import crd, model

from .conftest import eventually
from tests.kube_emulator import (CLAIMS, DDPJOBS, NODES, PODS, SERVICES, UNREACHABLE_TAINT, NodeUnreachable)

pytestmark = pytest.mark.timeout(60)

NS = "probe"  # the traces' namespace
# shared/ sits beside the checkout (here and in CI's fresh clone).
TRACES = Path(os.environ.get("DDPJOB_API_TRACES", Path(__file__).resolve().parents[3] / "shared" / "api-traces"))
JOBS = f"/apis/{model.API_VERSION}/namespaces/{NS}/{model.PLURAL}"
POD_LIST = f"/api/v1/namespaces/{NS}/pods"
ABSENT, TIME = "<absent>", "<time>"


# ---------------------------------------------------------------- helpers

def pod_manifest(name: str, *, node: str | None = None, labels: dict[str, str] | None = None,
                 owner: dict[str, Any] | None = None, grace: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "trainer", "image": "trainer:1"}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner_ref(owner)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def job_manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name},
            "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer", **spec}}


async def create(harness, path: str, body: dict[str, Any]) -> dict[str, Any]:
    code, created = await harness.request("POST", path, body, "application/json")
    assert code == 201, created
    return created


async def running_pod(harness, name: str, node: str = "node-1", **kwargs: Any) -> dict[str, Any]:
    pod = await create(harness, POD_LIST, pod_manifest(name, node=node, **kwargs))
    await harness.cluster.kubelet_start(NS, name)
    return harness.cluster.get(PODS, NS, name) or pod


async def delete(harness, path: str, options: dict[str, Any] | None = None) -> tuple[int, Any]:
    return await harness.request("DELETE", path, options or {}, "application/json")


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


async def watch(harness, path: str, until: Callable[[dict[str, Any]], bool], timeout: float = 5,
                **params: str) -> list[dict[str, Any]]:
    """The events of a watch, until one satisfies `until`."""
    events: list[dict[str, Any]] = []
    async with harness.session.get(harness.url + path, params={"watch": "true", **params}) as response:
        assert response.status == 200, await response.text()
        async with asyncio.timeout(timeout):
            async for line in response.content:
                if line.strip():
                    events.append(json.loads(line))
                    if until(events[-1]):
                        break
    return events


def deleted(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda event: event["type"] == "DELETED" and event["object"]["metadata"]["name"] == name


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """{".status.conditions[Ready].status": "True", ...}: lists of conditions, containers etc.
    keyed by their type or name."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{path}.{key}"))
        return out or {path: {}}
    if isinstance(value, list) and value and all(isinstance(i, dict) and ("type" in i or "name" in i) for i in value):
        out = {}
        for item in value:
            out.update(flatten(item, f"{path}[{item.get('type', item.get('name'))}]"))
        return out
    return {path: value}


def is_time(path: str) -> bool:
    return path.rsplit(".", 1)[-1].endswith(("Time", "Timestamp", "At"))


def transitions(events: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Each event as (type, {path: new value}) of what it changed since the event before (the first
    against nothing). A timestamp counts only when it appears (as TIME) or goes: its value depends
    on the clock (the emulator's writes often share a second). resourceVersion and managedFields
    are left out."""
    out, before = [], {}
    for event in events:
        now = {p: (TIME if is_time(p) else v) for p, v in flatten(event["object"]).items()
               if not p.startswith((".metadata.resourceVersion", ".metadata.managedFields"))}
        changed = {p: now.get(p, ABSENT) for p in set(now) | set(before) if now.get(p, ABSENT) != before.get(p, ABSENT)}
        out.append((event["type"], changed))
        before = now
    return out


def trace(scenario: str, kind: str) -> list[dict[str, Any]]:
    """One recorded watch: concatenated JSON objects, one per event."""
    path = TRACES / f"{scenario}-{kind}-events.json"
    if not path.exists():
        pytest.skip(f"no recorded traces at {TRACES} (set DDPJOB_API_TRACES)")
    text, decoder, events, pos = path.read_text(), json.JSONDecoder(), [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return events
        event, pos = decoder.raw_decode(text, pos)
        events.append(event)


def first_life(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """A pod's events from its first ADDED to its first DELETED (its first incarnation)."""
    mine = [e for e in events if e["object"]["metadata"]["name"] == name]
    end = next(i for i, e in enumerate(mine) if e["type"] == "DELETED")
    return mine[:end + 1]


async def recorded_job(harness, scenario: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scenario's DDPJob, created in the emulator as kubectl applied it: (recorded, created)."""
    recorded = trace(scenario, "ddpjobs")[0]["object"]
    applied = json.loads(recorded["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    return recorded, await create(harness, JOBS, applied)


async def recorded_pod(harness, scenario: str, name: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The scenario's pod as the operator created it (its trace's spec), bound and Running."""
    recorded = first_life(trace(scenario, "pods"), name)[0]["object"]
    meta = {"name": name, "labels": recorded["metadata"]["labels"], "ownerReferences": [owner_ref(owner)]}
    await create(harness, POD_LIST, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": recorded["spec"]})
    await harness.cluster.kubelet_start(NS, name)
    return harness.cluster.get(PODS, NS, name)


def after(start: dict[str, Any], events: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The transitions of a watch's events, the first one counted from the object at `start`."""
    return transitions([{"type": "ADDED", "object": start}] + events)[1:]


def assert_same_story(recorded: list[tuple[str, dict[str, Any]]], emulated: list[tuple[str, dict[str, Any]]],
                      writers: list[str]) -> None:
    """Control-plane writes ("api") must change the same fields to the same values; kubelet writes
    ("kubelet") only status, to the same phase."""
    assert [t for t, _ in emulated] == [t for t, _ in recorded]
    for step, (writer, (_, real), (_, ours)) in enumerate(zip(writers, recorded, emulated)):
        if writer == "api":
            assert ours == real, f"step {step + 1}"
        else:
            assert all(p.startswith(".status.") for p in ours), f"step {step + 1}: {sorted(ours)}"
            assert ours.get(".status.phase") == real.get(".status.phase"), f"step {step + 1}"


# ---------------------------------------------------------------- server metadata, conflicts, subresources

async def test_create_fills_server_metadata(harness):
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    pod = await create(harness, POD_LIST, pod_manifest("p", labels={"a": "b"}))
    job = await create(harness, JOBS, job_manifest("j"))
    service = await create(harness, f"/api/v1/namespaces/{NS}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"generateName": "svc-"}, "spec": {}})
    for obj in (pod, job, service):
        meta = obj["metadata"]
        assert meta["namespace"] == NS and len(meta["uid"]) == 36
        assert isinstance(meta["resourceVersion"], str)
        assert parse_time(meta["creationTimestamp"]) >= before
    assert rv(pod) < rv(job) < rv(service)  # one counter for every object, like etcd's revision
    assert pod["metadata"]["generation"] == 1 and job["metadata"]["generation"] == 1
    assert "generation" not in service["metadata"]
    assert service["metadata"]["name"].startswith("svc-") and len(service["metadata"]["name"]) == 9
    assert pod["status"] == {"phase": "Pending"} and "status" not in job
    # Admission: every pod tolerates not-ready and unreachable nodes for 300 s, like in the traces.
    assert [t["key"] for t in pod["spec"]["tolerations"]] == ["node.kubernetes.io/not-ready", UNREACHABLE_TAINT]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30
    code, listed = await harness.request("GET", POD_LIST)
    assert code == 200 and listed["kind"] == "PodList" and int(listed["metadata"]["resourceVersion"]) >= rv(service)


async def test_create_of_an_existing_name_is_already_exists(harness):
    await create(harness, POD_LIST, pod_manifest("twice"))
    code, body = await harness.request("POST", POD_LIST, pod_manifest("twice"), "application/json")
    assert code == 409
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["reason"] == "AlreadyExists"
    assert body["message"] == 'pods "twice" already exists'
    assert body["details"] == {"name": "twice", "kind": "pods"}
    await create(harness, JOBS, job_manifest("twice"))
    code, body = await harness.request("POST", JOBS, job_manifest("twice"), "application/json")
    assert code == 409 and body["message"] == f'{model.PLURAL}.{model.GROUP} "twice" already exists'


async def test_a_stale_resource_version_is_a_conflict(harness):
    job = await create(harness, JOBS, job_manifest("occ"))
    path, stale = f"{JOBS}/occ", job["metadata"]["resourceVersion"]
    code, patched = await harness.request("PATCH", path, {"metadata": {"resourceVersion": stale, "labels": {"a": "1"}}})
    assert code == 200 and rv(patched) > int(stale)
    for method, sub, body in (("PATCH", "", {"metadata": {"resourceVersion": stale}, "spec": {"replicas": 3}}),
                              ("PATCH", "/status", {"metadata": {"resourceVersion": stale}, "status": {"phase": "x"}}),
                              ("PUT", "", {**patched, "metadata": {**patched["metadata"], "resourceVersion": stale}})):
        code, body = await harness.request(method, path + sub, body,
                                           "application/json" if method == "PUT" else "application/merge-patch+json")
        assert code == 409 and body["reason"] == "Conflict", body
        assert body["message"] == (f'Operation cannot be fulfilled on {model.PLURAL}.{model.GROUP} "occ": the object '
                                   "has been modified; please apply your changes to the latest version and try again")
    code, put = await harness.request("PUT", path, {**patched, "spec": {**patched["spec"], "replicas": 3}},
                                      "application/json")
    assert code == 200 and put["spec"]["replicas"] == 3 and put["metadata"]["generation"] == 2


async def test_generation_counts_spec_changes_only(harness):
    job = await create(harness, JOBS, job_manifest("gen"))
    path = f"{JOBS}/gen"
    _, job = await harness.request("PATCH", path + "/status", {"status": {"phase": "Running"}})
    assert job["metadata"]["generation"] == 1
    _, job = await harness.request("PATCH", path, {"metadata": {"labels": {"x": "y"}, "annotations": {"a": "b"}}})
    assert job["metadata"]["generation"] == 1
    _, job = await harness.request("PATCH", path, {"spec": {"replicas": 3}})
    assert job["metadata"]["generation"] == 2
    _, scaled = await harness.request("PATCH", path + "/scale", {"spec": {"replicas": 1}})
    assert scaled["kind"] == "Scale" and scaled["spec"]["replicas"] == 1
    assert harness.cluster.get(DDPJOBS, NS, "gen")["metadata"]["generation"] == 3
    # A write that changes nothing stores nothing: no new resourceVersion, no watch event.
    version = rv(harness.cluster.get(DDPJOBS, NS, "gen"))
    _, same = await harness.request("PATCH", path, {"spec": {"replicas": 1}})
    assert rv(same) == version and same["metadata"]["generation"] == 3


async def test_status_belongs_to_the_status_subresource(harness):
    await create(harness, JOBS, job_manifest("sub"))
    path = f"{JOBS}/sub"
    _, job = await harness.request("PATCH", path + "/status", {"status": {"phase": "Running"}, "spec": {"replicas": 5},
                                                               "metadata": {"labels": {"via": "status"}}})
    assert job["status"]["phase"] == "Running" and job["spec"]["replicas"] == 2
    assert "labels" not in job["metadata"]
    _, job = await harness.request("PATCH", path, {"status": {"phase": "Failed"}, "metadata": {"labels": {"a": "b"}}})
    assert job["status"]["phase"] == "Running" and job["metadata"]["labels"] == {"a": "b"}
    # Pods alike: only the kubelet's status writes change a pod's status.
    await create(harness, POD_LIST, pod_manifest("sp"))
    _, pod = await harness.request("PATCH", f"{POD_LIST}/sp", {"status": {"phase": "Running"}})
    assert pod["status"]["phase"] == "Pending"
    _, pod = await harness.request("PATCH", f"{POD_LIST}/sp/status", {"status": {"phase": "Running"}})
    assert pod["status"]["phase"] == "Running"


async def test_crd_structural_defaults_and_pruning(harness):
    job = await create(harness, JOBS, {**job_manifest("dflt"), "junk": 1,
                                       "status": {"phase": "Made up"}})
    spec = job["spec"]
    assert "junk" not in job and "status" not in job  # pruned; status only through /status
    assert spec["nprocPerNode"] == 1 and spec["failurePolicy"]["backoff"]["factor"] == 2.0
    assert spec["template"] == {"fsGroup": 1000, "terminationGracePeriodSeconds": 60}
    _, job = await harness.request("PATCH", f"{JOBS}/dflt", {"spec": {"unknownField": True,
                                                                       "failurePolicy": {"backoff": None}}})
    assert "unknownField" not in job["spec"]
    assert job["spec"]["failurePolicy"]["backoff"]["initialSeconds"] == 5  # removed, so defaulted again
    _, job = await harness.request("PATCH", f"{JOBS}/dflt/status", {"status": {"phase": "Running", "bogus": 1}})
    assert job["status"] == {"phase": "Running"}  # the schema does not know status.bogus
    # Defaults apply on read too: an object stored before they existed (straight into etcd) shows them.
    harness.cluster.objects[DDPJOBS, NS, "old"] = {**job_manifest("old"), "metadata": {"name": "old", "namespace": NS}}
    code, old = await harness.request("GET", f"{JOBS}/old")
    assert code == 200 and old["spec"]["rendezvous"]["port"] == 29400
    code, body = await harness.request("POST", JOBS, job_manifest("bad", replicas=0), "application/json")
    assert code == 422 and body["reason"] == "Invalid" and "replicas" in body["message"]


async def test_the_operator_tests_jobs_carry_the_crd_defaults(harness):
    """What Harness.apply creates is stored as a real server would store it, defaults included,
    so the operator under test reads the same spec it would read in a cluster."""
    await harness.apply("defaults")
    spec = harness.job("defaults")["spec"]
    properties = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert {k for k, v in properties.items() if "default" in v} <= set(spec)
    assert spec["failurePolicy"]["backoff"] == {"initialSeconds": 5, "maxSeconds": 300, "factor": 2.0}
    assert spec["rendezvous"]["backend"] == "c10d" and spec["runPolicy"]["suspend"] is False


async def test_patch_formats(harness):
    await create(harness, JOBS, job_manifest("fmt"))
    code, job = await harness.request("PATCH", f"{JOBS}/fmt", [{"op": "replace", "path": "/spec/replicas", "value": 3}],
                                      "application/json-patch+json")
    assert code == 200 and job["spec"]["replicas"] == 3
    code, body = await harness.request("PATCH", f"{JOBS}/fmt", {"spec": {"replicas": 1}},
                                       "application/strategic-merge-patch+json")
    assert code == 415 and body["reason"] == "UnsupportedMediaType"


async def test_crd_defaults_are_the_recorded_servers(harness):
    """The spec the real server stored for the applied manifest, default by default. The CRD has
    grown since the recording: every extra field must be one the current schema defaults."""
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for scenario in ("evict", "graceful-delete", "node-down", "kill-two"):
        recorded, created = await recorded_job(harness, scenario)
        real, ours = flatten(recorded["spec"], ".spec"), flatten(created["spec"], ".spec")
        assert {p: ours.get(p, ABSENT) for p in real} == real, scenario
        for path in set(ours) - set(real):
            node, defaulted = schema, False
            for part in path.strip(".").split("."):
                node = (node.get("properties") or {}).get(part) or {}
                defaulted = defaulted or "default" in node
            assert defaulted, f"{scenario}: {path} is neither recorded nor a default"
        await delete(harness, f"{JOBS}/{created['metadata']['name']}")


# ---------------------------------------------------------------- list and watch

async def test_label_selectors_on_list_and_watch(harness):
    for name, labels in (("a", {"app": "x", "role": "worker"}), ("b", {"app": "x"}), ("c", {"app": "y", "role": "s"}),
                         ("d", {})):
        await create(harness, POD_LIST, pod_manifest(name, labels=labels))

    async def names(selector: str) -> list[str]:
        code, listed = await harness.request("GET", f"{POD_LIST}?labelSelector={selector}")
        assert code == 200, listed
        return [p["metadata"]["name"] for p in listed["items"]]
    assert await names("app=x,role") == ["a"]
    assert await names("app==x") == ["a", "b"]
    assert await names("app!=x") == ["c", "d"]  # a missing label is "not equal"
    assert await names("!role") == ["b", "d"]
    assert await names("app in (x,y),role notin (s)") == ["a", "b"]
    assert await names("") == ["a", "b", "c", "d"]
    code, body = await harness.request("GET", f"{POD_LIST}?labelSelector=app%3D%3D%3Dx")
    assert code == 400 and body["reason"] == "BadRequest"

    # A watch with a selector sees an object enter it as ADDED and leave it as DELETED.
    start = rv(harness.cluster.get(PODS, NS, "d"))
    await harness.cluster.write((PODS, NS, "d"), {"metadata": {"labels": {"app": "x"}}})
    await harness.cluster.write((PODS, NS, "d"), {"metadata": {"labels": {"app": "z"}}})
    await harness.cluster.write((PODS, NS, "c"), {"metadata": {"labels": {"role": "t"}}})
    events = await watch(harness, POD_LIST, lambda e: e["type"] == "DELETED", labelSelector="app=x",
                         resourceVersion=str(start))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "d"), ("DELETED", "d")]


async def test_watch_resumes_from_a_resource_version_and_streams_live(harness):
    first = await create(harness, POD_LIST, pod_manifest("w1"))
    await create(harness, POD_LIST, pod_manifest("w2"))
    # From a version: only what came after it, no replay of the current objects.
    events = await watch(harness, POD_LIST, lambda e: True, resourceVersion=first["metadata"]["resourceVersion"])
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "w2")]
    # Without one: the current objects as ADDED, then changes as they happen.
    seen: list[dict[str, Any]] = []
    live = asyncio.create_task(watch(harness, POD_LIST, lambda e: seen.append(e) or deleted("w1")(e)))
    await eventually(lambda: len(seen) == 2, what="the initial ADDED events")
    await delete(harness, f"{POD_LIST}/w1")  # unscheduled: deleted at once
    events = await live
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "w1"), ("ADDED", "w2"), ("MODIFIED", "w1"), ("DELETED", "w1")]
    assert rv(events[-1]["object"]) > rv(events[-2]["object"])  # a deletion has a version of its own
    # A version older than the kept history (compacted) is 410 Gone, as an ERROR event.
    harness.cluster.compact(PODS, keep=2)
    [error] = await watch(harness, POD_LIST, lambda e: True, resourceVersion=first["metadata"]["resourceVersion"])
    assert error["type"] == "ERROR" and error["object"]["code"] == 410 and error["object"]["reason"] == "Expired"
    # A watch ends after timeoutSeconds, as on a real server.
    async with asyncio.timeout(5):
        assert await watch(harness, POD_LIST, lambda e: False, resourceVersion=str(rv(events[-1]["object"])),
                           timeoutSeconds="1") == []


async def test_field_selectors(harness):
    await running_pod(harness, "on-1", node="node-1")
    await running_pod(harness, "on-2", node="node-2")
    code, listed = await harness.request("GET", f"{POD_LIST}?fieldSelector=spec.nodeName%3Dnode-2")
    assert [p["metadata"]["name"] for p in listed["items"]] == ["on-2"]
    code, listed = await harness.request(
        "GET", f"{POD_LIST}?fieldSelector=metadata.name!%3Don-2,status.phase%3DRunning")
    assert [p["metadata"]["name"] for p in listed["items"]] == ["on-1"]
    code, body = await harness.request("GET", f"{POD_LIST}?fieldSelector=spec.foo%3Dx")
    assert code == 400 and body["message"] == "field label not supported: spec.foo"


# ---------------------------------------------------------------- deletion and garbage collection

async def test_graceful_deletion_of_pods(harness):
    pod = await running_pod(harness, "g", grace=45)
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    code, body = await delete(harness, f"{POD_LIST}/g")
    after = datetime.datetime.now(datetime.timezone.utc)
    assert code == 200 and body["kind"] == "Pod"
    meta = harness.cluster.get(PODS, NS, "g")["metadata"]
    ends = parse_time(meta["deletionTimestamp"])
    assert meta["deletionGracePeriodSeconds"] == 45 and meta["generation"] == 2
    # The grace period counted from the moment of the deletion (between the two readings, whole seconds).
    grace = datetime.timedelta(seconds=45)
    assert before + grace <= ends <= after + grace, (before, ends, after)
    # Again: nothing changes while the grace period runs; a longer one does not extend it.
    version = rv(harness.cluster.get(PODS, NS, "g"))
    await delete(harness, f"{POD_LIST}/g", {"gracePeriodSeconds": 100})
    assert rv(harness.cluster.get(PODS, NS, "g")) == version
    # A shorter one is taken; the uid precondition must name this incarnation.
    code, body = await delete(harness, f"{POD_LIST}/g", {"gracePeriodSeconds": 0, "preconditions": {"uid": "other"}})
    assert code == 409 and body["reason"] == "Conflict" and body["message"] == (
        f'Operation cannot be fulfilled on pods "g": Precondition failed: UID in precondition: other, '
        f'UID in object meta: {pod["metadata"]["uid"]}')
    code, _ = await delete(harness, f"{POD_LIST}/g",
                           {"gracePeriodSeconds": 0, "preconditions": {"uid": pod["metadata"]["uid"]}})
    assert code == 200 and harness.cluster.get(PODS, NS, "g") is None
    code, body = await delete(harness, f"{POD_LIST}/g")
    assert code == 404 and body["message"] == 'pods "g" not found'

    # Gone at once: a finished pod, a pod no kubelet runs; also with the grace period in the query.
    await running_pod(harness, "done")
    await harness.cluster.kubelet_exit(NS, "done", 0)
    await create(harness, POD_LIST, pod_manifest("unbound"))
    await running_pod(harness, "query")
    for name, query in (("done", ""), ("unbound", ""), ("query", "?gracePeriodSeconds=0")):
        code, body = await harness.request("DELETE", f"{POD_LIST}/{name}{query}")
        assert code == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 0, name
        assert harness.cluster.get(PODS, NS, name) is None, name

    # A custom resource has no grace period: gone at once, answered with a Status.
    await create(harness, JOBS, job_manifest("cr"))
    code, body = await delete(harness, f"{JOBS}/cr")
    assert code == 200 and body["kind"] == "Status" and body["status"] == "Success"


async def test_finalizers_hold_a_deletion(harness):
    await create(harness, JOBS, {**job_manifest("held"), "metadata": {"name": "held", "finalizers": ["x/y"]}})
    await delete(harness, f"{JOBS}/held")
    job = harness.cluster.get(DDPJOBS, NS, "held")
    assert job["metadata"]["deletionTimestamp"] and job["metadata"]["deletionGracePeriodSeconds"] == 0
    assert job["metadata"]["generation"] == 2
    await harness.request("PATCH", f"{JOBS}/held", {"metadata": {"finalizers": None}})
    assert harness.cluster.get(DDPJOBS, NS, "held") is None


async def test_garbage_collection_in_the_background_and_recursively(harness):
    job = await create(harness, JOBS, job_manifest("owner"))
    await create(harness, f"/api/v1/namespaces/{NS}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim", "ownerReferences": [owner_ref(job)]}, "spec": {}})
    await create(harness, f"/api/v1/namespaces/{NS}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "ownerReferences": [owner_ref(job)]},
        "spec": {}})
    pending = await create(harness, POD_LIST, pod_manifest("pending", owner=job))
    running = await running_pod(harness, "running", owner=job)
    # Dependents of dependents: a service owned by the running pod, one owned by the pending pod.
    for name, owner in (("of-running", running), ("of-pending", pending)):
        await create(harness, f"/api/v1/namespaces/{NS}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "ownerReferences": [owner_ref(owner)]},
            "spec": {}})
    # Two owners, one of which stays: the object stays and loses the reference to the other.
    keeper = await create(harness, JOBS, job_manifest("keeper"))
    await create(harness, f"/api/v1/namespaces/{NS}/services", {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "shared", "ownerReferences": [owner_ref(job), {**owner_ref(keeper), "controller": False}]},
        "spec": {}})

    await delete(harness, f"{JOBS}/owner", {"propagationPolicy": "Background"})
    cluster = harness.cluster
    await eventually(lambda: cluster.get(CLAIMS, NS, "claim") is None and cluster.get(SERVICES, NS, "svc") is None
                     and cluster.get(PODS, NS, "pending") is None and cluster.get(SERVICES, NS, "of-pending") is None,
                     what="the garbage collector")
    # A running pod is deleted gracefully, as any delete does: Terminating until its kubelet is done,
    # and what it owns stays until then.
    assert cluster.get(PODS, NS, "running")["metadata"]["deletionGracePeriodSeconds"] == 30
    assert cluster.get(SERVICES, NS, "of-running") is not None
    assert [r["name"] for r in cluster.get(SERVICES, NS, "shared")["metadata"]["ownerReferences"]] == ["keeper"]
    await cluster.kubelet_finish(NS, "running")
    await eventually(lambda: cluster.get(PODS, NS, "running") is None
                     and cluster.get(SERVICES, NS, "of-running") is None, what="the running pod and its dependents")
    code, body = await delete(harness, f"{JOBS}/keeper", {"propagationPolicy": "Foreground"})
    assert code == 501  # not emulated: a test must not believe it works


# ---------------------------------------------------------------- eviction and disruption conditions

async def test_the_eviction_subresource(harness):
    pod = await running_pod(harness, "ev", grace=60)
    start = rv(pod)
    code, body = await harness.request("POST", f"{POD_LIST}/ev/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "ev", "namespace": NS}},
        "application/json")
    assert code == 201
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    events = await watch(harness, POD_LIST, lambda e: "deletionTimestamp" in e["object"]["metadata"],
                         resourceVersion=str(start))
    condition = events[0]["object"]["status"]["conditions"][-1]
    assert condition["type"] == "DisruptionTarget" and condition["status"] == "True"
    assert (condition["reason"], condition["message"]) == ("EvictionByEvictionAPI", "Eviction API: evicting")
    assert "deletionTimestamp" not in events[0]["object"]["metadata"]  # the condition first, in a write of its own
    assert events[1]["object"]["metadata"]["deletionGracePeriodSeconds"] == 60 and len(events) == 2
    code, body = await harness.request("POST", f"{POD_LIST}/ev/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}}, "application/json")
    assert code == 400 and body["message"] == "name in URL does not match name in Eviction object"
    code, body = await harness.request("POST", f"{POD_LIST}/nope/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "nope"}}, "application/json")
    assert code == 404 and body["message"] == 'pods "nope" not found'


def conditions_of(pod: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions", ())}


def disruption(pod: dict[str, Any]) -> tuple[str, str, str] | None:
    return next(((c["status"], c["reason"], c["message"]) for c in pod["status"].get("conditions", ())
                 if c["type"] == "DisruptionTarget"), None)


async def test_disruption_target_as_the_control_plane_writes_it(harness):
    cluster = harness.cluster
    await running_pod(harness, "preempted")
    await cluster.preempt(NS, "preempted")
    pod = cluster.get(PODS, NS, "preempted")
    assert disruption(pod) == ("True", "PreemptionByScheduler",
                               "default-scheduler: preempting to accommodate a higher priority pod")
    assert pod["metadata"]["deletionTimestamp"] and pod["status"]["phase"] == "Running"

    await running_pod(harness, "tainted")
    await cluster.taint_manager_evict(NS, "tainted")
    pod = cluster.get(PODS, NS, "tainted")
    assert disruption(pod) == ("True", "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 30

    # The kubelet: the condition arrives in the same write as the Failed phase; the pod stays.
    for name, reason, message in (
            ("pressured", "Evicted", "The node was low on resource: memory. "),
            ("shutdown", "Terminated", "Pod was terminated in response to imminent node shutdown.")):
        start = rv(await running_pod(harness, name))
        await cluster.kubelet_terminate(NS, name, reason)
        [event] = await watch(harness, f"{POD_LIST}", lambda e: True, resourceVersion=str(start))
        status = event["object"]["status"]
        assert (status["phase"], status["reason"], status["message"]) == ("Failed", reason, message)
        assert disruption(event["object"]) == ("True", "TerminationByKubelet", message)
        assert "deletionTimestamp" not in event["object"]["metadata"]
        ready = {c["type"]: (c["status"], c.get("reason")) for c in status["conditions"]}
        assert ready["Ready"] == ready["ContainersReady"] == ("False", "PodFailed")


# ---------------------------------------------------------------- nodes

async def test_a_node_going_down_and_coming_back(harness):
    cluster = harness.cluster
    node = await cluster.add_node("n1")
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]} == {
        "MemoryPressure": "False", "DiskPressure": "False", "PIDPressure": "False", "Ready": "True"}
    await running_pod(harness, "on-n1", node="n1", grace=5)
    await running_pod(harness, "also-on-n1", node="n1")
    await running_pod(harness, "elsewhere", node="n2")

    await cluster.node_down("n1")
    code, node = await harness.request("GET", "/api/v1/nodes/n1")
    assert code == 200
    for condition in node["status"]["conditions"]:
        assert (condition["status"], condition["reason"], condition["message"]) == (
            "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
    assert [(t["key"], t["effect"]) for t in node["spec"]["taints"]] == [
        (UNREACHABLE_TAINT, "NoSchedule"), (UNREACHABLE_TAINT, "NoExecute")]
    assert all(t["timeAdded"] for t in node["spec"]["taints"])
    conditions = conditions_of(cluster.get(PODS, NS, "on-n1"))
    assert conditions["Ready"] == "False" and conditions["ContainersReady"] == "True"
    assert cluster.get(PODS, NS, "on-n1")["status"]["phase"] == "Running"
    assert conditions_of(cluster.get(PODS, NS, "elsewhere"))["Ready"] == "True"

    # No kubelet answers for the node's pods: a graceful deletion hangs, Terminating...
    for act in (lambda: cluster.kubelet_exit(NS, "on-n1", 1), lambda: cluster.kubelet_terminate(NS, "on-n1"),
                lambda: cluster.kubelet_start(NS, "on-n1")):
        with pytest.raises(NodeUnreachable):
            await act()
    await cluster.taint_manager_evict(NS, "on-n1")  # what happens 300 s later
    with pytest.raises(NodeUnreachable):
        await cluster.kubelet_finish(NS, "on-n1")
    pod = cluster.get(PODS, NS, "on-n1")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 5 and disruption(pod)[1] == "DeletionByTaintManager"
    # ...until someone deletes it with grace 0.
    code, _ = await delete(harness, f"{POD_LIST}/on-n1", {"gracePeriodSeconds": 0})
    assert code == 200 and cluster.get(PODS, NS, "on-n1") is None

    await cluster.node_up("n1")
    node = cluster.get(NODES, None, "n1")
    assert {c["type"]: c["reason"] for c in node["status"]["conditions"]}["Ready"] == "KubeletReady"
    assert "taints" not in node["spec"]
    await cluster.kubelet_start(NS, "also-on-n1")  # its containers survived: Ready again
    assert conditions_of(cluster.get(PODS, NS, "also-on-n1"))["Ready"] == "True"


# ---------------------------------------------------------------- the recorded traces

async def test_graceful_delete_as_recorded(harness):
    recorded = transitions(first_life(trace("graceful-delete", "pods"), "graceful-delete-worker-1"))
    _, job = await recorded_job(harness, "graceful-delete")
    pod = await recorded_pod(harness, "graceful-delete", "graceful-delete-worker-1", job)
    start = rv(pod)
    deleting = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    await delete(harness, f"{POD_LIST}/graceful-delete-worker-1", {"propagationPolicy": "Background"})  # kubectl's
    deleted_by = datetime.datetime.now(datetime.timezone.utc)
    finishing = deleted_by.replace(microsecond=0)
    await harness.cluster.kubelet_finish(NS, "graceful-delete-worker-1", 143)
    finished_by = datetime.datetime.now(datetime.timezone.utc)
    events = await watch(harness, POD_LIST, deleted("graceful-delete-worker-1"), resourceVersion=str(start),
                         fieldSelector="metadata.name=graceful-delete-worker-1")
    assert_same_story(recorded[1:], after(pod, events), ["api", "kubelet", "api", "api"])
    assert not any("DisruptionTarget" in p for _, changed in recorded for p in changed)  # none on a plain delete

    # The kubelet's grace-0 delete moves deletionTimestamp from the end of the grace period to now.
    def marks(history: list[dict]) -> list[datetime.datetime]:
        return [parse_time(e["object"]["metadata"]["deletionTimestamp"]) for e in history
                if e["type"] == "MODIFIED" and "deletionTimestamp" in e["object"]["metadata"]]
    # The real server's (recorded): its kubelet confirmed a few seconds into the 60 s grace period.
    recorded_marks = marks(first_life(trace("graceful-delete", "pods"), "graceful-delete-worker-1"))
    assert datetime.timedelta(seconds=55) <= recorded_marks[0] - recorded_marks[-1] <= datetime.timedelta(seconds=61)
    # The emulator's: the end of the grace period counted from the delete, then the moment of the kubelet's
    # delete (each between the readings around its call, whole seconds).
    grace = datetime.timedelta(seconds=60)
    emulated = marks(events)
    assert deleting + grace <= emulated[0] <= deleted_by + grace, (deleting, emulated, deleted_by)
    assert finishing <= emulated[-1] <= finished_by, (finishing, emulated, finished_by)


async def test_eviction_as_recorded(harness):
    recorded = transitions(first_life(trace("evict", "pods"), "evict-worker-1"))
    _, job = await recorded_job(harness, "evict")
    pod = await recorded_pod(harness, "evict", "evict-worker-1", job)
    start = rv(pod)
    code, _ = await harness.request("POST", f"{POD_LIST}/evict-worker-1/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "evict-worker-1", "namespace": NS}},
        "application/json")
    assert code == 201
    await harness.cluster.kubelet_finish(NS, "evict-worker-1", 143)
    events = await watch(harness, POD_LIST, deleted("evict-worker-1"), resourceVersion=str(start),
                         fieldSelector="metadata.name=evict-worker-1")
    assert_same_story(recorded[1:], after(pod, events), ["api", "api", "kubelet", "api", "api"])


async def test_node_down_as_recorded(harness):
    recorded = transitions(first_life(trace("node-down", "pods"), "node-down-worker-1"))
    _, job = await recorded_job(harness, "node-down")
    pod = await recorded_pod(harness, "node-down", "node-down-worker-1", job)
    await harness.cluster.add_node(pod["spec"]["nodeName"])
    start = rv(pod)
    await harness.cluster.node_down(pod["spec"]["nodeName"])
    await harness.cluster.node_up(pod["spec"]["nodeName"])
    await harness.cluster.kubelet_exit(NS, "node-down-worker-1", 137, "ContainerStatusUnknown",
                                       "The container could not be located when the pod was terminated")
    await delete(harness, f"{POD_LIST}/node-down-worker-1")  # the operator, no grace period: a Failed pod
    events = await watch(harness, POD_LIST, deleted("node-down-worker-1"), resourceVersion=str(start),
                         fieldSelector="metadata.name=node-down-worker-1")
    assert_same_story(recorded[1:], after(pod, events), ["api", "kubelet", "api", "api"])


async def test_killed_workers_as_recorded(harness):
    recorded = transitions(first_life(trace("kill-two", "pods"), "kill-two-worker-2"))
    _, job = await recorded_job(harness, "kill-two")
    pod = await recorded_pod(harness, "kill-two", "kill-two-worker-2", job)
    start = rv(pod)
    await harness.cluster.kubelet_exit(NS, "kill-two-worker-2", 137)
    # The operator's delete names the pod's uid, so that it never deletes a replacement.
    await delete(harness, f"{POD_LIST}/kill-two-worker-2", {"preconditions": {"uid": pod["metadata"]["uid"]}})
    events = await watch(harness, POD_LIST, deleted("kill-two-worker-2"), resourceVersion=str(start),
                         fieldSelector="metadata.name=kill-two-worker-2")
    assert_same_story(recorded[1:], after(pod, events), ["kubelet", "api", "api"])


@pytest.mark.parametrize("scenario", ["evict", "graceful-delete", "node-down", "kill-two"])
async def test_the_operators_status_writes_as_recorded(harness, scenario):
    """The recorded statuses, written through /status as the operator wrote them: each write is
    one MODIFIED that changes the same status fields (nothing pruned, nothing else touched)."""
    events = trace(scenario, "ddpjobs")
    recorded = transitions(events)
    assert all(t == "MODIFIED" and all(p.startswith(".status.") for p in changed) for t, changed in recorded[1:])
    assert {e["object"]["metadata"]["generation"] for e in events} == {1}
    _, job = await recorded_job(harness, scenario)
    path, before = f"{JOBS}/{job['metadata']['name']}/status", {}
    for event in events:
        status = event["object"]["status"]
        patch = {**{k: None for k in before if k not in status}, **status}
        code, written = await harness.request("PATCH", path, {"status": patch})
        assert code == 200 and written["status"] == status
        before = status
    seen: list[dict[str, Any]] = []
    ours = await watch(harness, JOBS, lambda e: seen.append(e) or len(seen) == len(events),
                       resourceVersion=str(rv(job)))
    assert ours[-1]["object"]["status"] == before
    assert all(e["object"]["metadata"]["generation"] == 1 and e["object"]["spec"] == job["spec"] for e in ours)
    assert transitions([{"type": "ADDED", "object": job}] + ours)[2:] == recorded[1:]
