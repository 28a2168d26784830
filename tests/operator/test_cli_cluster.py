"""`ddpjob submit | status | logs | list | delete | suspend | resume | scale` against the emulated API server
(credentials from a kubeconfig, as a user has them), with the real operator where the job must move."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddpjob_operator import cli, client, naming
from ddpjob_operator.kube import Connection

from .conftest import NAMESPACE, eventually
from tests.kube_emulator import DDPJOBS, api_error
from .test_client import cluster, manifest  # noqa: F401 - the emulated cluster serving pod logs

DDPJOB = Path(sys.executable).with_name("ddpjob")


@pytest.fixture()
def kubeconfig(cluster, tmp_path, monkeypatch) -> Path:  # noqa: F811
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": cluster[1]}}],
        "users": [{"name": "me", "user": {"token": "my-token"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "me", "namespace": NAMESPACE}}]}))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


async def ddpjob(capsys, *argv: str) -> tuple[int, str, str]:
    """`ddpjob ARGV` in a thread (the emulator runs in this loop); exit code, stdout, stderr."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, *docs: dict[str, Any]) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


async def test_submit_list_status_delete(kubeconfig, cluster, capsys, tmp_path):  # noqa: F811
    emulator, _ = cluster
    code, out, err = await ddpjob(capsys, "list")
    assert code == 0 and out == "" and err == f"no DDPJobs in namespace {NAMESPACE}\n"  # the context's namespace
    code, out, _ = await ddpjob(capsys, "submit", write(tmp_path, manifest("one"), manifest("two", replicas=1)))
    assert code == 0 and out.splitlines() == [f"ddpjob {NAMESPACE}/one created", f"ddpjob {NAMESPACE}/two created"]
    code, out, _ = await ddpjob(capsys, "list")
    rows = [line.split() for line in out.splitlines()]
    assert code == 0 and rows[0][:3] == ["NAME", "PHASE", "READY"] and [r[0] for r in rows[1:]] == ["one", "two"]
    code, out, _ = await ddpjob(capsys, "list", "-A")
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [[NAMESPACE, "one"], [NAMESPACE, "two"]]
    await emulator.write((DDPJOBS, NAMESPACE, "one"), {"status": {
        "phase": "Running", "readyReplicas": 2, "worldSize": 2, "restarts": 1,
        "progress": {"step": 30, "totalSteps": 60, "percent": 50, "eta": "1m", "loss": 0.25},
        "ranks": [{"index": 0, "pod": "one-worker-0", "phase": "Running", "ready": True, "node": "n1"},
                  {"index": 1, "pod": "one-worker-1", "phase": "Running", "ready": True, "node": "n2",
                   "restarts": 1, "lastExitCode": 137, "lastReason": "Error"}]}})
    code, out, _ = await ddpjob(capsys, "status", "one")
    assert code == 0
    assert out.splitlines()[0] == f"ddpjob {NAMESPACE}/one: Running"
    assert "workers 2/2 ready, world size 2, restarts 1/2" in out
    assert "progress: step 30 of 60 (50%), ETA 1m, loss 0.2500" in out
    assert "rank 1: one-worker-1 Running ready on n2, restarts 1, last exit 137 (Error)" in out
    code, out, _ = await ddpjob(capsys, "delete", "two")
    assert code == 0 and out.strip() == f"ddpjob {NAMESPACE}/two deleted"
    assert emulator.get(DDPJOBS, NAMESPACE, "two") is None


async def test_a_bad_manifest_prints_what_validate_prints(kubeconfig, cluster, capsys, tmp_path):  # noqa: F811
    emulator, _ = cluster
    path = write(tmp_path, manifest("bad", replicas=0, imagee="x"))
    code, _, err = await ddpjob(capsys, "submit", path)
    assert code == 2 and "Traceback" not in err
    _, _, validate_err = await ddpjob(capsys, "validate", path)
    assert err == validate_err and "spec.replicas: must be >= 1" in err
    assert emulator.live(DDPJOBS) == []


@pytest.mark.parametrize("argv", [["status", "nope"], ["logs", "nope"], ["delete", "nope"], ["suspend", "nope"],
                                  ["resume", "nope"], ["scale", "nope", "--replicas", "2"],
                                  ["status", "nope", "--watch"]])
async def test_a_missing_job_is_named_without_a_traceback(kubeconfig, capsys, argv):
    code, out, err = await ddpjob(capsys, *argv)
    assert code == 1 and out == ""
    assert err.strip() == (f"ddpjob {argv[0]}: ddpjob nope not found in namespace {NAMESPACE} (404). Fix: check the "
                           f"name and the namespace (`ddpjob list -n {NAMESPACE}` lists the jobs there)")


