"""The real operator (kopf, handlers, kube client over HTTP) against the emulated cluster."""

from __future__ import annotations

import pytest

from ddpjob_operator import builders

from .conftest import NAMESPACE, eventually

pytestmark = pytest.mark.timeout(60)


async def test_create_makes_services_store_and_workers(harness, operator):
    job = await harness.apply("digits", checkpoint={"claimTemplate": {"size": "1Gi"}})
    uid = job["metadata"]["uid"]
    workers = await harness.wait_workers("digits", 2)
    assert set(workers) == {"digits-worker-0", "digits-worker-1"}
    store = harness.pods("digits", builders.ROLE_STORE)
    assert set(store) == {"digits-rdzv"}
    for pod in list(workers.values()) + list(store.values()):
        assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
    command = workers["digits-worker-0"]["spec"]["containers"][0]["command"]
    assert f"--rdzv-id={uid}-g0" in command and f"--rdzv-endpoint=digits-rdzv.{NAMESPACE}.svc:29400" in command
    await harness.run_all("digits")
    status = await harness.wait_phase("digits", "Running")
    assert status["readyReplicas"] == 2 and status["worldSize"] == 2 and status["observedGeneration"] == 1
    assert status["selector"] == "elastic.ddp.dev/job-name=digits,elastic.ddp.dev/role=worker"
    assert [r["phase"] for r in status["ranks"]] == ["Running", "Running"]
    await eventually(lambda: any(e["reason"] == "Running" for e in harness.events("digits")), what="event")
