"""observations.py: pod bodies -> the decision layer's observations (table-driven, pure)."""

import pytest

from ddpjob_operator import decisions, model, naming, observations

FINISHED = "2026-11-22T00:00:00Z"


def worker_pod(container_status: dict, **status) -> dict:
    return {"metadata": {"name": "j-worker-1", "labels": {naming.LABEL_ROLE: naming.ROLE_WORKER,
                                                          naming.LABEL_REPLICA_INDEX: "1"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Failed", **status,
                       "containerStatuses": [{"name": naming.TRAINER_CONTAINER, **container_status}]}}


def terminated(code: int, message: str | None = None) -> dict:
    state = {"exitCode": code, "reason": "Error", "finishedAt": FINISHED}
    return {"terminated": {**state, "message": message} if message else state}


@pytest.mark.parametrize("container_status, pod_status, code, message", [
    # The launcher's termination message (or the log tail, FallbackToLogsOnError).
    ({"state": terminated(3, "rank 1 (local rank 1) exited with code 3")}, {}, 3,
     "rank 1 (local rank 1) exited with code 3"),
    # The container ran again since: the previous run's message is in lastState.
    ({"state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": terminated(137, "killed by SIGKILL")},
     {}, None, "killed by SIGKILL"),
    # No container message: the pod's own (an eviction says why).
    ({"state": terminated(137)}, {"reason": "Evicted", "message": "The node was low on resource: memory."}, 137,
     "The node was low on resource: memory."),
    ({"state": terminated(1)}, {}, 1, None),
])
def test_worker_observation_carries_the_termination_message(container_status, pod_status, code, message):
    observed = observations.worker_observation(observations.summarize_pod(worker_pod(container_status, **pod_status)))
    assert (observed.index, observed.exit_code, observed.message) == (1, code, message)


@pytest.mark.parametrize("status, expected", [
    ({"phase": "Pending", "startTime": FINISHED, "containerStatuses": [{"name": naming.TRAINER_CONTAINER,
      "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}}}]},
     ("ImagePullBackOff", 'Back-off pulling image "nope:1"', FINISHED)),
    # Not yet on a node: no startTime, so the pod's creation counts.
    ({"phase": "Pending", "containerStatuses": [{"name": naming.TRAINER_CONTAINER,
      "state": {"waiting": {"reason": "CreateContainerConfigError"}}}]},
     ("CreateContainerConfigError", None, "2026-11-21T23:00:00Z")),
    ({"phase": "Running", "containerStatuses": [{"name": naming.TRAINER_CONTAINER,
      "state": {"running": {"startedAt": FINISHED}}}]}, None),
])
def test_a_waiting_container_is_observed_with_its_reason_and_since_when(status, expected):
    from ddpjob_operator import decisions
    pod = {"metadata": {"name": "j-worker-0", "creationTimestamp": "2026-11-21T23:00:00Z",
                        "labels": {naming.LABEL_ROLE: naming.ROLE_WORKER}}, "spec": {}, "status": status}
    waiting = observations.worker_observation(observations.summarize_pod(pod)).waiting
    if expected is None:
        assert waiting is None
    else:
        reason, message, since = expected
        assert waiting == decisions.Waiting(reason, message, decisions.parse_time(since))


def disrupted_pod(condition_reason: str, condition_status: str = "True", *, pod_reason: str | None = None,
                  deleted: bool = False, code: int = 137) -> dict:
    """A worker pod whose DisruptionTarget condition says who ended it, as the control plane writes it."""
    pod = worker_pod({"state": terminated(code)}, conditions=[
        {"type": "Ready", "status": "False"},
        {"type": "DisruptionTarget", "status": condition_status, "reason": condition_reason,
         "message": f"{condition_reason}: the message"}])
    if pod_reason is not None:
        pod["status"]["reason"] = pod_reason
    if deleted:
        pod["metadata"]["deletionTimestamp"] = FINISHED
    return pod


@pytest.mark.parametrize("body, reason, disruption", [
    # The condition is the only sign: no pod reason, not deleted. Exit 137 alone would be a retryable failure.
    (disrupted_pod("PreemptionByScheduler"), "PreemptionByScheduler", True),
    (disrupted_pod("EvictionByEvictionAPI"), "EvictionByEvictionAPI", True),
    (disrupted_pod("DeletionByTaintManager"), "DeletionByTaintManager", True),
    (disrupted_pod("TerminationByKubelet"), "TerminationByKubelet", True),
    # Exit 1 would be the user's permanent error: the condition still makes it a disruption.
    (disrupted_pod("EvictionByEvictionAPI", code=1), "EvictionByEvictionAPI", True),
    # The condition's reason wins over the pod's own (the kubelet's node-pressure eviction, its shutdown).
    (disrupted_pod("TerminationByKubelet", pod_reason="Evicted"), "TerminationByKubelet", True),
    (disrupted_pod("TerminationByKubelet", pod_reason="Terminated"), "TerminationByKubelet", True),
    # The Eviction API, the scheduler and the taint manager delete the pod after writing the condition.
    (disrupted_pod("PreemptionByScheduler", deleted=True), "PreemptionByScheduler", True),
    (disrupted_pod("DeletionByTaintManager", deleted=True), "DeletionByTaintManager", True),
    # A condition that is not True (a disruption that was called off) says nothing: the pod's own reason and
    # the container's tell.
    (disrupted_pod("PreemptionByScheduler", "False"), "Error", False),
    (disrupted_pod("EvictionByEvictionAPI", "Unknown", pod_reason="Evicted"), "Evicted", True),
])
def test_the_disruption_target_condition_says_it_was_a_disruption_and_why(body, reason, disruption):
    """The reason the user sees (the rank's lastReason, the incident's and the WorkerDisrupted event's)
    is the one on the pod's DisruptionTarget condition, and the condition alone makes the exit a
    disruption: never charged, whatever its exit code."""
    observed = observations.worker_observation(observations.summarize_pod(body))
    assert (observed.reason, observed.disruption) == (reason, disruption)
    kind = decisions.classify_exit(observed.exit_code, observed.reason, observed.disruption, model.FailurePolicy(),
                                   observed.message)
    assert (kind == decisions.DISRUPTION) == disruption


# ---------------------------------------------------------------- parse_status: keep every valid field

SUCCEEDED = {
    "phase": "Succeeded", "message": "all workers exited 0", "restarts": 2, "disruptions": 1, "generation": 3,
    "replicas": 0, "startTime": "2026-11-22T00:00:00Z", "completionTime": "2026-11-22T01:00:00Z",
    "observedGeneration": 4, "selector": "a=b",
    "conditions": [{"type": "Succeeded", "status": "True", "reason": "AllWorkersSucceeded",
                    "lastTransitionTime": "2026-11-22T01:00:00Z"}],
    "ranks": [{"index": 0, "pod": "j-worker-0", "phase": "Succeeded", "restarts": 1},
              {"index": 1, "pod": "j-worker-1", "phase": "Succeeded", "restarts": 1, "lastExitCode": 137}],
    "progress": {"step": 100, "epoch": 3, "loss": 0.25, "lastCheckpointStep": 100},
}


def _with(**changes) -> dict:
    raw = {**SUCCEEDED}
    for key, value in changes.items():
        if value is ...:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize("raw, expected", [
    # Unknown keys (a newer operator's fields, kopf's bookkeeping) are ignored, at every level.
    (_with(futureField={"x": 1}), {}),
    (_with(kopf={"progress": {}}), {}),
    (_with(progress={**SUCCEEDED["progress"], "futureRate": 9.5}), {}),
    (_with(conditions=[{**SUCCEEDED["conditions"][0], "severity": "Info"}]), {}),
    (_with(ranks=[{**r, "gpu": "GPU-0"} for r in SUCCEEDED["ranks"]]), {}),
    # One invalid field is dropped alone; the rest of the status stays.
    (_with(message=42), {"message": None}),
    (_with(phase="Completed"), {"phase": None}),
    (_with(disruptions="many"), {"disruptions": 0}),
    (_with(startTime=["not", "a", "time"]), {"start_time": None}),
    (_with(progress={**SUCCEEDED["progress"], "loss": "nan?"}), {"progress.loss": None, "progress.step": 100}),
    (_with(progress="broken"), {"progress": None}),
    # Lists: only the bad entries go.
    (_with(conditions=[{"type": "Created", "status": "Maybe", "lastTransitionTime": "t"},
                       SUCCEEDED["conditions"][0], "not-a-mapping"]),
     {"conditions": [model.Condition.model_validate(SUCCEEDED["conditions"][0])]}),
    (_with(ranks=[{"pod": "no-index", "phase": "Running"}, SUCCEEDED["ranks"][1]]),
     {"ranks": [model.RankStatus.model_validate(SUCCEEDED["ranks"][1])]}),
    (_with(ranks=[{**SUCCEEDED["ranks"][0], "lastExitCode": "x"}, SUCCEEDED["ranks"][1]]),
     {"ranks": [model.RankStatus.model_validate(SUCCEEDED["ranks"][0]),
                model.RankStatus.model_validate(SUCCEEDED["ranks"][1])]}),
    (_with(ranks="oops"), {"ranks": []}),
])
def test_parse_status_keeps_every_valid_field(raw, expected):
    status = observations.parse_status(raw)
    clean = model.DDPJobStatus.model_validate(SUCCEEDED)
    for key, value in expected.items():
        if "." in key:
            outer, inner = key.split(".")
            assert getattr(getattr(status, outer), inner) == value, key
        else:
            assert getattr(status, key) == value, key
    # Everything not named above is exactly what a clean parse gives.
    untouched = {k for k in model.DDPJobStatus.model_fields if k not in {e.split(".")[0] for e in expected}}
    assert {k: getattr(status, k) for k in untouched} == {k: getattr(clean, k) for k in untouched}


def test_a_succeeded_status_with_an_unknown_key_stays_succeeded():
    """Dropping it all would start the finished job again, with a fresh restart budget."""
    status = observations.parse_status({**SUCCEEDED, "addedByANewerOperator": True})
    assert (status.phase, status.restarts, status.disruptions, status.generation) == ("Succeeded", 2, 1, 3)
    assert status.completion_time == "2026-11-22T01:00:00Z"
    assert [c.type for c in status.conditions] == ["Succeeded"]


@pytest.mark.parametrize("raw", [None, {}, [], "garbage", 7])
def test_parse_status_of_nothing_is_an_empty_status(raw):
    assert observations.parse_status(raw) == model.DDPJobStatus()
