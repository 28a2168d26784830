"""progress/pods.py: the pod index lookup finds a token's pod by name and uid among the job's own pods."""

from __future__ import annotations

from ddpjob_operator import model, naming, observations, progress


def test_the_worker_lookup_refuses_the_token_of_a_replaced_pod_of_the_same_name():
    """A review names the pod's uid: once worker 0 is replaced (same name, a new uid), a token still bound to
    the old pod finds no worker, and the new pod's finds rank 0."""
    replacement = observations.summarize_pod({"metadata": {
        "name": "job-worker-0", "uid": "pod-new", "labels": {naming.LABEL_ROLE: naming.ROLE_WORKER,
                                                              naming.LABEL_REPLICA_INDEX: "0",
                                                              naming.LABEL_GENERATION: "1"},
        "ownerReferences": [{"apiVersion": model.API_VERSION, "kind": model.KIND, "name": "job", "uid": "job-uid",
                             "controller": True}]}, "spec": {}, "status": {"phase": "Running"}})
    jobs = {("ns", "job"): {"metadata": {"uid": "job-uid"}}}
    index = {("ns", "job-uid"): (replacement,)}

    def find(pod_uid: str) -> progress.Worker | None:
        return progress.find_worker_in(index, jobs, "ns", "job", progress.Identity("ns", "job-worker-0", pod_uid),
                                       naming.ROLE_WORKER)
    assert find("pod-old") is None
    assert find("pod-new") == progress.Worker("job-uid", 0, 1)
