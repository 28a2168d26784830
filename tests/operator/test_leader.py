"""Leader election: the pure rules (table-driven), the fence, settings, and two real operator
processes (`python -m ddpjob_operator.run`, each in its own OS process) against the emulated API
server: SIGKILL, SIGSTOP/SIGCONT and SIGTERM of the one that leads."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import attrs
import kmock
import pytest
import pytest_asyncio
from kmock._internal import rendering

from ddpjob_operator import kube, leader, naming, settings
from ddpjob_operator.leader import Action, LeaseRecord, Timing, Verb, decide, fenced

from ..support import wait_for
from .conftest import NAMESPACE, Harness, assert_within_permissions, eventually, started
from tests.kube_emulator import LEASES, PODS, Cluster

pytestmark = pytest.mark.timeout(120)

T = Timing(lease_duration=15, renew_deadline=10.0, retry_period=2.0)


def held(holder: str, duration: int = 15, rv: str = "7") -> LeaseRecord:
    return LeaseRecord(holder=holder, duration=duration, transitions=2, acquire_time="2026-11-23T00:00:00.000000Z",
                       renew_time="2026-11-23T00:00:10.000000Z", resource_version=rv)


# ---------------------------------------------------------------- the pure rules

@pytest.mark.parametrize(("lease", "observed_at", "now", "expected"), [
    (None, 0.0, 100.0, Action(Verb.CREATE)),  # nobody created it yet
    (held("me"), 0.0, 100.0, Action(Verb.RENEW)),  # ours, however old: renew
    (held(""), 100.0, 100.0, Action(Verb.TAKE_OVER)),  # released on SIGTERM: at once
    (held("other"), 100.0, 100.0, Action(Verb.WAIT, 115.0)),  # just renewed by another
    (held("other"), 100.0, 114.999, Action(Verb.WAIT, 115.0)),  # not yet expired by our clock
    (held("other"), 100.0, 115.0, Action(Verb.TAKE_OVER)),  # unchanged for leaseDurationSeconds
    (held("other", duration=40), 100.0, 130.0, Action(Verb.WAIT, 140.0)),  # the Lease's own duration counts
    (held("other", duration=0), 100.0, 115.0, Action(Verb.TAKE_OVER)),  # none recorded: ours
], ids=["absent", "ours", "released", "fresh", "almost-expired", "expired", "longer-lease", "no-duration"])
def test_decide(lease, observed_at, now, expected):
    assert decide(lease, observed_at, now, "me", T) == expected


@pytest.mark.parametrize(("renewed_at", "now", "is_fenced"), [
    (None, 0.0, True),  # never held it
    (100.0, 100.0, False),
    (100.0, 109.999, False),
    (100.0, 110.0, True),  # renew deadline passed without a successful renewal
    (100.0, 500.0, True),  # paused (SIGSTOP) for minutes
])
def test_fenced(renewed_at, now, is_fenced):
    assert fenced(renewed_at, now, T) is is_fenced


def test_the_old_holder_stops_before_anyone_may_take_over():
    """For every moment a standby can first see a renewal (it starts after the renewal began), the
    renewer is fenced before the standby's takeover time: the renew deadline is the margin."""
    renewed_at = 100.0
    for seen_after in (0.0, 0.001, 1.0, 9.9):
        observed_at = renewed_at + seen_after
        takeover_at = decide(held("old"), observed_at, observed_at, "new", T).expires_at
        assert takeover_at is not None
        assert fenced(renewed_at, takeover_at - 1e-6, T), seen_after
        assert takeover_at - (renewed_at + T.renew_deadline) >= T.lease_duration - T.renew_deadline


@pytest.mark.parametrize(("verb", "previous", "holder", "transitions", "acquire"), [
    (Verb.CREATE, None, "me", 0, "now"),
    (Verb.RENEW, held("me"), "me", 2, "2026-11-23T00:00:00.000000Z"),
    (Verb.TAKE_OVER, held("other"), "me", 3, "now"),
])
def test_lease_body(verb, previous, holder, transitions, acquire):
    from datetime import datetime, timezone
    now = datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=timezone.utc)
    body = leader.lease_body("ops", "lease", "me", T, previous, verb, now)
    spec = body["spec"]
    assert spec["holderIdentity"] == holder and spec["leaseTransitions"] == transitions
    assert spec["renewTime"] == "2026-11-23T01:02:03.456789Z" and spec["leaseDurationSeconds"] == 15
    assert spec["acquireTime"] == ("2026-11-23T01:02:03.456789Z" if acquire == "now" else acquire)
    # Every write but the first names the version it was decided on: a race is a 409, not two winners.
    assert body["metadata"].get("resourceVersion") == (previous.resource_version if previous else None)


