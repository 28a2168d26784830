"""The progress endpoint: trainers POST their progress here; the operator shows it in the status and
detects hangs (decisions/progress.py).

    POST /v1/namespaces/<namespace>/ddpjobs/<job>/progress
    Authorization: Bearer <the pod's projected service-account token, audience DDPJOB_OPERATOR_PROGRESS_AUDIENCE>
    {"step": 120, "total_steps": 1000, "loss": 0.42, "epoch": 1, "samples_per_second": 812.0, ...}

Authentication: the token is checked with the TokenReview API (authentication.k8s.io/v1, the only
permission this needs) against the operator's own audience, which the answer's `audiences` must list,
so a token meant for the API server, or for anything else, is refused, and a progress token is useless
against the API server. Results are cached for a minute (by the token's SHA-256), so a pod reporting
every few seconds costs one review a minute. Made-up tokens cannot starve real workers: refusals are
cached apart, unknown tokens are limited per peer address and by a budget of their own, and re-reviews
of tokens once valid have another. Authorization: the review names the pod the token is bound to
(user.extra authentication.kubernetes.io/pod-name and pod-uid); that exact pod (name and uid) must be a
worker of the job in the URL, in the operator's pod index, which holds only pods the job controls
(ownerReference). Training pods therefore need no RBAC, and a pod can only write its own job's
progress. The report is attributed to the pod's replica index and generation (its labels), never to
what the body claims.

Answers: 204 accepted; 400 malformed or too deeply nested JSON; 401 no or invalid token (counted); 403
a token of a pod that is not a worker of this job (counted); 404 unknown path; 408 body too slow; 413
body over 4 KiB; 422 invalid fields; 429 over the per-pod rate or a review budget; 503 this replica is
a standby, or the review failed (the client retries at once: another connection reaches another
replica). Reports the operator could not take are recorded for the job (the stall clock holds for
them), but only those a worker of the job could have sent: a spent re-review budget (429) for a token
once valid for a pod that is still the job's worker, a failed review (503), 500. Unknown tokens held back
by a budget are not: anyone can send those, and they would keep a hung job from ever stalling. Headers
must arrive within HEADER_SECONDS and at most MAX_CONNECTIONS are open. Nothing a client sends can raise
out of the handler.

Status writes are bounded: the tracker publishes a job's progress at most every
DDPJOB_OPERATOR_PROGRESS_WRITE_SECONDS (default 5), and publishing only triggers the job's ordinary
reconcile, which merges `status.progress` into its one status patch (accounting writes are untouched:
they go on record first, as always). 100 running jobs cost at most 20 status writes a second.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import logging
import math
import os
import ssl
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Mapping

import aiohttp.web
from prometheus_client.core import GaugeMetricFamily

from . import builders, decisions

logger = logging.getLogger("ddpjob_operator.progress")

DEFAULT_AUDIENCE = "progress.elastic.ddp.dev"
MAX_BODY_BYTES = 4096
TOKEN_CACHE_SECONDS = 60.0
NEGATIVE_CACHE_SECONDS = 10.0
TOKEN_CACHE_ENTRIES = 10_000
RATE_PER_POD = 2.0  # reports a second, sustained (the client heartbeats every 5 s and reports per log interval)
BURST_PER_POD = 10.0
# TokenReviews the operator sends, in two budgets a flood cannot cross: tokens never seen valid (anyone
# can send those) and re-reviews of tokens that were valid (only real pods hold those), so random
# tokens never starve a worker whose cached review expired. Cached ones cost none.
REVIEWS_PER_SECOND = 50.0
REREVIEWS_PER_SECOND = 50.0
# Reviews of unknown tokens per peer address: one client (pod) cannot spend the unknown budget alone.
SOURCE_REVIEWS_PER_SECOND = 2.0
SOURCE_REVIEW_BURST = 20.0
MAX_STEP = 10**12  # beyond any real run; a larger step would freeze the stall clock (refused, 422)
MAX_JSON_DEPTH = 8  # a report is a flat object; deeper nesting is refused before parsing (400)
HEADER_SECONDS = 10.0  # a connection's request headers (and idle keep-alive) must arrive within this
BODY_SECONDS = 10.0  # and its body within this
MAX_CONNECTIONS = 1024  # open connections at once; more are closed on accept
RANK0_CLAIM_SECONDS = 15.0  # a pod's claim to rank 0 lapses after this long without its reports
RATE_WINDOW_SECONDS = 120.0  # the step rate behind the ETA is measured over about this long
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

RESULTS = ("accepted", "unauthenticated", "forbidden", "invalid", "too_large", "rate_limited", "standby",
           "unavailable")


class BadReport(ValueError):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


@dataclass(frozen=True)
class Report:
    step: int
    total_steps: int | None = None
    epoch: int | None = None
    loss: float | None = None
    samples_per_second: float | None = None
    world_size: int | None = None
    last_checkpoint_step: int | None = None
    rank: int | None = None  # the global rank that sent it; rank 0's values are the job's
    step_seconds: float | None = None  # this pod's own time per step, apart from waiting in collectives
    # The rendezvous generation the sending trainer runs in: a survivor's old trainer may report after its pod
    # was carried into the next generation (its last report at exit, a heartbeat): it only ever lowers the
    # generation the report is attributed to (attributed_generation), never raises it.
    generation: int | None = None


_INTS = ("total_steps", "epoch", "world_size", "last_checkpoint_step", "rank", "generation")
_FLOATS = ("loss", "samples_per_second", "step_seconds")
MAX_STEP_SECONDS = 86400.0  # one step of a day: beyond it a report is wrong, not slow
MAX_INT = 2**53


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in raw JSON (strings skipped), without parsing it:
    json.loads recurses, so a few KiB of brackets would raise RecursionError."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def parse_report(raw: bytes) -> Report:
    """A report body -> Report; BadReport(400 or 422) naming the field. Unknown keys are ignored."""
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise BadReport(400, f"the body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels; a report is "
                             "a flat JSON object such as {\"step\": 120}")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReport(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadReport(400, "the body must be a JSON object such as {\"step\": 120}")
    values: dict[str, Any] = {}
    step = body.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise BadReport(422, f"step must be a whole number from 0 to {MAX_STEP}, got {step!r}")
    values["step"] = step
    for key in _INTS:
        value = body.get(key)
        if value is None:
            continue
        limit = MAX_STEP if key in ("total_steps", "last_checkpoint_step") else MAX_INT - 1
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise BadReport(422, f"{key} must be a whole number from 0 to {limit} or null, got {value!r}")
        values[key] = value
    for key in _FLOATS:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BadReport(422, f"{key} must be a finite number or null, got {value!r}")
        if key == "samples_per_second" and value < 0:
            raise BadReport(422, f"{key} must be >= 0, got {value!r}")
        if key == "step_seconds" and not 0 <= value <= MAX_STEP_SECONDS:
            raise BadReport(422, f"{key} must be from 0 to {MAX_STEP_SECONDS:g} seconds or null, got {value!r}")
        values[key] = float(value)
    return Report(**values)


# ---------------------------------------------------------------- rate limits


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


# ---------------------------------------------------------------- authentication


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


# ---------------------------------------------------------------- what the operator keeps


@dataclass
class _Rank:
    generation: int
    step: int
    last_seen: datetime


@dataclass
class JobProgress:
    generation: int = -1
    step: int = -1
    last_advance: datetime | None = None
    latest: Report | None = None
    received_at: datetime | None = None
    ranks: dict[int, _Rank] = field(default_factory=dict)
    history: collections.deque[tuple[datetime, int]] = field(default_factory=lambda: collections.deque(maxlen=64))
    published: decisions.ProgressObservation | None = None
    published_at: datetime | None = None
    dirty: bool = False
    rank0_index: int | None = None  # the pod (replica index) whose reports say rank 0 in this generation
    rank0_claimed: datetime | None = None  # that pod's newest report saying rank 0
    last_refused: datetime | None = None  # the operator last could not take a report for this job
    timings: decisions.TimingHistory = field(default_factory=decisions.TimingHistory)  # straggler detection


class ProgressTracker:
    """Reports -> per-job state -> the decision layer's ProgressObservation, published at a bounded rate."""

    def __init__(self, write_seconds: float = 5.0):
        self.write_seconds = write_seconds
        self.jobs: dict[str, JobProgress] = {}
        self.names: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name), for the metrics

    def record(self, uid: str, key: tuple[str, str], index: int, generation: int, report: Report,
               now: datetime) -> None:
        self.names[uid] = key
        job = self.jobs.setdefault(uid, JobProgress())
        rank = job.ranks.get(index)
        if rank is None or generation >= rank.generation:
            job.ranks[index] = _Rank(generation, report.step, now)
        if report.step_seconds is not None:
            job.timings.add(index, generation, report.step, report.step_seconds, now)
        if generation < job.generation:
            return  # a pod of a generation left behind (still stopping): its rank's silence is all it tells
        if generation > job.generation:
            job.generation, job.step, job.last_advance, job.latest = generation, -1, None, None
            job.rank0_index = job.rank0_claimed = None
            job.history.clear()
        if report.step_seconds is not None:
            job.dirty = True  # stepTimes follow every worker's reports, not only rank 0's
        if report.step > job.step:
            job.step, job.last_advance = report.step, now
            job.history.append((now, report.step))
        # Rank 0's values are the job's (its loss is already averaged over ranks); otherwise the newest step.
        # The body's rank is only a claim: the first pod making it in a generation keeps it while it says so,
        # so another pod saying `rank: 0` never takes over the job's values. The claim ends when its pod
        # reports another rank (a re-rendezvous gave rank 0 to another pod: a promoted spare, a replacement)
        # or stops saying rank 0 for RANK0_CLAIM_SECONDS, even while it goes on reporting as another rank.
        if job.rank0_index == index and report.rank is not None and report.rank != 0:
            job.rank0_index = job.rank0_claimed = None
            if job.latest is not None and job.latest.rank == 0:
                job.latest = dataclasses.replace(job.latest, rank=None)  # no longer rank 0's: the newest step wins
        if report.rank == 0 and (job.rank0_index is None or job.rank0_claimed is None
                                 or (now - job.rank0_claimed).total_seconds() > RANK0_CLAIM_SECONDS):
            job.rank0_index = index  # unclaimed, or its claim lapsed
        if report.rank == 0 and job.rank0_index == index:
            job.rank0_claimed = now
        elif report.rank == 0:
            report = dataclasses.replace(report, rank=None)
        if job.latest is None or report.rank == 0 or (job.latest.rank != 0 and report.step >= job.latest.step):
            job.latest, job.received_at, job.dirty = report, now, True

    def refused(self, uid: str, now: datetime) -> None:
        """The operator could not take a report for this job (a review budget spent, a failed review): its
        silence is then the operator's, and decisions/progress.py holds the stall clock for it."""
        self.jobs.setdefault(uid, JobProgress()).last_refused = now

    def due_in(self, uid: str, now: datetime) -> float | None:
        """Seconds until the job's new reports may be published (0: now); None when nothing is new."""
        job = self.jobs.get(uid)
        if job is None or not job.dirty:
            return None
        if job.published_at is None:
            return 0.0
        return max(0.0, (job.published_at + timedelta(seconds=self.write_seconds) - now).total_seconds())

    def observation(self, uid: str, now: datetime, final: bool = False) -> decisions.ProgressObservation | None:
        """What the decision layer sees: the job-level values as last published (a publish happens here,
        at most every write_seconds, and at once when `final`: a worker finished, so the status write that
        may say Succeeded carries the trainers' last report), with the live clock of the stall rule."""
        job = self.jobs.get(uid)
        if job is None or job.last_advance is None or job.latest is None:
            return None
        if job.dirty and (final or (self.due_in(uid, now) or 0.0) <= 0.0):
            latest = job.latest
            job.published = decisions.ProgressObservation(
                generation=job.generation, step=latest.step, last_advance=job.last_advance,
                total_steps=latest.total_steps, epoch=latest.epoch, loss=latest.loss,
                samples_per_second=latest.samples_per_second, last_checkpoint_step=latest.last_checkpoint_step,
                world_size=latest.world_size, steps_per_second=self._rate(job), updated_at=job.received_at,
                timings=job.timings.snapshot())
            job.published_at, job.dirty = now, False
        if job.published is None:
            return None
        ranks = tuple(decisions.RankReport(i, r.generation, r.step, r.last_seen) for i, r in sorted(job.ranks.items()))
        return _replace(job.published, generation=job.generation, last_advance=job.last_advance, ranks=ranks,
                        last_refused=job.last_refused)

    @staticmethod
    def _rate(job: JobProgress) -> float | None:
        points = list(job.history)
        if len(points) < 2:
            return None
        newest = points[-1]
        oldest = next((p for p in points if (newest[0] - p[0]).total_seconds() <= RATE_WINDOW_SECONDS), points[0])
        if oldest is newest:
            oldest = points[-2]
        seconds = (newest[0] - oldest[0]).total_seconds()
        return (newest[1] - oldest[1]) / seconds if seconds > 0 else None

    def forget(self, uid: str) -> None:
        self.jobs.pop(uid, None)
        self.names.pop(uid, None)

    def collect(self, now: Callable[[], datetime]) -> Iterable[GaugeMetricFamily]:
        """Per-job Prometheus gauges: step, samples/s, seconds since the step last advanced."""
        labels = ["namespace", "ddpjob"]
        step = GaugeMetricFamily("ddpjob_job_progress_step", "Last optimizer step a DDPJob reported", labels=labels)
        rate = GaugeMetricFamily("ddpjob_job_samples_per_second", "Training throughput a DDPJob reported",
                                 labels=labels)
        since = GaugeMetricFamily("ddpjob_job_seconds_since_progress",
                                  "Seconds since a DDPJob's step last advanced (in its newest generation)",
                                  labels=labels)
        own = GaugeMetricFamily("ddpjob_rank_step_seconds", "A DDPJob worker's own time per step (apart from "
                                "waiting for the others in collectives), its newest report in the job's generation",
                                labels=labels + ["rank"])
        moment = now()
        for uid, job in list(self.jobs.items()):
            if uid not in self.names or job.latest is None or job.last_advance is None:
                continue
            key = list(self.names[uid])
            for rank in job.timings.snapshot():
                if rank.generation == job.generation and rank.samples:
                    own.add_metric(key + [str(rank.index)], rank.samples[-1].seconds)
            step.add_metric(key, job.latest.step)
            if job.latest.samples_per_second is not None:
                rate.add_metric(key, job.latest.samples_per_second)
            since.add_metric(key, max(0.0, (moment - job.last_advance).total_seconds()))
        return [step, rate, since, own]


