"""Incidents: one failure or disruption of a generation, with every exit it causes, charged once.

Each test here is a defect the issue-16 review found (it failed before the decision layer was split
by concern and accounting became per incident)."""

from datetime import timedelta

import pytest

from ddpjob_operator import decisions as d, job_manifests, launch, model, naming
from ddpjob_operator.agent import contract

from .test_decisions import STORE, T0, failed, job, of, running_status, seen, spec, w

OPTIONS = d.Options(incident_settle_seconds=10)
CLOSED = f"rank 0 (local rank 0) exited with code 1: DistBackendError: Connection closed by peer " \
         f"{contract.RENDEZVOUS_CLOSED_MARK}"


def decide(view, observed):
    return d.decide(view, observed, OPTIONS)


def ranks(n, phase="Running"):
    return [{"index": i, "pod": f"j-worker-{i}", "phase": phase} for i in range(n)]


# ---------------------------------------------------------------- 1. one incident, one charge

@pytest.mark.parametrize("scope", ["Pod", "All"])
def test_four_workers_exiting_in_one_pass_are_one_charge(scope):
    s = spec(replicas=4, failurePolicy={"maxRestarts": 3, "restartScope": scope})
    out = decide(job(s, running_status(ranks=ranks(4))),
                 seen(failed(0, 137), failed(1, 143), failed(2, 137), failed(3, 143)))
    st = out.status
    assert st.phase == "Restarting" and st.restarts == 1 and st.generation == 1
    assert st.incidents[-1].charged and st.incidents[-1].ranks == [0, 1, 2, 3]
    assert sum(e.reason == d.REASON_WORKER_FAILED for e in of(out, d.Event)) == 1


def test_the_same_incident_over_two_passes_is_one_charge():
    s = spec(replicas=4, failurePolicy={"maxRestarts": 3})
    first = decide(job(s, running_status(ranks=ranks(4))), seen(w(0), w(1), failed(2, 137), failed(3, 137)))
    # Charged at once: the survivors are carried into generation 1, where they rejoin in place.
    assert first.status.restarts == 1 and first.status.generation == 1
    later = T0 + timedelta(seconds=1)
    # Survivors that exited after all (the incident's own consequences) are replaced, never charged again.
    second = decide(job(s, first.status), seen(failed(0, 1, message=CLOSED, at=later),
                                               failed(1, 1, message=CLOSED, at=later), failed(2, 137),
                                               failed(3, 137), now=later))
    assert second.status.restarts == 1 and second.status.generation == 1 and second.status.phase == "Restarting"
    # The old generation's pods exiting after the charge belong to it: nothing more is charged.
    third = decide(job(s, second.status), seen(failed(0, 1), failed(1, 1), failed(2, 137), failed(3, 137),
                                               now=later + timedelta(seconds=30)))
    assert third.status.restarts == 1 and third.status.phase == "Restarting"


def test_peers_exits_seen_before_the_kill_that_caused_them_are_not_a_user_error():
    """Each pod's status comes from its own kubelet: survivors' exit 1 may arrive before the SIGKILL."""
    s = spec(replicas=3)
    first = decide(job(s, running_status(ranks=ranks(3))),
                   seen(failed(0, 1, message=CLOSED), failed(1, 1, message=CLOSED), w(2)))
    assert first.status.phase == "Running" and not first.status.incidents  # waiting, not failed
    second = decide(job(s, first.status), seen(failed(0, 1, message=CLOSED), failed(1, 1, message=CLOSED),
                                               failed(2, 137), now=T0 + timedelta(seconds=2)))
    assert second.status.phase == "Restarting" and second.status.restarts == 1


def test_a_user_error_fails_at_once_with_nothing_charged():
    s = spec(replicas=2)
    out = decide(job(s, running_status(ranks=ranks(2))), seen(failed(0, 1), failed(1, 1, message=CLOSED)))
    assert out.status.phase == "Failed" and out.status.restarts == 0
    failed_condition = next(c for c in out.status.conditions if c.type == "Failed")
    assert failed_condition.reason == d.REASON_PERMANENT_ERROR


def test_a_lone_user_error_whose_peers_never_exit_fails_after_the_settle_time():
    s = spec(replicas=2)
    first = decide(job(s, running_status(ranks=ranks(2))), seen(failed(0, 1), w(1)))
    assert first.status.phase == "Running" and first.requeue_after == 10
    out = decide(job(s, first.status), seen(failed(0, 1), w(1), now=T0 + timedelta(seconds=10)))
    assert out.status.phase == "Failed" and out.status.restarts == 0


