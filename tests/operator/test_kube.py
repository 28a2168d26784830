"""The thin API layer's idempotency rules, over HTTP against the emulated API server."""

from ddpjob_operator import kube

from tests.kube_emulator import PODS


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}


async def test_create_of_an_existing_object_is_done_not_an_error(cluster):
    _, url = cluster
    api = kube.Kube(kube.Connection(server=url))
    try:
        assert await api.create(_pod("p")) is not None
        assert await api.create(_pod("p")) is None
    finally:
        await api.close()


async def test_delete_names_the_incarnation_it_means(cluster):
    """A stale view must never delete the newer pod that reuses a replaced pod's name."""
    emulator, url = cluster
    api = kube.Kube(kube.Connection(server=url))
    try:
        old = await api.create(_pod("job-worker-1"))
        assert await api.delete(kube.PODS, "default", "job-worker-1", grace_seconds=0,
                                uid=old["metadata"]["uid"])
        new = await api.create(_pod("job-worker-1"))
        assert new["metadata"]["uid"] != old["metadata"]["uid"]

        # The old uid again (a pass that still saw the old pod): nothing happens to the new one.
        assert not await api.delete(kube.PODS, "default", "job-worker-1", grace_seconds=0,
                                    uid=old["metadata"]["uid"])
        assert [p["metadata"]["uid"] for p in emulator.live(PODS, "default")] == \
            [new["metadata"]["uid"]]
        assert not await api.delete(kube.PODS, "default", "gone", uid="x")  # 404: already gone
    finally:
        await api.close()