def test_release_empties_the_holder():
    from datetime import datetime, timezone
    body = leader.lease_body("ops", "lease", "", T, held("me"), Verb.WAIT, datetime.now(timezone.utc))
    assert body["spec"]["holderIdentity"] == "" and body["spec"]["leaseDurationSeconds"] == 1
    assert decide(LeaseRecord.from_body({**body, "metadata": {"resourceVersion": "9"}}), 0, 0, "b", T).verb \
        is Verb.TAKE_OVER


async def test_fenced_client_sends_no_write_once_the_renew_deadline_passed():
    """The fence is checked as each call starts: what reaches a real HTTP server is exactly the calls made
    while the elector may act, and every read."""
    now = [100.0]
    sent: list[tuple[str, str]] = []

    async def record(request: aiohttp.web.Request) -> aiohttp.web.Response:
        if "/leases" in request.path:  # the election's own calls: no Lease yet, then the one it creates
            if request.method == "GET":
                return aiohttp.web.json_response({"kind": "Status", "reason": "NotFound"}, status=404)
            return aiohttp.web.json_response({**await request.json(), "metadata": {"resourceVersion": "1"}},
                                             status=201)
        sent.append((request.method, request.path))
        return aiohttp.web.json_response({"kind": "Status", "items": []})

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    connection = kube.Connection(server=f"http://127.0.0.1:{port}")
    elector = leader.Elector(kube.Kube(connection), "ops", "lease", "me", T, clock=lambda: now[0])
    api = leader.FencedKube(connection, elector)
    try:
        with pytest.raises(leader.NotLeader):  # never renewed
            await api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"}})
        now[0] = 95.0
        await elector.run_round()  # renewed (created) 5 s before the calls below: may act
        now[0] = 100.0
        await api.delete(kube.PODS, "n", "p")
        await api.patch_status("n", "j", {"phase": "Running"})
        now[0] = 105.0  # paused: 10 s since the renewal began
        with pytest.raises(leader.NotLeader):
            await api.patch_status("n", "j", {"phase": "Running"})
        with pytest.raises(leader.NotLeader):
            await api.delete(kube.PODS, "n", "p")
        await api.latest_event_message("n", "uid", "FailedMount")  # reads are harmless
    finally:
        await elector.stop(release=False)
        await api.close()
        await runner.cleanup()
    assert [method for method, _ in sent] == ["DELETE", "PATCH", "GET"], sent
    assert sent[0][1] == "/api/v1/namespaces/n/pods/p" and sent[1][1].endswith("/namespaces/n/ddpjobs/j/status")


async def test_a_refused_renewal_stops_acting_at_once_even_when_the_lease_cannot_be_read_again():
    """A renewal answered 409 means another replica wrote the Lease: the elector stops acting then, not at its
    renew deadline (10 s away here), and stays fenced while the API server will not let it read the Lease."""
    answers: dict[str, tuple[int, dict[str, Any]]] = {"GET": (404, {"kind": "Status", "reason": "NotFound"})}
    sent: list[tuple[str, str]] = []

    async def serve(request: aiohttp.web.Request) -> aiohttp.web.Response:
        sent.append((request.method, request.path))
        if request.method == "POST":  # the Lease created
            body = await request.json()
            body["metadata"]["resourceVersion"] = "1"
            return aiohttp.web.json_response(body, status=201)
        status, body = answers[request.method]
        return aiohttp.web.json_response(body, status=status)

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", serve)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    connection = kube.Connection(server=f"http://127.0.0.1:{runner.addresses[0][1]}")
    elector = leader.Elector(kube.Kube(connection), "ops", "lease", "me", T)
    api = leader.FencedKube(connection, elector)
    try:
        await elector.run_round()  # no Lease yet: created, held
        assert elector.leading()
        answers["PUT"] = (409, {"kind": "Status", "reason": "Conflict", "message": "the object has been modified"})
        answers["GET"] = (503, {"kind": "Status", "reason": "ServiceUnavailable", "message": "overloaded"})
        await elector.run_round()  # the renewal is refused: someone else wrote the Lease
        assert not elector.leading()
        with pytest.raises(kube.ApiError):  # the next round cannot read the Lease: still not acting
            await elector.run_round()
        assert not elector.leading()
        with pytest.raises(leader.NotLeader):
            await api.delete(kube.PODS, "n", "p")
    finally:
        await elector.stop(release=False)
        await api.close()
        await runner.cleanup()
    assert [method for method, path in sent] == ["GET", "POST", "PUT", "GET"], sent
    assert all("/leases" in path for _, path in sent), sent  # no write of the operator went out