def _replace(observation: decisions.ProgressObservation, **changes: Any) -> decisions.ProgressObservation:
    return dataclasses.replace(observation, **changes)


class TrackerCollector:
    """Adapts the tracker to prometheus_client's collector protocol."""

    def __init__(self, tracker: ProgressTracker, clock: Callable[[], datetime]):
        self.tracker, self.clock = tracker, clock

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return self.tracker.collect(self.clock)


# ---------------------------------------------------------------- the HTTP server


@dataclass(frozen=True)
class Worker:
    """The operator's view of the pod a token is bound to, when it is a worker of the job in the URL."""

    uid: str  # the job's
    index: int
    generation: int


class ServerCertificate:
    """The endpoint's TLS certificate, reloaded when its files change (cert-manager renews a Secret in place;
    the kubelet swaps the mounted files): new connections get the new one, open ones keep theirs."""

    CHECK_SECONDS = 30.0

    def __init__(self, cert_file: str, key_file: str, clock: Callable[[], float] = time.monotonic):
        self.cert_file, self.key_file, self.clock = cert_file, key_file, clock
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._stat()
        self.context.load_cert_chain(cert_file, key_file)
        self._checked = clock()

    def _stat(self) -> tuple[float, ...]:
        return tuple(os.stat(f).st_mtime_ns for f in (self.cert_file, self.key_file))

    def refresh(self, force: bool = False) -> None:
        if not force and self.clock() - self._checked < self.CHECK_SECONDS:
            return
        self._checked = self.clock()
        try:
            stamp = self._stat()
            if force or stamp != self._stamp:
                self.context.load_cert_chain(self.cert_file, self.key_file)
                self._stamp = stamp
                logger.info("progress endpoint: loaded the renewed certificate %s", self.cert_file)
        except (OSError, ssl.SSLError) as exc:  # half-written during a swap: keep the old one, retry later
            logger.warning("progress endpoint: cannot load certificate %s yet: %s", self.cert_file, exc)


