"""Thin async access to the Kubernetes API: the only module that makes the operator's own calls.

kopf has no general-purpose client, so this is a few verbs over aiohttp with the same
credentials kopf logs in with. Idempotency lives here: AlreadyExists on create and NotFound on
delete mean "done". Everything else (a 409 Conflict included) raises `ApiError`, and the caller
retries the whole reconcile (level-based, so that is always safe).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import aiohttp
import kopf

from . import model, object_names

USER_AGENT = "ddpjob-operator"


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Connection:
    server: str  # e.g. https://10.0.0.1:443
    token: str | None = None
    token_path: str | None = None  # read at each use: projected service-account tokens rotate
    ca_path: str | None = None
    certificate_path: str | None = None
    private_key_path: str | None = None
    insecure: bool = False

    @classmethod
    def from_environment(cls) -> "Connection":
        """The pod's service account when running in a cluster, else the current kubeconfig context."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port and (SERVICE_ACCOUNT_DIR / "token").exists():
            host = f"[{host}]" if ":" in host else host  # IPv6
            return cls(server=f"https://{host}:{port}", token_path=str(SERVICE_ACCOUNT_DIR / "token"),
                       ca_path=str(SERVICE_ACCOUNT_DIR / "ca.crt"))
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration)
        auth = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken") or ""
        scheme, _, credential = auth.partition(" ")
        return cls(server=configuration.host, token=credential if scheme.lower() == "bearer" else None,
                   ca_path=configuration.ssl_ca_cert, certificate_path=configuration.cert_file,
                   private_key_path=configuration.key_file, insecure=not configuration.verify_ssl)

    def current_token(self) -> str | None:
        if self.token_path:
            return Path(self.token_path).read_text().strip()
        return self.token

    def for_kopf(self) -> kopf.ConnectionInfo:
        """kopf calls the login handler again on a 401, so a rotated token is picked up."""
        token = self.current_token()
        return kopf.ConnectionInfo(server=self.server, token=token, scheme="Bearer" if token else None,
                                   ca_path=self.ca_path, certificate_path=self.certificate_path,
                                   private_key_path=self.private_key_path, insecure=self.insecure)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"HTTP {status} {reason}: {message}")


class NotOwned(ApiError):
    """A create met an object of the same name that belongs to something else."""


# What a call may end in that the next try can fix: a refusal, a dropped connection, a timeout.
RETRYABLE_ERRORS = (ApiError, aiohttp.ClientError, asyncio.TimeoutError)


@dataclass(frozen=True)
class Kind:
    """Where a resource lives in the URL space."""

    api_version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        """The object's URL, or the collection's (name None); namespace None: every namespace's collection.
        The one builder of a request's path: an empty name or namespace (which would address the collection:
        a delete there deletes every object of it) or one that would move the URL ('/', '.', '..', '%') raises
        object_names.InvalidName, and every segment is percent-escaped."""
        segments = ["api", "v1"] if self.api_version == "v1" else ["apis", *self.api_version.split("/")]
        if namespace is not None:
            segments += ["namespaces", object_names.check(namespace, object_names.PATH_SEGMENT, "namespace")]
        segments.append(self.plural)
        if name is not None:
            segments.append(object_names.check(name, object_names.PATH_SEGMENT, f"{self.plural} name"))
        if subresource is not None:
            segments.append(subresource)
        return "/" + "/".join(object_names.segment(s) for s in segments)


PODS = Kind("v1", "pods")
SERVICES = Kind("v1", "services")
CLAIMS = Kind("v1", "persistentvolumeclaims")
CONFIG_MAPS = Kind("v1", "configmaps")  # the job's agent files (job_manifests.agent_config_map)
EVENTS = Kind("v1", "events")
DDPJOBS = Kind(model.API_VERSION, model.PLURAL)
# runPolicy.schedulingPolicy: the PodGroups of Volcano and of the scheduler-plugins coscheduling plugin.
POD_GROUPS = {api_version: Kind(api_version, "podgroups") for api_version, _ in model.GANG_SCHEDULERS.values()}
KINDS = {("v1", "Pod"): PODS, ("v1", "Service"): SERVICES, ("v1", "PersistentVolumeClaim"): CLAIMS,
         ("v1", "ConfigMap"): CONFIG_MAPS,
         **{(api_version, "PodGroup"): kind for api_version, kind in POD_GROUPS.items()}}


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 patch turning `old` into `new` (removed keys become null, lists are replaced)."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before:
            patch[key] = value
    return patch