# ---------------------------------------------------------------- settings

BASE = {"DDPJOB_OPERATOR_LEASE_NAME": "ddpjob-operator", "POD_NAMESPACE": "ops", "POD_NAME": "op-0"}


def test_settings_lease_defaults_from_the_downward_api():
    got = settings.from_env(BASE)
    assert (got.leader_election, got.lease_name, got.lease_namespace, got.identity) == (
        True, "ddpjob-operator", "ops", "op-0")
    assert (got.lease_duration_seconds, got.lease_renew_deadline_seconds, got.lease_retry_period_seconds) == (
        15, 10.0, 2.0)
    assert not settings.from_env({}).leader_election  # one replica that always acts


@pytest.mark.parametrize(("env", "message"), [
    ({"DDPJOB_OPERATOR_LEASE_NAME": "x"}, "DDPJOB_OPERATOR_LEASE_NAMESPACE: required with DDPJOB_OPERATOR_LEASE_NAME"),
    ({**BASE, "DDPJOB_OPERATOR_LEASE_NAME": "Bad_Name"}, "DDPJOB_OPERATOR_LEASE_NAME='Bad_Name': must be a DNS-1123"),
    ({**BASE, "DDPJOB_OPERATOR_LEASE_DURATION_SECONDS": "2.5"}, "DDPJOB_OPERATOR_LEASE_DURATION_SECONDS='2.5': "
                                                              "must be a whole number"),
    ({**BASE, "DDPJOB_OPERATOR_LEASE_RENEW_DEADLINE_SECONDS": "15"},
     "DDPJOB_OPERATOR_LEASE_RETRY_PERIOD_SECONDS=2.0 < DDPJOB_OPERATOR_LEASE_RENEW_DEADLINE_SECONDS=15.0 < "
     "DDPJOB_OPERATOR_LEASE_DURATION_SECONDS=15 must hold"),
    ({**BASE, "DDPJOB_OPERATOR_LEASE_RETRY_PERIOD_SECONDS": "0"}, "DDPJOB_OPERATOR_LEASE_RETRY_PERIOD_SECONDS='0'"),
    ({**BASE, "DDPJOB_OPERATOR_HEARTBEAT_SECONDS": "soon"}, "DDPJOB_OPERATOR_HEARTBEAT_SECONDS='soon'"),
])
def test_bad_lease_settings_name_the_variable(env, message):
    with pytest.raises(settings.SettingsError) as failure:
        settings.from_env(env)
    assert message in str(failure.value)


# ---------------------------------------------------------------- two operator processes

