"""The Python API (ddpjob_operator.client; `import ddpjob` gives the same objects) against the emulated API
server, with the real operator where the job must move: every verb, and every error path (a bad manifest, a
missing job, a timeout, a job that failed while awaited, logs of a pod that does not run yet). The client is
synchronous: each call runs in a thread, as in a user's program, while the emulator and the test's kubelet run
in the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import kmock
import pytest
import pytest_asyncio
import yaml

from ddpjob_operator import cli, client, function_job, model, naming, validation
from ddpjob_operator.kube import Connection

from .conftest import NAMESPACE, eventually
from tests.kube_emulator import DDPJOBS, PODS
from tests.kube_emulator import LogCluster

CONFIG_MAPS = kmock.resource("", "v1", "configmaps")
MANIFEST = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": "fit"},
            "spec": {"replicas": 2, "maxReplicas": 3, "image": "trainer:1", "entrypoint": "ddp_trainer",
                     "failurePolicy": {"maxRestarts": 2}}}


@pytest_asyncio.fixture()
async def cluster() -> AsyncIterator[tuple[LogCluster, str]]:
    """The conftest's emulated cluster, serving pod logs too."""
    async with LogCluster() as emulator, kmock.Server(emulator) as server:
        emulator.register_resources()
        emulator.resources[CONFIG_MAPS] = kmock.ResourceInfo(  # function jobs ship their program in one
            kind="ConfigMap", singular="configmap", namespaced=True,
            verbs={"list", "watch", "get", "create", "update", "patch", "delete"})
        yield emulator, str(server.url).rstrip("/")


@pytest.fixture()
def api(cluster) -> client.Client:
    return client.Client(namespace=NAMESPACE, connection=Connection(server=cluster[1], insecure=True))


def manifest(name: str = "fit", **spec: Any) -> dict[str, Any]:
    return {**MANIFEST, "metadata": {"name": name}, "spec": {**MANIFEST["spec"], **spec}}


async def call(fn, *args, **kwargs):
    return await asyncio.to_thread(fn, *args, **kwargs)


def stored(emulator, name: str) -> dict[str, Any] | None:
    return emulator.get(DDPJOBS, NAMESPACE, name)


# ---------------------------------------------------------------- create, get, list


async def test_create_from_a_file_a_dict_and_the_model(api, cluster, tmp_path):
    emulator, _ = cluster
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("from-file")))
    created = await call(api.create, path)
    assert (created.name, created.namespace) == ("from-file", NAMESPACE) and created.uid
    await call(api.create, manifest("from-dict", replicas=1))
    typed = model.DDPJob.model_validate(manifest("from-model", replicas=3))
    await call(api.create, typed)
    names = sorted(j.name for j in await call(api.list))
    assert names == ["from-dict", "from-file", "from-model"]
    got = await call(api.get, "from-model")
    assert isinstance(got.spec, model.DDPJobSpec) and got.spec.replicas == 3 and got.spec.max_nodes == 3
    assert stored(emulator, "from-dict")["spec"]["replicas"] == 1  # what the server holds
    assert [j.name for j in await call(api.list, "elsewhere")] == []
    assert len(await call(api.list, all_namespaces=True)) == 3


async def test_a_bad_manifest_is_refused_with_the_validate_messages_and_nothing_is_sent(api, cluster, tmp_path):
    emulator, _ = cluster
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(manifest("bad", replicas=4, maxReplicas=3, nprocPerNod=2)))
    with pytest.raises(client.InvalidManifest) as raised:
        await call(api.create, path)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert cli.main(["validate", str(path)]) == 2
    assert [str(e) for e in raised.value.errors] == stderr.getvalue().splitlines()
    text = str(raised.value)
    assert "spec.nprocPerNod: unknown field. Fix: did you mean `nprocPerNode`?" in text
    with pytest.raises(client.InvalidManifest, match="replicas must be <= maxReplicas"):
        await call(api.create, manifest("bad", replicas=4, maxReplicas=3))
    with pytest.raises(client.InvalidManifest, match=r"metadata.name: .*Fix"):
        await call(api.create, {**manifest(), "metadata": {"name": "Bad_Name"}})
    assert emulator.live(DDPJOBS) == []


