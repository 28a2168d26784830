"""The Client: the verbs on DDPJobs, each a thin call into the module of its concern."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from .. import kube, model, object_names, validation
from ..kube import Connection
from . import creation, functions, pod_logs, waits
from .errors import InvalidManifest, checked_name
from .job import Job
from .manifests import as_manifest
from .transport import Transport, default_namespace


class Client:
    """DDPJobs in one namespace (each call may name another). Connects lazily, on the first call."""

    def __init__(self, namespace: str | None = None, connection: Connection | None = None, *,
                 request_timeout: float = 30.0):
        if namespace is not None:
            checked_name(namespace, object_names.NAMESPACE, "namespace")
        self.namespace = namespace if namespace is not None else (
            default_namespace() if connection is None else "default")
        self._transport = Transport(connection, request_timeout)

    @property
    def connection(self) -> Connection:
        return self._transport.connection

    @property
    def request_timeout(self) -> float:
        return self._transport.request_timeout

    @request_timeout.setter
    def request_timeout(self, seconds: float) -> None:
        self._transport.request_timeout = seconds

    def _namespace(self, namespace: str | None) -> str:
        """The namespace a call means (None: the client's), checked before anything is sent. The client's own was
        checked when given, so a bad one here came from the kubeconfig context."""
        if namespace is None:
            return checked_name(self.namespace, object_names.NAMESPACE, "the kubeconfig context's namespace")
        return checked_name(namespace, object_names.NAMESPACE, "namespace")

    def _manifest_namespace(self, body: dict[str, Any], namespace: str | None) -> str:
        return self._namespace(namespace if namespace is not None else body.setdefault("metadata", {}).get("namespace"))

    # ---- creating

    def create(self, job: str | Path | Mapping[str, Any] | model.DDPJob, namespace: str | None = None, *,
               judge: bool = True) -> Job:
        """Create a DDPJob from a manifest file (one DDPJob), a dict or the model; returns it as stored. With
        `judge` (the default) the API server first dry-runs it and what it creates (`judge`)."""
        body = as_manifest(job)
        return creation.create(self._transport, body, self._manifest_namespace(body, namespace), judge=judge)

    def judge(self, job: str | Path | Mapping[str, Any] | model.DDPJob, namespace: str | None = None) -> list[str]:
        """Have the API server dry-run (`dryRun=All`: admission and validation, nothing kept) the DDPJob and the
        objects the operator creates for it first (Services, claim, store and worker pods): InvalidManifest naming
        the DDPJob field when it refuses one. Returns notes on what could not be judged (no permission)."""
        body = as_manifest(job)
        return creation.judge_objects(self._transport, body, self._manifest_namespace(body, namespace))

    def submit_function(self, fn: Callable[..., Any], namespace: str | None = None, **options: Any) -> Job:
        """A Python function as a job (function_job.build, `options` as for it): creates the ConfigMap, then
        the job, then makes the job own the ConfigMap (deleting the job deletes it). A function that cannot be
        shipped, or options the model refuses, raise InvalidManifest naming the field and the fix."""
        return functions.submit_function(self._transport, self._namespace(namespace), fn, **options)

    # ---- reading and changing

    def get(self, name: str, namespace: str | None = None) -> Job:
        return waits.read(self._transport, self._namespace(namespace), name)

    def list(self, namespace: str | None = None, *, all_namespaces: bool = False,
             label_selector: str | None = None) -> list[Job]:
        path = kube.DDPJOBS.path(None if all_namespaces else self._namespace(namespace))
        listed = self._transport.call("GET", path, params={"labelSelector": label_selector})
        return [Job(item) for item in (listed or {}).get("items") or ()]

    def delete(self, name: str, namespace: str | None = None, *, wait: bool = False,
               timeout: float = 120.0) -> None:
        """Delete the job; its pods, Services and claim go with it (owner references).
        With `wait`, return once the job itself is gone."""
        ns = self._namespace(namespace)
        self._transport.job_call("DELETE", ns, name, body={"propagationPolicy": "Background"})
        if wait:
            waits.until_gone(self._transport, ns, name, timeout)

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
        self._transport.job_call("PATCH", self._namespace(namespace), name, "scale",
                                 body={"spec": {"replicas": replicas}}, content_type="application/merge-patch+json")
        return self.get(name, namespace)

    def _patch_spec(self, name: str, namespace: str | None, patch: dict[str, Any]) -> Job:
        return Job(self._transport.job_call("PATCH", self._namespace(namespace), name, body={"spec": patch},
                                            content_type="application/merge-patch+json"))

    # ---- waiting and following

    def watch(self, name: str, namespace: str | None = None, *, timeout: float | None = None) -> Iterator[Job]:
        """The job now, then each time it changes, until it is Succeeded or Failed (or `timeout` passed:
        the iteration just ends). Built on the API's watch, so nothing is polled."""
        return waits.watch(self._transport, self._namespace(namespace), name, timeout)

    def progress(self, name: str, namespace: str | None = None, *,
                 timeout: float | None = None) -> Iterator[model.Progress]:
        """status.progress each time it changes (step, loss, samples/s, ETA), until the job ends."""
        return waits.progress(self._transport, self._namespace(namespace), name, timeout)

    def wait(self, name: str, phase: str | Iterable[str] | None = None, namespace: str | None = None, *,
             condition: str | None = None, timeout: float = 3600.0) -> Job:
        """Until the job is in `phase` (one or several; default: Succeeded) or has `condition` True.

        Raises JobEnded when it finished otherwise (Failed while waiting for Succeeded: the reason and
        message are in the error), WaitTimeout after `timeout` seconds (with the last status), JobNotFound."""
        return waits.wait(self._transport, self._namespace(namespace), name, phase, condition, timeout)

    def worker_pod(self, name: str, rank: int = 0, namespace: str | None = None) -> str:
        """The pod of worker `rank` (status.ranks[].index, `<job>-worker-<rank>`), checked against the spec;
        a rank that is no whole number is refused (InvalidArgument) before anything is sent."""
        ns = self._namespace(namespace)
        return pod_logs.worker_pod(self._transport, ns, name, pod_logs.checked_rank(rank))

    def logs(self, name: str, rank: int = 0, namespace: str | None = None, *, follow: bool = False,
             tail_lines: int | None = None, previous: bool = False) -> Iterator[str]:
        """The trainer log lines of one worker pod (rank: its replica index; with nprocPerNode > 1 the pod's
        log holds all its processes). `follow`: stream until the job ends, moving on to a replacement
        pod when this rank's pod is replaced."""
        ns = self._namespace(namespace)
        return pod_logs.lines(self._transport, ns, name, pod_logs.checked_rank(rank), follow=follow,
                          tail_lines=pod_logs.checked_tail_lines(tail_lines), previous=previous)


def submit(train_fn: Callable[..., Any], *, client: Client | None = None, namespace: str | None = None,
           **options: Any) -> Job:
    """A Python function as a job (Client.submit_function): see docs/python-api.md."""
    return (client or Client(namespace=namespace)).submit_function(train_fn, namespace, **options)
