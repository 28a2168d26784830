"""Fixtures: an emulated cluster (kmock over HTTP), the real operator (kopf) on it, a kubelet."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import kmock
import pytest
import pytest_asyncio

from ddpjob_operator import model, naming, permissions
from ddpjob_operator.kube import Connection
from ddpjob_operator.run import run_operator
from ddpjob_operator.settings import Settings

from tests.kube_emulator import DDPJOBS, PODS, Cluster

NAMESPACE = "team-a"
FAST = Settings(health_port=0, metrics_port=0, resync_seconds=0.5, stuck_terminating_seconds=2.0,
                cannot_start_seconds=1.0, incident_settle_seconds=1.0, retry_seconds=0.2, request_timeout_seconds=10)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "settings(**changes): the operator fixture's Settings, changed for one test")


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
                     between: Callable[[], Awaitable[Any]] | None = None) -> Any:
    """Poll until check() returns something truthy (the operator works asynchronously); check may be a
    coroutine function (to look in the operator's own loop)."""
    deadline = time.monotonic() + timeout
    while True:
        if between is not None:
            await between()
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


class Harness:
    """The test's side of the cluster: a user with kubectl, and the kubelet."""

    def __init__(self, cluster: Cluster, url: str, session: aiohttp.ClientSession):
        self.cluster, self.url, self.session = cluster, url, session

    # ---------------------------------------------------------------- kubectl

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        async with self.session.request(method, self.url + path, json=body,
                                        headers={"Content-Type": content_type}) as response:
            return response.status, await response.json()

    def job_path(self, name: str, sub: str = "") -> str:
        return f"/apis/{model.API_VERSION}/namespaces/{NAMESPACE}/{model.PLURAL}/{name}" + (f"/{sub}" if sub else "")

    async def apply(self, name: str, **spec: Any) -> dict[str, Any]:
        body = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name},
                "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer", **spec}}
        status, created = await self.request("POST", f"/apis/{model.API_VERSION}/namespaces/{NAMESPACE}/"
                                             f"{model.PLURAL}", body, "application/json")
        assert status < 300, created
        return created

    async def patch_spec(self, name: str, spec: dict[str, Any]) -> tuple[int, Any]:
        return await self.request("PATCH", self.job_path(name), {"spec": spec})

    async def scale(self, name: str, replicas: int) -> tuple[int, Any]:
        return await self.request("PATCH", self.job_path(name, "scale"), {"spec": {"replicas": replicas}})

    async def delete_job(self, name: str) -> None:
        status, body = await self.request("DELETE", self.job_path(name), {}, "application/json")
        assert status < 300, body

    # ---------------------------------------------------------------- reading

    def job(self, name: str) -> dict[str, Any] | None:
        return next((j for j in self.cluster.live(DDPJOBS, NAMESPACE) if j["metadata"]["name"] == name), None)

    def status(self, name: str) -> dict[str, Any]:
        return (self.job(name) or {}).get("status") or {}

    def pods(self, job: str, role: str = naming.ROLE_WORKER) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.cluster.live(PODS, NAMESPACE)
                if p["metadata"]["labels"].get(naming.LABEL_JOB_NAME) == job
                and p["metadata"]["labels"].get(naming.LABEL_ROLE) == role}

    def events(self, job: str) -> list[dict[str, Any]]:
        return [e for e in self.cluster.live(kmock.resource("", "v1", "events"), NAMESPACE)
                if e["involvedObject"]["name"] == job]

    def condition(self, job: str, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status(job).get("conditions", []) if c["type"] == type_), None)

    async def wait_phase(self, job: str, phase: str, timeout: float = 10.0) -> dict[str, Any]:
        return await eventually(lambda: self.status(job) if self.status(job).get("phase") == phase else None,
                                timeout, f"{job} to reach phase {phase} (now {self.status(job).get('phase')})")

    async def wait_workers(self, job: str, count: int, timeout: float = 10.0, **labels: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            pods = {n: p for n, p in self.pods(job).items()
                    if not p["metadata"].get("deletionTimestamp")
                    and all(p["metadata"]["labels"].get(f"{model.GROUP}/{k}") == v for k, v in labels.items())}
            return pods if len(pods) == count else None
        return await eventually(check, timeout, f"{count} workers of {job} with {labels}")

    # ---------------------------------------------------------------- kubelet

    async def set_status(self, pod: str, status: dict[str, Any]) -> None:
        await self.cluster.write((PODS, NAMESPACE, pod), {"status": status})

    async def run(self, *pods: str) -> None:
        for pod in pods:
            await self.cluster.write((PODS, NAMESPACE, pod), {"spec": {"nodeName": "node-1"}, "status": {
                "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": c, "state": {"running": {"startedAt": "2026-11-22T00:00:00Z"}}}
                                      for c in (naming.TRAINER_CONTAINER, naming.STORE_CONTAINER)]}})

    async def run_all(self, job: str) -> None:
        await self.run(*self.pods(job), *self.pods(job, naming.ROLE_STORE))

    async def exit(self, pod: str, code: int, reason: str = "Error", message: str | None = None) -> None:
        """`message`: the container's termination message (what the launcher writes)."""
        terminated = {"exitCode": code, "reason": reason, "finishedAt": "2026-11-22T00:00:00Z"}
        if message is not None:
            terminated["message"] = message
        await self.set_status(pod, {
            "phase": "Succeeded" if code == 0 else "Failed", "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": naming.TRAINER_CONTAINER, "state": {"terminated": terminated}}]})

    async def evict(self, pod: str) -> None:
        await self.set_status(pod, {
            "phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}],
            "containerStatuses": [{"name": naming.TRAINER_CONTAINER, "state": {"terminated": {
                "exitCode": 137, "reason": "Error", "finishedAt": "2026-11-22T00:00:00Z"}}}]})

    async def settle(self, job: str, check: Callable[[], Any], timeout: float = 10.0, what: str = "",
                     confirm: Callable[[str], Awaitable[Any]] | None = None) -> Any:
        """Like eventually(), the kubelets confirming the job's graceful deletions in between: `confirm(job)`,
        by default finish_terminating (every kubelet answers; test_scenarios' Nodes.confirm plays
        kubelets that report exit 143 first, and lost nodes that never answer)."""
        return await eventually(check, timeout, what, between=lambda: (confirm or self.finish_terminating)(job))

    async def finish_terminating(self, job: str) -> list[str]:
        """The kubelet confirms every graceful deletion (the containers have exited)."""
        done = []
        for role in (naming.ROLE_WORKER, naming.ROLE_STORE):
            for name, pod in self.pods(job, role).items():
                if pod["metadata"].get("deletionTimestamp"):
                    await self.cluster.remove((PODS, NAMESPACE, name))
                    done.append(name)
        return done


