"""Issue 31 item 8: at `helm uninstall` the chart's Role goes while the operator's replicas still stop, and
the API server answers 403 for the Lease (its renewal, an election round, the release at SIGTERM). That is
expected and logged at info level; only a replica that keeps being refused long after (its Role or
RoleBinding missing while it runs) warns, once. The Elector runs its real loop against a real HTTP server
that plays the API server."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp.web
import pytest

from ddpjob_operator import kube, leader

from .conftest import eventually

pytestmark = pytest.mark.timeout(60)

FAST = leader.Timing(lease_duration=2, renew_deadline=1.0, retry_period=0.05)
FORBIDDEN = (403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
                   "message": 'leases.coordination.k8s.io "lease" is forbidden: User '
                              '"system:serviceaccount:ops:ddpjob-operator" cannot update resource "leases"'})


class ApiServer:
    """Creates the Lease and renews it until `forbid()`: from then on every request is refused 403."""

    def __init__(self) -> None:
        self.forbidden = False
        self.sent: list[tuple[str, int]] = []
        self.lease: dict[str, Any] | None = None

    def forbid(self) -> None:
        self.forbidden = True

    async def serve(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        status, body = await self._answer(request)
        self.sent.append((request.method, status))
        return aiohttp.web.json_response(body, status=status)

    async def _answer(self, request: aiohttp.web.Request) -> tuple[int, dict[str, Any]]:
        if self.forbidden:
            return FORBIDDEN
        if request.method == "GET":
            return (200, self.lease) if self.lease else (404, {"kind": "Status", "reason": "NotFound", "code": 404})
        self.lease = await request.json()
        self.lease["metadata"]["resourceVersion"] = str(len(self.sent) + 1)
        return 201 if request.method == "POST" else 200, self.lease

    async def __aenter__(self) -> "ApiServer":
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self.serve)
        self.runner = aiohttp.web.AppRunner(app)
        await self.runner.setup()
        await aiohttp.web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("ddpjob")]


@pytest.mark.parametrize("renew_deadline", [10.0, 0.5], ids=["SIGTERM while it still acts: the release refused",
                                                             "SIGTERM after its renew deadline passed"])
async def test_the_role_removed_while_the_leader_stops_is_logged_quietly(caplog, renew_deadline):
    caplog.set_level(logging.INFO, logger="ddpjob_operator")
    timing = leader.Timing(lease_duration=15, renew_deadline=renew_deadline, retry_period=0.05)
    async with ApiServer() as server:
        elector = leader.Elector(kube.Kube(kube.Connection(server=server.url)), "ops", "lease", "op-0", timing)
        elector.start()
        await eventually(elector.leading, what="the Lease held")
        server.forbid()  # helm uninstall: the Role is gone, the pod still stopping
        await eventually(lambda: server.sent.count(("PUT", 403)) >= 3 and elector.leading() == (renew_deadline > 1),
                         what="renewals refused")
        await elector.stop()  # SIGTERM
    assert elector.withdrawn_since is not None
    assert warnings(caplog) == []
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("expected while the chart is uninstalled" in m for m in said), said
    if renew_deadline > 1:  # it still held the Lease: its release is refused too
        assert any(m.startswith("could not release Lease ops/lease") and "403" in m for m in said), said
    else:
        assert any(m.startswith("could not renew Lease ops/lease") for m in said), said


async def test_a_replica_refused_long_after_warns_once_its_role_is_missing(caplog, monkeypatch):
    """The same refusals while the replica goes on running past WITHDRAWN_WARN_SECONDS: its RBAC is missing."""
    monkeypatch.setattr(leader, "WITHDRAWN_WARN_SECONDS", 0.3)
    caplog.set_level(logging.INFO, logger="ddpjob_operator")
    async with ApiServer() as server:
        server.forbid()
        elector = leader.Elector(kube.Kube(kube.Connection(server=server.url)), "ops", "lease", "op-1", FAST)
        elector.start()
        try:
            await eventually(lambda: any("Role or RoleBinding is missing" in m for m in warnings(caplog)),
                             what="the warning")
            rounds = len(server.sent)
            await eventually(lambda: len(server.sent) >= rounds + 5, what="more refused rounds")
        finally:
            await elector.stop()
    assert len(warnings(caplog)) == 1, warnings(caplog)


async def test_other_failures_of_a_round_still_warn(caplog):
    caplog.set_level(logging.INFO, logger="ddpjob_operator")
    elector = leader.Elector(kube.Kube(kube.Connection(server="http://127.0.0.1:9")), "ops", "lease", "op-2", FAST)
    elector.round_failed(kube.ApiError(500, "InternalError", "etcd timed out"))
    assert warnings(caplog) == ["leader election round failed: HTTP 500 InternalError: etcd timed out"]
    assert elector.withdrawn_since is None
    await elector.api.close()
    await asyncio.sleep(0)
