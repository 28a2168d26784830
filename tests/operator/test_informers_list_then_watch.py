"""The operator's informers (informer.py): one LIST handed to a view (pods parsed into the summaries a pass
reads), then a WATCH from the list's resourceVersion; `synced` only once everything is listed; a 410 Gone
answered by listing again and swapping the namespace in one step (a job missing from it is forgotten);
only pods their labelled job controls.

The pod index's bookkeeping is table-tested; the informers run against the HTTP API emulator (its list,
its watch, its 410 for a compacted resourceVersion); the last test runs the real operator, whose passes
wait for the first listings."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, AsyncIterator

import aiohttp
import kmock
import pytest
import pytest_asyncio

from ddpjob_operator import job_manifests, kube, model, naming, observations
from ddpjob_operator.handlers import Controller, JobView
from ddpjob_operator.informer import POD_SELECTOR, Informer, PodIndex, PodView, indexed
from ddpjob_operator.metrics import Metrics

from .conftest import FAST, NAMESPACE, Harness, OperatorProcess, assert_within_permissions, eventually, reconcile_passes, \
    started
from tests.kube_emulator import DDPJOBS, PODS, Cluster

JOB_A = naming.JobRef("a", NAMESPACE, "uid-a")
JOB_B = naming.JobRef("b", NAMESPACE, "uid-b")


def pod(job: naming.JobRef, index: int, *, phase: str = "Pending", owner: naming.JobRef | None = None,
        namespace: str = NAMESPACE) -> dict[str, Any]:
    """A worker pod of `job` as the operator makes it (labels and controller ownerReference), or, with
    `owner`, one that carries job's labels but is controlled by another object."""
    labels = {**naming.job_labels(job), naming.LABEL_ROLE: naming.ROLE_WORKER,
              naming.LABEL_REPLICA_INDEX: str(index), naming.LABEL_GENERATION: "0"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": naming.worker_name(job.name, index), "namespace": namespace, "uid": f"p-{index}",
                         "labels": labels, "ownerReferences": [job_manifests.owner_reference(owner or job)]},
            "spec": {"containers": [{"name": naming.TRAINER_CONTAINER, "image": "trainer:1"}]},
            "status": {"phase": phase}}


# ------------------------------------------------------------------ the index (pure)

def put(index: PodIndex, body: dict[str, Any]) -> dict[tuple[str, str], str]:
    return index.put(*indexed(body))


def test_a_pod_is_indexed_under_the_job_that_controls_it_and_changes_name_that_job():
    index = PodIndex()
    assert put(index, pod(JOB_A, 0)) == {(NAMESPACE, "uid-a"): "a"}
    assert put(index, pod(JOB_A, 0)) == {}  # the same summary again: no change, no trigger
    assert put(index, pod(JOB_A, 0, phase="Running")) == {(NAMESPACE, "uid-a"): "a"}
    assert put(index, pod(JOB_A, 1)) == {(NAMESPACE, "uid-a"): "a"}
    assert [p.name for p in index[(NAMESPACE, "uid-a")]] == ["a-worker-0", "a-worker-1"]
    assert index[(NAMESPACE, "uid-a")][0].phase == "Running" and index.pods() == 2


def test_labels_copied_onto_a_pod_another_object_controls_index_nothing():
    index = PodIndex()
    assert put(index, pod(JOB_A, 0, owner=JOB_B)) == {}
    assert len(index) == 0 and index.pods() == 0


def test_a_deleted_pod_leaves_and_its_job_is_still_named_when_it_had_no_other():
    index = PodIndex()
    put(index, pod(JOB_A, 0))
    assert index.put((NAMESPACE, "a-worker-0"), None, "", None) == {(NAMESPACE, "uid-a"): "a"}
    assert (NAMESPACE, "uid-a") not in index and index.pods() == 0
    assert index.put((NAMESPACE, "a-worker-0"), None, "", None) == {}  # gone already


def test_a_pod_taken_over_by_another_controller_leaves_its_job():
    index = PodIndex()
    put(index, pod(JOB_A, 0))
    assert put(index, pod(JOB_A, 0, owner=JOB_B)) == {(NAMESPACE, "uid-a"): "a"}
    assert len(index) == 0