OPERATOR_NAMESPACE = "ddpjob-system"
LEASE_NAME = "ddpjob-operator"
# Short timings so the tests take seconds; the chart's defaults are 15 / 10 / 2 (bench/operator_failover.py).
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 3, 2.0, 0.25
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: kmock, cluster: {server: "%s"}}]
users: [{name: test, user: {}}]
contexts: [{name: kmock, context: {cluster: kmock, user: test}}]
current-context: kmock
"""


@dataclass(frozen=True)
class Request:
    at: float  # time.monotonic() when it arrived
    agent: str
    method: str
    path: str
    status: int


@attrs.define(kw_only=True)
class RecordingCluster(Cluster):
    """The emulator, keeping every request with who sent it and the answer's status."""

    log: list[Request] = attrs.field(factory=list, init=False)

    async def serve(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        arrived = time.monotonic()
        response = await super().serve(request)
        self.log.append(Request(arrived, request.headers.get("User-Agent", ""), str(request.method.value
                                if hasattr(request.method, "value") else request.method).upper(),
                                request.url.path + ("?dryRun=All" if request.params.get("dryRun") else ""),
                                response.status))  # a dry run creates nothing: not a create
        return response


class Replica:
    """One operator replica: `python -m ddpjob_operator.run` in its own OS process, as in its own pod."""

    def __init__(self, name: str, url: str, tmp: Path, **extra_env: str):
        self.name, self._metrics_port = name, 0
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG % url)
        self.log_path = tmp / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDPJOB_OPERATOR_")}
        env.update({
            "KUBECONFIG": str(kubeconfig), "POD_NAME": name, "POD_NAMESPACE": OPERATOR_NAMESPACE,
            "DDPJOB_OPERATOR_WATCH_NAMESPACES": NAMESPACE, "DDPJOB_OPERATOR_HEALTH_PORT": "0",
            "DDPJOB_OPERATOR_METRICS_PORT": "auto", "DDPJOB_OPERATOR_BIND_ADDRESS": "127.0.0.1",
            "DDPJOB_OPERATOR_LOG_LEVEL": "INFO", "DDPJOB_OPERATOR_RESYNC_SECONDS": "1",
            # A failed worker's peer runs on: replace it at once, so the times measure the failover.
            "DDPJOB_OPERATOR_INCIDENT_SETTLE_SECONDS": "0.01", "DDPJOB_OPERATOR_RETRY_SECONDS": "0.2",
            "DDPJOB_OPERATOR_LEASE_NAME": LEASE_NAME,
            "DDPJOB_OPERATOR_LEASE_DURATION_SECONDS": str(LEASE_DURATION),
            "DDPJOB_OPERATOR_LEASE_RENEW_DEADLINE_SECONDS": str(RENEW_DEADLINE),
            "DDPJOB_OPERATOR_LEASE_RETRY_PERIOD_SECONDS": str(RETRY_PERIOD), **extra_env})
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "ddpjob_operator.run"], env=env, stdout=log,
                                            stderr=subprocess.STDOUT)

    @property
    def agent(self) -> str:
        return f"{kube.USER_AGENT}/{self.name}"

    def signal(self, signum: int) -> float:
        self.process.send_signal(signum)
        return time.monotonic()

    @property
    def metrics_port(self) -> int:
        """The port the kernel gave its metrics endpoint ("auto"), from its log line."""
        def logged() -> int:
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", self.log_path.read_text(errors="replace"))
            assert found or self.process.poll() is None, f"{self.name} ended: {self.output()}"
            return int(found.group(1)) if found else 0
        if not self._metrics_port:
            self._metrics_port = wait_for(logged, f"{self.name}'s metrics port in its log", 30, 0.05,
                                          explain=self.output)
        return self._metrics_port

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                if line.startswith("ddpjob_leader")}

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(15)


class Pair:
    def __init__(self, emulator: RecordingCluster, harness: Harness, url: str, tmp: Path):
        self.emulator, self.harness, self.url, self.tmp = emulator, harness, url, tmp
        self.replicas: list[Replica] = []

    def start(self, name: str) -> Replica:
        (self.tmp / name).mkdir()
        replica = Replica(name, self.url, self.tmp / name)
        self.replicas.append(replica)
        return replica

    def holder(self) -> str | None:
        lease = self.emulator.get(LEASES, OPERATOR_NAMESPACE, LEASE_NAME)
        return ((lease or {}).get("spec") or {}).get("holderIdentity")

    async def wait_holder(self, name: str, timeout: float = 30) -> float:
        await eventually(lambda: self.holder() == name, timeout, f"{name} to hold the Lease (holder {self.holder()})")
        return time.monotonic()

    def requests(self, replica: Replica, since: float = 0.0) -> list[Request]:
        return [r for r in self.emulator.log if r.agent == replica.agent and r.at >= since]

    async def wait_standby(self, replica: Replica) -> None:
        """The standby has read the Lease and kopf watches (so its pod index is filled)."""
        await eventually(lambda: any(r.path.endswith(f"/leases/{LEASE_NAME}") for r in self.requests(replica)),
                         30, f"{replica.name} to read the Lease")
        await eventually(lambda: len(self.watching("ddpjobs")) >= 2 and len(self.watching("pods")) >= 2, 30,
                         "both replicas to watch DDPJobs and pods")

    def watching(self, kind: str) -> list[rendering.Request]:
        return [r for r in self.emulator.in_flight() if r.resource is not None and r.resource.plural == kind
                and r.params.get("watch")]

    async def running_job(self, name: str = "train") -> dict[str, Any]:
        job = await self.harness.apply(name, replicas=2, minReplicas=1,
                                       failurePolicy={"maxRestarts": 3, "restartScope": "Pod",
                                                      "backoff": {"initialSeconds": 0, "maxSeconds": 1}})
        await self.harness.wait_workers(name, 2, timeout=20)
        await eventually(lambda: self.harness.pods(name, naming.ROLE_STORE), 20, "the store pod")
        await self.harness.run_all(name)
        await self.harness.wait_phase(name, "Running", timeout=20)
        return job


