"""Fixtures for tests that drive a real cluster (`make kind-up kind-load helm-install e2e`)."""

from __future__ import annotations

import uuid

import pytest

from ddpjob_operator import model

from . import cluster


@pytest.fixture(scope="session")
def kube() -> None:
    """A reachable cluster with the DDPJob CRD; skips with the reason when there is none."""
    reason = cluster.why_no_cluster()
    if reason:
        pytest.skip(reason)
    crd = f"{model.PLURAL}.{model.GROUP}"
    found = cluster.kubectl("get", "crd", crd, check=False)
    if found.returncode != 0:
        pytest.fail(f"the cluster has no {crd} CRD: run `make helm-install` (it applies the chart's CRD)")
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")


@pytest.fixture(scope="session")
def operator(kube) -> None:
    """The operator Deployment `make helm-install` created is available."""
    deployments = cluster.get_json("deployments", "-n", cluster.OPERATOR_NAMESPACE,
                                   "-l", "app.kubernetes.io/name=ddpjob-operator")["items"]
    if not deployments:
        pytest.fail(f"no ddpjob-operator Deployment in namespace {cluster.OPERATOR_NAMESPACE}: "
                    "run `make helm-install` (or set DDPJOB_E2E_OPERATOR_NAMESPACE)")
    for deployment in deployments:
        cluster.kubectl("rollout", "status", "-n", cluster.OPERATOR_NAMESPACE,
                        f"deployment/{deployment['metadata']['name']}", "--timeout=180s", timeout=240)


@pytest.fixture
def namespace(kube) -> str:
    """A fresh namespace per test, deleted afterwards with everything in it."""
    name = f"ddpjob-e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "app.kubernetes.io/part-of=ddpjob-e2e")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def faults(kube) -> None:
    """The fault command (DDPJOB_E2E_FAULTS) is set; skips with the reason when it is not."""
    reason = cluster.why_no_faults()
    if reason:
        pytest.skip(reason)