@pytest.mark.parametrize("before, after, changed", [
    ([], [], set()),
    ([(JOB_A, 0, "Pending")], [(JOB_A, 0, "Pending")], set()),
    ([(JOB_A, 0, "Pending")], [(JOB_A, 0, "Running")], {"a"}),
    ([(JOB_A, 0, "Pending"), (JOB_B, 0, "Pending")], [(JOB_B, 0, "Pending")], {"a"}),  # a's pod went away
    ([(JOB_A, 0, "Pending")], [(JOB_A, 0, "Pending"), (JOB_B, 1, "Pending")], {"b"}),
])
def test_a_relisted_namespace_is_swapped_in_and_names_the_jobs_whose_pods_differ(before, after, changed):
    index, listed = PodIndex(), PodIndex()
    for job, i, phase in before:
        put(index, pod(job, i, phase=phase))
    put(index, pod(JOB_A, 5, namespace="team-b"))  # another namespace's: untouched
    for job, i, phase in after:
        put(listed, pod(job, i, phase=phase))
    assert set(index.replace_namespace(NAMESPACE, listed).values()) == changed
    assert {k: [p.phase for p in v] for k, v in index.items() if k[0] == NAMESPACE} == \
        {k: [p.phase for p in v] for k, v in listed.items()}
    assert [p.name for p in index[("team-b", "uid-a")]] == ["a-worker-5"]
    assert index.pods() == len(after) + 1


# ------------------------------------------------------------------ against the API emulator

@dataclasses.dataclass
class Rig:
    cluster: Cluster
    api: kube.Kube
    informer: Informer
    view: PodView
    changes: list[str]
    watches: list[dict[str, str]]  # the parameters of every watch the informer started
    gate: asyncio.Event  # a watch starts only while it is set
    a: naming.JobRef = JOB_A  # the DDPJobs stored (the garbage collector removes pods whose owner is not)
    b: naming.JobRef = JOB_B
    at_gate: int = 0  # watches waiting for the gate

    async def create(self, body: dict[str, Any]) -> None:
        await self.cluster.create(PODS, NAMESPACE, body)

    async def write(self, name: str, status: dict[str, Any]) -> None:
        await self.cluster.write((PODS, NAMESPACE, name), {"status": status})

    def phases(self, job: naming.JobRef) -> dict[str, str]:
        return {p.name: p.phase for p in self.view.index.get((NAMESPACE, job.uid), ())}

    def uid(self, job: naming.JobRef, index: int) -> str:
        return self.cluster.get(PODS, NAMESPACE, naming.worker_name(job.name, index))["metadata"]["uid"]


@pytest_asyncio.fixture()
async def rig(cluster: tuple[Cluster, str]) -> AsyncIterator[Rig]:
    emulator, url = cluster
    api = kube.Kube(kube.Connection(server=url))
    changes: list[str] = []
    view = PodView(lambda namespace, name: changes.append(name))
    informer = Informer(api, kube.PODS, (NAMESPACE,), view, selector=POD_SELECTOR, watch_seconds=1,
                        backoff=(0.05, 0.2))
    rig = Rig(emulator, api, informer, view, changes, [], asyncio.Event())
    rig.gate.set()
    for name in ("a", "b"):
        job = await emulator.create(DDPJOBS, NAMESPACE, {
            "apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name},
            "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer"}})
        setattr(rig, name, naming.JobRef(name, NAMESPACE, job["metadata"]["uid"]))
    watch = api.watch

    async def gated_watch(kind: kube.Kind, namespace: str | None, params: dict[str, str],
                          read_timeout: float) -> AsyncIterator[dict[str, Any]]:
        rig.at_gate += 1
        await rig.gate.wait()
        rig.at_gate -= 1
        rig.watches.append(params)
        async for event in watch(kind, namespace, params, read_timeout):
            yield event
    api.watch = gated_watch  # type: ignore[method-assign]
    yield rig
    await api.close()


