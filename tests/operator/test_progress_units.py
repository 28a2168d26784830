"""The progress package without a cluster: report validation, rate limits, the TokenReview cache, the tracker's
bounded publishing and generations, and the trainer's client against the real endpoint."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ddpjob_operator import builders, model, progress, store

from .conftest import eventually

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 22, 12, tzinfo=timezone.utc)


@pytest.mark.parametrize("raw, status, field", [
    (b"", 400, "JSON"), (b"{", 400, "JSON"), (b'"x"', 400, "object"), (b"{}", 422, "step"),
    (b'{"step": true}', 422, "step"), (b'{"step": 1.5}', 422, "step"), (b'{"step": -3}', 422, "step"),
    (b'{"step": 1, "loss": "x"}', 422, "loss"), (b'{"step": 1, "loss": Infinity}', 422, "loss"),
    (b'{"step": 1, "total_steps": -1}', 422, "total_steps"), (b'{"step": 1, "samples_per_second": -2}', 422,
                                                               "samples_per_second"),
    (b'\xff\xfe', 400, "JSON"),
])
def test_bad_reports_are_refused_naming_the_field(raw, status, field):
    with pytest.raises(progress.BadReport) as bad:
        progress.parse_report(raw)
    assert bad.value.status == status and field in str(bad.value)


def test_a_report_keeps_known_fields_and_ignores_others():
    report = progress.parse_report(json.dumps({"step": 5, "total_steps": 10, "loss": 1, "rank": 0, "x": [1]}).encode())
    assert report == progress.Report(step=5, total_steps=10, loss=1.0, rank=0)


def test_token_bucket_allows_the_burst_then_the_rate():
    now = [0.0]
    bucket = progress.TokenBucket(rate=2.0, burst=3.0, clock=lambda: now[0])
    assert [bucket.allow("pod") for _ in range(4)] == [True, True, True, False]
    assert bucket.allow("other")  # per key
    now[0] += 0.5  # one more token
    assert bucket.allow("pod") and not bucket.allow("pod")


def review_answer(pod="w-0", uid="u-0", namespace="ns", authenticated=True, audiences=(progress.DEFAULT_AUDIENCE,)):
    return {"status": {"authenticated": authenticated, "audiences": list(audiences), "user": {
        "username": f"system:serviceaccount:{namespace}:default",
        "extra": {progress.POD_NAME_KEY: [pod], progress.POD_UID_KEY: [uid]}}}}


async def test_token_review_is_cached_and_checks_the_audience_and_the_pod_binding():
    calls = []

    async def review(token, audiences):
        calls.append((token, tuple(audiences)))
        return {"good": review_answer(), "api": review_answer(audiences=("https://kubernetes.default.svc",)),
                "unbound": {"status": {"authenticated": True, "audiences": [progress.DEFAULT_AUDIENCE],
                                       "user": {"username": "system:serviceaccount:ns:x"}}},
                }.get(token, {"status": {"authenticated": False, "error": "invalid bearer token"}})

    now = [0.0]
    reviewer = progress.TokenReviewer(review, progress.DEFAULT_AUDIENCE, clock=lambda: now[0])
    identity = await reviewer.authenticate("good")
    assert identity == progress.Identity("ns", "w-0", "u-0")
    await reviewer.authenticate("good")
    assert calls == [("good", (progress.DEFAULT_AUDIENCE,))]  # cached
    for token, why in (("forged", "invalid bearer token"), ("api", "audience"), ("unbound", "pod-bound")):
        with pytest.raises(progress.Unauthenticated, match=why):
            await reviewer.authenticate(token)
    now[0] += progress.TOKEN_CACHE_SECONDS + 1
    await reviewer.authenticate("good")
    assert len([c for c in calls if c[0] == "good"]) == 2  # reviewed again after the cache time


async def test_concurrent_reports_with_one_token_share_one_review():
    gate = asyncio.Event()

    async def review(token, audiences):
        await gate.wait()  # in flight until every report has asked
        return review_answer()
    reviewer = progress.TokenReviewer(review, progress.DEFAULT_AUDIENCE)
    calls = 0
    original = reviewer._review

    async def counted(token):
        nonlocal calls
        calls += 1
        return await original(token)
    reviewer._review = counted  # type: ignore[method-assign]
    reports = [asyncio.ensure_future(reviewer.authenticate("t")) for _ in range(20)]
    await eventually(lambda: calls >= 1, 10, "the review to start")
    for _ in range(5):  # let every report reach the reviewer
        await asyncio.sleep(0)
    gate.set()
    identities = await asyncio.gather(*reports)
    assert calls == 1 and len(set(identities)) == 1


def test_the_worker_lookup_refuses_the_token_of_a_replaced_pod_of_the_same_name():
    """A review names the pod's uid: once worker 0 is replaced (same name, a new uid), a token still bound to
    the old pod finds no worker, and the new pod's finds rank 0."""
    replacement = store.summarize_pod({"metadata": {
        "name": "job-worker-0", "uid": "pod-new", "labels": {builders.LABEL_ROLE: builders.ROLE_WORKER,
                                                              builders.LABEL_REPLICA_INDEX: "0",
                                                              builders.LABEL_GENERATION: "1"},
        "ownerReferences": [{"apiVersion": model.API_VERSION, "kind": model.KIND, "name": "job", "uid": "job-uid",
                             "controller": True}]}, "spec": {}, "status": {"phase": "Running"}})
    jobs = {("ns", "job"): {"metadata": {"uid": "job-uid"}}}
    index = {("ns", "job-uid"): (replacement,)}

    def find(pod_uid: str) -> progress.Worker | None:
        return progress.find_worker_in(index, jobs, "ns", "job", progress.Identity("ns", "job-worker-0", pod_uid),
                                       builders.ROLE_WORKER)
    assert find("pod-old") is None
    assert find("pod-new") == progress.Worker("job-uid", 0, 1)


