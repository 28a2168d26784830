"""Issue 23 (items 1, 9, 12): the progress endpoint under hostile and accidental input, always through the
real endpoint over loopback: a flood of made-up tokens cannot starve a worker's reports (separate review
budgets, a per-source limit, negative caching), a stall is never charged while the operator refuses a
job's reports, TokenReview answers are checked (audiences), bodies are bounded (depth, step), slow and
idle clients are bounded, a body's `rank` claim is attributed to the pod its token names, and the
trainer's client keeps transient failures out of its warnings."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import pytest

from ddpjob_operator import progress

from ddpjob_operator.settings import AUTO_PORT

from .conftest import FAST, NAMESPACE, eventually, operator_fixture, started

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
AUDIENCE = progress.DEFAULT_AUDIENCE
JOB_URL = "/v1/namespaces/ns/ddpjobs/job/progress"


def answer(pod: str, uid: str = "", audiences=(AUDIENCE,)) -> dict:
    return {"status": {"authenticated": True, "audiences": list(audiences), "user": {
        "username": "system:serviceaccount:ns:default",
        "extra": {progress.POD_NAME_KEY: [pod], progress.POD_UID_KEY: [uid or f"uid-{pod}"]}}}}


class Endpoint:
    """The real ProgressServer on loopback, with a scripted TokenReview and a two-worker job."""

    def __init__(self, review, budgets: dict | None = None, **server_args):
        self.calls: list[str] = []
        self.counts: dict[str, int] = {}
        self.refusals: list[tuple[str, str]] = []
        self.tracker = progress.ProgressTracker(write_seconds=0.0)

        async def counted(token, audiences):
            self.calls.append(token)
            return await review(token, audiences)
        self.skipped = 0.0  # seconds pass_time() moved the reviewer's clock on
        self.reviewer = progress.TokenReviewer(counted, AUDIENCE, lambda: time.monotonic() + self.skipped,
                                               **(budgets or {}))
        workers = {"w-0": 0, "w-1": 1}
        self.server = progress.ProgressServer(
            self.tracker, self.reviewer,
            find_worker=lambda ns, name, who: progress.Worker("job-uid", workers[who.pod_name], 0)
            if who.pod_name in workers and who.pod_uid == f"uid-{who.pod_name}" else None,
            leading=lambda: True, accepted=lambda *a: None,
            count=lambda r: self.counts.__setitem__(r, self.counts.get(r, 0) + 1),
            clock=lambda: datetime.now(timezone.utc), **server_args)
        self.server.refused = lambda ns, name: self.refusals.append((ns, name))

    def pass_time(self, seconds: float) -> None:
        """The reviewer's caches and budgets see `seconds` more pass (its cached reviews expire)."""
        self.skipped += seconds

    async def __aenter__(self) -> "Endpoint":
        await self.server.start(0, "127.0.0.1")
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()
        await self.server.stop()

    async def post(self, token: str, body=None, raw: bytes | None = None) -> tuple[int, str]:
        data = raw if raw is not None else json.dumps(body if body is not None else {"step": 1}).encode()
        async with self.session.post(f"http://127.0.0.1:{self.server.port}{JOB_URL}", data=data,
                                     headers={"Authorization": f"Bearer {token}"}) as response:
            return response.status, await response.text()


async def review_workers(token, audiences):
    if token.startswith("w-"):
        return answer(token)
    return {"status": {"authenticated": False, "error": "invalid bearer token"}}


# ---------------------------------------------------------------- item 9: answers and bodies


async def test_an_empty_audiences_list_is_the_api_servers_not_ours():
    async def review(token, audiences):
        return answer("w-0", audiences=())  # authenticated, but for the API server's own audience
    async with Endpoint(review) as endpoint:
        status, text = await endpoint.post("api-token")
        assert status == 401 and AUDIENCE in text
        assert endpoint.tracker.observation("job-uid", datetime.now(timezone.utc)) is None


