"""The Python API: create, wait for, follow, list, suspend, resume, scale and delete DDPJobs.

    from ddpjob_operator import client
    jobs = client.Client()                      # kubeconfig's current context, or in-cluster credentials
    job = jobs.create("examples/cpu-digits.yaml")
    for line in jobs.logs(job.name, rank=0, follow=True): print(line)
    job = jobs.wait(job.name)                   # Succeeded, or JobEnded naming the reason

Synchronous and plain HTTP (urllib): it works the same in a script, a pipeline step and a notebook
(which already runs an event loop of its own). Credentials are the operator's own
(`kube.Connection.from_environment`). Manifests are checked with the model the CRD is generated from
before anything is sent, so a bad manifest fails with exactly what `ddpjob validate` prints.
Never imports torch.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from . import builders, function_job, kube, model, object_names, server_fields, validation
from .kube import SERVICE_ACCOUNT_DIR, Connection
from .validation import FieldError

USER_AGENT = "ddpjob-client"
TERMINAL_PHASES = ("Succeeded", "Failed")
CONFIG_MAPS = kube.Kind("v1", "configmaps")


# ---------------------------------------------------------------- errors


class DDPJobError(Exception):
    """Every error of this API: its message says what happened and the fix."""


class InvalidManifest(validation.InvalidJob, DDPJobError):
    """The manifest breaks a rule of the CRD: `errors` are `ddpjob validate`'s, each with its field and fix."""


class InvalidName(DDPJobError, object_names.InvalidName):
    """A name or namespace no object can have (empty, holding '/', not a DNS label ...): refused before anything
    is sent, since an empty name addresses the whole collection (a delete there deletes every DDPJob)."""


def _valid(value: Any, rule: object_names.NameRule, argument: str) -> str:
    try:
        return object_names.check(value, rule, argument)
    except object_names.InvalidName as exc:
        raise InvalidName(str(exc)) from None


class JobNotFound(DDPJobError):
    def __init__(self, namespace: str, name: str):
        self.namespace, self.name = namespace, name
        super().__init__(f"ddpjob {name} not found in namespace {namespace} (404). Fix: check the name and the "
                         f"namespace (`ddpjob list -n {namespace}` lists the jobs there)")


class JobExists(DDPJobError):
    def __init__(self, namespace: str, name: str):
        self.namespace, self.name = namespace, name
        super().__init__(f"ddpjob {name} already exists in namespace {namespace} (409). Fix: pick another "
                         f"metadata.name, or delete the old job first (`ddpjob delete {name} -n {namespace}`)")


class WaitTimeout(DDPJobError, TimeoutError):
    """`wait` gave up: what it waited for, and the job's last status."""

    def __init__(self, what: str, timeout: float, job: "Job"):
        self.job = job
        super().__init__(f"timed out after {timeout:g}s waiting for ddpjob {job.namespace}/{job.name} {what}; "
                         f"last status: {job.describe()}")


class JobEnded(DDPJobError):
    """The job reached a terminal phase other than the one awaited (a Failed job while waiting for Succeeded)."""

    def __init__(self, what: str, job: "Job"):
        self.job = job
        super().__init__(f"ddpjob {job.namespace}/{job.name} ended {job.phase} while waiting for it {what}: "
                         f"{job.describe()}")


class LogsUnavailable(DDPJobError):
    """The worker pod has no log to show (not created yet, or its container not started)."""


class ApiError(DDPJobError):
    """Any other answer of the API server, quoted."""

    def __init__(self, status: int, reason: str, message: str, what: str = ""):
        self.status, self.reason, self.message = status, reason, message
        hint = {401: " Fix: your credentials were refused; log in again (kubeconfig) or check the token",
                403: " Fix: your account lacks this permission (RBAC); ask for it, or use another namespace"}
        super().__init__(f"{what}{': ' if what else ''}HTTP {status} {reason}: {message}.{hint.get(status, '')}")


# ---------------------------------------------------------------- a job as read back


