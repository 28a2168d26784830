"""An empty or invalid DDPJob name or namespace never reaches the API server (issue 38).

`ddpjob delete ""` (an unset `$JOB`) sent DELETE .../namespaces/NS/ddpjobs: the collection's URL, which the API
server serves as deletecollection, so every DDPJob of the namespace went (their pods and checkpoint claims with
them) and the CLI printed "deleted". A name holding '/', '?', '#' or '%', or '.' and '..', changes the URL too.
Every verb of the CLI and of the Python client refuses such a name or namespace before it sends anything, with
one line naming the argument and the fix; the jobs stay."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from typing import Any, AsyncIterator, Callable

import kmock
import pytest
import pytest_asyncio
import yaml

from ddpjob_operator import client, kube, object_names
from ddpjob_operator.kube import Connection

from .conftest import NAMESPACE
from tests.kube_emulator import DDPJOBS
from tests.kube_emulator import LogCluster
from .test_cli_cluster import DDPJOB, ddpjob, kubeconfig, write  # noqa: F401 - the CLI as a user runs it
from .test_client import CONFIG_MAPS, manifest

# Each is refused as a DDPJob name: empty, a path segment that moves the URL, or no DNS-1035 label of <= 50.
BAD_NAMES = ("", "a/b", "#x", "?x", "x?watch=true", ".", "..", "x%2F", "One", "one\n", " one", "x" * 51)
BAD_NAMESPACES = ("", "a/b", "#x", "?x", ".", "..", "Team-A", "team_a", "x" * 64)


class RecordingCluster(LogCluster):
    """The emulated API server (with deletecollection), keeping every resource request it was sent."""

    @property
    def sent(self) -> list[str]:
        return self.__dict__.setdefault("_sent", [])

    async def serve(self, request: Any) -> Any:
        if request.resource is not None and request.resource.plural:
            self.sent.append(f"{request.method.value} {request.url.raw_path}")
        return await super().serve(request)


@pytest_asyncio.fixture()
async def cluster() -> AsyncIterator[tuple[RecordingCluster, str]]:
    """Two DDPJobs in NAMESPACE, and nothing yet sent after them."""
    async with RecordingCluster() as emulator, kmock.Server(emulator) as server:
        emulator.register_resources()
        emulator.resources[CONFIG_MAPS] = kmock.ResourceInfo(
            kind="ConfigMap", singular="configmap", namespaced=True,
            verbs={"list", "watch", "get", "create", "update", "patch", "delete"})
        url = str(server.url).rstrip("/")
        api = client.Client(namespace=NAMESPACE, connection=Connection(server=url, insecure=True))
        for name in ("one", "two"):
            await asyncio.to_thread(api.create, manifest(name), judge=False)
        emulator.sent.clear()
        yield emulator, url


def both_jobs_stay(emulator: RecordingCluster) -> None:
    assert emulator.sent == []
    assert sorted(job["metadata"]["name"] for job in emulator.live(DDPJOBS, NAMESPACE)) == ["one", "two"]


def delete_url(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="DELETE")) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


async def test_the_collection_url_an_empty_name_made_is_a_deletecollection(cluster):
    """What `delete ""` sent before: the emulator, as the API server, deletes every DDPJob of the namespace there
    (and answers 405 on the all-namespaces URL, where the API server has no deletecollection)."""
    emulator, url = cluster
    code, deleted = await asyncio.to_thread(delete_url, url + kube.DDPJOBS.path(NAMESPACE))
    assert (code, deleted["kind"]) == (200, "DDPJobList")
    assert [job["metadata"]["name"] for job in deleted["items"]] == ["one", "two"]
    assert emulator.live(DDPJOBS, NAMESPACE) == []
    code, _ = await asyncio.to_thread(delete_url, url + kube.DDPJOBS.path(None))
    assert code == 405


# ---------------------------------------------------------------- the CLI


JOB_VERBS = (("delete",), ("delete", "--wait"), ("status",), ("status", "--watch"), ("logs",), ("logs", "-f"),
             ("suspend",), ("resume",), ("scale", "--replicas", "2"))


async def test_the_cli_refuses_a_bad_name_or_namespace_and_sends_nothing(kubeconfig, cluster, capsys,  # noqa: F811
                                                                         tmp_path):
    emulator, _ = cluster
    runs = [((verb, name, *options), "NAME") for verb, *options in JOB_VERBS for name in BAD_NAMES]
    namespaced = [(verb, "one", *options) for verb, *options in JOB_VERBS]
    namespaced += [("list",), ("submit", write(tmp_path, manifest("three")))]
    runs += [((*argv, "-n", namespace), "--namespace") for argv in namespaced for namespace in BAD_NAMESPACES]
    for argv, argument in runs:
        code, out, err = await ddpjob(capsys, *argv)
        assert (code, out) == (2, ""), argv
        assert err.count("\n") == 1 and err.startswith(f"ddpjob {argv[0]}: {argument} "), (argv, err)
        assert "Fix: " in err and "Traceback" not in err, (argv, err)
    code, _, err = await ddpjob(capsys, "delete", "", "-n", NAMESPACE)
    assert "NAME is empty" in err and "every DDPJob of the namespace" in err
    both_jobs_stay(emulator)


async def test_the_installed_command_refuses_an_unset_job_variable(kubeconfig, cluster):  # noqa: F811
    """`ddpjob delete "$JOB"` with JOB unset, as a shell runs it: a separate process, exit 2, one line."""
    emulator, _ = cluster
    process = await asyncio.create_subprocess_exec(
        str(DDPJOB), "delete", "", env={**os.environ}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert (process.returncode, out) == (2, b"")
    assert err.decode().startswith("ddpjob delete: NAME is empty: ") and err.count(b"\n") == 1
    both_jobs_stay(emulator)


async def test_a_bad_namespace_in_the_kubeconfig_is_named(kubeconfig, cluster, capsys):  # noqa: F811
    emulator, _ = cluster
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = "Team/A"
    kubeconfig.write_text(yaml.safe_dump(config))
    code, out, err = await ddpjob(capsys, "delete", "one")
    assert (code, out) == (2, "")
    assert err.startswith("ddpjob delete: the kubeconfig context's namespace 'Team/A' may not ") and "Fix: " in err
    both_jobs_stay(emulator)


async def test_the_cli_still_deletes_the_job_it_names(kubeconfig, cluster, capsys):  # noqa: F811
    emulator, _ = cluster
    code, out, _ = await ddpjob(capsys, "delete", "two", "-n", NAMESPACE)
    assert (code, out) == (0, f"ddpjob {NAMESPACE}/two deleted\n")
    assert [job["metadata"]["name"] for job in emulator.live(DDPJOBS, NAMESPACE)] == ["one"]


# ---------------------------------------------------------------- the Python client


def train() -> None:
    """A function job's body (never run here)."""