async def test_no_kubeconfig_is_a_message(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    code, _, err = await ddpjob(capsys, "list", "-n", "x")
    assert code == 1 and "no Kubernetes credentials" in err and "Fix: set KUBECONFIG" in err


async def test_submit_watch_shows_the_job_live_until_it_succeeds(kubeconfig, harness, operator, capsys, tmp_path):
    path = write(tmp_path, manifest("fit"))
    capsys.readouterr()
    run = asyncio.create_task(asyncio.to_thread(cli.main, ["submit", path, "--watch"]))
    await harness.wait_workers("fit", 2)
    await eventually(lambda: harness.pods("fit", naming.ROLE_STORE), what="the store pod")
    await harness.run_all("fit")
    await harness.wait_phase("fit", "Running")
    for pod in harness.pods("fit"):
        await harness.exit(pod, 0)
    assert await asyncio.wait_for(run, 30) == 0
    out = capsys.readouterr().out
    assert f"ddpjob {NAMESPACE}/fit created" in out
    assert "job fit: Running" in out and "fit-worker-1: Running (restarts 0)" in out
    assert "job fit: Succeeded after" in out
    assert f"worker logs: ddpjob logs fit -n {NAMESPACE} --rank R" in out


async def test_logs_suspend_resume_scale(kubeconfig, harness, operator, cluster, capsys, tmp_path):  # noqa: F811
    emulator, _ = cluster
    await ddpjob(capsys, "submit", write(tmp_path, manifest("fit")))
    await harness.wait_workers("fit", 2)
    code, _, err = await ddpjob(capsys, "logs", "fit", "--rank", "1")
    assert code == 1 and "has no log yet" in err and "waiting to start" in err
    await eventually(lambda: harness.pods("fit", naming.ROLE_STORE), what="the store pod")
    await harness.run_all("fit")
    await emulator.log(NAMESPACE, "fit-worker-1", "step 1 loss 2.0", "step 2 loss 1.0")
    code, out, _ = await ddpjob(capsys, "logs", "fit", "--rank", "1", "--tail", "1")
    assert code == 0 and out == "step 2 loss 1.0\n"
    code, out, _ = await ddpjob(capsys, "scale", "fit", "--replicas", "3")
    assert code == 0 and out.strip() == f"ddpjob {NAMESPACE}/fit scaled to 3 workers"
    code, _, err = await ddpjob(capsys, "scale", "fit", "--replicas", "9")
    assert code == 2 and err == ("spec.replicas: replicas must be <= maxReplicas: lower replicas (kubectl scale) or "
                                 "raise maxReplicas\n")
    code, out, _ = await ddpjob(capsys, "suspend", "fit")
    assert code == 0 and "suspended" in out
    await harness.settle("fit", lambda: harness.status("fit").get("phase") == "Suspended", what="Suspended")
    code, out, _ = await ddpjob(capsys, "resume", "fit")
    assert code == 0 and emulator.get(DDPJOBS, NAMESPACE, "fit")["spec"]["runPolicy"]["suspend"] is False


async def test_the_installed_command(kubeconfig, cluster, tmp_path):  # noqa: F811
    """The console script itself, as a user runs it (a separate process reading KUBECONFIG)."""
    process = await asyncio.create_subprocess_exec(
        str(DDPJOB), "submit", write(tmp_path, manifest("cmd")), env={**os.environ},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert out.decode().strip() == f"ddpjob {NAMESPACE}/cmd created"
    assert cluster[0].get(DDPJOBS, NAMESPACE, "cmd") is not None


async def test_an_expired_token_is_read_again_once(kubeconfig, cluster):  # noqa: F811
    """An exec plugin's token expires: a 401 reads the kubeconfig again and retries once; a token that is
    still refused is an error with the fix."""
    emulator, _ = cluster
    serve = emulator.serve

    async def refusing(request):  # an API server that no longer accepts the first token
        if request.headers.get("Authorization") == "Bearer my-token":
            return emulator.failure(api_error(401, "Unauthorized", "Unauthorized"))
        return await serve(request)

    emulator.serve = refusing
    api = client.Client()
    assert api.connection.token == "my-token"
    config = yaml.safe_load(kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "renewed-token"
    kubeconfig.write_text(yaml.safe_dump(config))
    assert await asyncio.to_thread(api.list) == []
    assert api.connection.token == "renewed-token"
    stale = client.Client(connection=Connection(server=cluster[1], token="my-token"), namespace=NAMESPACE)
    with pytest.raises(client.ApiError, match="HTTP 401 Unauthorized.*Fix: your credentials were refused"):
        await asyncio.to_thread(stale.list)
