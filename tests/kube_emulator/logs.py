"""The emulated API server plus the pod log endpoint (`GET .../pods/<pod>/log`), as the kubelet serves it
through a v1.36 API server: text/plain; `container` (required when the pod has several), `tailLines`,
`follow` (streams until the container has terminated), `previous`; 404 for a missing pod, 400 for a
container that is unknown or still waiting to start, with the server's words. The test's kubelet writes
the lines (`log`); a replacement pod of the same name starts with an empty log (keyed by uid)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp.web
from kmock._internal import rendering

from .cluster import Cluster
from .resources import PODS
from .rules import api_error, not_found


class LogCluster(Cluster):
    @property
    def _logs(self) -> dict[tuple[str, str], list[str]]:  # (pod uid, container) -> lines
        if "_log_lines" not in self.__dict__:
            self.__dict__["_log_lines"] = {}
        return self.__dict__["_log_lines"]

    def _changed(self) -> asyncio.Condition:
        if "_log_changed" not in self.__dict__:
            self.__dict__["_log_changed"] = asyncio.Condition()
        return self.__dict__["_log_changed"]

    async def log(self, namespace: str, pod: str, *lines: str, container: str = "trainer") -> None:
        """The container printed `lines` (the test's kubelet)."""
        current = self.get(PODS, namespace, pod)
        assert current is not None, f"no pod {pod}"
        self._logs.setdefault((current["metadata"]["uid"], container), []).extend(lines)
        async with self._changed():
            self._changed().notify_all()

    async def commit(self, key: Any, obj: Any, type_: str) -> dict[str, Any]:
        stored = await super().commit(key, obj, type_)
        if key[0] == PODS:  # a container that terminated ends its followers
            async with self._changed():
                self._changed().notify_all()
        return stored

    async def serve(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource == PODS and request.subresource == "log" and request.method == "GET":
            try:
                return await self._serve_log(request)
            except Exception as exc:  # KubernetesError: the server's Status
                if hasattr(exc, "status") and hasattr(exc, "reason"):
                    return self.failure(exc)  # type: ignore[arg-type]
                raise
        return await super().serve(request)

    def _container_state(self, pod: dict[str, Any], container: str) -> tuple[str, str]:
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            if status.get("name") == container:
                state = status.get("state") or {}
                if "running" in state:
                    return "running", ""
                if "terminated" in state:
                    return "terminated", ""
                return "waiting", (state.get("waiting") or {}).get("reason", "ContainerCreating")
        return "waiting", "ContainerCreating"

    async def _serve_log(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        namespace, name, params = request.namespace, request.name, request.params
        pod = self.get(PODS, namespace, name)
        if pod is None:
            raise not_found(PODS, name)
        containers = [c["name"] for c in pod["spec"].get("containers") or ()]
        container = params.get("container")
        if not container:
            if len(containers) != 1:
                raise api_error(400, "BadRequest", f"a container name must be specified for pod {name}, choose "
                                                   f"one of: [{' '.join(containers)}]")
            container = containers[0]
        if container not in containers:
            raise api_error(400, "BadRequest", f"container {container} is not valid for pod {name}")
        state, reason = self._container_state(pod, container)
        if state == "waiting":
            raise api_error(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: '
                                               f"{reason}")
        uid = pod["metadata"]["uid"]
        lines = self._logs.get((uid, container), [])
        start = max(0, len(lines) - int(params["tailLines"])) if params.get("tailLines") else 0
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        assert request._raw_request is not None
        await response.prepare(request._raw_request)
        sent = start
        follow = params.get("follow") == "true"
        while True:
            lines = self._logs.get((uid, container), [])
            for line in lines[sent:]:
                await response.write((line + "\n").encode())
            sent = len(lines)
            if not follow:
                break
            async with self._changed():  # checked and awaited under the lock: no wake-up is missed
                current = self.get(PODS, namespace, name)
                ended = current is None or current["metadata"]["uid"] != uid or \
                    self._container_state(current, container)[0] == "terminated"
                if len(self._logs.get((uid, container), [])) == sent:
                    if ended:
                        break
                    await self._changed().wait()
        await response.write_eof()
        return response
