"""Issue 23 (item 12): progress reports reach the acting replica only. The leader labels its own pod
(progress_router.PROGRESS_LEADER_LABEL), which the chart's progress Service selects; a replica that stops leading
removes it. Two real operators (kopf, leader election) against the emulator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddpjob_operator import progress_router
from ddpjob_operator.settings import AUTO_PORT

from .conftest import FAST, OperatorProcess, assert_within_permissions, eventually
from tests.kube_emulator import PODS

pytestmark = pytest.mark.timeout(90)
SYSTEM = "ddpjob-system"


def labeled(emulator) -> set[str]:
    return {p["metadata"]["name"] for p in emulator.live(PODS, SYSTEM)
            if (p["metadata"].get("labels") or {}).get(progress_router.PROGRESS_LEADER_LABEL) == "true"}


async def test_only_the_leaders_pod_carries_the_progress_label(cluster):
    emulator, url = cluster
    for name in ("operator-a", "operator-b"):
        await emulator.create(PODS, SYSTEM, {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "labels": {"app.kubernetes.io/name": "ddpjob-operator"}},
            "spec": {"containers": [{"name": "operator", "image": "operator:1"}]}})
    base = replace(FAST, lease_name="ddpjob-operator", lease_namespace=SYSTEM, lease_duration_seconds=3,
                   lease_renew_deadline_seconds=2.0, lease_retry_period_seconds=0.5, progress_leader_label=True,
                   progress_port=AUTO_PORT, bind_address="127.0.0.1")
    first = OperatorProcess(url, replace(base, identity="operator-a"))
    second = OperatorProcess(url, replace(base, identity="operator-b"))
    await first.start()
    await eventually(lambda: first.controller and first.controller.leading(), 15, "operator-a to lead")
    await second.start()
    await eventually(lambda: labeled(emulator) == {"operator-a"}, 15, "the leader's label")
    # The standby stays unlabeled: it keeps standing by (its Lease loop ran meanwhile).
    await eventually(lambda: second.controller is not None and second.controller.router.labeled is False, 15,
                     "the standby to settle its (absent) label")
    assert labeled(emulator) == {"operator-a"}
    # The leader stops (SIGTERM): its label goes, and the new leader's pod gets it.
    await first.stop()
    await eventually(lambda: labeled(emulator) == {"operator-b"}, 20, "the label on the new leader")
    await second.stop()
    assert labeled(emulator) == set()
    assert_within_permissions(emulator)
