"""Issue 12 on a real cluster: status.progress and the PROGRESS%/ETA columns appear and advance; a rank
that hangs mid-training (the trainer's --fault-hang-at-step: a SIGSTOPped trainer process) gives Stalled,
one charged gang restart and finally Succeeded; a report with another job's token is refused (403).
Skipped without a cluster (`make kind-up kind-load helm-install e2e`)."""

from __future__ import annotations

import json

import pytest

from . import cluster
from .scenario import FAULT_AT, Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
AUDIENCE = "progress.elastic.ddp.dev"


def _progress(t: Training) -> dict:
    return t.status.get("progress") or {}


def test_progress_appears_and_advances_in_kubectl_get(namespace, operator):
    t = Training(namespace, digits_job("progress")).start()
    first = t.wait(lambda: _progress(t).get("step"), "status.progress.step", 600)
    t.wait(lambda: (_progress(t).get("step") or 0) > first, "the step to advance", 120)
    p = _progress(t)
    assert p["totalSteps"] and 0 <= p["percent"] <= 100 and p["updatedTime"] and p["worldSize"] == 2
    table = cluster.kubectl("get", "ddpj", "progress", "-n", namespace).stdout
    header = table.splitlines()[0].split()
    assert "PROGRESS%" in header and "ETA" in header, table
    wide = cluster.kubectl("get", "ddpj", "progress", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert {"STEP", "LOSS", "SAMPLES/S"} <= set(wide), wide
    t.wait_terminal()
    assert _progress(t).get("step"), "status.progress is kept after the job ends"


def test_hung_rank_stalls_restarts_once_and_succeeds(namespace, operator):
    t = Training(namespace, digits_job(
        "stall", trainer_args=["--fault-hang-at-step", str(FAULT_AT), "--fault-rank", "1"],
        run_policy={"activeDeadlineSeconds": 1500, "progressDeadlineSeconds": 60},
        template={"terminationGracePeriodSeconds": 15},
        failure_policy={"maxRestarts": 2, "restartScope": "All", "backoff": {"initialSeconds": 1, "maxSeconds": 10}},
    )).start()
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    stalls = [i for i in t.status.get("incidents", []) if i["reason"] == "Stalled"]
    assert len(stalls) == 1 and stalls[0]["charged"] and stalls[0]["generation"] == 0, t.status.get("incidents")
    condition = cluster.condition_of(t.job, "Stalled")
    assert condition is not None and condition["status"] == "False", condition  # cleared by generation 1
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "reason=Stalled")["items"]
    assert any(e["type"] == "Warning" and "no training progress for 60s" in e["message"] for e in events), events


def _post_from(namespace: str, pod: str, url: str, token: str) -> int:
    """POST a report from inside a worker pod (the Service is only reachable in the cluster)."""
    program = ("import sys, urllib.request, urllib.error\n"
               "req = urllib.request.Request(sys.argv[1], data=b'{\"step\": 1}', method='POST', headers={\n"
               "    'Content-Type': 'application/json', 'Authorization': 'Bearer ' + sys.argv[2]})\n"
               "try:\n    print(urllib.request.urlopen(req, timeout=10).status)\n"
               "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    out = cluster.kubectl("exec", "-n", namespace, pod, "-c", "trainer", "--", "python", "-c", program, url, token)
    return int(out.stdout.strip().splitlines()[-1])


def test_a_report_with_another_jobs_token_is_refused(namespace, operator):
    a = Training(namespace, digits_job("mine")).start()
    b = Training(namespace, digits_job("theirs")).start()
    for t in (a, b):
        t.wait(lambda t=t: len(cluster.running_workers(namespace, t.name)) == 2, "running workers", 600)
    pod_a, pod_b = "mine-worker-0", "theirs-worker-0"
    env = {e["name"]: e.get("value") for e in cluster.get_json("pod", "-n", namespace, pod_a)["spec"]["containers"][0]["env"]}
    url_a = env["DDPJOB_PROGRESS_URL"]
    url_b = url_a.replace("/ddpjobs/mine/", "/ddpjobs/theirs/")
    uid_b = cluster.get_json("pod", "-n", namespace, pod_b)["metadata"]["uid"]
    token_b = cluster.kubectl("create", "token", "default", "-n", namespace, "--audience", AUDIENCE,
                              "--bound-object-kind", "Pod", "--bound-object-name", pod_b,
                              "--bound-object-uid", uid_b).stdout.strip()
    api_token = cluster.kubectl("create", "token", "default", "-n", namespace, "--bound-object-kind", "Pod",
                                "--bound-object-name", pod_b, "--bound-object-uid", uid_b).stdout.strip()
    assert _post_from(namespace, pod_a, url_a, token_b) == 403  # job theirs' token on job mine
    assert _post_from(namespace, pod_a, url_a, api_token) == 401  # not the operator's audience
    assert _post_from(namespace, pod_a, url_a, "forged") == 401
    assert _post_from(namespace, pod_a, url_b, token_b) == 204  # the token's own job (from anywhere)
    refused = json.dumps(cluster.get_json("ddpj", "-n", namespace, "mine").get("status", {}).get("progress"))
    assert '"step": 1,' not in refused