@pytest_asyncio.fixture()
async def cluster() -> AsyncIterator[tuple[RecordingCluster, str]]:
    """conftest's `cluster`, keeping every request with its answer (the Lease writes' 409s among them)."""
    async with RecordingCluster() as emulator, kmock.Server(emulator) as server:
        emulator.register_resources()
        yield emulator, str(server.url).rstrip("/")


@pytest_asyncio.fixture()
async def pair(cluster: tuple[RecordingCluster, str], harness: Harness, tmp_path: Path) -> AsyncIterator[Pair]:
    emulator, url = cluster
    pair = Pair(emulator, harness, url, tmp_path)
    try:
        yield pair
    finally:
        for replica in pair.replicas:
            await asyncio.to_thread(replica.close)
        for replica in pair.replicas:
            print(f"---- {replica.name}\n{replica.output()}")
    assert_within_permissions(emulator)


def writes(requests: list[Request]) -> list[Request]:
    """The operator's own writes: anything but reads and the Lease itself."""
    return [r for r in requests if r.method != "GET" and "/leases" not in r.path]


async def fail_worker(pair: Pair, job: str, index: int) -> float:
    await pair.emulator.kubelet_exit(NAMESPACE, naming.worker_name(job, index), 137)
    return time.monotonic()


async def wait_replaced(pair: Pair, job: str, index: int, timeout: float) -> float:
    name = naming.worker_name(job, index)

    def replaced() -> bool:
        pod = pair.emulator.get(PODS, NAMESPACE, name)
        return bool(pod) and pod["metadata"]["labels"].get(naming.LABEL_ATTEMPT) == "1"

    await eventually(replaced, timeout, f"{name} replaced (attempt 1)")
    return pair.emulator.created[(NAMESPACE, name)]


async def test_graceful_stop_hands_the_lease_over_at_once(pair):
    a = pair.start("op-a")
    await pair.wait_holder("op-a")  # alone (replicaCount 1): it creates the Lease and leads at once
    b = pair.start("op-b")
    await pair.wait_standby(b)
    await pair.running_job()
    assert writes(pair.requests(b)) == [], "the standby wrote something"
    assert pair.holder() == "op-a"
    assert a.metrics()["ddpjob_leader"] == 1 and b.metrics()["ddpjob_leader"] == 0

    stopped = a.signal(signal.SIGTERM)
    took_over = await pair.wait_holder("op-b", timeout=30)
    assert await asyncio.to_thread(a.process.wait, 15) == 0
    # Handed over, not expired: op-a's release (an empty holder) was written, and op-b's takeover came
    # right after it (the order of the API server's history, not a time). op-a renews until it releases: its
    # election runs on its own while the controller stops.
    holders = [(change.obj.get("spec") or {}).get("holderIdentity") or "" for change in pair.emulator.history(LEASES)]
    assert holders[holders.index("op-b") - 1:holders.index("op-b") + 1] == ["", "op-b"], holders
    lease_puts = [r for r in pair.emulator.log if r.at >= stopped and r.method == "PUT" and "/leases/" in r.path
                  and r.status == 200]
    agents = [r.agent for r in lease_puts]
    assert a.agent not in agents[agents.index(b.agent):], lease_puts
    await eventually(lambda: b.metrics()["ddpjob_leader"] == 1, 5, "op-b's leader gauge")
    assert b.metrics()["ddpjob_leader_changes_total"] >= 1
    lease = pair.emulator.get(LEASES, OPERATOR_NAMESPACE, LEASE_NAME)["spec"]
    assert lease["leaseTransitions"] == 1 and lease["leaseDurationSeconds"] == LEASE_DURATION

    failed = await fail_worker(pair, "train", 1)  # the new leader acts
    await wait_replaced(pair, "train", 1, timeout=10)
    await eventually(lambda: pair.harness.status("train").get("restarts") == 1, 10, "one restart charged")
    print(f"graceful: Lease handed over in {took_over - stopped:.2f}s; replaced {time.monotonic() - failed:.2f}s "
          f"after the failure")


