"""progress/auth.py: token buckets and the TokenReview cache (audience, pod binding, one review per token)."""

from __future__ import annotations

import asyncio

import pytest

from ddpjob_operator import progress

from .conftest import eventually


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

    calls = 0

    async def review(token, audiences):
        nonlocal calls
        calls += 1
        await gate.wait()  # in flight until every report has asked
        return review_answer()
    reviewer = progress.TokenReviewer(review, progress.DEFAULT_AUDIENCE)
    reports = [asyncio.ensure_future(reviewer.authenticate("t")) for _ in range(20)]
    await eventually(lambda: calls >= 1, 10, "the review to start")
    for _ in range(5):  # let every report reach the reviewer
        await asyncio.sleep(0)
    gate.set()
    identities = await asyncio.gather(*reports)
    assert calls == 1 and len(set(identities)) == 1