@pytest_asyncio.fixture()
async def cluster() -> AsyncIterator[tuple[Cluster, str]]:
    async with Cluster() as emulator, kmock.Server(emulator) as server:
        emulator.register_resources()
        yield emulator, str(server.url).rstrip("/")


@pytest_asyncio.fixture()
async def harness(cluster: tuple[Cluster, str]) -> AsyncIterator[Harness]:
    emulator, url = cluster
    async with aiohttp.ClientSession(headers={"User-Agent": "kubectl-test"}) as session:
        yield Harness(emulator, url, session)


class OperatorProcess:
    """The real operator (kopf + handlers) in its own thread and event loop, as in its own pod.

    (kopf cancels every task of its loop that it did not start when it stops, so it cannot share
    the test's loop, where the emulated API server runs.) It can be stopped and started again.
    """

    def __init__(self, url: str, settings: Settings = FAST):
        self.url, self.settings = url, settings
        self.thread: threading.Thread | None = None
        self.stop_flag = threading.Event()
        self.controller: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the operator's own

    async def start(self) -> None:
        self.stop_flag, ready = threading.Event(), threading.Event()

        def main() -> None:
            asyncio.run(run_operator(self.settings, Connection(server=self.url, insecure=True),
                                     stop_flag=self.stop_flag, ready_flag=ready,
                                     on_controller=self._adopt))

        self.thread = threading.Thread(target=main, name="operator", daemon=True)
        self.thread.start()
        await eventually(ready.is_set, 10, "the operator to start")
        if self.settings.progress_port:  # AUTO_PORT in tests: its port is known once it listens
            await eventually(lambda: self.controller.progress_server.port, 10, "the progress endpoint to listen")

    def _adopt(self, controller: Any) -> None:  # called in the operator's loop
        self.controller, self.loop = controller, asyncio.get_running_loop()

    async def in_operator(self, coroutine: Awaitable[Any]) -> Any:
        """Run a coroutine in the operator's loop (its objects belong there) and wait for it."""
        assert self.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    async def stop(self) -> None:
        if self.thread is not None:
            self.stop_flag.set()
            await asyncio.to_thread(self.thread.join, 15)
            assert not self.thread.is_alive(), "the operator did not stop"
            self.thread = None


def operator_fixture(settings: Settings = FAST) -> Any:
    """The `operator` fixture, the one way tests run the operator: the real operator on the emulated
    cluster with `settings` (a module's own: `operator = operator_fixture(SETTINGS)`), changed by the
    test's `settings(**changes)` marks (module marks first); its calls checked against the chart's RBAC."""
    @pytest_asyncio.fixture()
    async def operator(cluster: tuple[Cluster, str], request: pytest.FixtureRequest) -> AsyncIterator[OperatorProcess]:
        emulator, url = cluster
        changes: dict[str, Any] = {}
        for mark in reversed(list(request.node.iter_markers("settings"))):
            changes.update(mark.kwargs)
        process = OperatorProcess(url, dataclasses.replace(settings, **changes))
        await process.start()
        try:
            yield process
        finally:
            await process.stop()
        assert_within_permissions(emulator)
    return operator


operator = operator_fixture()


async def started(harness: Harness, name: str, *, kubelet: Callable[[str], Awaitable[Any]] | None = None,
                  **spec: Any) -> dict[str, Any]:
    """Apply a job and play the kubelet (`kubelet(job)`, by default Harness.run_all) until all of its
    pods run."""
    job = await harness.apply(name, **spec)
    await harness.wait_workers(name, spec.get("replicas", 2))
    await eventually(lambda: harness.pods(name, naming.ROLE_STORE), what="the store pod")
    await (kubelet or harness.run_all)(name)
    await harness.wait_phase(name, "Running")
    return job


def reconcile_passes(operator: OperatorProcess) -> int:
    """How many reconcile passes the operator has finished (any job)."""
    for line in operator.controller.metrics.text().splitlines():
        if line.startswith("ddpjob_reconcile_duration_seconds_count"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


async def passes(operator: OperatorProcess, count: int = 2) -> None:
    """Until the operator finished `count` more reconcile passes (the 0.5 s resync makes them): the horizon
    of a check that nothing (more) happens, instead of a sleep."""
    start = reconcile_passes(operator)
    await eventually(lambda: reconcile_passes(operator) >= start + count, 10, f"{count} more reconcile passes")


def assert_within_permissions(emulator: Cluster) -> None:
    """Every call the operator made is one the chart's RBAC grants (permissions.py)."""
    assert emulator.calls, "the recorder saw no operator calls"
    outside = sorted(c for c in emulator.calls if not permissions.allows(*c))
    assert outside == [], f"operator called APIs outside permissions.PERMISSIONS: {outside}"