# verb -> a call of it with (client, name, namespace); iterators are drained (nothing is asked before the first item)
JOB_CALLS: dict[str, Callable[[client.Client, Any, Any], Any]] = {
    "get": lambda api, name, ns: api.get(name, ns),
    "delete": lambda api, name, ns: api.delete(name, ns),
    "delete(wait=True)": lambda api, name, ns: api.delete(name, ns, wait=True, timeout=1),
    "suspend": lambda api, name, ns: api.suspend(name, ns),
    "resume": lambda api, name, ns: api.resume(name, ns),
    "scale": lambda api, name, ns: api.scale(name, 2, ns),
    "wait": lambda api, name, ns: api.wait(name, namespace=ns, timeout=1),
    "watch": lambda api, name, ns: list(api.watch(name, ns, timeout=1)),
    "progress": lambda api, name, ns: list(api.progress(name, ns, timeout=1)),
    "logs": lambda api, name, ns: list(api.logs(name, 0, ns)),
    "worker_pod": lambda api, name, ns: api.worker_pod(name, 0, ns),
}
NAMESPACE_CALLS: dict[str, Callable[[client.Client, Any], Any]] = {
    "list": lambda api, ns: api.list(ns),
    "create": lambda api, ns: api.create(manifest("three"), ns),
    "judge": lambda api, ns: api.judge(manifest("three"), ns),
    "submit_function": lambda api, ns: api.submit_function(train, ns),
    "submit": lambda api, ns: client.submit(train, client=api, namespace=ns),
    "Client": lambda api, ns: client.Client(namespace=ns, connection=api.connection).list(),
    **{verb: (lambda call: lambda api, ns: call(api, "one", ns))(call) for verb, call in JOB_CALLS.items()},
}