# ---------------------------------------------------------------- 2. a closed rendezvous is never rejoined

def test_pod_scope_agent_that_closed_the_rendezvous_moves_the_job_to_a_new_generation():
    s = spec(replicas=3, minReplicas=1)
    out = decide(job(s, running_status(ranks=ranks(3))), seen(w(0), w(1), failed(2, 139, message=CLOSED)))
    st = out.status
    assert st.restarts == 1 and st.generation == 1
    assert not [a for a in of(out, d.CreateWorker) if a.generation == 0]


def test_pod_scope_kill_replaces_only_the_killed_rank_and_keeps_the_survivors_at_once():
    s = spec(replicas=3, minReplicas=1)
    view = job(s, running_status(ranks=ranks(3)))
    out = decide(view, seen(w(0), w(1), failed(2, 137)))
    assert out.status.restarts == 1 and out.status.generation == 1 and not of(out, d.DeleteWorker)
    assert [(r.uid, r.generation) for r in out.status.ranks[:2]] == [(w(0).uid, 1), (w(1).uid, 1)]
    # After the crash-loop backoff (no step reported), the killed pod goes and only it is created again.
    later = decide(job(s, out.status), seen(w(0), w(1), failed(2, 137), now=T0 + timedelta(seconds=10)))
    assert of(later, d.DeleteWorker) == [d.DeleteWorker("j-worker-2", d.REASON_REPLACE, force=True)]
    assert of(later, d.CreateWorker) == [d.CreateWorker(2, 1, 1)] and later.status.restarts == 1


# ---------------------------------------------------------------- 3. one budget; disruptions never charge

def test_survivors_exits_caused_by_an_eviction_are_not_charged():
    s = spec(replicas=3, failurePolicy={"maxRestarts": 0})
    out = decide(job(s, running_status(ranks=ranks(3))),
                 seen(failed(0, 1, message=CLOSED), failed(1, 1, message=CLOSED),
                      failed(2, 143, "Evicted", disruption=True)))
    st = out.status
    assert st.phase == "Restarting" and st.restarts == 0 and st.disruptions == 1 and st.generation == 1


def test_exit_143_after_a_graceful_delete_by_someone_else_is_a_disruption():
    s = spec(replicas=2, failurePolicy={"maxRestarts": 0})
    deleted = failed(1, 143, terminating_since=T0 + timedelta(seconds=30))
    out = decide(job(s, running_status(ranks=ranks(2))), seen(w(0), deleted))
    assert out.status.phase == "Restarting" and out.status.restarts == 0 and out.status.disruptions == 1


def test_torchrun_never_restarts_in_place():
    flags = dict(launch.torchrun_flags(spec(failurePolicy={"maxRestarts": 7}), endpoint="e:1", rdzv_id="r",
                                       local_addr="a"))
    assert flags["max-restarts"] == "0"


# ---------------------------------------------------------------- 4. every agent of a generation agrees on --nnodes

def test_a_new_node_range_starts_a_new_generation_without_charging():
    """The restart path (in process, a new size is done in place: test_scale_in_place_decisions.py)."""
    s = spec(replicas=3, minReplicas=2, maxReplicas=4, failurePolicy={"recovery": "Restart"})
    old_range = (w(0, node_range="2-2"), w(1, node_range="2-2"))
    out = decide(job(s, running_status(ranks=ranks(2))), seen(*old_range))
    st = out.status
    assert st.generation == 1 and st.restarts == 0 and st.incidents[-1].cause == d.REASON_RANGE_CHANGED
    assert not of(out, d.CreateWorker)  # only once the old generation is gone
    assert {a.name for a in of(out, d.DeleteWorker)} == {"j-worker-0", "j-worker-1"}


def test_every_agent_of_a_generation_agrees_on_nnodes_and_its_maximum_is_the_generation_size():
    """A round completes when the generation's last worker joins, not after lastCallTimeoutSeconds."""
    s = spec(replicas=3, minReplicas=2, maxReplicas=4)
    out = decide(job(s, running_status()), seen())
    assert of(out, d.CreateWorker) == [d.CreateWorker(i, 0, 0) for i in range(3)]
    for i in range(3):
        pod = job_manifests.worker_pod(naming.JobRef("j", "ns", "u"), s, index=i, generation=0)
        assert pod["metadata"]["labels"][naming.LABEL_NNODES] == "2-3"
        assert "--nnodes=2:3" in pod["spec"]["containers"][0]["command"]
    # kubectl scale to 4: a new size is a new generation (graceful, not charged).
    grown = spec(replicas=4, minReplicas=2, maxReplicas=4)
    out = decide(job(grown, running_status(ranks=ranks(3))), seen(*(w(i, node_range="2-3") for i in range(3))))
    assert out.status.generation == 1 and out.status.restarts == 0


