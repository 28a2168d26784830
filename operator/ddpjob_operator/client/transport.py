"""HTTP to the API server: the credentials (the operator's own, `kube.Connection.from_environment`), TLS, the
bearer token read again once when it expired, and the API server's answers turned into the client's errors.
Synchronous and plain urllib, so it works the same in a script, a pipeline step and a notebook (which already
runs an event loop of its own)."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from .. import kube, object_names
from ..kube import SERVICE_ACCOUNT_DIR, Connection
from ..validation import FieldError
from .errors import ApiError, DDPJobError, InvalidManifest, JobNotFound, checked_name

USER_AGENT = "ddpjob-client"


def default_namespace() -> str:
    """In a pod: its own namespace; else the kubeconfig context's namespace; else `default`."""
    in_cluster = SERVICE_ACCOUNT_DIR / "namespace"
    if in_cluster.exists():
        return in_cluster.read_text().strip() or "default"
    try:
        from kubernetes import config

        _, current = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG") or None)
        return (current or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # no kubeconfig: the connection reports that, with its fix
        return "default"


class Transport:
    """One API server, reached lazily (credentials are read on the first request)."""

    def __init__(self, connection: Connection | None, request_timeout: float):
        self._connection = connection
        self._from_environment = connection is None
        self.request_timeout = request_timeout
        self._ssl: ssl.SSLContext | None = None

    @property
    def connection(self) -> Connection:
        if self._connection is None:
            try:
                self._connection = Connection.from_environment()
            except Exception as exc:  # kubernetes.config raises several unrelated types
                raise DDPJobError(f"no Kubernetes credentials ({exc}). Fix: set KUBECONFIG or use "
                                  f"`kubectl config use-context`, or run in a pod with a service account") from None
        return self._connection

    def _context(self) -> ssl.SSLContext | None:
        conn = self.connection
        if not conn.server.startswith("https"):
            return None
        if self._ssl is None:
            if conn.insecure:
                context = ssl.create_default_context()
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            else:
                context = ssl.create_default_context(cafile=conn.ca_path)
            if conn.certificate_path:
                context.load_cert_chain(conn.certificate_path, conn.private_key_path)
            self._ssl = context
        return self._ssl

    def open(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
             content_type: str = "application/json", timeout: float | None = None, what: str = "",
             retried: bool = False):
        """The response, open (a stream for a watch or a followed log); ApiError for any refusal."""
        conn = self.connection
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        url = conn.server.rstrip("/") + path + (f"?{query}" if query else "")
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        token = conn.current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        try:
            return urllib.request.urlopen(request, timeout=timeout or self.request_timeout, context=self._context())
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and self._from_environment and not retried:
                # An exec plugin's or an OIDC token expired: read the credentials again, once.
                self._connection, self._ssl = None, None
                return self.open(method, path, body=body, params=params, content_type=content_type,
                                 timeout=timeout, what=what, retried=True)
            text = exc.read().decode(errors="replace")
            try:
                info = json.loads(text)
            except ValueError:
                info = {}
            info = info if isinstance(info, dict) else {}
            raise ApiError(exc.code, info.get("reason") or exc.reason or "", info.get("message") or text[:300],
                           what) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DDPJobError(f"cannot reach the Kubernetes API at {conn.server}: {reason}. Fix: check that the "
                              f"cluster is up and KUBECONFIG names it") from None

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The answer's JSON (None for an empty one)."""
        with self.open(method, path, **kwargs) as response:
            text = response.read().decode()
        return json.loads(text) if text else None

    def job_call(self, method: str, namespace: str, name: Any, sub: str | None = None, **kwargs: Any) -> Any:
        """A call on one DDPJob (or its `sub`resource), its name checked first: JobNotFound for a 404, and the
        CRD's refusal (422) in `ddpjob validate`'s words."""
        ns = checked_name(namespace, object_names.NAMESPACE, "namespace")
        checked_name(name, object_names.JOB_NAME, "name")
        try:
            return self.call(method, kube.DDPJOBS.path(ns, name, sub), **kwargs)
        except ApiError as exc:
            if exc.status == 404:
                raise JobNotFound(ns, name) from None
            if exc.status == 422:  # the CRD's schema or rules: the same words as `ddpjob validate`
                raise InvalidManifest([FieldError(f"ddpjob {name}", exc.message)]) from None
            raise