async def test_a_second_job_of_the_same_name_is_refused(api):
    await call(api.create, manifest())
    with pytest.raises(client.JobExists, match=f"ddpjob fit already exists in namespace {NAMESPACE}.*Fix"):
        await call(api.create, manifest())


@pytest.mark.parametrize("verb", ["get", "delete", "suspend", "resume", "scale", "wait", "watch", "progress",
                                  "logs", "worker_pod"])
async def test_a_missing_job_is_named(api, verb):
    args: tuple[Any, ...] = {"scale": ("nope", 2)}.get(verb, ("nope",))
    fn = getattr(api, verb)
    with pytest.raises(client.JobNotFound) as raised:
        result = await call(fn, *args)
        if isinstance(result, Iterator):  # watch, progress, logs: nothing is asked before the first item
            await call(list, result)
    assert f"ddpjob nope not found in namespace {NAMESPACE} (404)" in str(raised.value)
    assert "Fix:" in str(raised.value)


async def test_no_cluster_is_a_message_not_a_traceback():
    api = client.Client(namespace="x", connection=Connection(server="http://127.0.0.1:9", insecure=True))
    with pytest.raises(client.DDPJobError, match="cannot reach the Kubernetes API at http://127.0.0.1:9.*Fix"):
        await call(api.list)


# ---------------------------------------------------------------- waiting, with the real operator


async def start(api, harness, name: str = "fit", **spec: Any) -> client.Job:
    created = await call(api.create, manifest(name, **spec))
    await harness.wait_workers(name, (spec.get("replicas") or 2))
    await eventually(lambda: harness.pods(name, naming.ROLE_STORE), what="the store pod")
    await harness.run_all(name)
    return created


async def test_wait_for_a_phase_and_for_a_condition(api, harness, operator):
    await start(api, harness)
    running = await call(api.wait, "fit", "Running", timeout=30)
    assert running.phase == "Running" and running.status.ready_replicas == 2
    assert (await call(api.wait, "fit", condition="Running", timeout=30)).condition("Running").status == "True"
    for pod in harness.pods("fit"):
        await harness.exit(pod, 0)
    done = await call(api.wait, "fit", timeout=30)  # default: Succeeded
    assert done.phase == "Succeeded"


async def test_a_timeout_says_what_was_awaited_and_the_last_status(api, harness, operator):
    await start(api, harness)
    await harness.wait_phase("fit", "Running")
    with pytest.raises(client.WaitTimeout) as raised:
        await call(api.wait, "fit", "Succeeded", timeout=0.5)
    text = str(raised.value)
    assert f"waiting for ddpjob {NAMESPACE}/fit to reach phase Succeeded" in text
    assert "last status: phase Running" in text and "2/2 workers ready" in text
    assert isinstance(raised.value, TimeoutError) and raised.value.job.phase == "Running"


async def test_a_job_that_fails_while_awaited_ends_the_wait_with_its_reason(api, harness, operator):
    await start(api, harness)
    await harness.wait_phase("fit", "Running")
    await harness.exit(naming.worker_name("fit", 1), 1)  # a user error: Failed at once
    with pytest.raises(client.JobEnded) as raised:
        await call(api.wait, "fit", timeout=30)
    assert f"ddpjob {NAMESPACE}/fit ended Failed while waiting for it to reach phase Succeeded" in str(raised.value)
    assert "PermanentError" in str(raised.value)


async def test_progress_follows_status_progress_until_the_job_ends(api, cluster):
    emulator, _ = cluster
    await call(api.create, manifest())
    seen: list[model.Progress] = []
    done = threading.Event()

    def follow() -> None:
        for p in api.progress("fit", timeout=30):
            seen.append(p)
        done.set()

    task = asyncio.create_task(asyncio.to_thread(follow))
    key = (DDPJOBS, NAMESPACE, "fit")
    await emulator.write(key, {"status": {"phase": "Running", "progress": {"step": 10, "totalSteps": 40,
                                                                            "loss": 1.5}}})
    await eventually(lambda: len(seen) == 1, what="the first progress")
    await emulator.write(key, {"status": {"message": "no progress change"}})  # not a new progress
    await emulator.write(key, {"status": {"progress": {"step": 20, "totalSteps": 40, "loss": 0.9}}})
    await eventually(lambda: len(seen) == 2, what="the second progress")
    await emulator.write(key, {"status": {"phase": "Succeeded"}})
    await task
    assert done.is_set() and [(p.step, p.loss) for p in seen] == [(10, 1.5), (20, 0.9)]