# ---------------------------------------------------------------- 5. success while a replacement is pending

def test_success_while_a_replacement_is_still_pending():
    s = spec(replicas=3)
    out = decide(job(s, running_status(ranks=ranks(3))),
                 seen(w(0, "Succeeded"), w(1, "Succeeded"), w(2, "Pending", attempt=1)))
    assert out.status.phase == "Succeeded"
    assert d.DeleteWorker("j-worker-2", d.REASON_CLEANUP) in of(out, d.DeleteWorker)


def test_a_replacement_that_found_the_rendezvous_closed_does_not_spoil_success():
    s = spec(replicas=3)
    late = failed(2, 1, message="rendezvous failed: RendezvousClosedError: closed", attempt=1)
    out = decide(job(s, running_status(ranks=ranks(3))), seen(w(0, "Succeeded"), w(1, "Succeeded"), late))
    assert out.status.phase == "Succeeded"


# ---------------------------------------------------------------- 6. a resume always gets its start time

def test_a_resume_whose_status_write_was_lost_still_gets_a_start_time():
    suspended = running_status(phase="Suspended", startTime=None)
    out = decide(job(spec(runPolicy={"activeDeadlineSeconds": 60}), suspended), seen(w(0), w(1)))
    assert out.status.start_time == d.rfc3339(T0)
    assert d.accounting(out.status) != d.accounting(suspended)  # written before any pod is touched
    again = decide(job(spec(runPolicy={"activeDeadlineSeconds": 60}), out.status),
                   seen(w(0), w(1), now=T0 + timedelta(seconds=61)))
    assert again.status.phase == "Failed"
    assert sum(e.reason == d.REASON_RESUMED for e in of(again, d.Event)) == 0


# ---------------------------------------------------------------- 9. pods that cannot be created, placed or started

def unschedulable(message):
    return d.Waiting("Unschedulable", message, T0)


def test_an_unschedulable_worker_is_shown_and_its_peers_rendezvous_timeout_is_not_charged():
    s = spec(replicas=2)
    stuck = w(1, "Pending", unschedulable=unschedulable("0/4 nodes are available: 4 Insufficient cpu."))
    out = decide(job(s, running_status(phase="Pending", ranks=ranks(2))), seen(w(0), stuck))
    assert "Insufficient cpu" in out.status.message
    assert any(c.type == d.CONDITION_UNSCHEDULABLE and c.status == "True" for c in out.status.conditions)
    timed_out = failed(0, 1, message="rendezvous failed: RendezvousTimeoutError: ")
    out = decide(job(s, out.status), seen(timed_out, stuck))
    assert out.status.restarts == 0 and out.status.generation == 1


def test_a_missing_claim_fails_the_job_naming_the_field_after_the_cannot_start_time():
    s = spec(replicas=1)
    missing = w(0, "Pending", unschedulable=unschedulable('persistentvolumeclaim "ckpt" not found'))
    view = job(s, running_status(phase="Pending", ranks=ranks(1)))
    assert decide(view, seen(missing)).status.phase == "Pending"
    out = decide(view, seen(missing, now=T0 + timedelta(seconds=300)))
    assert out.status.phase == "Failed" and "spec.checkpoint.claimName" in out.status.message
    assert next(c for c in out.status.conditions if c.type == "Failed").reason == d.REASON_VOLUME_UNAVAILABLE


@pytest.mark.parametrize("status_code, reason, message, phase, condition_reason", [
    (403, "Forbidden", 'pods "j-worker-0" is forbidden: violates PodSecurity "restricted:latest"', "Failed",
     d.REASON_POD_REJECTED),
    (422, "Invalid", 'Pod "j-worker-0" is invalid: spec.containers[0].resources', "Failed", d.REASON_POD_REJECTED),
    (403, "Forbidden", 'pods "j-worker-0" is forbidden: exceeded quota: q, requested: pods=1', "Pending", None),
    (409, "AlreadyExists", 'services "j-rdzv" already exists', "Failed", d.REASON_NAME_CONFLICT),
])
def test_objects_the_api_server_refuses(status_code, reason, message, phase, condition_reason):
    kind, name = ("Service", "j-rdzv") if status_code == 409 else ("Pod", "j-worker-0")
    refused = d.CreateRejected(kind, name, status_code, reason, message, T0, not_owned=status_code == 409)
    view = job(spec(), running_status(phase="Pending", ranks=ranks(2)))
    out = d.decide(view, d.Observed(workers=(w(1),), store=STORE, now=T0, rejected=(refused,)), OPTIONS)
    assert out.status.phase == phase
    if condition_reason:
        failed_condition = next(c for c in out.status.conditions if c.type == "Failed")
        assert failed_condition.reason == condition_reason and f"{kind} {name}" in failed_condition.message
        if status_code != 409:
            assert message.split(":")[0] in failed_condition.message  # the server's own words
    else:  # quota: shown, retried after the backoff, never recreated at once
        assert not of(out, d.CreateWorker) and out.requeue_after == 10
        assert any(c.type == d.CONDITION_CREATE_BLOCKED for c in out.status.conditions)