class _Refuse(asyncio.Protocol):
    """Accepted past MAX_CONNECTIONS: closed at once (the client's retry or next report gets through)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class ProgressServer:
    """A small aiohttp app on its own port (DDPJOB_OPERATOR_PROGRESS_PORT), in the operator's loop.

    `find_worker(namespace, job, identity)` -> Worker | None is the operator's pod index lookup;
    `leading()` says whether this replica acts; `accepted(namespace, job, uid)` is called after each
    accepted report (the controller schedules the job's reconcile when a publish is due);
    `refused(namespace, job)` after each report of the job the operator could not take (429 for a spent
    re-review budget of a token once valid for one of its workers, 503 for a failed review, 500): the stall
    clock holds for it.

    Slow or idle clients are bounded: headers (and keep-alive idleness) within `header_seconds`, the
    body within `body_seconds`, at most `max_connections` open at once."""

    def __init__(self, tracker: ProgressTracker, reviewer: TokenReviewer,
                 find_worker: Callable[[str, str, Identity], Worker | None], leading: Callable[[], bool],
                 accepted: Callable[[str, str, str], None], count: Callable[[str], None],
                 clock: Callable[[], datetime], refused: Callable[[str, str], None] = lambda ns, name: None, *,
                 header_seconds: float = HEADER_SECONDS, body_seconds: float = BODY_SECONDS,
                 max_connections: int = MAX_CONNECTIONS,
                 assignment: Callable[[str, str, Identity], dict[str, Any] | None] = lambda ns, name, who: None):
        self.tracker, self.reviewer, self.find_worker = tracker, reviewer, find_worker
        self.assignment = assignment
        self.leading, self.accepted, self.count, self.clock = leading, accepted, count, clock
        self.refused = refused
        self.header_seconds, self.body_seconds, self.max_connections = header_seconds, body_seconds, max_connections
        self.limiter = TokenBucket(RATE_PER_POD, BURST_PER_POD)
        self.app = aiohttp.web.Application(client_max_size=MAX_BODY_BYTES)
        self.app.router.add_post("/v1/namespaces/{namespace}/ddpjobs/{name}/progress", self.handle)
        # A warm spare asks which rank's place it takes (contract.ASSIGNMENT_PATH): 200 with it, 204 not yet.
        self.app.router.add_get("/v1/namespaces/{namespace}/ddpjobs/{name}/assignment", self.handle_assignment)
        self.app.router.add_get("/healthz", self.healthz)
        self._runner: aiohttp.web.AppRunner | None = None
        self._server: asyncio.base_events.Server | None = None
        self.port: int | None = None

    async def start(self, port: int, address: str = "0.0.0.0", certificate: ServerCertificate | None = None) -> None:
        """Listen on `port` (0: any free one); HTTPS with `certificate`."""
        # aiohttp's keep-alive timer starts at accept and closes a connection that has not sent a whole
        # request by then: the header bound (its default is an hour).
        self._runner = aiohttp.web.AppRunner(self.app, access_log=None, keepalive_timeout=self.header_seconds)
        await self._runner.setup()
        server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if certificate is not None:
                certificate.refresh()
            return _Refuse() if len(server.connections) >= self.max_connections else server()
        tls: dict[str, Any] = {} if certificate is None else {"ssl": certificate.context,
                                                               "ssl_handshake_timeout": self.header_seconds}
        self._server = await asyncio.get_running_loop().create_server(protocol, address, port, **tls)
        self.port = self._server.sockets[0].getsockname()[1]  # the real port when 0 was asked for

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runner is not None:
            await self._runner.shutdown()
            await self._runner.cleanup()
            self._runner = None

    async def healthz(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"leading": self.leading()})

    def _answer(self, status: int, result: str, message: str = "") -> aiohttp.web.Response:
        self.count(result)
        if status == 204:
            return aiohttp.web.Response(status=204)
        headers = {"WWW-Authenticate": 'Bearer realm="ddpjob-progress"'} if status == 401 else None
        return aiohttp.web.json_response({"error": message}, status=status, headers=headers)

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            return await self._handle(request)
        except Exception:  # noqa: BLE001 - a client must never crash the operator
            logger.exception("progress report failed")
            self._refused(request)
            return self._answer(500, "unavailable", "internal error")

    def _refused(self, request: aiohttp.web.Request) -> None:
        try:
            self.refused(request.match_info["namespace"], request.match_info["name"])
        except Exception:  # noqa: BLE001 - bookkeeping only
            logger.exception("recording a refused progress report failed")

    async def handle_assignment(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            identity = await self._identify(request)
            if isinstance(identity, aiohttp.web.Response):
                return identity
            given = self.assignment(request.match_info["namespace"], request.match_info["name"], identity)
        except Exception:  # noqa: BLE001 - a client must never crash the operator
            logger.exception("assignment request failed")
            return self._answer(500, "unavailable", "internal error")
        if given is None:
            return aiohttp.web.Response(status=204)
        return aiohttp.web.json_response(given)

    async def _identify(self, request: aiohttp.web.Request) -> Identity | aiohttp.web.Response:
        """The pod the bearer token names, or the refusal to send."""
        if not self.leading():
            return self._answer(503, "standby", "this operator replica is a standby; retry")
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return self._answer(401, "unauthenticated", "send the pod's projected service-account token")
        try:
            return await self.reviewer.authenticate(token.strip(), request.remote or "")
        except Unauthenticated as exc:
            return self._answer(401, "unauthenticated", str(exc))
        except RateLimited as exc:
            return self._answer(429, "rate_limited", str(exc))

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not self.leading():
            return self._answer(503, "standby", "this operator replica is a standby; retry (another connection "
                                                "reaches the active one)")
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return self._answer(413, "too_large", f"a report is at most {MAX_BODY_BYTES} bytes")
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return self._answer(401, "unauthenticated", "send the pod's projected service-account token: "
                                                        "Authorization: Bearer <token>")
        token = token.strip()
        try:
            identity = await self.reviewer.authenticate(token, request.remote or "")
        except Unauthenticated as exc:
            return self._answer(401, "unauthenticated", str(exc))
        except RateLimited as exc:
            # Only a worker of this job holds its stall: made-up tokens cost reviews, never a hung job's restart.
            who = exc.identity
            if who is not None and who.namespace == namespace and self.find_worker(namespace, name, who) is not None:
                self._refused(request)
            return self._answer(429, "rate_limited", str(exc))
        except Exception as exc:  # noqa: BLE001 - the API server could not review it: try later
            logger.warning("TokenReview failed: %s", exc)
            self._refused(request)
            return self._answer(503, "unavailable", "the token could not be reviewed now; retry later")
        worker = self.find_worker(namespace, name, identity) if identity.namespace == namespace else None
        if worker is None:
            return self._answer(403, "forbidden", f"pod {identity.namespace}/{identity.pod_name} is not a worker of "
                                                  f"DDPJob {namespace}/{name}")
        if not self.limiter.allow(identity.pod_uid):
            return self._answer(429, "rate_limited", f"at most {RATE_PER_POD:g} reports a second per pod")
        try:
            async with asyncio.timeout(self.body_seconds):
                raw = await request.read()
        except aiohttp.web.HTTPRequestEntityTooLarge:
            return self._answer(413, "too_large", f"a report is at most {MAX_BODY_BYTES} bytes")
        except TimeoutError:
            return self._answer(408, "invalid", f"the body did not arrive within {self.body_seconds:g}s")
        try:
            report = parse_report(raw)
        except BadReport as exc:
            return self._answer(exc.status, "invalid", str(exc))
        self.tracker.record(worker.uid, (namespace, name), worker.index, attributed_generation(worker, report), report,
                            self.clock())
        self.accepted(namespace, name, worker.uid)
        return self._answer(204, "accepted")


def attributed_generation(worker: Worker, report: Report) -> int:
    """The generation a report counts for: the one the operator says its pod serves, or an older one its
    trainer says it runs in (a survivor's trainer of the generation before, reporting once more as it stops).
    The body can only lower it: a pod never speaks for a generation the operator has not given it."""
    return worker.generation if report.generation is None else min(worker.generation, report.generation)


def _own_pod(pods: Mapping[tuple[str, str], Any], body: Mapping[str, Any], namespace: str,
             identity: Identity) -> Any:
    """The identity's pod, by name and uid, among the job's pods (whose controller ownerReference is the
    job: labels alone are anyone's to copy)."""
    uid = (body.get("metadata") or {}).get("uid", "")
    for pod in pods.get((namespace, uid), ()) or ():
        if pod.name == identity.pod_name and pod.uid == identity.pod_uid and uid and pod.controller_uid == uid:
            return pod
    return None


def _rank_of(body: Mapping[str, Any], pod_uid: str) -> Mapping[str, Any] | None:
    """The status rank whose pod this is (a survivor carried along, a spare that took a rank's place)."""
    return next((r for r in (body.get("status") or {}).get("ranks") or () if r.get("uid") == pod_uid), None)


def find_worker_in(pods: Mapping[tuple[str, str], Any], jobs: Mapping[tuple[str, str], Mapping[str, Any]],
                   namespace: str, name: str, identity: Identity, worker_role: str) -> Worker | None:
    """The operator's pod index lookup: the identity's pod among the job's workers, or a spare the status
    names as a rank's pod."""
    body = jobs.get((namespace, name))
    pod = _own_pod(pods, body, namespace, identity) if body is not None else None
    if pod is None:
        return None
    uid = body["metadata"]["uid"]
    if pod.role == worker_role:
        return Worker(uid=uid, index=pod.index, generation=served_generation(body, pod.index, pod.uid, pod.generation))
    rank = _rank_of(body, pod.uid) if pod.role == builders.ROLE_SPARE else None
    if rank is not None and isinstance(rank.get("generation"), int):
        return Worker(uid=uid, index=rank["index"], generation=rank["generation"])
    return None


def assignment_in(pods: Mapping[tuple[str, str], Any], jobs: Mapping[tuple[str, str], Mapping[str, Any]],
                  namespace: str, name: str, identity: Identity,
                  spec_of: Callable[[Mapping[str, Any]], Any]) -> dict[str, Any] | None:
    """What a spare is told: the rank whose place the status gives it, that generation's rendezvous id and
    node range; None while it has none (or is not this job's spare). `spec_of(body)`: the parsed spec."""
    body = jobs.get((namespace, name))
    pod = _own_pod(pods, body, namespace, identity) if body is not None else None
    if pod is None or pod.role != builders.ROLE_SPARE:
        return None
    rank = _rank_of(body, pod.uid)
    if rank is None or not isinstance(rank.get("generation"), int) or rank.get("pod") != pod.name:
        return None
    spec = spec_of(body)
    if spec is None:
        return None
    generation = rank["generation"]
    return {"index": rank["index"], "generation": generation, "nnodes": builders.nnodes(spec),
            "rdzvId": builders.rendezvous_id(body["metadata"]["uid"], generation)}


def served_generation(job: Mapping[str, Any], index: int, pod_uid: str, label_generation: int) -> int:
    """A survivor's pod serves the generation the operator carried it into (status.ranks[].uid and
    .generation, the operator's own record), not only the one its label names."""
    for rank in (job.get("status") or {}).get("ranks") or ():
        if rank.get("index") == index and rank.get("uid") == pod_uid and isinstance(rank.get("generation"), int):
            return max(label_generation, rank["generation"])
    return label_generation
