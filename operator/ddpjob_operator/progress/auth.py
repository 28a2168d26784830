"""Who sent a report: the pod a projected service-account token is bound to (TokenReview with the operator's
own audience), cached by the token's hash, and the token buckets that keep a flood of made-up tokens from
starving real workers."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable

DEFAULT_AUDIENCE = "progress.elastic.ddp.dev"
TOKEN_CACHE_SECONDS = 60.0
NEGATIVE_CACHE_SECONDS = 10.0
TOKEN_CACHE_ENTRIES = 10_000
# TokenReviews the operator sends, in two budgets a flood cannot cross: tokens never seen valid (anyone
# can send those) and re-reviews of tokens that were valid (only real pods hold those), so random
# tokens never starve a worker whose cached review expired. Cached ones cost none.
REVIEWS_PER_SECOND = 50.0
REREVIEWS_PER_SECOND = 50.0
# Reviews of unknown tokens per peer address: one client (pod) cannot spend the unknown budget alone.
SOURCE_REVIEWS_PER_SECOND = 2.0
SOURCE_REVIEW_BURST = 20.0
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class TokenBucket:
    """Per-key token buckets with a monotonic clock; keys idle for a while are forgotten."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000):
        self.rate, self.burst, self.clock, self.max_keys = rate, burst, clock, max_keys
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def allow(self, key: str) -> bool:
        now = self.clock()
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return allowed



@dataclass(frozen=True)
class Identity:
    """The pod a valid token is bound to."""

    namespace: str
    pod_name: str
    pod_uid: str


class Unauthenticated(Exception):
    pass


class TokenReviewer:
    """TokenReview with the operator's audience, cached by the token's hash (never the token itself).

    A flood of made-up tokens must not lock real workers out: valid and refused answers are cached
    apart (refusals cannot evict valid entries), re-reviews of tokens once valid have a budget of their
    own, and reviews of unknown tokens are limited per peer address before the shared budget."""

    def __init__(self, review: Callable[[str, list[str]], Any], audience: str,
                 clock: Callable[[], float] = time.monotonic, *, reviews_per_second: float = REVIEWS_PER_SECOND,
                 rereviews_per_second: float = REREVIEWS_PER_SECOND,
                 source_per_second: float = SOURCE_REVIEWS_PER_SECOND, source_burst: float = SOURCE_REVIEW_BURST):
        self.review, self.audience, self.clock = review, audience, clock
        self._valid: collections.OrderedDict[str, tuple[float, Identity]] = collections.OrderedDict()
        self._refused: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        # Hashes once valid -> the pod they named: a refused re-review says whose report it was.
        self._known: collections.OrderedDict[str, Identity] = collections.OrderedDict()
        # A restart sees every pod at once: a burst of 4 s of reviews.
        self._unknown_budget = TokenBucket(reviews_per_second, 4 * reviews_per_second, clock)
        self._known_budget = TokenBucket(rereviews_per_second, 4 * rereviews_per_second, clock)
        self._sources = TokenBucket(source_per_second, source_burst, clock)
        self._in_flight: dict[str, asyncio.Future[tuple[Identity | None, str]]] = {}

    async def authenticate(self, token: str, source: str = "") -> Identity:
        """The token's pod; Unauthenticated (with why) when the API server does not vouch for it;
        RateLimited when a budget is spent. Raises the API client's errors when the review itself fails
        (the caller answers 503). `source`: the peer address, for the per-source limit."""
        if not (token.isascii() and token.isprintable()):
            # A service-account token is a JWT (printable ASCII). Other bytes (0xff 0xfe arrive as surrogates)
            # cannot be hashed or sent for review: anyone's, so refused here, costing no review and no stall hold.
            raise Unauthenticated("the token is not a service-account token (printable ASCII)")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        valid, refused = self._valid.get(key), self._refused.get(key)
        if valid is not None and valid[0] > now:
            return valid[1]
        if refused is not None and refused[0] > now:
            raise Unauthenticated(refused[1])
        if key in self._in_flight:
            identity, why = await asyncio.shield(self._in_flight[key])
        else:
            if key in self._known:
                if not self._known_budget.allow("reviews"):
                    raise RateLimited("too many token reviews; try again later", self._known[key])
            elif not self._sources.allow(source):
                raise RateLimited("too many unknown tokens from this address; try again later")
            elif not self._unknown_budget.allow("reviews"):
                raise RateLimited("too many unknown tokens; try again later")
            future: asyncio.Future[tuple[Identity | None, str]] = asyncio.get_running_loop().create_future()
            self._in_flight[key] = future
            try:
                identity, why = await self._review(token)
                future.set_result((identity, why))
            except BaseException as exc:
                future.set_exception(exc)
                future.exception()  # retrieved: waiters re-raise it
                raise
            finally:
                self._in_flight.pop(key, None)
            if identity is not None:
                _put(self._valid, key, (self.clock() + TOKEN_CACHE_SECONDS, identity))
                _put(self._known, key, identity)
                self._refused.pop(key, None)
            else:
                _put(self._refused, key, (self.clock() + NEGATIVE_CACHE_SECONDS, why))
                self._valid.pop(key, None)
        if identity is None:
            raise Unauthenticated(why)
        return identity

    async def _review(self, token: str) -> tuple[Identity | None, str]:
        status = (await self.review(token, [self.audience]) or {}).get("status") or {}
        if not status.get("authenticated"):
            return None, status.get("error") or f"the token is not valid for audience {self.audience}"
        # An empty list means "the API server's own audiences": never ours.
        if self.audience not in (status.get("audiences") or []):
            return None, f"the token is not valid for audience {self.audience}"
        user = status.get("user") or {}
        username, extra = user.get("username") or "", user.get("extra") or {}
        pod_name, pod_uid = (extra.get(POD_NAME_KEY) or [None])[0], (extra.get(POD_UID_KEY) or [None])[0]
        if not username.startswith(SERVICE_ACCOUNT_PREFIX) or not pod_name or not pod_uid:
            return None, "the token is not a pod-bound service-account token (a projected token of a worker pod)"
        namespace = username[len(SERVICE_ACCOUNT_PREFIX):].split(":", 1)[0]
        return Identity(namespace, pod_name, pod_uid), ""


def _put(cache: collections.OrderedDict[str, Any], key: str, value: Any) -> None:
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > TOKEN_CACHE_ENTRIES:
        cache.popitem(last=False)


class RateLimited(Exception):
    """A review budget is spent. `identity`: the pod the token was once valid for; None for a token never
    seen valid (anyone's)."""

    def __init__(self, message: str, identity: Identity | None = None):
        super().__init__(message)
        self.identity = identity