async def running(informer: Informer) -> asyncio.Task[None]:
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(informer.synced.wait(), 10)
    return task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_it_lists_every_pod_before_it_says_synced_then_watches_from_the_list(rig):
    await rig.create(pod(rig.a, 0))
    await rig.create(pod(rig.a, 1))
    await rig.create(pod(rig.b, 0, owner=rig.a))  # b's labels, a's pod: not b's, and not a's either
    task = await running(rig.informer)
    try:
        assert rig.phases(rig.a) == {"a-worker-0": "Pending", "a-worker-1": "Pending"}
        assert (NAMESPACE, rig.b.uid) not in rig.view.index and rig.view.index.pods() == 2
        assert rig.changes == []  # the first listing names no job: the job events and a new leader do
        await eventually(lambda: rig.watches, what="the watch")
        assert rig.watches[0]["resourceVersion"] == str(rig.cluster.resource_version)
        assert rig.watches[0]["allowWatchBookmarks"] == "true"

        await rig.write("a-worker-0", {"phase": "Running"})
        await eventually(lambda: rig.phases(rig.a)["a-worker-0"] == "Running", what="the change")
        await rig.create(pod(rig.b, 1))
        await eventually(lambda: rig.phases(rig.b) == {"b-worker-1": "Pending"}, what="the new pod")
        await rig.cluster.remove((PODS, NAMESPACE, "a-worker-1"))
        await eventually(lambda: "a-worker-1" not in rig.phases(rig.a), what="the deletion")
        assert rig.changes == ["a", "b", "a"]

        # The server ends each watch after timeoutSeconds (1 s here): the next resumes where it stopped.
        await eventually(lambda: len(rig.watches) >= 2, 5, "the watch resumed")
        await rig.write("a-worker-0", {"phase": "Succeeded"})
        await eventually(lambda: rig.phases(rig.a)["a-worker-0"] == "Succeeded", what="a change after resuming")
        assert rig.informer.lists == 1  # resumed, never listed again
    finally:
        await stopped(task)


async def test_a_resource_version_too_old_to_resume_from_is_listed_again_and_swapped_in(rig):
    rig.cluster.compact(PODS, keep=4)  # an etcd compacted down to 4 revisions
    await rig.create(pod(rig.a, 0))
    await rig.create(pod(rig.a, 1))
    task = await running(rig.informer)
    try:
        await eventually(lambda: rig.watches, what="the first watch")
        rig.gate.clear()  # the next watch waits: meanwhile more changes than the server keeps
        await eventually(lambda: rig.at_gate == 1, 5, "the open watch to end (timeoutSeconds 1)")
        for phase in ("Running", "Failed"):
            await rig.write("a-worker-0", {"phase": phase})
        await rig.cluster.remove((PODS, NAMESPACE, "a-worker-1"))
        for i in range(3):
            await rig.create(pod(rig.b, i))
        rig.gate.set()
        await eventually(lambda: rig.informer.lists == 2, 5, "the re-list after 410 Gone")
        assert rig.phases(rig.a) == {"a-worker-0": "Failed"}
        assert rig.phases(rig.b) == {f"b-worker-{i}": "Pending" for i in range(3)}
        assert sorted(set(rig.changes)) == ["a", "b"]
        # and it watches on from the new list
        await rig.write("b-worker-0", {"phase": "Running"})
        await eventually(lambda: rig.phases(rig.b)["b-worker-0"] == "Running", what="a change after the re-list")
    finally:
        await stopped(task)


async def test_a_refused_list_is_retried_and_nothing_is_synced_until_it_goes_through(rig):
    await rig.create(pod(rig.a, 0))
    rig.cluster.unavailable_until = time.monotonic() + 0.6  # the API server answers 503 for a while
    task = asyncio.create_task(rig.informer.run())
    try:
        await eventually(lambda: rig.cluster.call_counts[("", "pods", "list")] >= 2, 5, "a retried list")
        assert not rig.informer.synced.is_set() and len(rig.view.index) == 0
        await asyncio.wait_for(rig.informer.synced.wait(), 10)
        assert rig.phases(rig.a) == {"a-worker-0": "Pending"}
    finally:
        await stopped(task)


async def test_a_bookmark_moves_the_version_a_watch_resumes_from_and_an_http_410_lists_again(rig):
    """What the emulator does not send, a real API server does: BOOKMARK events (only a newer
    resourceVersion) and, on some versions, a watch refused with HTTP 410 rather than an ERROR event."""
    asked: list[str] = []
    bookmark = {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                               "metadata": {"resourceVersion": "900"}}}

    async def scripted(kind: kube.Kind, namespace: str | None, params: dict[str, str],
                       read_timeout: float) -> AsyncIterator[dict[str, Any]]:
        asked.append(params["resourceVersion"])
        if len(asked) == 1:
            yield bookmark  # then the server ends the watch (its timeoutSeconds)
        elif len(asked) == 2:
            raise kube.ApiError(410, "Expired", "too old resource version: 900 (1000)")
        else:
            await asyncio.Event().wait()  # an open watch with nothing to say
    rig.api.watch = scripted  # type: ignore[method-assign]
    await rig.create(pod(rig.a, 0))
    task = await running(rig.informer)
    try:
        await eventually(lambda: len(asked) == 3, 5, "a watch from the bookmark, then one after the re-list")
        listed = str(rig.cluster.resource_version)
        assert asked == [listed, "900", listed] and rig.informer.lists == 2
        assert rig.phases(rig.a) == {"a-worker-0": "Pending"}
    finally:
        await stopped(task)


