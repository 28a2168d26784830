"""store.py: pod bodies -> the decision layer's observations (table-driven, pure)."""

import pytest

from ddpjob_operator import builders, store

FINISHED = "2026-11-22T00:00:00Z"


def worker_pod(container_status: dict, **status) -> dict:
    return {"metadata": {"name": "j-worker-1", "labels": {builders.LABEL_ROLE: builders.ROLE_WORKER,
                                                          builders.LABEL_REPLICA_INDEX: "1"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Failed", **status,
                       "containerStatuses": [{"name": builders.TRAINER_CONTAINER, **container_status}]}}


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
    observed = store.worker_observation(store.summarize_pod(worker_pod(container_status, **pod_status)))
    assert (observed.index, observed.exit_code, observed.message) == (1, code, message)


@pytest.mark.parametrize("status, expected", [
    ({"phase": "Pending", "startTime": FINISHED, "containerStatuses": [{"name": builders.TRAINER_CONTAINER,
      "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}}}]},
     ("ImagePullBackOff", 'Back-off pulling image "nope:1"', FINISHED)),
    # Not yet on a node: no startTime, so the pod's creation counts.
    ({"phase": "Pending", "containerStatuses": [{"name": builders.TRAINER_CONTAINER,
      "state": {"waiting": {"reason": "CreateContainerConfigError"}}}]},
     ("CreateContainerConfigError", None, "2026-11-21T23:00:00Z")),
    ({"phase": "Running", "containerStatuses": [{"name": builders.TRAINER_CONTAINER,
      "state": {"running": {"startedAt": FINISHED}}}]}, None),
])
def test_a_waiting_container_is_observed_with_its_reason_and_since_when(status, expected):
    from ddpjob_operator import decisions
    pod = {"metadata": {"name": "j-worker-0", "creationTimestamp": "2026-11-21T23:00:00Z",
                        "labels": {builders.LABEL_ROLE: builders.ROLE_WORKER}}, "spec": {}, "status": status}
    waiting = store.worker_observation(store.summarize_pod(pod)).waiting
    if expected is None:
        assert waiting is None
    else:
        reason, message, since = expected
        assert waiting == decisions.Waiting(reason, message, decisions.parse_time(since))