class Kube:
    """`user_agent` names the caller; `before_write` runs before every call but a GET and refuses it by
    raising (leader.FencedKube: no write while this replica is not the leader)."""

    def __init__(self, connection: Connection, *, timeout_seconds: float = 30.0, user_agent: str = USER_AGENT,
                 before_write: Callable[[], None] | None = None):
        self.connection = connection
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.user_agent, self.before_write = user_agent, before_write
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            conn = self.connection
            ssl_context: ssl.SSLContext | bool = False if conn.insecure else ssl.create_default_context(
                cafile=conn.ca_path)
            if isinstance(ssl_context, ssl.SSLContext) and conn.certificate_path:
                ssl_context.load_cert_chain(conn.certificate_path, conn.private_key_path)
            headers = {"User-Agent": self.user_agent}
            self._session = aiohttp.ClientSession(
                base_url=conn.server.rstrip("/") + "/", headers=headers, timeout=self.timeout,
                connector=aiohttp.TCPConnector(ssl=ssl_context if conn.server.startswith("https") else None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None,
                    content_type: str = "application/json") -> tuple[int, Any]:
        if method != "GET" and self.before_write is not None:
            self.before_write()
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        token = self.connection.current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with self._open().request(method, path.lstrip("/"), data=data, params=params,
                                        headers=headers) as response:
            text = await response.text()
            payload = json.loads(text) if text else None
            if response.status >= 400:
                info = payload if isinstance(payload, dict) else {}
                raise ApiError(response.status, info.get("reason") or response.reason or "",
                               info.get("message") or text[:200])
            return response.status, payload

    async def list_page(self, kind: Kind, namespace: str | None, params: dict[str, str]) -> dict[str, Any]:
        """One page of a LIST (`limit` and `continue` in `params`); ApiError when it cannot (410: the
        continue token expired)."""
        _, listed = await self._call("GET", kind.path(namespace), params=params)
        return listed or {}

    async def watch(self, kind: Kind, namespace: str | None, params: dict[str, str],
                    read_timeout: float) -> AsyncIterator[dict[str, Any]]:
        """The events of a WATCH (`watch=true` is added), one parsed JSON object per line, until the server
        ends the stream (its timeoutSeconds); ApiError when the server refuses it (a 410 included). A
        stream silent for `read_timeout` seconds raises asyncio.TimeoutError. Lines are split here, not by
        aiohttp's readline, which refuses a line over 128 KiB (a pod with a large spec)."""
        headers = {"Authorization": f"Bearer {token}"} if (token := self.connection.current_token()) else {}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout.total, sock_read=read_timeout)
        async with self._open().get(kind.path(namespace).lstrip("/"), params={**params, "watch": "true"},
                                    headers=headers, timeout=timeout) as response:
            if response.status >= 400:
                text = await response.text()
                info = _json_or_none(text)
                info = info if isinstance(info, dict) else {}
                raise ApiError(response.status, info.get("reason") or response.reason or "",
                               info.get("message") or text[:200])
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
            if buffer.strip():
                yield json.loads(buffer)

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        """Read one object; ApiError (a 404 included) when it cannot."""
        _, body = await self._call("GET", kind.path(namespace, name))
        return body or {}

    async def write(self, kind: Kind, manifest: dict[str, Any], *, create: bool) -> dict[str, Any]:
        """Create (POST) or replace (PUT) one object exactly as given, and return what the server stored.
        Unlike `create`, a 409 raises: a name already taken, or a replace decided on a resourceVersion that
        someone else has changed since (the Lease's optimistic concurrency)."""
        meta = manifest["metadata"]
        if create:
            _, written = await self._call("POST", kind.path(meta["namespace"]), body=manifest)
        else:
            _, written = await self._call("PUT", kind.path(meta["namespace"], meta["name"]), body=manifest)
        return written or {}

    async def create(self, manifest: dict[str, Any], kind: Kind | None = None, *,
                     dry_run: bool = False) -> dict[str, Any] | None:
        """Create; None when it already exists and is this owner's (an earlier attempt succeeded: done).

        A 409 on a name held by an object with another controller (or none) raises NotOwned: another
        job's Service, a user's claim. Deterministic names make that an error the user must see.
        With `dry_run` the API server judges the object (defaults, admission, validation: `dryRun=All`)
        and keeps nothing."""
        kind = kind or KINDS[(manifest["apiVersion"], manifest["kind"])]
        meta = manifest["metadata"]
        try:
            _, created = await self._call("POST", kind.path(meta["namespace"]), body=manifest,
                                          params={"dryRun": "All"} if dry_run else None)
            return created
        except ApiError as exc:
            if exc.status != 409:
                raise
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or ()}
        if owners:
            try:
                existing = await self.get(kind, meta["namespace"], meta["name"])
            except ApiError as exc:
                if exc.status != 404:
                    raise
                # It held the name a moment ago and is gone now: the name is free, try again (retryable).
                raise ApiError(409, "Conflict", f"{manifest['kind']} {meta['name']} was just deleted") from None
            existing_meta = (existing or {}).get("metadata") or {}
            held_by = {ref.get("uid") for ref in existing_meta.get("ownerReferences") or ()}
            if existing_meta.get("deletionTimestamp") and not owners & held_by:
                # A previous job's object of the same name, still being garbage-collected: try again later.
                raise ApiError(409, "Conflict", f"{manifest['kind']} {meta['name']} is still being deleted")
            if not owners & held_by:
                raise NotOwned(409, "AlreadyExists", f"{manifest['kind']} {meta['name']} already exists and is "
                                                     f"not owned by {manifest['metadata']['ownerReferences'][0]['name']}")
        return None

    async def delete(self, kind: Kind, namespace: str, name: str, *, grace_seconds: int | None = None,
                     uid: str | None = None) -> bool:
        """Delete; False when it is already gone. Children are removed in the background.

        With `uid`, only that incarnation is deleted: a 409 (precondition failed) means the name
        now belongs to a newer object, so the one meant is gone too.
        """
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call("DELETE", kind.path(namespace, name), body=body)
            return True
        except ApiError as exc:
            if exc.status == 404 or (exc.status == 409 and uid):
                return False
            raise

    async def latest_event_message(self, namespace: str, involved_uid: str, reason: str) -> str | None:
        """The newest message of the Events with this reason about one object, if any."""
        _, listed = await self._call("GET", EVENTS.path(namespace), params={
            "fieldSelector": f"involvedObject.uid={involved_uid},reason={reason}"})
        items = (listed or {}).get("items") or []
        items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return items[-1].get("message") if items else None

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """Merge-patch the DDPJob status subresource; False when the job is gone.

        No resourceVersion precondition: the operator is the only status writer, and a 409 from
        anything else raises, so the caller re-runs the whole (idempotent) reconcile.
        """
        try:
            await self._call("PATCH", DDPJOBS.path(namespace, name, "status"), body={"status": patch},
                             content_type="application/merge-patch+json")
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise

    async def patch_pod_labels(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        """Merge-patch one pod's labels (None removes one): the leader's own pod (progress routing)."""
        await self._call("PATCH", PODS.path(namespace, name), body={"metadata": {"labels": labels}},
                         content_type="application/merge-patch+json")

    async def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """TokenReview (authentication.k8s.io/v1): whether the API server vouches for `token` with one of
        `audiences`, and whose it is (the progress endpoint's authentication)."""
        _, reviewed = await self._call("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": list(audiences)}})
        return reviewed or {}

    async def post_event(self, involved: dict[str, str], type_: str, reason: str, message: str,
                         timestamp: str) -> None:
        namespace = involved["namespace"]
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": {"apiVersion": model.API_VERSION, "kind": model.KIND, **involved},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": "ddpjob-operator"}, "reportingComponent": "ddpjob-operator",
            "firstTimestamp": timestamp, "lastTimestamp": timestamp, "count": 1,
        }
        await self._call("POST", EVENTS.path(namespace), body=event)
