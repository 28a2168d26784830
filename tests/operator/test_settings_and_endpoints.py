"""Operator settings validation, `ddpjob render`, and the metrics and liveness endpoints."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from ddpjob_operator import informer, job_manifests, kube, naming, settings
from ddpjob_operator.validation import parse_job

from .conftest import FAST, OperatorProcess, assert_within_permissions, eventually
from tests.kube_emulator import labels_match, parse_label_selector

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_watch_all_namespaces():
    s = settings.from_env({})
    assert s.clusterwide and s.metrics_port == 9090 and s.health_port == 8080
    assert s.liveness_endpoint == "http://0.0.0.0:8080/healthz"


def test_values_are_parsed():
    s = settings.from_env({"DDPJOB_OPERATOR_WATCH_NAMESPACES": "team-a, team-b", "DDPJOB_OPERATOR_LOG_LEVEL": "debug",
                           "DDPJOB_OPERATOR_METRICS_PORT": "0", "DDPJOB_OPERATOR_STUCK_TERMINATING_SECONDS": "90",
                           "DDPJOB_OPERATOR_CANNOT_START_SECONDS": "120",
                           "DDPJOB_OPERATOR_INCIDENT_SETTLE_SECONDS": "4",
                           "DDPJOB_OPERATOR_MAX_CONCURRENT_RECONCILES": "8", "DDPJOB_OPERATOR_PROGRESS_PORT": "auto"})
    assert s.watch_namespaces == ("team-a", "team-b") and not s.clusterwide
    assert s.log_level == "DEBUG" and s.metrics_port == 0 and s.stuck_terminating_seconds == 90
    assert s.progress_port == settings.AUTO_PORT
    assert s.cannot_start_seconds == 120 and s.incident_settle_seconds == 4 and s.max_concurrent_reconciles == 8


@pytest.mark.parametrize("name, value, words", [
    ("DDPJOB_OPERATOR_METRICS_PORT", "http", "whole number 0-65535"),
    ("DDPJOB_OPERATOR_HEALTH_PORT", "70000", "whole number 0-65535"),
    ("DDPJOB_OPERATOR_LOG_LEVEL", "LOUD", "DEBUG, INFO, WARNING, ERROR"),
    ("DDPJOB_OPERATOR_WATCH_NAMESPACES", "Team_A", "DNS-1123"),
    ("DDPJOB_OPERATOR_RESYNC_SECONDS", "-1", "greater than 0"),
    ("DDPJOB_OPERATOR_MAX_CONCURRENT_RECONCILES", "0", "at least 1"),
    ("DDPJOB_OPERATOR_RESYNC_SECONDZ", "1", "unknown setting"),
])
def test_bad_values_name_the_variable_and_the_fix(name, value, words):
    with pytest.raises(settings.SettingsError) as caught:
        settings.from_env({name: value})
    assert name in str(caught.value) and words in str(caught.value)


def test_operator_refuses_bad_settings_without_a_traceback():
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator.run"], capture_output=True, text=True,
                            env={"DDPJOB_OPERATOR_METRICS_PORT": "nope", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert result.returncode == 2
    assert "DDPJOB_OPERATOR_METRICS_PORT" in result.stderr and "Traceback" not in result.stderr


def test_render_prints_what_the_operator_creates():
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "render", str(ROOT / "examples/cpu-digits.yaml"),
                             "-n", "ml", "--uid", "u-1"], capture_output=True, text=True, check=True, timeout=60)
    docs = list(yaml.safe_load_all(result.stdout))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ConfigMap", job_manifests.agent_config_map_name("digits-cpu")), ("Service", "digits-cpu-workers"), ("Service", "digits-cpu-rdzv"), ("PersistentVolumeClaim", "digits-cpu-checkpoints"),
        ("Pod", "digits-cpu-rdzv"), ("Pod", "digits-cpu-worker-0"), ("Pod", "digits-cpu-worker-1")]
    assert "--rdzv-id=u-1-g0" in docs[-1]["spec"]["containers"][0]["command"]


def test_render_of_an_invalid_file_names_the_field():
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "render",
                             str(ROOT / "tests/api/invalid/replicas-zero.yaml")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "spec.replicas" in result.stderr and "Traceback" not in result.stderr


def test_operator_package_never_imports_torch():
    code = ("import sys, ddpjob_operator.run, ddpjob_operator.cli, ddpjob_operator.handlers; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "False"


def reserved_port() -> int:
    """A port for a server that cannot bind port 0 and report it (kopf's liveness endpoint reads port 0 as
    80). Not one that was free a moment ago (anyone may take it meanwhile): one left in TIME_WAIT, which the
    kernel hands out to no port-0 bind and no client, and which a server binding it with SO_REUSEADDR
    (asyncio's default) still gets."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = server.accept()
            accepted.close()  # closed first on the server's side: the port's connection waits there
    return port


async def test_metrics_and_liveness_endpoints(harness, cluster):
    _, url = cluster
    health_port = reserved_port()
    process = OperatorProcess(url, settings.Settings(**{**FAST.__dict__, "metrics_port": settings.AUTO_PORT,
                                                        "health_port": health_port, "bind_address": "127.0.0.1"}))
    await process.start()
    try:
        metrics_port = process.controller.metrics.port  # the one the kernel gave it ("auto")
        await harness.apply("observed", minReplicas=1, failurePolicy={"backoff": {"initialSeconds": 0}})
        await harness.wait_workers("observed", 2)
        await harness.run_all("observed")
        await harness.wait_phase("observed", "Running")
        await harness.exit("observed-worker-1", 137)
        await eventually(lambda: harness.status("observed").get("restarts") == 1, what="a restart")
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{health_port}/healthz") as response:
                assert response.status == 200
                assert (await response.json())["jobs"] == 1
            async def scrape() -> str:
                async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                    return await response.text()
            text = await scrape()
            assert "ddpjob_restarts_total 1.0" in text
            assert "ddpjob_reconcile_duration_seconds_count" in text
            assert 'ddpjob_jobs{phase="' in text and ("Restarting\"} 1.0" in text or "Running\"} 1.0" in text)
    finally:
        await process.stop()
    assert ("", "pods", "create") in harness.cluster.calls and ("", "events", "create") in harness.cluster.calls
    assert_within_permissions(harness.cluster)


def test_in_cluster_connection_uses_the_service_account(monkeypatch, tmp_path):
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_text("")
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    connection = kube.Connection.from_environment()
    assert connection.server == "https://10.0.0.1:443" and connection.ca_path == str(tmp_path / "ca.crt")
    assert connection.for_kopf().token == "sa-token" and connection.for_kopf().scheme == "Bearer"


def test_kubeconfig_connection(monkeypatch, tmp_path):
    config = tmp_path / "config"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://api.example:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "user-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(config))
    connection = kube.Connection.from_environment()
    assert (connection.server, connection.token, connection.insecure) == ("https://api.example:6443", "user-token", True)


async def test_rotated_token_is_used_by_the_next_call(cluster, tmp_path):
    emulator, url = cluster
    token = tmp_path / "token"
    token.write_text("first")
    api = kube.Kube(kube.Connection(server=url, token_path=str(token)))
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}
        await api.create(pod)
        token.write_text("second")
        assert await api.delete(kube.PODS, "ns", "p", grace_seconds=0)
    finally:
        await api.close()
    assert emulator.credentials == ["Bearer first", "Bearer second"]


def test_pods_are_listed_and_watched_with_the_operators_label_selector():
    """The API server filters pods: the operator's worker and store pods match the selector its pod
    informer sends; a user's pod in the same namespace does not."""
    selector = parse_label_selector(informer.POD_SELECTOR)
    job = naming.JobRef("digits", "team-a", "uid-1")
    spec = parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "digits"},
                      "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer"}}).spec
    worker = job_manifests.worker_pod(job, spec, index=0, generation=0)
    assert labels_match(worker["metadata"]["labels"], selector)
    assert labels_match({**naming.job_labels(job), naming.LABEL_ROLE: naming.ROLE_STORE}, selector)
    assert not labels_match({"app": "notebook"}, selector)
    assert not labels_match({naming.LABEL_MANAGED_BY: "helm"}, selector)