async def test_sigkilled_leader_standby_acts_within_the_lease_time(pair):
    a = pair.start("op-a")
    await pair.wait_holder("op-a")
    b = pair.start("op-b")
    await pair.wait_standby(b)
    await pair.running_job()

    killed = a.signal(signal.SIGKILL)
    await fail_worker(pair, "train", 1)  # nobody acts on it until op-b leads
    replaced_at = await wait_replaced(pair, "train", 1, timeout=30)
    assert pair.holder() == "op-b"
    await eventually(lambda: pair.harness.status("train").get("restarts") == 1, 10, "one restart charged")
    # The order, by the API server's log (how fast is bench/operator_failover.py's): op-a's last renewal,
    # op-b's takeover no sooner than leaseDurationSeconds after it, then op-b's replacement pod.
    last_renewal = max(r.at for r in pair.requests(a) if r.method == "PUT" and "/leases/" in r.path
                       and r.status == 200)
    takeover = min(r.at for r in pair.requests(b) if r.method == "PUT" and "/leases/" in r.path and r.status == 200)
    replacement = [r for r in pair.requests(b) if r.method == "POST" and r.path.endswith("/pods") and r.status == 201]
    assert last_renewal + LEASE_DURATION <= takeover <= replacement[0].at, (last_renewal, takeover, replacement)
    assert not [r for r in pair.requests(b, 0.0) if r.at < takeover and r.method != "GET"
                and "/leases" not in r.path], "op-b wrote before it led"
    print(f"SIGKILL: replacement created {replaced_at - killed:.2f}s after the kill")