async def test_deep_json_huge_steps_and_slow_bodies_are_refused_cleanly():
    async with Endpoint(review_workers) as endpoint:
        status, text = await endpoint.post("w-0", raw=b"[" * 2000 + b"]" * 2000)
        assert status == 400 and "deeper" in text  # not a RecursionError (500)
        status, text = await endpoint.post("w-0", raw=b'{"step": 1, "x": ' + b'{"a": ' * 20 + b"1" + b"}" * 21)
        assert status == 400 and "deeper" in text
        # Brackets inside strings are text, not nesting.
        assert (await endpoint.post("w-0", {"step": 1, "note": "[[[[[[[[[[[[{{{{{{{{{{"}))[0] == 204
        for field in ("step", "total_steps"):
            status, text = await endpoint.post("w-0", {"step": 5, field: 10**15})
            assert status == 422 and field in text and str(progress.MAX_STEP) in text
        assert (await endpoint.post("w-0", {"step": progress.MAX_STEP}))[0] == 204
        assert endpoint.counts.get("unavailable", 0) == 0


async def test_slow_and_idle_clients_are_cut_off_and_connections_are_bounded():
    async with Endpoint(review_workers, header_seconds=0.3, max_connections=4) as endpoint:
        port = endpoint.server.port
        # A slowloris: half a request line, then nothing. The server closes the connection.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST " + JOB_URL.encode() + b" HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 20) == b""  # EOF: closed by the server
        writer.close()
        # Four idle connections fill the limit; a fifth is closed at once, even before they time out.
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        await eventually(lambda: len(endpoint.server._runner.server.connections) == 4, what="4 open connections")
        extra_reader, extra_writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(extra_reader.read(), 20) == b""
        extra_writer.close()
        for r, w in idle:
            assert await asyncio.wait_for(r.read(), 20) == b""  # idle ones time out too
            w.close()
        assert (await endpoint.post("w-0", {"step": 3}))[0] == 204  # still serving


async def test_a_rank_claim_is_attributed_to_the_pod_its_token_names():
    async with Endpoint(review_workers) as endpoint:
        assert (await endpoint.post("w-0", {"step": 10, "rank": 0, "loss": 0.5}))[0] == 204
        # Worker 1 claims rank 0 with a newer step and a bogus loss: its report counts for worker 1 only.
        assert (await endpoint.post("w-1", {"step": 12, "rank": 0, "loss": 99.0}))[0] == 204
        seen = endpoint.tracker.observation("job-uid", datetime.now(timezone.utc))
        assert seen.loss == 0.5 and {r.index: r.step for r in seen.ranks} == {0: 10, 1: 12}