def test_tracker_publishes_at_a_bounded_rate_and_keeps_the_live_clock():
    tracker = progress.ProgressTracker(write_seconds=5)
    key = ("ns", "job")
    tracker.record("uid", key, 0, 0, progress.Report(step=10, total_steps=100, rank=0), T0)
    first = tracker.observation("uid", T0)
    assert first.step == 10 and first.generation == 0 and tracker.due_in("uid", T0) is None
    tracker.record("uid", key, 0, 0, progress.Report(step=20, total_steps=100, rank=0), T0 + timedelta(seconds=1))
    assert tracker.due_in("uid", T0 + timedelta(seconds=1)) == pytest.approx(4)
    held = tracker.observation("uid", T0 + timedelta(seconds=1))
    assert held.step == 10 and held.last_advance == T0 + timedelta(seconds=1)  # display held back, clock live
    later = tracker.observation("uid", T0 + timedelta(seconds=5))
    assert later.step == 20 and later.steps_per_second == pytest.approx(10)


def test_tracker_generations_rank_zero_and_heartbeats():
    tracker = progress.ProgressTracker(write_seconds=0.001)
    key = ("ns", "job")
    tracker.record("uid", key, 1, 0, progress.Report(step=30, rank=1, loss=9.0), T0)
    tracker.record("uid", key, 0, 0, progress.Report(step=30, rank=0, loss=0.5), T0)
    tracker.record("uid", key, 1, 0, progress.Report(step=35, rank=1, loss=9.0), T0 + timedelta(seconds=1))
    seen = tracker.observation("uid", T0 + timedelta(seconds=2))
    assert seen.loss == 0.5  # rank 0's values are the job's
    # A heartbeat repeats the step: it keeps the rank "seen" but does not move the clock.
    tracker.record("uid", key, 0, 0, progress.Report(step=30, rank=0), T0 + timedelta(seconds=9))
    seen = tracker.observation("uid", T0 + timedelta(seconds=9))
    assert seen.last_advance == T0 + timedelta(seconds=1)
    assert {r.index: r.last_seen for r in seen.ranks}[0] == T0 + timedelta(seconds=9)
    # A new generation resets the clock; the old generation's stragglers never move it again.
    tracker.record("uid", key, 0, 1, progress.Report(step=20, rank=0), T0 + timedelta(seconds=20))
    tracker.record("uid", key, 1, 0, progress.Report(step=99, rank=1), T0 + timedelta(seconds=21))
    seen = tracker.observation("uid", T0 + timedelta(seconds=22))
    assert (seen.generation, seen.step, seen.last_advance) == (1, 20, T0 + timedelta(seconds=20))
    tracker.forget("uid")
    assert tracker.observation("uid", T0) is None


async def test_trainer_client_reports_to_the_real_endpoint_with_its_token(tmp_path):
    """The runtime library's client (trainer-image) against this endpoint: the token file, the rank,
    the heartbeat, and a 503 from a standby retried once."""
    sys.path.insert(0, str(ROOT / "trainer-image"))
    from ddp_trainer.runtime.progress import ProgressReporter

    leading = [False]
    tracker = progress.ProgressTracker(write_seconds=0.01)
    counts: dict[str, int] = {}

    async def review(token, audiences):
        return review_answer(pod="job-worker-0") if token == "pod-token" else {"status": {"authenticated": False}}
    server = progress.ProgressServer(
        tracker, progress.TokenReviewer(review, progress.DEFAULT_AUDIENCE),
        find_worker=lambda ns, name, who: progress.Worker("uid", 0, 0) if who.pod_name == "job-worker-0" else None,
        leading=lambda: leading[0], accepted=lambda *a: None,
        count=lambda r: counts.__setitem__(r, counts.get(r, 0) + 1), clock=lambda: datetime.now(timezone.utc))
    await server.start(0, "127.0.0.1")
    try:
        token = tmp_path / "token"
        token.write_text("pod-token\n")
        url = f"http://127.0.0.1:{server.port}/v1/namespaces/ns/ddpjobs/job/progress"
        client = ProgressReporter(None, url, enabled=False, http_enabled=True, token_file=str(token), rank=0,
                                  heartbeat_s=0.2, min_interval_s=0.05)
        await asyncio.to_thread(client.report, step=7, total_steps=70, loss=0.25)
        await eventually(lambda: counts.get("standby", 0) >= 2, 30, "the 503 and its one retry")
        assert "accepted" not in counts  # a standby stores nothing
        leading[0] = True
        await eventually(lambda: counts.get("accepted", 0) >= 1, 30, "a heartbeat reaching the leader")
        seen = tracker.observation("uid", datetime.now(timezone.utc))
        assert seen.step == 7 and seen.total_steps == 70 and seen.loss == 0.25
        token.write_text("rotated-but-wrong")  # read at every send
        await eventually(lambda: counts.get("unauthenticated", 0) >= 1, 30, "a heartbeat with the wrong token")
        await asyncio.to_thread(client.close)
    finally:
        await server.stop()