# ---------------------------------------------------------------- 10. nothing hides a failure

def test_a_store_loss_in_the_same_pass_does_not_hide_a_user_error():
    s = spec(replicas=2)
    out = decide(job(s, running_status(ranks=ranks(2))), seen(failed(0, 2), failed(1, 1, message=CLOSED),
                                                              store=d.StoreObservation("Failed")))
    assert out.status.phase == "Failed"
    assert next(c for c in out.status.conditions if c.type == "Failed").reason == d.REASON_PERMANENT_ERROR


def test_a_succeeded_job_with_an_unknown_status_key_stays_succeeded():
    from ddpjob_operator import observations
    stored = running_status(phase="Succeeded", restarts=2).wire() | {"somethingNew": {"a": 1}}
    status = observations.parse_status(stored)
    assert status.phase == "Succeeded" and status.restarts == 2
    out = decide(job(spec(), status), seen())
    assert out.status.phase == "Succeeded" and not of(out, d.CreateWorker)


def test_incident_history_is_bounded():
    s = spec(replicas=1, failurePolicy={"maxRestarts": 100})
    status = running_status(ranks=ranks(1))
    for generation in range(d.INCIDENT_HISTORY + 3):
        out = decide(job(s, status), seen(failed(0, 137, generation=generation, attempt=generation)))
        status = out.status
    assert len(status.incidents) == d.INCIDENT_HISTORY and status.restarts == d.INCIDENT_HISTORY + 3
    assert status.incidents[-1].generation == d.INCIDENT_HISTORY + 2
    assert isinstance(status.incidents[0], model.Incident)


def test_a_volume_that_cannot_be_mounted_fails_the_job_naming_the_fields():
    s = spec(replicas=1)
    mount = d.Waiting(d.REASON_FAILED_MOUNT, 'MountVolume.SetUp failed for volume "data" : configmap "cfg" not found',
                      T0)
    view = job(s, running_status(phase="Pending", ranks=ranks(1)))
    assert decide(view, seen(w(0, "Pending", waiting=mount))).status.phase == "Pending"
    out = decide(view, seen(w(0, "Pending", waiting=mount), now=T0 + timedelta(seconds=300)))
    failed_condition = next(c for c in out.status.conditions if c.type == "Failed")
    assert failed_condition.reason == d.REASON_VOLUME_UNAVAILABLE
    assert "template.volumes" in failed_condition.message and 'configmap "cfg" not found' in failed_condition.message


def test_a_pod_the_taint_manager_deleted_is_force_deleted_at_once():
    """Its node stopped answering: no kubelet will confirm the deletion, so nothing is gained by waiting."""
    s = spec(replicas=2)
    # Not Ready: the node lifecycle controller marks a silent node's pods so before the taint manager acts.
    lost = w(1, terminating_since=T0 + timedelta(seconds=60), reason="DeletionByTaintManager", disruption=True,
             ready=False)
    out = decide(job(s, running_status(ranks=ranks(2))), seen(w(0), lost))
    assert d.DeleteWorker("j-worker-1", d.REASON_STUCK_TERMINATING, force=True) in of(out, d.DeleteWorker)
    assert out.status.disruptions == 1 and out.status.restarts == 0
    for alive in (w(1, terminating_since=T0 + timedelta(seconds=60), reason="EvictionByEvictionAPI", disruption=True),
                  # A NoExecute maintenance taint on a healthy node: its kubelet lets the worker checkpoint.
                  w(1, terminating_since=T0 + timedelta(seconds=60), reason="DeletionByTaintManager", disruption=True)):
        out = decide(job(s, running_status(ranks=ranks(2))), seen(w(0), alive))
        assert not [a for a in of(out, d.DeleteWorker) if a.force]