def refused(call: Callable[[], Any], argument: str) -> str:
    with pytest.raises(ValueError) as raised:
        call()
    error = raised.value
    assert isinstance(error, client.InvalidName) and isinstance(error, client.DDPJobError)
    assert str(error).startswith(f"{argument} ") and "Fix: " in str(error) and "\n" not in str(error)
    return str(error)


@pytest.mark.parametrize("verb", JOB_CALLS)
async def test_the_client_refuses_a_bad_job_name_and_sends_nothing(cluster, verb):
    emulator, url = cluster
    api = client.Client(namespace=NAMESPACE, connection=Connection(server=url, insecure=True))
    for name in (*BAD_NAMES, None, 3):
        await asyncio.to_thread(refused, lambda: JOB_CALLS[verb](api, name, None), "name")
    both_jobs_stay(emulator)


@pytest.mark.parametrize("verb", NAMESPACE_CALLS)
async def test_the_client_refuses_a_bad_namespace_and_sends_nothing(cluster, verb):
    emulator, url = cluster
    api = client.Client(namespace=NAMESPACE, connection=Connection(server=url, insecure=True))
    for namespace in (*BAD_NAMESPACES, 3):
        await asyncio.to_thread(refused, lambda: NAMESPACE_CALLS[verb](api, namespace), "namespace")
    both_jobs_stay(emulator)


async def test_a_pod_name_from_the_status_is_checked_before_its_log_is_asked_for(cluster):
    """status.ranks[].pod comes from the server: a pod name no pod can have is refused, not put in a URL."""
    emulator, url = cluster
    api = client.Client(namespace=NAMESPACE, connection=Connection(server=url, insecure=True))
    await emulator.write((DDPJOBS, NAMESPACE, "one"), {"status": {"ranks": [{"index": 0, "pod": "../two", "phase": "Running"}]}})
    emulator.sent.clear()
    message = await asyncio.to_thread(refused, lambda: list(api.logs("one", 0)), f"ddpjob {NAMESPACE}/one status.ranks[].pod")
    assert "a pod name" in message
    assert emulator.sent == [f"GET {kube.DDPJOBS.path(NAMESPACE, 'one')}"]


def test_every_rule_refuses_what_no_object_can_be_named():
    """The rules themselves, each against its own limits (the model's for a DDPJob name)."""
    limits = {object_names.JOB_NAME: 50, object_names.NAMESPACE: 63, object_names.POD_NAME: 253}
    for rule, longest in limits.items():
        assert object_names.check("a" * longest, rule, "x") == "a" * longest
        for bad in ("", ".", "..", "a/b", "a%2F", "a?b", "a#b", "a b", "a\n", "-a", "a-", "A", "a" * (longest + 1)):
            with pytest.raises(object_names.InvalidName, match=r"^x .*Fix: "):
                object_names.check(bad, rule, "x")
    assert object_names.check("a.b", object_names.POD_NAME, "x") == "a.b"
    assert object_names.check("1a", object_names.NAMESPACE, "x") == "1a"
    with pytest.raises(object_names.InvalidName, match="DNS-1035"):
        object_names.check("1a", object_names.JOB_NAME, "x")  # a job's name starts with a letter