class Recorded:
    """A view that records what an informer hands it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []  # (what, name)

    def begin_listing(self, namespace: str | None) -> None:
        self.seen.append(("begin", namespace or ""))

    def listed(self, namespace: str | None, obj: dict[str, Any]) -> None:
        self.seen.append(("listed", obj["metadata"]["name"]))

    def end_listing(self, namespace: str | None, first: bool) -> None:
        self.seen.append(("end", "first" if first else "again"))

    def watched(self, event_type: str, obj: dict[str, Any]) -> None:
        self.seen.append((event_type, obj["metadata"]["name"]))


async def test_the_job_informer_hands_listings_and_events_to_its_view_and_lists_again_after_410(rig):
    rig.cluster.compact(DDPJOBS, keep=2)
    view = Recorded()
    informer = Informer(rig.api, kube.DDPJOBS, (NAMESPACE,), view, watch_seconds=1, backoff=(0.05, 0.2))
    task = await running(informer)
    try:
        assert view.seen == [("begin", NAMESPACE), ("listed", "a"), ("listed", "b"), ("end", "first")]
        await eventually(lambda: rig.watches, what="the watch")
        await rig.cluster.write((DDPJOBS, NAMESPACE, "a"), {"metadata": {"labels": {"x": "1"}}})
        await eventually(lambda: ("MODIFIED", "a") in view.seen, what="the change")
        rig.gate.clear()
        await eventually(lambda: rig.at_gate == 1, 5, "the open watch to end (timeoutSeconds 1)")
        view.seen.clear()
        await rig.cluster.remove((DDPJOBS, NAMESPACE, "b"))
        for i in range(3):
            await rig.cluster.write((DDPJOBS, NAMESPACE, "a"), {"metadata": {"labels": {"x": str(i)}}})
        rig.gate.set()
        await eventually(lambda: informer.lists == 2, 5, "the re-list after 410 Gone")
        assert view.seen == [("begin", NAMESPACE), ("listed", "a"), ("end", "again")]
    finally:
        await stopped(task)


async def test_a_job_missing_from_a_listing_that_replaces_an_older_one_is_forgotten(rig):
    """The controller's JobView: after a re-list, a job the listing lacks was deleted meanwhile."""
    controller = Controller(rig.api, FAST, Metrics())
    view = JobView(controller)
    jobs = {name: rig.cluster.get(DDPJOBS, NAMESPACE, name) for name in ("a", "b")}
    view.begin_listing(NAMESPACE)
    for body in jobs.values():
        view.listed(NAMESPACE, body)
    view.end_listing(NAMESPACE, first=True)
    assert sorted(controller.cache.keys()) == [(NAMESPACE, "a"), (NAMESPACE, "b")]
    view.begin_listing(NAMESPACE)
    view.listed(NAMESPACE, jobs["a"])
    view.end_listing(NAMESPACE, first=False)
    assert controller.cache.keys() == [(NAMESPACE, "a")]
    await controller.queue.stop()