# ---------------------------------------------------------------- suspend, resume, scale, delete


async def test_suspend_resume_and_scale(api, harness, operator, cluster):
    emulator, _ = cluster
    await start(api, harness)
    await harness.wait_phase("fit", "Running")
    suspended = await call(api.suspend, "fit")
    assert suspended.raw["spec"]["runPolicy"]["suspend"] is True
    await harness.settle("fit", lambda: harness.status("fit").get("phase") == "Suspended" and not harness.pods("fit"),
                         what="the job suspended, its workers gone")
    assert (await call(api.wait, "fit", "Suspended", timeout=5)).phase == "Suspended"
    await call(api.resume, "fit")
    assert stored(emulator, "fit")["spec"]["runPolicy"]["suspend"] is False
    await harness.wait_workers("fit", 2)
    scaled = await call(api.scale, "fit", 3)
    assert scaled.raw["spec"]["replicas"] == 3
    await harness.settle("fit", lambda: len([p for p in harness.pods("fit").values()
                                             if not p["metadata"].get("deletionTimestamp")]) == 3,
                         what="three workers")
    with pytest.raises(client.InvalidManifest) as raised:
        await call(api.scale, "fit", 4)
    assert "spec.replicas: replicas must be <= maxReplicas" in str(raised.value)
    assert stored(emulator, "fit")["spec"]["replicas"] == 3  # nothing was sent


async def test_delete_removes_the_job_and_what_it_owns(api, harness, operator, cluster):
    emulator, _ = cluster
    await start(api, harness)
    await call(api.delete, "fit", wait=True, timeout=30)
    assert stored(emulator, "fit") is None
    await harness.settle("fit", lambda: not harness.pods("fit") and not harness.pods("fit", naming.ROLE_STORE),
                         what="the job's pods collected")
    with pytest.raises(client.JobNotFound):
        await call(api.delete, "fit")


# ---------------------------------------------------------------- logs


async def test_logs_of_a_rank_and_their_errors(api, harness, operator, cluster):
    emulator, _ = cluster
    await call(api.create, manifest())
    await harness.wait_workers("fit", 2)
    with pytest.raises(client.LogsUnavailable, match="has no log yet.*waiting to start: ContainerCreating.*Fix"):
        await call(list, api.logs("fit", rank=1))
    with pytest.raises(client.LogsUnavailable, match="has no rank 3. Fix: pick a rank in 0..2"):
        await call(list, api.logs("fit", rank=3))
    await harness.run_all("fit")
    await emulator.log(NAMESPACE, "fit-worker-0", "rank0 step 1", "rank0 step 2")
    await emulator.log(NAMESPACE, "fit-worker-1", "rank1 step 1", "rank1 step 2", "rank1 step 3")
    assert await call(list, api.logs("fit")) == ["rank0 step 1", "rank0 step 2"]
    assert await call(list, api.logs("fit", rank=1, tail_lines=2)) == ["rank1 step 2", "rank1 step 3"]


async def test_follow_streams_across_a_replaced_pod_until_the_job_ends(api, harness, operator, cluster):
    emulator, _ = cluster
    await start(api, harness)
    await harness.wait_phase("fit", "Running")
    worker = naming.worker_name("fit", 1)
    await emulator.log(NAMESPACE, worker, "first pod: step 1")
    lines: list[str] = []

    def follow() -> None:
        lines.extend(api.logs("fit", rank=1, follow=True))

    task = asyncio.create_task(asyncio.to_thread(follow))
    await eventually(lambda: lines == ["first pod: step 1"], what="the first line")
    await emulator.log(NAMESPACE, worker, "first pod: killed")
    first_uid = harness.pods("fit")[worker]["metadata"]["uid"]
    await harness.exit(worker, 137, reason="Error")  # charged, replaced
    await harness.settle("fit", lambda: worker in harness.pods("fit")
                         and harness.pods("fit")[worker]["metadata"]["uid"] != first_uid, what="a new pod")
    await harness.run(worker)
    await emulator.log(NAMESPACE, worker, "second pod: resumed")
    await eventually(lambda: lines[-1:] == ["second pod: resumed"], what="the replacement's line")
    for pod in harness.pods("fit"):
        await harness.exit(pod, 0)
    await asyncio.wait_for(task, 30)
    assert lines == ["first pod: step 1", "first pod: killed", "second pod: resumed"]
    assert emulator.get(PODS, NAMESPACE, worker) is not None


