"""Issue 36, "a lost rendezvous store is not a lost gang", the API tier: the real operator against the API
emulator. With failurePolicy.recovery InProcess a SIGKILLed store pod is recreated under the same name (the
workers reach it through its Service, which follows the new pod), every worker keeps its pod and the job its
generation, and nothing is charged: the workers' process groups never used the store after they formed, and
their agents and trainers reconnect to the new one and republish what it held. With Restart, today's
behaviour: every worker moves to a fresh generation, not charged.
"""

from __future__ import annotations

import pytest

from tests.kube_emulator import PODS

from .conftest import eventually, passes
from .test_scenarios import NO_BACKOFF, NS, assert_outcome, creations, nodes, operator, started  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)


async def test_in_process_job_keeps_every_worker_and_its_generation_when_the_store_is_killed(
        harness, operator, nodes):
    await started(harness, nodes, "keep", replicas=3, minReplicas=1, maxReplicas=3,
                  failurePolicy={"maxRestarts": 3, "recovery": "InProcess", **NO_BACKOFF})
    workers = {name: pod["metadata"]["uid"] for name, pod in harness.pods("keep").items()}
    await nodes.exit("keep-rdzv", 137)
    # The failed store pod is removed and a fresh one created under its name; the kubelet starts it.
    await harness.settle("keep", lambda: creations(harness, "keep")["keep-rdzv"] == 2, what="a fresh store",
                         confirm=nodes.confirm)
    await eventually(lambda: nodes.waiting("keep") == ["keep-rdzv"], what="the fresh store waiting for its node")
    await nodes.start("keep-rdzv")
    await passes(operator)
    assert {name: pod["metadata"]["uid"] for name, pod in harness.pods("keep").items()} == workers
    assert creations(harness, "keep") == {"keep-worker-0": 1, "keep-worker-1": 1, "keep-worker-2": 1,
                                          "keep-rdzv": 2}
    assert_outcome(harness, "keep", phase="Running", reason="Running", restarts=0, disruptions=0, generation=0,
                   incident=None)
    said = [e for e in harness.events("keep") if e["reason"] == "RendezvousStoreLost"]
    assert [e["type"] for e in said] == ["Normal"], said
    assert "keep training" in said[0]["message"] and "not charged" in said[0]["message"], said[0]["message"]


async def test_in_process_job_recreates_a_store_deleted_behind_its_back(harness, operator, nodes):
    """The store pod deleted (kubectl delete pod, a drain): gone, not failed; the same answer."""
    await started(harness, nodes, "gone", failurePolicy={"recovery": "InProcess", **NO_BACKOFF})
    workers = {name: pod["metadata"]["uid"] for name, pod in harness.pods("gone").items()}
    await harness.cluster.remove((PODS, NS, "gone-rdzv"))
    await eventually(lambda: creations(harness, "gone")["gone-rdzv"] == 2, what="a fresh store")
    await nodes.start("gone-rdzv")
    await passes(operator)
    assert {name: pod["metadata"]["uid"] for name, pod in harness.pods("gone").items()} == workers
    assert_outcome(harness, "gone", phase="Running", reason="Running", restarts=0, disruptions=0, generation=0,
                   incident=None)


async def test_restart_job_still_moves_every_worker_to_a_fresh_generation(harness, operator, nodes):
    await started(harness, nodes, "restart", failurePolicy={"maxRestarts": 3, "recovery": "Restart", **NO_BACKOFF})
    await nodes.exit("restart-rdzv", 137)
    await eventually(lambda: harness.status("restart").get("generation") == 1, what="generation 1")
    await nodes.generation_running("restart", 1, 2)
    assert creations(harness, "restart") == {"restart-worker-0": 2, "restart-worker-1": 2, "restart-rdzv": 2}
    assert_outcome(harness, "restart", phase="Running", reason="Running", restarts=0, disruptions=1, generation=1,
                   incident=("Disruption", False, [0, 1]))

