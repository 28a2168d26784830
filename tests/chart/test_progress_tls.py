"""Issue 23 (item 9, TLS): the chart serves the progress endpoint over HTTPS from a Secret it is given or
that cert-manager issues, and the operator gets the certificate, key and CA files. Helm's own engine."""

from __future__ import annotations

import kubernetes_validate
import pytest

from .helm_install import RELEASE_NAMESPACE, install_dry_run

HOST = f"ddpjob-operator-progress.{RELEASE_NAMESPACE}.svc"
FILES = {"DDPJOB_OPERATOR_PROGRESS_TLS_CERT_FILE": "/etc/ddpjob/progress-tls/tls.crt",
         "DDPJOB_OPERATOR_PROGRESS_TLS_KEY_FILE": "/etc/ddpjob/progress-tls/tls.key",
         "DDPJOB_OPERATOR_PROGRESS_CA_FILE": "/etc/ddpjob/progress-tls/ca.crt"}


def _pod(release) -> dict:
    return release.one("Deployment")["spec"]["template"]["spec"]


def _env(release) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in _pod(release)["containers"][0]["env"] if "valueFrom" not in e}


def _secret_volume(release) -> str | None:
    volumes = {v["name"]: v for v in _pod(release)["volumes"]}
    mounts = {m["name"]: m for m in _pod(release)["containers"][0]["volumeMounts"]}
    if "progress-tls" not in volumes:
        return None
    assert mounts["progress-tls"] == {"name": "progress-tls", "mountPath": "/etc/ddpjob/progress-tls",
                                      "readOnly": True}
    return volumes["progress-tls"]["secret"]["secretName"]


def test_plain_http_by_default():
    release = install_dry_run()
    env = _env(release)
    assert env["DDPJOB_OPERATOR_PROGRESS_URL"] == f"http://{HOST}:8090"
    assert not FILES.keys() & env.keys() and _secret_volume(release) is None
    assert not [m for m in release.manifests if m["apiVersion"].startswith("cert-manager.io")]


def test_https_from_a_given_secret():
    release = install_dry_run({"progress": {"tls": {"enabled": True, "secretName": "my-progress-cert"}}})
    kubernetes_validate.validate(release.one("Deployment"), kubernetes_validate.latest_version(), strict=True)
    env = _env(release)
    assert env["DDPJOB_OPERATOR_PROGRESS_URL"] == f"https://{HOST}:8090"
    assert FILES.items() <= env.items() and _secret_volume(release) == "my-progress-cert"
    assert not [m for m in release.manifests if m["apiVersion"].startswith("cert-manager.io")]


def test_https_issued_by_cert_manager():
    release = install_dry_run({"progress": {"tls": {"enabled": True, "certManager": {"enabled": True}}}})
    assert _secret_volume(release) == "ddpjob-operator-progress-tls"
    assert _env(release)["DDPJOB_OPERATOR_PROGRESS_URL"] == f"https://{HOST}:8090"
    issued = {(m["kind"], m["metadata"]["name"]): m for m in release.manifests
              if m["apiVersion"] == "cert-manager.io/v1"}
    assert set(issued) == {("Issuer", "ddpjob-operator-selfsigned"), ("Certificate", "ddpjob-operator-progress-ca"),
                           ("Issuer", "ddpjob-operator-progress-ca"), ("Certificate", "ddpjob-operator-progress")}
    leaf = issued[("Certificate", "ddpjob-operator-progress")]["spec"]
    assert leaf["secretName"] == "ddpjob-operator-progress-tls" and HOST in leaf["dnsNames"]
    assert leaf["issuerRef"]["name"] == "ddpjob-operator-progress-ca"
    assert issued[("Certificate", "ddpjob-operator-progress-ca")]["spec"]["isCA"] is True
    assert all(m["metadata"]["namespace"] == RELEASE_NAMESPACE for m in issued.values())


@pytest.mark.parametrize("tls, message", [
    ({"enabled": True}, "secretName"),  # nothing to serve
    ({"enabled": True, "secretName": "Bad_Name"}, "secretName"),
    ({"enabled": "yes"}, "enabled"),
])
def test_incomplete_tls_values_are_refused(tls, message):
    with pytest.raises(Exception, match=message):
        install_dry_run({"progress": {"tls": tls}})