# ---------------------------------------------------------------- issue 10: a node lost silently is not charged

# What Gloo says when the peer it waits for went silent (its node stopped answering, or it froze).
SILENT = ("rank 0 (local rank 0) exited with code 1: DistBackendError: [/pytorch/third_party/gloo/gloo/transport/tcp/"
          "unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete "
          f"{contract.RENDEZVOUS_CLOSED_MARK}")
RESET = ("rank 0 (local rank 0) exited with code 1: DistBackendError: [/pytorch/third_party/gloo/gloo/transport/tcp/"
         f"pair.cc:537] Read error [10.0.0.7]:4711: Connection reset by peer {contract.RENDEZVOUS_CLOSED_MARK}")
SILENT_OPTIONS = d.Options(incident_settle_seconds=10, silent_peer_settle_seconds=60)


@pytest.mark.parametrize("message, peer_node, waits", [
    (SILENT, "node-1", 60),  # the peer's node may be lost: wait for the node controller's verdict
    (SILENT, None, 10),  # no node (the local runner): a frozen process, nothing to wait for
    (RESET, "node-1", 10),  # a reset connection: the peer's process died, its exit is on its way
])
def test_survivors_timing_out_on_a_peer_on_a_node_wait_for_the_node_verdict(message, peer_node, waits):
    s = spec(replicas=2, failurePolicy={"maxRestarts": 3})
    status = running_status(ranks=ranks(2))
    survivor, peer = failed(0, 1, message=message, node="node-0"), w(1, node=peer_node)
    for after in (waits - 1, waits):
        out = d.decide(job(s, status), seen(survivor, peer, now=T0 + timedelta(seconds=after)), SILENT_OPTIONS)
        if after < waits:
            assert out.status.phase == "Running" and not out.status.incidents and out.requeue_after == 1
    # Nothing else showed: charged as a hang, once.
    assert out.status.restarts == 1 and out.status.incidents[-1].cause == d.RETRYABLE


def test_a_silent_peer_evicted_from_its_lost_node_makes_the_incident_an_uncharged_disruption():
    """The node stopped answering: the survivor's collective timed out (trainer --dist-steady-timeout)
    before the node controller declared the node lost; then the taint manager evicted the peer. One
    disruption, nothing charged, and the lost pod is force-deleted (its kubelet will never confirm)."""
    s = spec(replicas=2, failurePolicy={"maxRestarts": 0})
    status = running_status(ranks=ranks(2))
    survivor = failed(0, 1, message=SILENT, node="node-0")
    waiting = d.decide(job(s, status), seen(survivor, w(1, node="node-1", ready=False,
                                                      ), now=T0 + timedelta(seconds=20)), SILENT_OPTIONS)
    assert waiting.status.phase == "Running" and not waiting.status.incidents
    evicted = w(1, node="node-1", ready=False, reason="DeletionByTaintManager", disruption=True,
                terminating_since=T0 + timedelta(seconds=85))
    out = d.decide(job(s, waiting.status), seen(survivor, evicted, now=T0 + timedelta(seconds=25)), SILENT_OPTIONS)
    st = out.status
    assert (st.phase, st.restarts, st.disruptions, st.generation) == ("Restarting", 0, 1, 1), st.message
    assert st.incidents[-1].cause == d.DISRUPTION and st.incidents[-1].ranks == [0, 1]
    forced = {a.name for a in of(out, d.DeleteWorker) if a.force}
    assert forced == {"j-worker-0", "j-worker-1"}  # the exited survivor and the lost pod: nothing to wait for


@pytest.mark.parametrize("store, forced", [
    # Evicted from a node that stopped answering: no kubelet will confirm its deletion.
    (d.StoreObservation("Running", ready=False, reason="DeletionByTaintManager", terminating_since=T0), True),
    # A NoExecute maintenance taint on a healthy node: its kubelet stops it; nothing to cut short yet.
    (d.StoreObservation("Running", ready=True, reason="DeletionByTaintManager", terminating_since=T0), False),
    (d.StoreObservation("Running", ready=False, terminating_since=T0), False),  # the operator's own delete
])
def test_a_store_the_taint_manager_evicted_from_a_lost_node_is_force_deleted_at_once(store, forced):
    s = spec(replicas=2)
    out = d.decide(job(s, running_status(ranks=ranks(2))), seen(w(0), w(1), store=store), OPTIONS)
    assert (d.DeleteStore(d.REASON_STUCK_TERMINATING, force=True) in of(out, d.DeleteStore)) == forced