async def raw_request(port: int, method: str, path: str, authorization: bytes, body: bytes = b"") -> int:
    """One HTTP/1.1 request with exactly these Authorization bytes (a client library would encode them); its
    status code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
                     + b"Authorization: " + authorization + b"\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 20)
        return int(status_line.split()[1])
    finally:
        writer.close()


@pytest.mark.parametrize("token", [b"\xff\xfe", b"w-0\xff\xfe", b"\xc3\xa9t\xc3\xa9"],
                         ids=["0xff 0xfe", "a worker's name then 0xff 0xfe", "UTF-8 but not ASCII"])
async def test_a_token_that_is_not_printable_ascii_is_a_401_that_holds_nothing(token):
    """Issue 31 item 2: such a token made hashing it raise, taken for a failed review (503) and recorded as
    a refusal against the job in the URL, holding its stall clock. It is a 401: no review, no refusal."""
    async with Endpoint(review_workers) as endpoint:
        port = endpoint.server.port
        for _ in range(20):
            assert await raw_request(port, "POST", JOB_URL, b"Bearer " + token, b'{"step": 1}') == 401
        assert await raw_request(port, "GET", JOB_URL.replace("/progress", "/assignment"), b"Bearer " + token) == 401
        assert endpoint.calls == [] and endpoint.refusals == []
        assert endpoint.counts == {"unauthenticated": 21}
        assert endpoint.tracker.observation("job-uid", datetime.now(timezone.utc)) is None
        assert endpoint.tracker.jobs == {}  # no last_refused: the stall clock of no job holds
        assert (await endpoint.post("w-0"))[0] == 204  # and the endpoint still serves the job's workers


# ---------------------------------------------------------------- item 1: review budgets


async def test_review_rate_limit_failed_review_and_negative_cache():
    failing = [False]

    async def review(token, audiences):
        if failing[0]:
            raise aiohttp.ClientConnectionError("API server unreachable")
        return await review_workers(token, audiences)
    async with Endpoint(review) as endpoint:
        assert (await endpoint.post("w-1"))[0] == 204
        # Negative cache: one made-up token sent again and again costs one review.
        for _ in range(5):
            assert (await endpoint.post("made-up"))[0] == 401
        assert endpoint.calls.count("made-up") == 1
        # Per-source limit: unknown tokens from one address past the burst are 429 without a review.
        codes = [(await endpoint.post(f"random-{i}"))[0] for i in range(60)]
        assert codes[:10] == [401] * 10 and codes.count(429) >= 30
        reviewed = len(endpoint.calls)
        assert reviewed <= 2 + progress.SOURCE_REVIEW_BURST + 5
        # Made-up tokens held back are anyone's: they never hold the job's stall clock.
        assert endpoint.refusals == []
        # A failed review is 503 (retry later), and is a refusal: the stall clock holds.
        failing[0] = True
        endpoint.pass_time(progress.TOKEN_CACHE_SECONDS)  # its cached review expired: a re-review, which fails
        before = len(endpoint.refusals)
        status, text = await endpoint.post("w-1")
        assert status == 503 and "retry" in text and endpoint.refusals == [("ns", "job")] * (before + 1)
        assert endpoint.counts["unavailable"] == 1


async def test_a_worker_once_valid_is_re_reviewed_from_a_budget_of_its_own():
    now = [0.0]
    calls = []

    async def review(token, audiences):
        calls.append(token)
        return await review_workers(token, audiences)
    reviewer = progress.TokenReviewer(review, AUDIENCE, clock=lambda: now[0], reviews_per_second=1,
                                      rereviews_per_second=1, source_per_second=1000, source_burst=1000)
    assert (await reviewer.authenticate("w-0", "10.0.0.5")).pod_name == "w-0"
    for i in range(10):  # the unknown budget (burst 4) is spent by made-up tokens
        with pytest.raises((progress.Unauthenticated, progress.RateLimited)):
            await reviewer.authenticate(f"junk-{i}", "10.0.0.66")
    with pytest.raises(progress.RateLimited):
        await reviewer.authenticate("junk-more", "10.0.0.66")
    now[0] += progress.TOKEN_CACHE_SECONDS + 0.1  # the worker's review expired: reviewed again, not refused
    assert (await reviewer.authenticate("w-0", "10.0.0.5")).pod_name == "w-0"
    assert calls.count("w-0") == 2


# ---------------------------------------------------------------- the real operator


operator = operator_fixture(replace(FAST, progress_port=AUTO_PORT, progress_write_seconds=0.5, bind_address="127.0.0.1",
                                   progress_url="http://ddpjob-progress.ddpjob-system.svc:8090"))


def report_url(operator, job: str) -> str:
    port = operator.controller.progress_server.port
    return f"http://127.0.0.1:{port}/v1/namespaces/{NAMESPACE}/ddpjobs/{job}/progress"


async def post(session, url: str, token: str, body: dict) -> int:
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as response:
        await response.read()
        return response.status


async def test_a_flood_of_made_up_tokens_does_not_starve_a_worker(harness, operator, monkeypatch):
    """~1,500 requests with random tokens from four concurrent clients (loopback, bounded in count) while
    the job's worker 0 keeps reporting with a review cache that expires every 0.3 s: each of its reports is
    accepted, and nothing is charged."""
    await started(harness, "victim", runPolicy={"progressDeadlineSeconds": 10})
    monkeypatch.setattr(progress.auth, "TOKEN_CACHE_SECONDS", 0.3)
    token = harness.cluster.issue_token(NAMESPACE, "victim-worker-0", (AUDIENCE,))
    url = report_url(operator, "victim")
    flood_codes: list[int] = []
    done = asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        assert await post(session, url, token, {"step": 1, "rank": 0}) == 204

        async def flood() -> None:
            for _ in range(375):
                flood_codes.append(await post(session, url, f"sa-token-{uuid.uuid4().hex}", {"step": 10**6}))

        async def worker() -> list[int]:
            codes, step = [], 1
            while not done.is_set() or len(codes) < 4:
                await asyncio.sleep(0.35)  # past the review cache: each report needs a fresh review
                step += 1
                codes.append(await post(session, url, token, {"step": step, "rank": 0}))
            return codes

        reporting = asyncio.get_running_loop().create_task(worker())
        await asyncio.gather(*(flood() for _ in range(4)))
        done.set()
        worker_codes = await reporting
    assert len(flood_codes) == 1500 and set(flood_codes) <= {401, 429}
    assert flood_codes.count(429) > 1000  # most never reached the API server
    assert worker_codes == [204] * len(worker_codes), worker_codes
    step = 1 + len(worker_codes)
    await eventually(lambda: harness.status("victim").get("progress", {}).get("step") == step, what="the last step")
    status = harness.status("victim")
    assert status["restarts"] == 0 and status["phase"] == "Running"


async def test_no_stall_is_charged_while_the_operator_cannot_take_the_reports(harness, operator, monkeypatch):
    """TokenReviews fail (503) for longer than the progress deadline while the worker keeps reporting: no
    stall. Once reviews work again and the worker really stops, the stall comes a deadline later, once."""
    await started(harness, "blind", runPolicy={"progressDeadlineSeconds": 10},
                  failurePolicy={"maxRestarts": 2, "backoff": {"initialSeconds": 0, "maxSeconds": 1}})
    token = harness.cluster.issue_token(NAMESPACE, "blind-worker-0", (AUDIENCE,))
    other = harness.cluster.issue_token(NAMESPACE, "blind-worker-1", (AUDIENCE,))
    url = report_url(operator, "blind")
    controller = operator.controller
    monkeypatch.setattr(progress.auth, "TOKEN_CACHE_SECONDS", 0.0)  # every report is reviewed
    async with aiohttp.ClientSession() as session:
        assert await post(session, url, token, {"step": 5, "rank": 0}) == 204
        assert await post(session, url, other, {"step": 5, "rank": 1}) == 204
        reviewer = controller.progress_server.reviewer
        real_review = reviewer.review

        async def unreachable(token, audiences):
            raise aiohttp.ClientConnectionError("the API server is unreachable")
        reviewer.review = unreachable  # each review now fails
        codes = []

        def stalled_for() -> float:
            return float(next((line.rsplit(" ", 1)[1] for line in controller.metrics.text().splitlines()
                               if line.startswith("ddpjob_job_seconds_since_progress") and '"blind"' in line), 0))

        async def refused_report() -> None:
            codes.append(await post(session, url, token, {"step": 6, "rank": 0}))
            await asyncio.sleep(0.5)
        # The step has not advanced for deadline + 3 s (resyncs every 0.5 s reconciled it meanwhile).
        await eventually(lambda: stalled_for() >= 13, 30, "13 s without an accepted step", between=refused_report)
        assert codes and set(codes) == {503}
        status = harness.status("blind")
        assert status["restarts"] == 0 and status["phase"] == "Running", status.get("incidents")
        assert (harness.condition("blind", "Stalled") or {}).get("status") != "True"
        # Reviews work again, but the workers stay silent (a real hang): charged once, a deadline later.
        reviewer.review = real_review
        await eventually(lambda: (c := harness.condition("blind", "Stalled")) and c["status"] == "True", 30,
                         "the Stalled condition")
        status = harness.status("blind")
        assert status["restarts"] == 1 and [i["reason"] for i in status["incidents"]] == ["Stalled"]


async def test_a_flood_of_made_up_tokens_cannot_keep_a_hung_job_from_stalling(harness, operator):
    """A job's workers report once and then hang, while made-up tokens keep arriving at its URL (one per
    poll, at most 1,500, loopback): most are refused for the per-source budget (429), yet none holds the
    stall clock, so the job is Stalled a deadline after its last step and charged once."""
    await started(harness, "hung", runPolicy={"progressDeadlineSeconds": 10},
                  failurePolicy={"maxRestarts": 2, "backoff": {"initialSeconds": 0, "maxSeconds": 1}})
    url = report_url(operator, "hung")
    codes: list[int] = []
    async with aiohttp.ClientSession() as session:
        for index in (0, 1):
            token = harness.cluster.issue_token(NAMESPACE, f"hung-worker-{index}", (AUDIENCE,))
            assert await post(session, url, token, {"step": 5, "rank": index}) == 204

        async def made_up() -> None:
            if len(codes) < 1500:
                codes.append(await post(session, url, f"sa-token-{uuid.uuid4().hex}", {"step": 10**6}))
        await eventually(lambda: (c := harness.condition("hung", "Stalled")) and c["status"] == "True", 40,
                         "the Stalled condition", between=made_up)
    assert set(codes) <= {401, 429} and codes.count(429) > len(codes) // 2, codes
    status = harness.status("hung")
    assert status["restarts"] == 1 and [i["reason"] for i in status["incidents"]] == ["Stalled"]


async def test_a_token_of_a_replaced_pod_of_the_same_name_is_refused(harness, operator):
    """The old pod's token names its uid: once a replacement of the same name is in the operator's index
    (and its own token is accepted), the old token must still be refused, by the uid and not by the name."""
    await started(harness, "swap", minReplicas=1, failurePolicy={"maxRestarts": 3, "backoff": {
        "initialSeconds": 0, "maxSeconds": 1}})
    old_uid = harness.pods("swap")["swap-worker-0"]["metadata"]["uid"]
    old = harness.cluster.issue_token(NAMESPACE, "swap-worker-0", (AUDIENCE,))
    url = report_url(operator, "swap")
    async with aiohttp.ClientSession() as session:
        assert await post(session, url, old, {"step": 1}) == 204
        await harness.exit("swap-worker-0", 137, "OOMKilled")
        await eventually(lambda: harness.pods("swap").get("swap-worker-0", {}).get("metadata", {}).get("uid")
                         not in (None, old_uid), what="the replacement of worker 0")
        new_uid = harness.pods("swap")["swap-worker-0"]["metadata"]["uid"]
        controller = operator.controller
        who = progress.Identity(NAMESPACE, "swap-worker-0", old_uid)
        job_uid = harness.job("swap")["metadata"]["uid"]
        # The operator's pod index follows the watch: wait until it holds the replacement (same name, new
        # uid) and no longer the old pod. Before that the lookup finds no pod of that name at all, and would
        # refuse the old token even without comparing uids.
        await eventually(lambda: {p.uid for p in controller.cache.pods_of(NAMESPACE, job_uid)
                                  if p.name == "swap-worker-0"} == {new_uid},
                         what="the replacement, and only it, in the operator's index")
        assert controller.progress_server.find_worker(NAMESPACE, "swap", replace(who, pod_uid=new_uid)) is not None
        # The replacement's own token is accepted: its pod of that name is there to be found.
        new = harness.cluster.issue_token(NAMESPACE, "swap-worker-0", (AUDIENCE,))
        assert await post(session, url, new, {"step": 1}) == 204
        # The old token's review is still cached (it names the old uid): the lookup refuses it, since the
        # pod of that name now is another one.
        assert await post(session, url, old, {"step": 2}) == 403
        assert controller.progress_server.find_worker(NAMESPACE, "swap", who) is None


# ---------------------------------------------------------------- item 12: the trainer's client


async def test_the_client_keeps_transient_failures_out_of_its_warnings(tmp_path, caplog):
    """A standby's 503 (or a refused review) is routine: logged at debug, so the launcher's last log line,
    which a killed worker's incident may quote, never is a progress warning. A token the endpoint refuses
    (401) is a misconfiguration and still warns."""
    sys.path.insert(0, str(ROOT / "trainer-image"))
    from ddp_trainer.runtime.progress import ProgressReporter

    leading = [False]
    tracker = progress.ProgressTracker(write_seconds=0.01)
    counts: dict[str, int] = {}
    server = progress.ProgressServer(
        tracker, progress.TokenReviewer(review_workers, AUDIENCE),
        find_worker=lambda ns, name, who: progress.Worker("uid", 0, 0), leading=lambda: leading[0],
        accepted=lambda *a: None, count=lambda r: counts.__setitem__(r, counts.get(r, 0) + 1),
        clock=lambda: datetime.now(timezone.utc))
    await server.start(0, "127.0.0.1")
    try:
        token = tmp_path / "token"
        token.write_text("w-0\n")
        client = ProgressReporter(None, f"http://127.0.0.1:{server.port}{JOB_URL}", enabled=False,
                                  http_enabled=True, token_file=str(token), rank=0, heartbeat_s=0.1,
                                  min_interval_s=0.01)
        with caplog.at_level(logging.DEBUG, logger="ddp_trainer"):
            await asyncio.to_thread(client.report, step=1)
            await eventually(lambda: counts.get("standby", 0) >= 4, what="standby answers")
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert any("503" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
            token.write_text("not-a-token")
            leading[0] = True
            await eventually(lambda: counts.get("unauthenticated", 0) >= 1, what="a refused token")
            await eventually(lambda: [r for r in caplog.records if r.levelno == logging.WARNING], what="a warning")
            warning = [r for r in caplog.records if r.levelno == logging.WARNING][0].getMessage()
            assert "401" in warning
        await asyncio.to_thread(client.close)
    finally:
        await server.stop()