def test_namespaces_listed_at_the_same_time_keep_their_listings_apart():
    """One informer lists each watched namespace concurrently (watchNamespaces): pages of two listings
    interleave, and each listing replaces only its own namespace's pods."""
    changes: list[tuple[str, str]] = []
    view = PodView(lambda namespace, name: changes.append((namespace, name)))
    job_b = naming.JobRef("b", "team-b", "uid-b")
    view.begin_listing(NAMESPACE)
    view.begin_listing("team-b")
    view.listed(NAMESPACE, pod(JOB_A, 0))
    view.listed("team-b", pod(job_b, 0, namespace="team-b"))
    view.listed(NAMESPACE, pod(JOB_A, 1))
    view.end_listing(NAMESPACE, first=True)
    view.end_listing("team-b", first=True)
    assert [p.name for p in view.index[(NAMESPACE, "uid-a")]] == ["a-worker-0", "a-worker-1"]
    assert [p.name for p in view.index[("team-b", "uid-b")]] == ["b-worker-0"]
    # Re-listed together again, nothing changed: nothing to report.
    view.begin_listing("team-b")
    view.begin_listing(NAMESPACE)
    view.listed("team-b", pod(job_b, 0, namespace="team-b"))
    view.listed(NAMESPACE, pod(JOB_A, 0))
    view.listed(NAMESPACE, pod(JOB_A, 1))
    view.end_listing("team-b", first=False)
    view.end_listing(NAMESPACE, first=False)
    assert changes == [] and view.index.pods() == 3


async def test_jobs_of_namespaces_listed_at_the_same_time_are_all_kept(rig):
    controller = Controller(rig.api, FAST, Metrics())
    view = JobView(controller)
    job_a = rig.cluster.get(DDPJOBS, NAMESPACE, "a")
    elsewhere = {**job_a, "metadata": {**job_a["metadata"], "namespace": "team-b", "uid": "uid-other"}}
    view.begin_listing(NAMESPACE)
    view.begin_listing("team-b")
    view.listed(NAMESPACE, job_a)
    view.listed("team-b", elsewhere)
    view.end_listing(NAMESPACE, first=True)  # team-b's job is not NAMESPACE's to forget
    view.end_listing("team-b", first=True)
    assert sorted(controller.cache.keys()) == [(NAMESPACE, "a"), ("team-b", "a")]
    await controller.queue.stop()


# ------------------------------------------------------------------ the real operator

class SlowPodListing(Cluster):
    """The emulator, answering a LIST of pods only once `pods_listed` is set."""

    async def serve_list(self, request: Any) -> Any:
        if request.resource == PODS:
            await self.pods_listed.wait()
        return await super().serve_list(request)


async def test_no_pass_runs_before_every_pod_is_listed_so_no_listed_job_is_taken_as_having_lost_its_pods():
    """A running job, the operator restarted while its pods' LIST is slow: the job's event (and a new job's)
    arrive, and no pass runs until the list is in; then the running job keeps its pods and the new one starts."""
    async with SlowPodListing() as emulator, kmock.Server(emulator) as server, \
            aiohttp.ClientSession(headers={"User-Agent": "kubectl-test"}) as session:
        emulator.register_resources()
        emulator.pods_listed = asyncio.Event()
        emulator.pods_listed.set()
        url = str(server.url).rstrip("/")
        harness = Harness(emulator, url, session)
        operator = OperatorProcess(url, FAST)
        await operator.start()
        try:
            await started(harness, "steady")
            uids = {name: p["metadata"]["uid"] for name, p in harness.pods("steady").items()}
        finally:
            await operator.stop()

        emulator.pods_listed.clear()
        operator = OperatorProcess(url, FAST)
        await operator.start()
        try:
            await harness.apply("fresh")
            controller = operator.controller

            async def waiting() -> tuple[int, frozenset[Any], bool]:
                return len(controller.queue), controller.queue.running(), controller.synced()
            # Both jobs' events are in and asked for a pass; the queue holds them while the pods are unlisted.
            await eventually(lambda: controller.cache.get((NAMESPACE, "fresh")) and controller.cache.get(
                (NAMESPACE, "steady")), what="both jobs' events")
            assert await operator.in_operator(waiting()) == (2, frozenset(), False)
            assert reconcile_passes(operator) == 0 and not harness.pods("fresh")

            emulator.pods_listed.set()
            await harness.wait_workers("fresh", 2)
            await eventually(lambda: harness.status("fresh").get("phase") == "Pending", what="fresh decided")
            assert {name: p["metadata"]["uid"] for name, p in harness.pods("steady").items()} == uids
            status = harness.status("steady")
            assert status["phase"] == "Running" and status.get("restarts", 0) == 0 and \
                status.get("disruptions", 0) == 0, status
        finally:
            await operator.stop()
        assert_within_permissions(emulator)


def test_the_index_summaries_are_the_stores():
    """What a pass reads of a listed pod is store.summarize_pod's summary of it, nothing of its own."""
    body = pod(JOB_A, 3, phase="Running")
    assert indexed(body)[3] == observations.summarize_pod(body)
