"""The operator's own API client (kube.py) builds every path with one helper (kube.Kind.path): an empty name or
namespace, or one that would move the URL, is refused before anything is sent (an empty pod name made a DELETE of
the pod collection: deletecollection, every pod of the namespace), and every segment is percent-escaped, so a
'?' or '#' in a name names that object instead of ending the path."""

from typing import AsyncIterator

import pytest
import pytest_asyncio

from ddpjob_operator import kube, object_names

from tests.kube_emulator import PODS


@pytest_asyncio.fixture()
async def api(cluster) -> AsyncIterator[kube.Kube]:
    """The operator's client, and pods a and b in namespace default."""
    emulator, url = cluster
    for name in ("a", "b"):
        await emulator.create(PODS, "default", {"metadata": {"name": name}, "spec": {"containers": [{"name": "c"}]}})
    client = kube.Kube(kube.Connection(server=url))
    yield client
    await client.close()


async def test_an_empty_or_url_moving_name_is_refused_and_every_pod_stays(cluster, api):
    emulator, _ = cluster
    for namespace, name in (("default", ""), ("default", "."), ("default", ".."), ("default", "a/b"),
                            ("default", "a%2Fb"), ("", "a"), ("..", "a"), ("x/y", "a")):
        with pytest.raises(object_names.InvalidName, match="Fix: "):
            await api.delete(kube.PODS, namespace, name, grace_seconds=0)
        with pytest.raises(object_names.InvalidName):
            await api.patch_pod_labels(namespace, name, {"x": "y"})
        with pytest.raises(object_names.InvalidName):
            await api.get(kube.PODS, namespace, name)
    with pytest.raises(object_names.InvalidName, match="namespace is empty"):
        await api.list_page(kube.PODS, "", {})
    assert sorted(p["metadata"]["name"] for p in emulator.live(PODS, "default")) == ["a", "b"]


async def test_a_query_or_fragment_character_in_a_name_is_escaped(cluster, api):
    """`x?watch=true` is a pod name to look up (404 here), not the pod collection's URL with a query; `a?` is not
    pod a, `#x` not the collection."""
    emulator, _ = cluster
    for name in ("x?watch=true", "#x", "a?", "a#b", "a b"):
        with pytest.raises(kube.ApiError) as raised:
            await api.get(kube.PODS, "default", name)
        assert raised.value.status == 404 and name in raised.value.message
        assert not await api.delete(kube.PODS, "default", name)  # 404: not there, nothing else touched
    assert sorted(p["metadata"]["name"] for p in emulator.live(PODS, "default")) == ["a", "b"]
    assert kube.PODS.path("default", "a?b", "log") == "/api/v1/namespaces/default/pods/a%3Fb/log"
    assert kube.DDPJOBS.path(None) == "/apis/elastic.ddp.dev/v1alpha1/ddpjobs"
