"""Issue 12 on a real cluster: status.progress and the PROGRESS%/ETA columns appear and advance; a rank
that hangs mid-training (the trainer's --fault-hang-at-step: a SIGSTOPped trainer process) gives Stalled,
one charged gang restart and finally Succeeded; a report with another job's token is refused (403).
Skipped without a cluster (`make kind-up kind-load helm-install e2e`)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from ddpjob_operator.model import TRAINER_CONTAINER

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
    t.assert_final_progress()  # kept after the job ends, at its last step


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


POST_PROGRESS = Path(__file__).with_name("post_progress.py")


def _post_from_pod(namespace: str, pod: str, reports: list[tuple[str, str, dict]]) -> list[int]:
    """POST each (job, token, body) to the operator's progress endpoint from inside `pod`, through the
    operator's Service and with the pod's CA, as a trainer does (post_progress.py run by the pod's Python);
    the answers' status codes."""
    spec = cluster.get_json("pod", "-n", namespace, pod)["spec"]
    trainer = next(c for c in spec["containers"] if c["name"] == TRAINER_CONTAINER)
    url = next((e.get("value") for e in trainer.get("env", ()) if e["name"] == "DDPJOB_PROGRESS_URL"), None)
    if not url:
        pytest.skip("the operator gives its workers no DDPJOB_PROGRESS_URL (installed without a progress endpoint)")
    args = [a for job, token, body in reports
            for a in (re.sub(r"/ddpjobs/[^/]+/progress$", f"/ddpjobs/{job}/progress", url), token, json.dumps(body))]
    out = cluster.kubectl("exec", "-i", "-n", namespace, pod, "-c", TRAINER_CONTAINER, "--", "python", "-", *args,
                          stdin=POST_PROGRESS.read_text(), timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def _reports(operator_pod: str) -> dict[str, float]:
    """ddpjob_progress_reports_total by result, from the acting operator's /metrics, read through the API
    server's pod proxy (no port-forward: not every test cluster serves one)."""
    port = int(cluster.operator_setting("DDPJOB_OPERATOR_METRICS_PORT", "9090"))
    result = cluster.raw_get(f"/api/v1/namespaces/{cluster.OPERATOR_NAMESPACE}/pods/{operator_pod}:{port}/proxy/metrics",
                             check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot read the operator's /metrics through the API server's pod proxy: {result.stderr.strip()}")
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^ddpjob_progress_reports_total\{result="([a-z_]+)"\} (\S+)$', result.stdout, re.MULTILINE)}


def test_a_report_with_another_jobs_token_is_refused(namespace, operator):
    """Sent from a pod in the cluster (one of mine's workers) through the operator's Service, as a trainer
    sends its reports: the token alone says who reports. Refusals are read from the acting operator's
    counters, and a refused report's values never reach a status."""
    a = Training(namespace, digits_job("mine")).start()
    b = Training(namespace, digits_job("theirs")).start()
    for t in (a, b):
        t.wait(lambda t=t: len(cluster.running_workers(namespace, t.name)) == 2, "running workers", 600)
    pod_b = "theirs-worker-0"
    uid_b = cluster.get_json("pod", "-n", namespace, pod_b)["metadata"]["uid"]
    token_b = cluster.kubectl("create", "token", "default", "-n", namespace, "--audience", AUDIENCE,
                              "--bound-object-kind", "Pod", "--bound-object-name", pod_b,
                              "--bound-object-uid", uid_b).stdout.strip()
    api_token = cluster.kubectl("create", "token", "default", "-n", namespace, "--bound-object-kind", "Pod",
                                "--bound-object-name", pod_b, "--bound-object-uid", uid_b).stdout.strip()
    forged_step = 987_654_321  # far beyond the digits run: only a refused report could carry it
    acting = cluster.acting_operator_pod()
    before = _reports(acting)
    answers = _post_from_pod(namespace, "mine-worker-0", [
        ("mine", token_b, {"step": forged_step}),  # theirs' token on mine
        ("mine", api_token, {"step": forged_step}),  # not our audience
        ("mine", "forged", {"step": forged_step}),
        ("theirs", token_b, {"step": 1})])  # the token's own job
    after = _reports(acting)
    assert answers == [403, 401, 401, 204], answers
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in ("forbidden", "unauthenticated")}
    assert grew == {"forbidden": 1, "unauthenticated": 2}, (before, after)
    # mine's own workers go on reporting: once a newer report is published, the refused one was not.
    refused_at = int(time.time())
    a.wait(lambda: cluster.parse_time(_progress(a).get("updatedTime") or "1970-01-01T00:00:00Z") > refused_at
           or a.status.get("phase") in ("Succeeded", "Failed"),
           "mine's progress published after the refused reports (or its final status)", 300)
    assert _progress(a).get("step") != forged_step, _progress(a)
