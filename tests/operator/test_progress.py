"""Issue 12 against the emulated cluster: the real operator's progress endpoint (TokenReview
authentication, authorization by the pod index, bad input, rate limits), status.progress written at a
bounded rate, and hang detection end to end (Stalled, a charged gang restart)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from dataclasses import replace

import aiohttp
import pytest
import pytest_asyncio

from ddpjob_operator import naming
from ddpjob_operator.agent import contract
from ddpjob_operator import progress as progress_module

from .conftest import FAST, NAMESPACE, eventually, operator_fixture, started

pytestmark = pytest.mark.timeout(90)
AUDIENCE = "progress.elastic.ddp.dev"


# progress_port 0 means "off" to the settings: the reporter fixture starts the operator's own endpoint on a
# port the kernel picks (a port chosen in advance could be taken by then), in the operator's loop.
operator = operator_fixture(replace(FAST, progress_url="http://ddpjob-progress.ddpjob-system.svc:8090",
                                    progress_write_seconds=0.5, bind_address="127.0.0.1"))


class Reporter:
    def __init__(self, operator, session: aiohttp.ClientSession):
        self.base = f"http://127.0.0.1:{operator.controller.progress_server.port}"
        self.session = session

    async def post(self, job: str, token: str | None, body=None, *, raw: bytes | None = None,
                   namespace: str = NAMESPACE) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else __import__("json").dumps(body if body is not None else {"step": 1}).encode()
        async with self.session.post(f"{self.base}/v1/namespaces/{namespace}/ddpjobs/{job}/progress", data=data,
                                     headers=headers) as response:
            text = await response.text()
            return response.status, (__import__("json").loads(text) if text else {})


@pytest_asyncio.fixture()
async def reporter(operator):
    await operator.in_operator(operator.controller.progress_server.start(0, "127.0.0.1"))
    assert operator.controller.progress_server.port
    async with aiohttp.ClientSession() as session:
        yield Reporter(operator, session)


def metric(operator, name: str, **labels: str) -> float | None:
    """The series' value; None when the operator exports no such series."""
    for line in operator.controller.metrics.text().splitlines():
        if line.startswith(name + ("{" if labels else "")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


TOKEN_REVIEW = ("authentication.k8s.io", "tokenreviews", "create")


async def test_progress_appears_and_advances(harness, operator, reporter):
    await started(harness, "prog")
    began = time.monotonic()
    pod = harness.pods("prog")["prog-worker-0"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[contract.PROGRESS_URL_ENV].endswith(f"/v1/namespaces/{NAMESPACE}/ddpjobs/prog/progress")
    token = harness.cluster.issue_token(NAMESPACE, "prog-worker-0", (AUDIENCE,))
    body = {"step": 100, "total_steps": 400, "loss": 0.75, "epoch": 1, "samples_per_second": 640.0,
            "world_size": 2, "last_checkpoint_step": 80, "rank": 0, "time": 1.0, "extra": "ignored"}
    assert (await reporter.post("prog", token, body))[0] == 204
    progress = await eventually(lambda: harness.status("prog").get("progress"), what="status.progress")
    assert progress["step"] == 100 and progress["totalSteps"] == 400 and progress["percent"] == 25
    assert progress["loss"] == 0.75 and progress["samplesPerSecond"] == 640.0 and progress["lastCheckpointStep"] == 80
    assert progress["worldSize"] == 2 and progress["updatedTime"]
    assert progress.get("eta") is None  # one report: no rate yet
    assert (await reporter.post("prog", token, {**body, "step": 200}))[0] == 204
    progress = await eventually(lambda: (p := harness.status("prog").get("progress")) and p["step"] == 200 and p,
                                what="the step to advance")
    assert progress["percent"] == 50 and re.fullmatch(r"\d+s|\d+m(\d+s)?|\d+h(\d+m)?|\d+d(\d+h)?",
                                                          progress["eta"]), progress  # two reports: a rate
    assert metric(operator, "ddpjob_job_progress_step", ddpjob="prog") == 200
    assert metric(operator, "ddpjob_job_samples_per_second", ddpjob="prog") == 640.0
    # The step advanced during this test: no longer ago than the test began.
    since = metric(operator, "ddpjob_job_seconds_since_progress", ddpjob="prog")
    assert since is not None and 0 <= since <= time.monotonic() - began, since
    assert metric(operator, "ddpjob_progress_reports_total", result="accepted") == 2
    # The endpoint needed exactly one TokenReview for the two reports (cached by the token's hash).
    assert harness.cluster.call_counts[TOKEN_REVIEW] == 1


async def test_forged_foreign_and_bad_reports_are_refused(harness, operator, reporter):
    await started(harness, "mine")
    await started(harness, "theirs")
    mine = harness.cluster.issue_token(NAMESPACE, "mine-worker-0", (AUDIENCE,))
    theirs = harness.cluster.issue_token(NAMESPACE, "theirs-worker-0", (AUDIENCE,))
    api_token = harness.cluster.issue_token(NAMESPACE, "mine-worker-1", ("https://kubernetes.default.svc",))
    store = harness.cluster.issue_token(NAMESPACE, "mine-rdzv", (AUDIENCE,))

    assert (await reporter.post("mine", None))[0] == 401
    assert (await reporter.post("mine", "forged-token"))[0] == 401
    status, answer = await reporter.post("mine", api_token)  # a token for the API server, not for us
    assert status == 401 and "audience" in answer["error"]
    status, answer = await reporter.post("mine", theirs)  # another job's worker
    assert status == 403 and "theirs-worker-0" in answer["error"] and "mine" in answer["error"]
    assert (await reporter.post("mine", store))[0] == 403  # the store pod is not a worker
    assert (await reporter.post("mine", mine, namespace="team-b"))[0] == 403  # another namespace's job
    assert (await reporter.post("nosuchjob", mine))[0] == 403

    assert (await reporter.post("mine", mine, raw=b"{not json"))[0] == 400
    assert (await reporter.post("mine", mine, raw=b"[1, 2]"))[0] == 400
    status, answer = await reporter.post("mine", mine, {"step": -1})
    assert status == 422 and "step" in answer["error"]
    status, answer = await reporter.post("mine", mine, {"step": 3, "loss": "NaN"})
    assert status == 422 and "loss" in answer["error"]
    status, answer = await reporter.post("mine", mine, raw=b'{"step": 1, "pad": "' + b"x" * 10_000 + b'"}')
    assert status == 413
    assert harness.status("mine").get("progress") is None and harness.status("theirs").get("progress") is None
    assert metric(operator, "ddpjob_progress_reports_total", result="unauthenticated") == 3
    assert metric(operator, "ddpjob_progress_reports_total", result="forbidden") == 4
    assert metric(operator, "ddpjob_progress_reports_total", result="invalid") == 4
    assert metric(operator, "ddpjob_progress_reports_total", result="too_large") == 1
    # The operator is still serving.
    assert (await reporter.post("mine", mine, {"step": 5}))[0] == 204


async def test_rate_limit_and_bounded_status_writes(harness, operator, reporter):
    await started(harness, "busy")
    token = harness.cluster.issue_token(NAMESPACE, "busy-worker-0", (AUDIENCE,))
    api, writes, lock = operator.controller.api, [], threading.Lock()
    patch = api.patch_status

    async def counting(namespace, name, body):
        if "progress" in body:
            with lock:
                writes.append(name)
        return await patch(namespace, name, body)
    api.patch_status = counting
    tracker = operator.controller.progress
    # The first report is published at once; then nothing more for the write interval (here long).
    tracker.write_seconds = 300.0
    assert (await reporter.post("busy", token, {"step": 1, "rank": 0}))[0] == 204
    await eventually(lambda: harness.status("busy").get("progress", {}).get("step") == 1, 10, "the first report")
    codes = []
    began = time.monotonic()
    for step in range(2, 41):  # 39 more back to back: far above 2 a second
        codes.append((await reporter.post("busy", token, {"step": step, "rank": 0}))[0])
    burst_seconds = time.monotonic() - began
    # The burst (10, one spent above), then 2 a second: a bound that grows with however long the machine
    # took, not a time.
    assert codes[:9] == [204] * 9 and set(codes) <= {204, 429}, codes
    assert codes.count(204) + 1 <= progress_module.BURST_PER_POD + progress_module.RATE_PER_POD * burst_seconds + 1, \
        (codes, burst_seconds)
    assert metric(operator, "ddpjob_progress_reports_total", result="rate_limited") == codes.count(429)
    accepted = max(s for s, c in zip(range(2, 41), codes) if c == 204)
    # Reconciles ran since (the 0.5 s resync, the reports' own triggers), and none published.
    passes = metric(operator, "ddpjob_reconcile_duration_seconds_count")
    await eventually(lambda: metric(operator, "ddpjob_reconcile_duration_seconds_count") >= passes + 3, 10,
                     "three more reconcile passes")
    assert harness.status("busy")["progress"]["step"] == 1 and writes == ["busy"], writes
    # Held back, not lost: once the interval allows, the newest accepted step is published, once.
    tracker.write_seconds = 0.5
    await eventually(lambda: harness.status("busy").get("progress", {}).get("step") == accepted, 10,
                     "the newest accepted step in the status")
    assert writes == ["busy", "busy"], writes


async def test_a_hung_rank_stalls_restarts_and_is_charged_once(harness, operator, reporter):
    await started(harness, "hang", runPolicy={"progressDeadlineSeconds": 10},
                  failurePolicy={"maxRestarts": 2, "backoff": {"initialSeconds": 0, "maxSeconds": 1}})
    tokens = [harness.cluster.issue_token(NAMESPACE, f"hang-worker-{i}", (AUDIENCE,)) for i in (0, 1)]
    for i, token in enumerate(tokens):
        assert (await reporter.post("hang", token, {"step": 10, "rank": 0 if i == 0 else 1}))[0] == 204
    # Worker 1 freezes (SIGSTOP): no more reports. Worker 0 blocks in the collective and heartbeats.
    async def heartbeat() -> None:
        while True:
            await reporter.post("hang", tokens[0], {"step": 10, "rank": 0})
            await asyncio.sleep(1.0)
    beating = asyncio.get_running_loop().create_task(heartbeat())
    try:
        await eventually(lambda: (c := harness.condition("hang", "Stalled")) and c["status"] == "True", 20,
                         "the Stalled condition")
    finally:
        beating.cancel()
    status = harness.status("hang")
    assert status["restarts"] == 1 and status["generation"] == 1 and status["phase"] == "Restarting"
    incident = status["incidents"][-1]
    assert incident["reason"] == "Stalled" and incident["charged"] and incident["ranks"] == [1]
    await eventually(lambda: any(e["reason"] == "Stalled" and e["type"] == "Warning" and "worker 1" in e["message"]
                                 for e in harness.events("hang")), what="the Stalled Warning event")
    # The whole gang is replaced in generation 1; the old pods were deleted gracefully.
    await harness.settle("hang", lambda: len(harness.pods("hang")) == 2 and all(
        p["metadata"]["labels"][naming.LABEL_GENERATION] == "1" for p in harness.pods("hang").values()),
        what="generation 1 workers")
    await harness.run_all("hang")
    await harness.wait_phase("hang", "Running")
    assert metric(operator, "ddpjob_stalls_total") == 1
    # The new generation reports: the condition clears, nothing more is charged.
    token = harness.cluster.issue_token(NAMESPACE, "hang-worker-0", (AUDIENCE,))
    assert (await reporter.post("hang", token, {"step": 12, "rank": 0}))[0] == 204
    await eventually(lambda: harness.condition("hang", "Stalled")["status"] == "False", 10, "Stalled=False")
    assert harness.status("hang")["restarts"] == 1
