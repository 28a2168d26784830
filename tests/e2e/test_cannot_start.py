"""Workers that can never start, against the failure-semantics contract (docs/operator.md, "What users
can rely on"): a missing checkpoint claim and a volume that cannot be mounted fail the job after the
operator's DDPJOB_OPERATOR_CANNOT_START_SECONDS naming the field; an unschedulable worker is queueing,
bounded by activeDeadlineSeconds; a pod the API server's admission rejects fails the job at once with
the server's words. None of them spends the restart budget or counts as a disruption."""

from __future__ import annotations

import pytest

from . import cluster
from .scenario import Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MARGIN = 240  # pods created, the kubelet's first attempt, the operator's reconcile


@pytest.fixture(scope="module")
def cannot_start_seconds(operator) -> float:
    seconds = float(cluster.operator_setting("DDPJOB_OPERATOR_CANNOT_START_SECONDS", "300"))
    if seconds > 600:
        pytest.skip(f"the operator's DDPJOB_OPERATOR_CANNOT_START_SECONDS is {seconds:g}s: longer than "
                    f"10 min, too long for an e2e test")
    return seconds


def _assert_failed_after(t: Training, seconds: float) -> None:
    started = cluster.parse_time(t.job["metadata"]["creationTimestamp"])
    ended = cluster.parse_time(t.status["completionTime"])
    assert ended - started >= seconds - 2, (
        f"failed {ended - started:.0f}s after creation, before DDPJOB_OPERATOR_CANNOT_START_SECONDS={seconds:g}")


def test_missing_checkpoint_claim_fails_after_the_cannot_start_timeout(namespace, operator, cannot_start_seconds):
    t = Training(namespace, digits_job("no-claim", checkpoint={
        "claimName": "no-such-claim", "mountPath": "/checkpoints", "intervalSteps": 10})).start()

    phase, reason, message = t.wait_terminal(timeout=cannot_start_seconds + MARGIN)

    t.assert_outcome(phase="Failed", reason="VolumeUnavailable", restarts=0, disruptions=0)
    assert "checkpoint.claimName" in message, message
    _assert_failed_after(t, cannot_start_seconds)


def test_unmountable_volume_fails_after_the_cannot_start_timeout(namespace, operator, cannot_start_seconds):
    template = {"volumes": [{"name": "settings", "configMap": {"name": "no-such-config"}}],
                "volumeMounts": [{"name": "settings", "mountPath": "/etc/settings"}]}
    t = Training(namespace, digits_job("no-volume", template=template)).start()
    t.wait(lambda: any(r.ever_scheduled for r in t.records.values()), "a worker to be scheduled", timeout=300)

    phase, reason, message = t.wait_terminal(timeout=cannot_start_seconds + MARGIN)

    t.assert_outcome(phase="Failed", reason="VolumeUnavailable", restarts=0, disruptions=0)
    assert "template.volumes" in message, message
    _assert_failed_after(t, cannot_start_seconds)


def test_unschedulable_worker_waits_with_the_schedulers_message_until_the_deadline(namespace, operator):
    deadline = 120
    t = Training(namespace, digits_job("no-room", resources={"cpu": "1000", "memory": "1Gi"}, run_policy={
        "activeDeadlineSeconds": deadline, "cleanPodPolicy": "Running", "successPolicy": "AllWorkers"})).start()

    # The scheduler's words: "0/3 nodes are available: ... 2 Insufficient cpu. preemption: ...".
    words = "nodes are available"
    t.wait(lambda: t.status.get("phase") == "Pending" and words in (t.status.get("message") or ""),
           "phase Pending with the scheduler's message in status.message", timeout=deadline)
    unschedulable = cluster.condition_of(t.job, "PodsUnschedulable") or {}
    assert unschedulable.get("status") == "True" and words in unschedulable.get("message", ""), \
        t.status.get("conditions")

    t.wait_terminal(timeout=deadline + MARGIN)
    t.assert_outcome(phase="Failed", reason="DeadlineExceeded", restarts=0, disruptions=0)
    assert not any(r.ever_running for r in t.records.values())


def test_pod_rejected_by_admission_fails_the_job_quoting_the_server(namespace, operator):
    # Pod Security admission in enforce mode refuses the worker (and store) pods with 403 Forbidden.
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    t = Training(namespace, digits_job("rejected")).start()

    phase, reason, message = t.wait_terminal(timeout=300)

    t.assert_outcome(phase="Failed", reason="PodRejected", restarts=0, disruptions=0)
    assert "violates PodSecurity" in message, message
    assert not t.records, f"no worker pod can exist: {sorted(r.name for r in t.records.values())}"