@dataclass(frozen=True)
class Job:
    """A DDPJob as the API server holds it: typed spec and status (the CRD's model), and the raw object."""

    raw: dict[str, Any]

    @property
    def name(self) -> str:
        return self.raw["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.raw["metadata"].get("namespace", "")

    @property
    def uid(self) -> str:
        return self.raw["metadata"].get("uid", "")

    @property
    def spec(self) -> model.DDPJobSpec:
        return validation.parse_spec(self.raw.get("spec"))

    @property
    def status(self) -> model.DDPJobStatus:
        """Salvaged field by field: a status written by a newer operator never makes the client fail."""
        return model.salvage(model.DDPJobStatus, self.raw.get("status") or {}) or model.DDPJobStatus()

    @property
    def phase(self) -> str | None:
        return (self.raw.get("status") or {}).get("phase")

    @property
    def progress(self) -> model.Progress | None:
        return self.status.progress

    def condition(self, type_: str) -> model.Condition | None:
        return next((c for c in self.status.conditions if c.type == type_), None)

    def describe(self) -> str:
        """One line: phase, reason and message, workers, restarts, progress."""
        s = self.status
        parts = [f"phase {s.phase or 'none yet'}"]
        reason = next((c.reason for c in s.conditions if c.type == s.phase and c.reason), "")
        if reason:
            parts[0] += f" ({reason})"
        parts.append(f"{s.ready_replicas}/{(self.raw.get('spec') or {}).get('replicas', '?')} workers ready")
        parts.append(f"restarts {s.restarts}, disruptions {s.disruptions}")
        p = s.progress
        if p is not None and p.step is not None:
            parts.append(f"step {p.step}" + (f" of {p.total_steps}" if p.total_steps else ""))
        if s.message:
            parts.append(f"message: {s.message}")
        return ", ".join(parts)


# ---------------------------------------------------------------- manifests


def load_manifests(path: str | Path) -> list[dict[str, Any]]:
    """The DDPJobs in a YAML file, each checked as `ddpjob validate` checks it (InvalidManifest otherwise)."""
    errors: list[FieldError] = []
    bodies = []
    try:
        documents = list(validation.load_documents(path))
    except validation.InvalidJob as exc:
        raise InvalidManifest([FieldError(str(path), str(e)) for e in exc.errors]) from None
    for doc in documents:
        try:
            validation.parse_job(doc.body)
            bodies.append(validation.plain(doc.body))
        except validation.InvalidJob as exc:
            errors += [FieldError(doc.label, str(e)) for e in exc.errors]
    if errors:
        raise InvalidManifest(errors)
    if not bodies:
        raise InvalidManifest([FieldError(str(path), "no DDPJob in file", "add a DDPJob manifest")])
    return bodies


def as_manifest(job: str | Path | Mapping[str, Any] | model.DDPJob) -> dict[str, Any]:
    """A manifest file (exactly one DDPJob), a dict or the model -> the checked object to send."""
    if isinstance(job, model.DDPJob):
        return job.wire()
    if isinstance(job, (str, Path)):
        bodies = load_manifests(job)
        if len(bodies) != 1:
            raise InvalidManifest([FieldError(str(job), f"holds {len(bodies)} DDPJobs",
                                              "create them one by one (`load_manifests` reads them all)")])
        return bodies[0]
    if isinstance(job, Mapping):
        body = validation.plain(job)
        try:
            validation.parse_job(body)
        except validation.InvalidJob as exc:
            raise InvalidManifest(exc.errors) from None
        return body
    raise InvalidManifest([FieldError("", f"cannot make a DDPJob of a {type(job).__name__}",
                                      "pass a manifest path, a dict or a ddpjob_operator.model.DDPJob")])


def default_namespace() -> str:
    """In a pod: its own namespace; else the kubeconfig context's namespace; else `default`."""
    in_cluster = SERVICE_ACCOUNT_DIR / "namespace"
    if in_cluster.exists():
        return in_cluster.read_text().strip() or "default"
    try:
        import os

        from kubernetes import config

        _, current = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG") or None)
        return (current or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # no kubeconfig: the connection reports that, with its fix
        return "default"


# ---------------------------------------------------------------- the client


class Client:
    """DDPJobs in one namespace (each call may name another). Connects lazily, on the first call."""

    def __init__(self, namespace: str | None = None, connection: Connection | None = None, *,
                 request_timeout: float = 30.0):
        self._connection = connection
        self._from_environment = connection is None
        if namespace is not None:
            _valid(namespace, object_names.NAMESPACE, "namespace")
        self.namespace = namespace if namespace is not None else (
            default_namespace() if connection is None else "default")
        self.request_timeout = request_timeout
        self._ssl: ssl.SSLContext | None = None

    # ---- transport

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

    def _open(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
              content_type: str = "application/json", timeout: float | None = None, what: str = "",
              retried: bool = False):
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
                return self._open(method, path, body=body, params=params, content_type=content_type,
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

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        with self._open(method, path, **kwargs) as response:
            text = response.read().decode()
        return json.loads(text) if text else None

    def _namespace(self, namespace: str | None) -> str:
        """The namespace a call means (None: the client's), checked before anything is sent. The client's own was
        checked when given, so a bad one here came from the kubeconfig context."""
        if namespace is None:
            return _valid(self.namespace, object_names.NAMESPACE, "the kubeconfig context's namespace")
        return _valid(namespace, object_names.NAMESPACE, "namespace")

    def _job_call(self, method: str, name: str, namespace: str | None, sub: str | None = None, **kwargs: Any) -> Any:
        ns = self._namespace(namespace)
        _valid(name, object_names.JOB_NAME, "name")
        try:
            return self._call(method, kube.DDPJOBS.path(ns, name, sub), **kwargs)
        except ApiError as exc:
            if exc.status == 404:
                raise JobNotFound(ns, name) from None
            if exc.status == 422:  # the CRD's schema or rules: the same words as `ddpjob validate`
                raise InvalidManifest([FieldError(f"ddpjob {name}", exc.message)]) from None
            raise

    # ---- verbs

    def create(self, job: str | Path | Mapping[str, Any] | model.DDPJob, namespace: str | None = None, *,
               judge: bool = True) -> Job:
        """Create a DDPJob from a manifest file (one DDPJob), a dict or the model; returns it as stored. With
        `judge` (the default) the API server first dry-runs it and what it creates (`judge`)."""
        body = as_manifest(job)
        meta = body.setdefault("metadata", {})
        ns = self._namespace(namespace if namespace is not None else meta.get("namespace"))
        meta["namespace"] = ns
        if judge:
            self.judge(body, ns)
        return self._create(body, ns)

    def judge(self, job: str | Path | Mapping[str, Any] | model.DDPJob, namespace: str | None = None) -> list[str]:
        """Have the API server dry-run (`dryRun=All`: admission and validation, nothing kept) the DDPJob and the
        objects the operator creates for it first (Services, claim, store and worker pods): InvalidManifest naming
        the DDPJob field when it refuses one. Returns notes on what could not be judged (no permission)."""
        body = as_manifest(job)
        ns = self._namespace(namespace if namespace is not None else body["metadata"].get("namespace"))
        body["metadata"]["namespace"] = ns
        self._create(body, ns, dry_run=True)
        parsed = validation.parse_job(body)
        notes, errors = [], []
        for manifest in builders.all_manifests(builders.JobRef.preview(parsed.metadata.name, ns), parsed.spec):
            kind, name = manifest["kind"], manifest["metadata"]["name"]
            try:
                self._call("POST", kube.KINDS[(manifest["apiVersion"], kind)].path(ns), body=manifest,
                           params={"dryRun": "All"})
            except ApiError as exc:
                if exc.status == 403 and "cannot create resource" in exc.message:
                    notes.append(f"{kind} {name} not judged: you may not create {kind}s (the operator may)")
                elif exc.status == 404 and kind == "PodGroup":
                    continue  # the operator reports a missing gang scheduler, with its fix
                elif exc.status == 409:
                    errors.append(FieldError(f"ddpjob {parsed.metadata.name}", f"{kind} {name} already exists in {ns}",
                                             f"rename the DDPJob or delete that {kind}"))
                elif exc.status in (400, 403, 422):
                    field = server_fields.ddpjob_field(kind, exc.message,
                                                       store_pod=name == builders.store_pod_name(parsed.metadata.name))
                    errors.append(FieldError(f"ddpjob {parsed.metadata.name}" + (f": {field}" if field else ""),
                                             f"the API server would refuse {kind} {name}: {exc.message}",
                                             "fix that DDPJob field, or ask about the namespace's admission policy"))
                else:
                    raise
        if errors:
            raise InvalidManifest(errors)
        return notes

    def _create(self, body: dict[str, Any], ns: str, *, dry_run: bool = False) -> Job:
        meta = body["metadata"]
        try:
            return Job(self._call("POST", kube.DDPJOBS.path(ns), body=body,
                                  params={"dryRun": "All"} if dry_run else None))
        except ApiError as exc:
            if exc.status == 409:
                raise JobExists(ns, meta["name"]) from None
            if exc.status == 422:
                raise InvalidManifest([FieldError(f"ddpjob {meta['name']}", exc.message)]) from None
            if exc.status == 404:
                raise DDPJobError(f"the cluster has no DDPJob API or no namespace {ns} (404: {exc.message}). Fix: "
                                  f"install the chart (docs/install.md) or create the namespace") from None
            raise

    def submit_function(self, fn: Callable[..., Any], namespace: str | None = None, **options: Any) -> Job:
        """A Python function as a job (function_job.build, `options` as for it): creates the ConfigMap, then
        the job, then makes the job own the ConfigMap (deleting the job deletes it)."""
        ns = self._namespace(namespace)
        fj = function_job.build(fn, namespace=ns, **options)
        config_map = CONFIG_MAPS.path(ns, fj.config_map["metadata"]["name"])
        try:
            self._call("POST", CONFIG_MAPS.path(ns), body=fj.config_map)
        except ApiError as exc:
            if exc.status == 409:
                raise JobExists(ns, fj.name) from None
            raise
        try:
            job = self.create(fj.manifest, ns)
        except Exception:
            self._call("DELETE", config_map)
            raise
        owner = {"apiVersion": model.API_VERSION, "kind": model.KIND, "name": job.name, "uid": job.uid,
                 "controller": True, "blockOwnerDeletion": True}
        self._call("PATCH", config_map, content_type="application/merge-patch+json",
                   body={"metadata": {"ownerReferences": [owner]}})
        return job

    def get(self, name: str, namespace: str | None = None) -> Job:
        return Job(self._job_call("GET", name, namespace))

    def list(self, namespace: str | None = None, *, all_namespaces: bool = False,
             label_selector: str | None = None) -> list[Job]:
        path = kube.DDPJOBS.path(None if all_namespaces else self._namespace(namespace))
        listed = self._call("GET", path, params={"labelSelector": label_selector})
        return [Job(item) for item in (listed or {}).get("items") or ()]

    def delete(self, name: str, namespace: str | None = None, *, wait: bool = False,
               timeout: float = 120.0) -> None:
        """Delete the job; its pods, Services and claim go with it (owner references).
        With `wait`, return once the job itself is gone."""
        self._job_call("DELETE", name, namespace, body={"propagationPolicy": "Background"})
        if wait:
            deadline = time.monotonic() + timeout
            for _ in self._changes(name, namespace, deadline, until_gone=True):
                pass

    def suspend(self, name: str, namespace: str | None = None) -> Job:
        """spec.runPolicy.suspend=true: workers stop gracefully (checkpoint), the claim stays."""
        return self._patch_spec(name, namespace, {"runPolicy": {"suspend": True}})

    def resume(self, name: str, namespace: str | None = None) -> Job:
        """spec.runPolicy.suspend=false: a new generation continues from the newest checkpoint."""
        return self._patch_spec(name, namespace, {"runPolicy": {"suspend": False}})

    def scale(self, name: str, replicas: int, namespace: str | None = None) -> Job:
        """The scale subresource (`kubectl scale`): checked against minReplicas..maxReplicas first."""
        current = self.get(name, namespace)
        try:
            validation.parse_spec({**(current.raw.get("spec") or {}), "replicas": replicas})
        except validation.InvalidJob as exc:
            raise InvalidManifest(exc.errors) from None
        self._job_call("PATCH", name, namespace, "scale", body={"spec": {"replicas": replicas}},
                       content_type="application/merge-patch+json")
        return self.get(name, namespace)

    def _patch_spec(self, name: str, namespace: str | None, patch: dict[str, Any]) -> Job:
        return Job(self._job_call("PATCH", name, namespace, body={"spec": patch},
                                  content_type="application/merge-patch+json"))

    # ---- waiting and following

    def watch(self, name: str, namespace: str | None = None, *, timeout: float | None = None) -> Iterator[Job]:
        """The job now, then each time it changes, until it is Succeeded or Failed (or `timeout` passed:
        the iteration just ends). Built on the API's watch, so nothing is polled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in self._changes(name, namespace, deadline):
            yield job
            if job.phase in TERMINAL_PHASES:
                return

    def progress(self, name: str, namespace: str | None = None, *,
                 timeout: float | None = None) -> Iterator[model.Progress]:
        """status.progress each time it changes (step, loss, samples/s, ETA), until the job ends."""
        last = None
        for job in self.watch(name, namespace, timeout=timeout):
            current = job.progress
            if current is not None and current != last:
                last = current
                yield current

    def wait(self, name: str, phase: str | Iterable[str] | None = None, namespace: str | None = None, *,
             condition: str | None = None, timeout: float = 3600.0) -> Job:
        """Until the job is in `phase` (one or several; default: Succeeded) or has `condition` True.

        Raises JobEnded when it finished otherwise (Failed while waiting for Succeeded: the reason and
        message are in the error), WaitTimeout after `timeout` seconds (with the last status), JobNotFound."""
        phases = (phase,) if isinstance(phase, str) else tuple(phase or (() if condition else ("Succeeded",)))
        what = " or ".join(
            ([f"to reach phase {'/'.join(phases)}"] if phases else []) + ([f"to have condition {condition}=True"]
                                                                          if condition else []))
        deadline = time.monotonic() + timeout
        last: Job | None = None
        for job in self._changes(name, namespace, deadline):
            last = job
            c = job.condition(condition) if condition else None
            if job.phase in phases or (c is not None and c.status == "True"):
                return job
            if job.phase in TERMINAL_PHASES:
                raise JobEnded(what, job)
        raise WaitTimeout(what, timeout, last or self.get(name, namespace))

    def _changes(self, name: str, namespace: str | None, deadline: float | None, *,
                 until_gone: bool = False) -> Iterator[Job]:
        """The job, then every version of it a watch sees, until `deadline` (None: for ever). A watch the
        server ends (timeoutSeconds, 410 Gone) is started again from a fresh read."""
        ns = self._namespace(namespace)
        while True:
            try:
                job = self.get(name, ns)
            except JobNotFound:
                if until_gone:
                    return
                raise
            yield job
            version = job.raw["metadata"].get("resourceVersion")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            seconds = max(1, min(300, int(remaining + 1))) if remaining is not None else 300
            params = {"watch": "true", "fieldSelector": f"metadata.name={name}", "resourceVersion": version,
                      "timeoutSeconds": seconds, "allowWatchBookmarks": "false"}
            try:
                # The socket timeout ends a watch that sees nothing by the deadline.
                with self._open("GET", kube.DDPJOBS.path(ns), params=params,
                                timeout=min(seconds, remaining) if remaining is not None else seconds + 30) as stream:
                    for line in stream:
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            break  # 410 Gone and the like: read it again, watch again
                        if event.get("type") == "DELETED":
                            if until_gone:
                                return
                            raise JobNotFound(ns, name)
                        yield Job(event["object"])
                        if deadline is not None and time.monotonic() >= deadline:
                            return
            except (TimeoutError, socket.timeout):
                pass
            if deadline is not None and time.monotonic() >= deadline:
                return

    # ---- logs

    def worker_pod(self, name: str, rank: int = 0, namespace: str | None = None) -> str:
        """The pod of worker `rank` (status.ranks[].index, `<job>-worker-<rank>`), checked against the spec."""
        job = self.get(name, namespace)
        replicas = (job.raw.get("spec") or {}).get("replicas", 1)
        top = max(replicas, (job.raw.get("spec") or {}).get("maxReplicas") or replicas)
        if not 0 <= rank < top:
            raise LogsUnavailable(f"ddpjob {job.namespace}/{name} has no rank {rank}. Fix: pick a rank in 0..{top - 1}")
        ranked = next((r.pod for r in job.status.ranks if r.index == rank), None)
        return _rank_pod(job, ranked) if ranked else builders.worker_name(name, rank)

    def logs(self, name: str, rank: int = 0, namespace: str | None = None, *, follow: bool = False,
             tail_lines: int | None = None, previous: bool = False) -> Iterator[str]:
        """The trainer log lines of one worker pod (rank: its replica index; with nprocPerNode > 1 the pod's
        log holds all its processes). `follow`: stream until the job ends, moving on to a replacement
        pod when this rank's pod is replaced."""
        ns = self._namespace(namespace)
        pod = self.worker_pod(name, rank, ns)
        while True:
            uid = self._pod_uid(ns, pod) if follow else None
            params = {"container": builders.TRAINER_CONTAINER, "follow": "true" if follow else None,
                      "tailLines": tail_lines, "previous": "true" if previous else None}
            try:
                with self._open("GET", kube.PODS.path(ns, pod, "log"), params=params,
                                timeout=None if follow else self.request_timeout,
                                what=f"logs of {pod}") as stream:
                    for raw in stream:
                        yield raw.decode(errors="replace").rstrip("\n")
            except ApiError as exc:
                if exc.status == 404:
                    raise LogsUnavailable(f"pod {pod} (rank {rank} of ddpjob {ns}/{name}) does not exist (404). Fix: "
                                          f"wait until the job runs (`ddpjob status {name}`)") from None
                if exc.status == 400:
                    raise LogsUnavailable(f"pod {pod} (rank {rank} of ddpjob {ns}/{name}) has no log yet: "
                                          f"{exc.message}. Fix: wait until it runs (`ddpjob status {name}`)") from None
                raise
            if not follow:
                return
            # This pod's container ended: stop with the job, or go on with the rank's replacement pod.
            replacement = self._next_pod(name, ns, rank, uid)
            if replacement is None:
                return
            pod, tail_lines = replacement, None

    def _pod_uid(self, namespace: str, pod: str) -> str | None:
        try:
            return self._call("GET", kube.PODS.path(namespace, pod))["metadata"]["uid"]
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _next_pod(self, name: str, namespace: str, rank: int, old_uid: str | None) -> str | None:
        """After a followed log ended: None once the job ended, else the rank's next pod once it runs."""
        for job in self._changes(name, namespace, None):
            if job.phase in TERMINAL_PHASES:
                return None
            current = next((r for r in job.status.ranks if r.index == rank), None)
            if current is not None and current.phase in ("Running", "Succeeded", "Failed"):
                pod = _rank_pod(job, current.pod)
                uid = current.uid or self._pod_uid(namespace, pod)
                if uid is not None and uid != old_uid:
                    return pod
        return None


def _rank_pod(job: Job, pod: str) -> str:
    """A rank's pod as the job's status names it, checked before it goes into a URL (the status is data)."""
    return _valid(pod, object_names.POD_NAME, f"ddpjob {job.namespace}/{job.name} status.ranks[].pod")


def submit(train_fn: Callable[..., Any], *, client: Client | None = None, namespace: str | None = None,
           **options: Any) -> Job:
    """A Python function as a job (Client.submit_function): see docs/python-api.md."""
    return (client or Client(namespace=namespace)).submit_function(train_fn, namespace, **options)
