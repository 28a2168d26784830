"""The operator survives the loss of its own node (issue 15): with the chart's two replicas on two
nodes, the node of the replica that holds the Lease goes silent (node-down: its processes frozen, the
Lease no longer renewed) while a job trains, and a worker on another node is SIGKILLed at once. The
standby takes the Lease over (within 30 s), replaces the worker and training goes on within 60 s of the
kill, with exactly one restart charged."""

from __future__ import annotations

import time

import pytest

from . import cluster
from .scenario import RECOVERED_WITHIN, Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

TAKEOVER_WITHIN = 30  # s after the leader's node goes silent: the chart's leaseDurationSeconds (15) and slack


def _lease() -> dict:
    name = cluster.operator_setting("DDPJOB_OPERATOR_LEASE_NAME", "")
    if not name:
        pytest.skip("the operator Deployment sets no DDPJOB_OPERATOR_LEASE_NAME: no leader election to test "
                    "(install the chart from this repository)")
    return cluster.get_json("lease", name, "-n", cluster.OPERATOR_NAMESPACE)


def _holder() -> str:
    return _lease().get("spec", {}).get("holderIdentity") or ""


def test_losing_the_leaders_node_hands_over_and_a_worker_crash_is_still_handled(faults, namespace, operator):
    pods = {p["metadata"]["name"]: p for p in cluster.operator_pods()
            if p.get("status", {}).get("phase") == "Running"}
    if len(pods) < 2:
        pytest.skip(f"needs 2 running operator replicas (the chart's default replicaCount), found {sorted(pods)}")
    leader = cluster.wait_for(lambda: _holder() if _holder() in pods else None, "a running replica to hold the Lease",
                              timeout=60, interval=1)
    leader_node = pods[leader]["spec"]["nodeName"]
    standby_nodes = {p["spec"]["nodeName"] for n, p in pods.items() if n != leader}
    if leader_node in standby_nodes or not standby_nodes:
        pytest.skip(f"the operator replicas share node {leader_node} (anti-affinity is only preferred): "
                    f"losing it would lose both")
    if leader_node in {n["metadata"]["name"] for n in cluster.nodes() if cluster.is_control_plane(n)}:
        pytest.skip(f"the leader runs on the control-plane node {leader_node}: the fault command refuses to take "
                    f"the API server down")
    job_node = sorted(standby_nodes)[0]
    # The whole job on the standby's node: losing the leader's node loses no worker, only its operator.
    pin = {"nodeSelector": {"kubernetes.io/hostname": job_node}}  # workers (template) and store (storeTemplate)
    t = Training(namespace, digits_job("operator-node-loss", template=pin, rendezvous={"storeTemplate": pin},
                                       failure_policy={"maxRestarts": 3, "restartScope": "Pod",
                                                       "backoff": {"initialSeconds": 1, "maxSeconds": 10}})).start()
    try:
        before = t.wait_training()
        g0 = t.generation
        victim = next(r for r in t.current(g0) if r.uid != t.rank0_pod().uid)

        lost_at, lost_wall = time.monotonic(), int(time.time())  # the API's timestamps have whole seconds
        with cluster.node_down(leader_node) as up:
            killed_at = time.monotonic()
            cluster.fault("kill", f"{namespace}/{victim.name}", "--signal", "9")

            new_leader = cluster.wait_for(lambda: _holder() if _holder() not in ("", leader) else None,
                                          f"a replica other than {leader} to hold the Lease", timeout=TAKEOVER_WITHIN,
                                          interval=0.5)
            took_over = time.monotonic() - lost_at
            assert new_leader in pods, f"the Lease went to {new_leader}, not the standby {sorted(set(pods) - {leader})}"

            deadline = killed_at + RECOVERED_WITHIN

            def training_again() -> bool:
                g = t.generation
                return g > g0 and bool(t.resumes(g)) and t.latest_step(g) > t.resumes(g)[0].step
            t.wait(training_again, "the worker replaced and training going on in a new generation",
                   timeout=max(deadline - time.monotonic(), 1), interval=1)
            recovered = time.monotonic() - killed_at
            print(f"leader {leader} on {leader_node} lost: {new_leader} took over after {took_over:.1f}s; "
                  f"training went on {recovered:.1f}s after the worker was killed")
            assert t.status.get("restarts") == 1 and t.status.get("disruptions", 0) == 0, t.describe()
            t.wait_progress_past(t.latest_step(t.generation))  # the new leader takes the reports (issue 31)
            # The new leader refreshes status.lastReconcileTime (every DDPJOB_OPERATOR_HEARTBEAT_SECONDS at most):
            # a time after the old leader was lost.
            heartbeat = float(cluster.operator_setting("DDPJOB_OPERATOR_HEARTBEAT_SECONDS", "60"))
            t.wait(lambda: cluster.parse_time(t.status.get("lastReconcileTime") or "1970-01-01T00:00:00Z") >= lost_wall,
                   "the new leader to refresh status.lastReconcileTime", timeout=heartbeat + 120, interval=2)
            up()  # rebooted: the frozen old leader never resumes

        t.wait_terminal()
        t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=g0 + 1)
        t.assert_final_progress()
        t.assert_resumed(g0 + 1, world=2, not_before=before)
        assert not t.overlaps, f"two pods of one index at the same time: {t.overlaps}"
    finally:
        cluster.kubectl("rollout", "status", "-n", cluster.OPERATOR_NAMESPACE, "deployment",
                        "-l", cluster.OPERATOR_SELECTOR, "--timeout=300s", check=False, timeout=330)