# ---------------------------------------------------------------- a function as a job


def train(steps: int = 1) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    for _ in range(steps):
        dist.barrier()


async def test_submit_ships_the_function_in_a_config_map_the_job_owns(api, cluster):
    emulator, _ = cluster
    job = await call(client.submit, train, client=api, name="fn", replicas=2, kwargs={"steps": 3})
    config_map = emulator.get(CONFIG_MAPS, NAMESPACE, "fn-function")
    assert config_map["data"][function_job.PROGRAM].rstrip().endswith("train(**_ddpjob_json.loads('{\"steps\": 3}'))")
    assert [(r["kind"], r["name"], r["uid"]) for r in config_map["metadata"]["ownerReferences"]] == \
        [("DDPJob", "fn", job.uid)]
    spec = stored(emulator, "fn")["spec"]
    assert spec["entrypoint"] == f"{function_job.MOUNT_PATH}/{function_job.PROGRAM}" and spec["replicas"] == 2
    assert {"name": "function", "configMap": {"name": "fn-function"}} in spec["template"]["volumes"]
    with pytest.raises(client.JobExists):
        await call(client.submit, train, client=api, name="fn")
    await call(api.delete, "fn", wait=True, timeout=30)
    await eventually(lambda: emulator.get(CONFIG_MAPS, NAMESPACE, "fn-function") is None,
                     what="the ConfigMap collected with its job")


# ---------------------------------------------------------------- `import ddpjob`

DOCS = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"
# Every name the client package gives its users (classes, functions of its modules): `ddpjob` must carry each one.
CLIENT_API = sorted(n for n, v in vars(client).items()
                    if not n.startswith("_") and (getattr(v, "__module__", None) or "").startswith(f"{client.__name__}."))


def test_the_client_package_gives_what_it_lists():
    assert CLIENT_API == sorted(client.__all__)


@pytest.mark.parametrize("name", CLIENT_API)
def test_import_ddpjob_gives_the_clients_own_objects(name):
    import ddpjob

    assert name in ddpjob.__all__ and getattr(ddpjob, name) is getattr(client, name)


@pytest.mark.parametrize("name, same", [("DDPJob", model.DDPJob), ("DDPJobSpec", model.DDPJobSpec),
                                        ("DDPJobStatus", model.DDPJobStatus), ("model", model),
                                        ("function_job", function_job), ("FieldError", validation.FieldError)])
def test_import_ddpjob_gives_the_model_and_function_jobs(name, same):
    import ddpjob

    assert name in ddpjob.__all__ and getattr(ddpjob, name) is same


def test_every_verb_the_guide_names_is_on_import_ddpjob():
    import ddpjob

    named = set(re.findall(r"`((?:jobs|ddpjob)\.[\w.]+)\(", DOCS.read_text()))
    assert {"jobs.create", "jobs.watch", "jobs.progress", "jobs.logs", "jobs.delete", "ddpjob.submit"} <= named
    for dotted in sorted(named):
        head, *path = dotted.split(".")
        obj: Any = ddpjob.Client if head == "jobs" else ddpjob
        for part in path:
            assert hasattr(obj, part), f"docs/python-api.md names {dotted}, which `import ddpjob` lacks"
            obj = getattr(obj, part)
        assert callable(obj), dotted
    assert set(ddpjob.__all__) <= set(dir(ddpjob))


def test_import_ddpjob_needs_no_torch_and_leaves_the_ddpjob_command_alone(tmp_path):
    code = ("import sys, ddpjob; from importlib.metadata import entry_points; "
            "print('torch' in sys.modules, ddpjob.__file__, "
            "[e.value for e in entry_points(group='console_scripts', name='ddpjob')], sep='\\n')")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                            timeout=60)
    torch_loaded, path, commands = result.stdout.splitlines()
    assert torch_loaded == "False"
    assert Path(path) == Path(__file__).resolve().parents[2] / "operator" / "ddpjob" / "__init__.py"
    assert commands == "['ddpjob_operator.cli:main']"  # the command is still the CLI, not this package
