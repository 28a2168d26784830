"""The HTTP server: an aiohttp app on its own port that authenticates, authorizes, rate-limits and parses
reports, then hands them to the tracker (the package's docstring says what each answer means)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any, Callable

import aiohttp.web

from .auth import Identity, RateLimited, TokenBucket, TokenReviewer, Unauthenticated
from .pods import Worker, attributed_generation
from .reports import BadReport, parse_report
from .tls import ServerCertificate
from .tracker import ProgressTracker

logger = logging.getLogger("ddpjob_operator.progress")

MAX_BODY_BYTES = 4096
RATE_PER_POD = 2.0  # reports a second, sustained (the client heartbeats every 5 s and reports per log interval)
BURST_PER_POD = 10.0
HEADER_SECONDS = 10.0  # a connection's request headers (and idle keep-alive) must arrive within this
BODY_SECONDS = 10.0  # and its body within this
MAX_CONNECTIONS = 1024  # open connections at once; more are closed on accept

RESULTS = ("accepted", "unauthenticated", "forbidden", "invalid", "too_large", "rate_limited", "standby",
           "unavailable", "dropped")
# How a connection ends under a body being read when its sender goes: a trainer killed mid-report (an RST, a
# FIN before the body's end, a TLS session cut off). ssl.SSLError is an OSError; aiohttp raises ClientPayloadError
# for a chunked body cut short.
PEER_GONE = (OSError, EOFError, aiohttp.ClientPayloadError)


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
                 assignment: Callable[[str, str, Identity], dict[str, Any] | None] = lambda ns, name, who: None,
                 generation: Callable[[str, str, Identity], dict[str, Any] | None] = lambda ns, name, who: None):
        self.tracker, self.reviewer, self.find_worker = tracker, reviewer, find_worker
        self.assignment, self.generation = assignment, generation
        self.leading, self.accepted, self.count, self.clock = leading, accepted, count, clock
        self.refused = refused
        self.header_seconds, self.body_seconds, self.max_connections = header_seconds, body_seconds, max_connections
        self.limiter = TokenBucket(RATE_PER_POD, BURST_PER_POD)
        self.app = aiohttp.web.Application(client_max_size=MAX_BODY_BYTES)
        self.app.router.add_post("/v1/namespaces/{namespace}/ddpjobs/{name}/progress", self.handle)
        # A warm spare asks which rank's place it takes (contract.ASSIGNMENT_PATH): 200 with it, 204 not yet.
        self.app.router.add_get("/v1/namespaces/{namespace}/ddpjobs/{name}/assignment", self.handle_assignment)
        # A worker's agent asks which generation the operator carried its pod into (contract.GENERATION_PATH).
        self.app.router.add_get("/v1/namespaces/{namespace}/ddpjobs/{name}/generation", self.handle_generation)
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
        return await self._tell(request, self.assignment, "assignment")

    async def handle_generation(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        return await self._tell(request, self.generation, "generation")

    async def _tell(self, request: aiohttp.web.Request,
                    lookup: Callable[[str, str, Identity], dict[str, Any] | None], what: str) -> aiohttp.web.Response:
        """200 with what `lookup` tells the token's pod, 204 when it has nothing to tell."""
        try:
            identity = await self._identify(request)
            if isinstance(identity, aiohttp.web.Response):
                return identity
            given = lookup(request.match_info["namespace"], request.match_info["name"], identity)
        except Exception:  # noqa: BLE001 - a client must never crash the operator
            logger.exception("%s request failed", what)
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
            logger.info("a progress report of pod %s/%s (DDPJob %s/%s) did not send its body within %gs",
                        identity.namespace, identity.pod_name, namespace, name, self.body_seconds)
            return self._answer(408, "invalid", f"the body did not arrive within {self.body_seconds:g}s")
        except PEER_GONE as exc:  # expected whenever a worker is killed: one quiet line, nobody to answer
            logger.info("a progress report of pod %s/%s (DDPJob %s/%s) ended with its connection: %s",
                        identity.namespace, identity.pod_name, namespace, name, exc or type(exc).__name__)
            return self._answer(400, "dropped", "the connection ended before the body")
        try:
            report = parse_report(raw)
        except BadReport as exc:
            return self._answer(exc.status, "invalid", str(exc))
        self.tracker.record(worker.uid, (namespace, name), worker.index, attributed_generation(worker, report), report,
                            self.clock())
        self.accepted(namespace, name, worker.uid)
        return self._answer(204, "accepted")
