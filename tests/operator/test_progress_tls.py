"""Issue 23 (item 9, TLS): the progress endpoint serves HTTPS with the certificate it is given (reloaded when
the files are renewed), worker pods get the CA, and the trainer's client verifies the endpoint with it.
The real endpoint and the real client over loopback; test certificates from trustme."""

from __future__ import annotations

import asyncio
import ssl
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import trustme

from ddpjob_operator import job_manifests, model, naming, progress, settings
from ddpjob_operator.agent import contract

from .conftest import eventually

ROOT = Path(__file__).resolve().parents[2]
URL_PATH = "/v1/namespaces/ns/ddpjobs/job/progress"


async def review(token, audiences):
    return {"status": {"authenticated": True, "audiences": list(audiences), "user": {
        "username": "system:serviceaccount:ns:default",
        "extra": {progress.POD_NAME_KEY: ["job-worker-0"], progress.POD_UID_KEY: ["u-0"]}}}}


def write_cert(ca: trustme.CA, directory: Path) -> tuple[str, str]:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(directory / "tls.crt"), append=True)
    cert.private_key_pem.write_to_path(str(directory / "tls.key"))
    return str(directory / "tls.crt"), str(directory / "tls.key")


async def peer_serial(port: int, ca: trustme.CA) -> int:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    _, writer = await asyncio.open_connection("localhost", port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    from cryptography import x509
    return x509.load_der_x509_certificate(der).serial_number


async def test_https_endpoint_the_client_verifies_with_the_ca_and_a_renewed_certificate(tmp_path):
    sys.path.insert(0, str(ROOT / "trainer-image"))
    from ddp_trainer.runtime.progress import ProgressReporter

    ca = trustme.CA()
    cert_file, key_file = write_cert(ca, tmp_path)
    tracker = progress.ProgressTracker(write_seconds=0.0)
    counts: dict[str, int] = {}
    server = progress.ProgressServer(
        tracker, progress.TokenReviewer(review, progress.DEFAULT_AUDIENCE),
        find_worker=lambda ns, name, who: progress.Worker("uid", 0, 0), leading=lambda: True,
        accepted=lambda *a: None, count=lambda r: counts.__setitem__(r, counts.get(r, 0) + 1),
        clock=lambda: datetime.now(timezone.utc))
    certificate = progress.ServerCertificate(cert_file, key_file)
    await server.start(0, "127.0.0.1", certificate)
    try:
        token = tmp_path / "token"
        token.write_text("t")
        url = f"https://localhost:{server.port}{URL_PATH}"
        ca_pem = ca.cert_pem.bytes().decode()
        client = ProgressReporter(None, url, enabled=False, http_enabled=True, token_file=str(token), rank=0,
                                  ca_pem=ca_pem, heartbeat_s=0.1, min_interval_s=0.01)
        await asyncio.to_thread(client.report, step=3, loss=0.5)
        await eventually(lambda: counts.get("accepted"), what="a report over HTTPS")
        assert tracker.jobs["uid"].step == 3
        await asyncio.to_thread(client.close)

        # A client that trusts another CA refuses the endpoint: nothing reaches it.
        before = dict(counts)
        stranger = ProgressReporter(None, url, enabled=False, http_enabled=True, token_file=str(token), rank=0,
                                    ca_pem=trustme.CA().cert_pem.bytes().decode(), heartbeat_s=0.05)
        await asyncio.to_thread(stranger.report, step=4)
        await asyncio.to_thread(stranger.flush)
        await asyncio.to_thread(stranger.close)
        assert counts == before and tracker.jobs["uid"].step == 3
        # Plain HTTP to the HTTPS port is no report either.
        plain = ProgressReporter(None, f"http://127.0.0.1:{server.port}{URL_PATH}", enabled=False,
                                 http_enabled=True, token_file=str(token), rank=0)
        await asyncio.to_thread(plain.report, step=5)
        await asyncio.to_thread(plain.close)
        assert counts == before

        # Renewed in place (cert-manager): new connections get the new certificate.
        first = await peer_serial(server.port, ca)
        write_cert(ca, tmp_path)
        certificate.refresh(force=True)
        assert await peer_serial(server.port, ca) != first
    finally:
        await server.stop()


def test_worker_pods_get_the_ca_and_settings_keep_https_consistent(tmp_path):
    ca = trustme.CA().cert_pem.bytes().decode().strip()
    endpoint = job_manifests.ProgressEndpoint("https://ddpjob-operator-progress.ddpjob-system.svc:8090",
                                              progress.DEFAULT_AUDIENCE, ca)
    spec = model.DDPJobSpec.model_validate({"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer"})
    pod = job_manifests.worker_pod(naming.JobRef("job", "ns", "uid"), spec, index=0, generation=0, progress=endpoint)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[contract.PROGRESS_CA_ENV] == ca and env[contract.PROGRESS_URL_ENV].startswith("https://")
    plain_endpoint = job_manifests.ProgressEndpoint("http://x:8090", progress.DEFAULT_AUDIENCE)
    plain = job_manifests.worker_pod(naming.JobRef("job", "ns", "uid"), spec, index=0, generation=0,
                                     progress=plain_endpoint)
    # No CA over plain HTTP: "" (off), explicit so that an envFrom cannot give one.
    assert {e["name"]: e.get("value") for e in plain["spec"]["containers"][0]["env"]}[contract.PROGRESS_CA_ENV] == ""
    env_vars = {"DDPJOB_OPERATOR_PROGRESS_TLS_CERT_FILE": "/tls/tls.crt", "DDPJOB_OPERATOR_PROGRESS_TLS_KEY_FILE":
                "/tls/tls.key", "DDPJOB_OPERATOR_PROGRESS_CA_FILE": "/tls/ca.crt",
                "DDPJOB_OPERATOR_PROGRESS_URL": "https://p.ns.svc:8090"}
    parsed = settings.from_env(env_vars)
    assert (parsed.progress_tls_cert_file, parsed.progress_ca_file) == ("/tls/tls.crt", "/tls/ca.crt")
    with pytest.raises(settings.SettingsError, match="set both"):
        settings.from_env({"DDPJOB_OPERATOR_PROGRESS_TLS_CERT_FILE": "/tls/tls.crt"})
    with pytest.raises(settings.SettingsError, match="https://"):
        settings.from_env({**env_vars, "DDPJOB_OPERATOR_PROGRESS_URL": "http://p.ns.svc:8090"})
