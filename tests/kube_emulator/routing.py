"""How the emulated API server routes a request: discovery to kmock, every resource verb to its handler,
errors as a Status; the operator's calls recorded, and a test's outage (503)."""

from __future__ import annotations

import time

import aiohttp.web
from kmock._internal import enums, rendering
from kmock._internal.k8s import KubernetesError

from .resources import TOKEN_REVIEWS, OPERATOR_AGENTS
from .rules import api_error


class RequestRouting:
    """Routing, the call record and the outage a test sets (part of Cluster)."""

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        # kmock matches each request by scanning its whole request history; keep only the requests
        # still being served (watches), or every call gets slower with every call before it.
        self._in_flight.add(request)
        self._requests[:] = [r for r in self._requests if r in self._in_flight]
        try:
            return await self.serve(request)
        finally:
            self._in_flight.discard(request)

    async def serve(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None or not resource.plural:
            return await super()._handle(request)  # discovery
        self.record(request)
        if self.unavailable(request):
            return self.failure(api_error(503, "ServiceUnavailable",
                                           "the server is currently unable to handle the request"))
        method, named, sub = request.method, request.name is not None, request.subresource
        try:
            if resource not in self.resources:
                raise api_error(404, "NotFound", "the server could not find the requested resource")
            if sub is not None and sub not in self.resources[resource].subresources:
                raise api_error(404, "NotFound", "the server could not find the requested resource")
            if method == "GET" and request.action == enums.action.WATCH:
                self._matching(request)  # a malformed selector is a 400, before any streaming
                return await super()._handle(request)  # kmock streams what _serve_watch yields
            if method == "GET" and named:
                code, body = 200, await self._get_object(request)
            elif method == "GET":
                code, body = 200, await self.serve_list(request)
            elif method == "POST" and not named and resource == TOKEN_REVIEWS:
                code, body = 201, self._review_token(request)
            elif method == "POST" and not named:
                code, body = 201, await self._create(request)
            elif method == "POST" and named and sub == "eviction":
                code, body = 201, await self._evict(request)
            elif method in ("PATCH", "PUT") and named:
                code, body = 200, await self._update(request)
            elif method == "DELETE" and named:
                code, body = 200, await self._delete_request(request)
            elif method == "DELETE" and sub is None and (request.namespace is not None
                                                          or not self.resources[resource].namespaced):
                code, body = 200, await self._delete_collection(request)
            else:
                raise api_error(405, "MethodNotAllowed",
                                "the server does not allow this method on the requested resource")
        except KubernetesError as exc:
            return self.failure(exc)
        return aiohttp.web.json_response(body, status=code)

    @staticmethod
    def failure(exc: KubernetesError) -> aiohttp.web.StreamResponse:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": exc.message, "reason": exc.reason}
        if exc.details:
            body["details"] = exc.details
        body["code"] = exc.status
        return aiohttp.web.json_response(body, status=exc.status)

    def unavailable(self, request: rendering.Request) -> bool:
        return (time.monotonic() < self.unavailable_until and request.action != enums.action.WATCH
                and request.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS))

    def record(self, request: rendering.Request) -> None:
        agent = request.headers.get("User-Agent", "")
        if not agent.startswith(OPERATOR_AGENTS):
            return
        verb = {enums.action.LIST: "list", enums.action.WATCH: "watch", enums.action.FETCH: "get",
                enums.action.CREATE: "create", enums.action.UPDATE: "patch",
                enums.action.DELETE: "delete"}.get(request.action)  # type: ignore[arg-type]
        if request.method == "PUT" and request.name:
            verb = "update"
        elif request.method == "POST" and request.name:
            verb = "create"  # a subresource such as pods/eviction
        if verb is None:
            return
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        self.calls.add((request.resource.group or "", resource, verb))
        self.call_counts[(request.resource.group or "", resource, verb)] += 1
        if "Authorization" in request.headers:
            self.credentials.append(request.headers["Authorization"])

