"""The operator's own faults, against the failure-semantics contract (docs/operator.md, "What users can
rely on"): the operator SIGKILLed in the middle of a reconcile while a job starts and trains (no
duplicate pod, no lost job, no restart charged), and the API server unavailable for a while."""

from __future__ import annotations

import pytest

from . import cluster
from .scenario import Training, digits_job
from .test_worker_faults import _recovers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def _restart_count(pod_name: str) -> int:
    pod = cluster.get_json("pod", pod_name, "-n", cluster.OPERATOR_NAMESPACE)
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return statuses[0].get("restartCount", 0) if statuses else 0


def test_operator_sigkilled_mid_reconcile_loses_nothing(faults, namespace, operator):
    operator_pod = cluster.acting_operator_pod()  # the leader, with the chart's two replicas
    restarts_before = _restart_count(operator_pod)
    t = Training(namespace, digits_job("operator-kill", replicas=3, max_steps=2000)).start()

    # The reconcile that creates the store and the 3 workers is under way once its first pod shows up.
    t.wait(lambda: bool(t.pods), "the operator to create the job's first worker", timeout=120, interval=0.2)
    cluster.fault("kill", f"{cluster.OPERATOR_NAMESPACE}/{operator_pod}")
    t.wait(lambda: _restart_count(operator_pod) > restarts_before, "the operator container to restart",
           timeout=300, interval=1)

    t.wait_terminal()

    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=0, disruptions=0, generation=0)
    t.assert_no_duplicates()
    assert sorted(r.index for r in t.records.values()) == [0, 1, 2], sorted(r.name for r in t.records.values())


OUTAGE_SECONDS = 90  # longer than the operator's Lease (15 s) and a worker's collective timeout (30 s)


def test_api_server_unavailable_for_a_while(faults, namespace, operator):
    """The API server stops answering for a while (`api-down`), just after a worker was SIGKILLed: the
    kubelet's report of the crash and the operator's reaction wait for it. Once it answers again, the
    operator (its watches, its Lease) picks up where it was: one charge, one new generation, training
    resumes at the same world size and succeeds, no pod made twice."""
    reason = cluster.why_fault_unsupported("api-down", "api-up")
    if reason:
        pytest.skip(reason)
    t = Training(namespace, digits_job("api-down", failure_policy={
        "maxRestarts": 3, "restartScope": "All", "backoff": {"initialSeconds": 1, "maxSeconds": 10}})).start()
    before = t.wait_training()
    g0 = t.generation
    victim = next(r for r in t.current(g0) if r.uid != t.rank0_pod().uid)
    try:
        cluster.fault("kill", f"{namespace}/{victim.name}", "--signal", "9")
        cluster.fault("api-down", str(OUTAGE_SECONDS))  # returns once the API server no longer answers
        assert not cluster.api_answers()
        # It comes back on its own after OUTAGE_SECONDS (the fault's watchdog).
        cluster.wait_for(cluster.api_answers, "the API server to answer again", timeout=OUTAGE_SECONDS + 300,
                         interval=2)
    finally:
        cluster.fault("api-up", check=False, timeout=400)  # never leave the cluster without its API server
    _recovers(t, before=before, g0=g0, world=2, restarts=1, disruptions=0)
    t.assert_no_duplicates(replacements=True)