async def test_paused_leader_is_fenced_and_never_acts_after_the_standby_took_over(pair):
    a = pair.start("op-a")
    await pair.wait_holder("op-a")
    b = pair.start("op-b")
    await pair.wait_standby(b)
    await pair.running_job()
    workers_before = set(pair.harness.pods("train"))
    # op-a is idle: its last Event of the start (posted after the status write) has arrived.
    await eventually(lambda: any(e["reason"] == "Running" for e in pair.harness.events("train")), 10,
                     "the Running event")

    paused = a.signal(signal.SIGSTOP)  # a long GC pause, a frozen VM, a partition: op-a cannot renew
    await fail_worker(pair, "train", 1)  # op-a's watch has it buffered for when it runs again
    took_over = await pair.wait_holder("op-b", timeout=LEASE_DURATION + 10)
    await wait_replaced(pair, "train", 1, timeout=10)
    await eventually(lambda: pair.harness.status("train").get("restarts") == 1, 10, "one restart charged")

    resumed = a.signal(signal.SIGCONT)
    # op-a runs again: its timers fire, the buffered events arrive, and its elector reads the Lease
    # (twice: a whole retry period of running) and sees op-b.
    await eventually(lambda: sum(1 for r in pair.requests(a, resumed) if "/leases/" in r.path) >= 2, 10,
                     "op-a to read the Lease again")
    await eventually(lambda: a.metrics()["ddpjob_leader"] == 0, 5, "op-a to report it does not lead")
    await fail_worker(pair, "train", 0)  # something for both to see after op-a resumed
    await eventually(lambda: pair.harness.status("train").get("restarts") == 2, 10, "op-b charging it once")
    await wait_replaced(pair, "train", 0, timeout=10)

    # Nothing from op-a arrived once it was stopped (a request already on the wire when SIGSTOP came
    # would arrive then, legitimately: op-a led), and surely nothing once op-b led.
    assert writes(pair.requests(a, took_over)) == [], "the old leader wrote after the standby took over"
    # A write on the wire when SIGSTOP came (an Event, a status write: op-a still led) may be read after
    # it, on a loaded machine; none may arrive once op-a's lease had run out.
    assert [r for r in writes(pair.requests(a, paused)) if r.at >= paused + LEASE_DURATION] == [], \
        "the paused leader wrote after it was fenced"
    # Resumed past its renew deadline, op-a's elector reads the Lease before anything else (it does not
    # renew on what it last wrote), and op-a says it stopped acting.
    lease_calls = [r for r in pair.requests(a, resumed) if "/leases/" in r.path]
    assert lease_calls[0].method == "GET", lease_calls
    assert "op-a does not hold Lease" in a.output(), a.output()
    # op-a never took the Lease back: one handover in all (op-a to op-b), op-b holds it.
    lease = pair.emulator.get(LEASES, OPERATOR_NAMESPACE, LEASE_NAME)["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("op-b", 1), lease
    assert a.metrics()["ddpjob_leader"] == 0 and b.metrics()["ddpjob_leader"] == 1
    status = pair.harness.status("train")
    assert status["restarts"] == 2, status  # one per failure: nothing charged twice
    worker_posts = [r for r in pair.emulator.log if r.method == "POST" and r.path.endswith("/pods")
                    and r.status == 201]
    # store + 2 workers at the start, one replacement per failure: no duplicate pod
    assert len(worker_posts) == 3 + 2, worker_posts
    assert set(pair.harness.pods("train")) == workers_before
    print(f"SIGSTOP: paused {resumed - paused:.2f}s; op-a made {len(pair.requests(a, resumed))} requests after "
          f"SIGCONT, none a write")


# ---------------------------------------------------------------- one in-process replica, the Lease moved under it

IN_PROCESS_LEASE = dict(lease_name=LEASE_NAME, lease_namespace=OPERATOR_NAMESPACE, identity="op-a",
                        lease_duration_seconds=LEASE_DURATION, lease_renew_deadline_seconds=RENEW_DEADLINE,
                        lease_retry_period_seconds=RETRY_PERIOD)
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/{LEASE_NAME}"


async def _write_lease(harness: Harness, holder: str, duration: int) -> None:
    """Another replica's write: on the version it read, as the elector does; read and written again when
    it lost a race (409) with op-a's renewal."""
    async def written() -> bool:
        _, lease = await harness.request("GET", LEASE_PATH)
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease["spec"].update(holderIdentity=holder, leaseDurationSeconds=duration, renewTime=now, acquireTime=now)
        code, body = await harness.request("PUT", LEASE_PATH, lease, "application/json")
        assert code in (200, 409), body
        return code == 200
    await eventually(written, 10, f"the Lease written for {holder!r}")


def lease_writes(cluster: RecordingCluster, identity: str, since: float) -> list[int]:
    """The answers to a replica's Lease writes (renewals, takeovers) since `since`, in order."""
    return [r.status for r in cluster.log if r.agent == f"{kube.USER_AGENT}/{identity}" and r.at >= since
            and r.method in ("PUT", "POST") and "/leases" in r.path]


# A renew deadline far beyond the test's waits: op-a stops leading on a refused renewal (409), never on its clock.
@pytest.mark.settings(**{**IN_PROCESS_LEASE, "lease_duration_seconds": 60, "lease_renew_deadline_seconds": 30.0})
async def test_a_replica_that_leads_again_forgets_what_it_wrote_before(harness, operator):
    """op-a leads and writes the job's status; op-b takes the Lease (op-a's next renewal is a 409) and
    charges two restarts; op-b hands the Lease back. op-a leads again and must account from the server's
    status (2 restarts), not from its own last write (0): the next failure is the third."""
    controller = operator.controller
    await eventually(controller.leading, 10, "op-a to lead")
    job = await started_job(harness, "relead")
    before_takeover = time.monotonic()
    await _write_lease(harness, "op-b", 3600)
    await eventually(lambda: not controller.leading(), 10, "op-a to lose the Lease (its renewal refused)")
    renewals = lease_writes(harness.cluster, "op-a", before_takeover)
    assert renewals and renewals[-1] == 409 and 409 not in renewals[:-1], renewals
    code, body = await harness.request("PATCH", harness.job_path("relead", "status"), {"status": {"restarts": 2}})
    assert code == 200, body
    await _write_lease(harness, "", 1)  # op-b stops gracefully: released
    await eventually(controller.leading, 10, "op-a to lead again")
    await harness.exit("relead-worker-1", 137, "OOMKilled")
    await eventually(lambda: harness.status("relead").get("restarts") != 2, 10, "the failure charged")
    assert harness.status("relead")["restarts"] == 3, harness.status("relead")
    assert job["metadata"]["uid"] == harness.job("relead")["metadata"]["uid"]


@pytest.mark.settings(**IN_PROCESS_LEASE)
async def test_a_leader_whose_renewals_fail_stops_acting_while_running_and_leads_again(harness, operator):
    """Not paused: the API server answers op-a 503 (an overloaded or partitioned API server). Past its renew
    deadline op-a stops acting on its own; once the API answers again it renews (nobody took over) and acts."""
    controller = operator.controller
    await eventually(controller.leading, 10, "op-a to lead")
    await started_job(harness, "outage")
    harness.cluster.unavailable_until = float("inf")
    # Fenced (by its clock), and told so (the renew deadline's timer: the leader gauge).
    await eventually(lambda: not controller.leading() and controller.metrics.registry.get_sample_value("ddpjob_leader") == 0, 10,
                     "op-a to stop acting")
    harness.cluster.unavailable_until = 0.0  # the outage ends when the test saw the fence, not at a time
    await eventually(controller.leading, 10, "op-a to lead again")
    lease = harness.cluster.get(LEASES, OPERATOR_NAMESPACE, LEASE_NAME)["spec"]
    assert lease["holderIdentity"] == "op-a" and lease["leaseTransitions"] == 0  # renewed, never handed over
    await harness.exit("outage-worker-1", 137, "OOMKilled")
    await eventually(lambda: harness.status("outage").get("restarts") == 1, 10, "op-a acting again")


async def started_job(harness: Harness, name: str) -> dict[str, Any]:
    return await started(harness, name, minReplicas=1, failurePolicy={
        "maxRestarts": 5, "restartScope": "Pod", "backoff": {"initialSeconds": 0, "maxSeconds": 1}})


@attrs.define(kw_only=True)
class BothReadFirst(Cluster):
    """The emulator, holding each Lease read until a second one came: two replicas decide on the same
    Lease. Records the Lease writes' answers."""

    answers: list[tuple[str, int]] = attrs.field(factory=list, init=False)
    pending: list[asyncio.Event] = attrs.field(factory=list, init=False)

    async def serve(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        method = str(getattr(request.method, "value", request.method)).upper()
        lease = "/leases" in request.url.path
        if lease and method == "GET":
            arrived = asyncio.Event()
            self.pending.append(arrived)
            if len(self.pending) == 2:
                for event in self.pending:
                    event.set()
                self.pending.clear()
            await asyncio.wait_for(arrived.wait(), 10)
        response = await super().serve(request)
        if lease and method != "GET":
            self.answers.append((method, response.status))
        return response


async def test_two_replicas_racing_for_the_lease_one_wins_and_the_other_takes_the_409():
    """Both read the Lease before either writes: both decide to create it, then (once it is released)
    both decide to take it over. Each time one write wins and the other is a 409 that the loser takes as
    "not ours" (its round ends without an error, not leading)."""
    async with BothReadFirst() as emulator, kmock.Server(emulator) as server:
        emulator.register_resources()
        url = str(server.url).rstrip("/")

        def elector(identity: str) -> leader.Elector:
            return leader.Elector(kube.Kube(kube.Connection(server=url)), OPERATOR_NAMESPACE, LEASE_NAME, identity,
                                  Timing(LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD))
        a, b, c = elector("op-a"), elector("op-b"), elector("op-c")
        try:
            await asyncio.gather(a.run_round(), b.run_round())
            assert sorted(emulator.answers) == [("POST", 201), ("POST", 409)], emulator.answers
            [winner] = [e for e in (a, b) if e.leading()]
            loser = b if winner is a else a
            assert emulator.get(LEASES, OPERATOR_NAMESPACE, LEASE_NAME)["spec"]["holderIdentity"] == winner.identity
            await winner.stop(release=True)  # SIGTERM: the Lease is released (an empty holder)
            emulator.answers.clear()
            await asyncio.gather(loser.run_round(), c.run_round())
            assert sorted(emulator.answers) == [("PUT", 200), ("PUT", 409)], emulator.answers
            [taker] = [e for e in (loser, c) if e.leading()]
            lease = emulator.get(LEASES, OPERATOR_NAMESPACE, LEASE_NAME)["spec"]
            assert lease["holderIdentity"] == taker.identity and lease["leaseTransitions"] == 1
        finally:
            for e in (a, b, c):
                await e.stop(release=False)
