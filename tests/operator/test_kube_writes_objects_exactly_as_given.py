"""kube.Kube's public verbs for an object the caller owns whole (the Lease), against the emulated API server:
`get` raises on a missing object, `write` creates or replaces exactly what it is given and, unlike `create`,
raises on a 409 (a name taken, a replace decided on a resourceVersion someone changed since); `before_write`
refuses every call but a read."""

from __future__ import annotations

import pytest

from ddpjob_operator import kube, leader

NAMESPACE = "ddpjob-system"


def lease(holder: str, resource_version: str | None = None, renewed: str = "2026-11-29T12:00:00.000000Z") -> dict:
    meta = {"name": "the-lease", "namespace": NAMESPACE}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed}}


async def test_write_creates_and_replaces_and_refuses_a_stale_version(cluster):
    _, url = cluster
    api = kube.Kube(kube.Connection(server=url))
    try:
        with pytest.raises(kube.ApiError) as missing:
            await api.get(leader.LEASES, NAMESPACE, "the-lease")
        assert missing.value.status == 404
        created = await api.write(leader.LEASES, lease("a"), create=True)
        assert created["spec"]["holderIdentity"] == "a"
        with pytest.raises(kube.ApiError) as taken:
            await api.write(leader.LEASES, lease("b"), create=True)  # b lost the race to create it
        assert taken.value.status == 409
        version = created["metadata"]["resourceVersion"]
        replaced = await api.write(leader.LEASES, lease("a", version, "2026-11-29T12:00:02.000000Z"), create=False)
        assert replaced["metadata"]["resourceVersion"] != version
        with pytest.raises(kube.ApiError) as stale:
            await api.write(leader.LEASES, lease("b", version), create=False)  # decided on the old version
        assert stale.value.status == 409
        assert (await api.get(leader.LEASES, NAMESPACE, "the-lease"))["spec"]["holderIdentity"] == "a"
    finally:
        await api.close()


async def test_before_write_refuses_writes_and_lets_reads_through(cluster):
    _, url = cluster
    refused: list[str] = []

    def fence() -> None:
        refused.append("write")
        raise leader.NotLeader("operator-b")

    api = kube.Kube(kube.Connection(server=url), user_agent="ddpjob-operator/operator-b", before_write=fence)
    try:
        with pytest.raises(leader.NotLeader):
            await api.write(leader.LEASES, lease("b"), create=True)
        with pytest.raises(kube.ApiError) as missing:  # a read goes to the server: nothing was created
            await api.get(leader.LEASES, NAMESPACE, "the-lease")
        assert missing.value.status == 404 and refused == ["write"]
    finally:
        await api.close()
