"""A Python function as a job: its program in a ConfigMap that the job owns."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from .. import function_job, kube, model, validation
from .creation import create
from .errors import ApiError, InvalidArgument, InvalidManifest, JobExists
from .job import Job
from .manifests import as_manifest
from .transport import Transport

CONFIG_MAPS = kube.Kind("v1", "configmaps")


def built(fn: Callable[..., Any], namespace: str, options: dict[str, Any]) -> function_job.FunctionJob:
    """function_job.build's job, its refusals raised as the client's own errors (the field, the fix)."""
    try:
        inspect.signature(function_job.build).bind(fn, namespace=namespace, **options)
    except TypeError as exc:
        known = [p for p in inspect.signature(function_job.build).parameters if p not in ("fn", "namespace")]
        raise InvalidArgument(f"submit: {exc}. Fix: its options are {', '.join(known)}") from None
    try:
        return function_job.build(fn, namespace=namespace, **options)
    except validation.InvalidJob as exc:
        raise InvalidManifest(exc.errors) from None


def submit_function(transport: Transport, namespace: str, fn: Callable[..., Any], **options: Any) -> Job:
    """Creates the ConfigMap, then the job, then makes the job own the ConfigMap (deleting the job deletes it)."""
    fj = built(fn, namespace, options)
    config_map = CONFIG_MAPS.path(namespace, fj.config_map["metadata"]["name"])
    try:
        transport.call("POST", CONFIG_MAPS.path(namespace), body=fj.config_map)
    except ApiError as exc:
        if exc.status == 409:
            raise JobExists(namespace, fj.name) from None
        raise
    try:
        job = create(transport, as_manifest(fj.manifest), namespace)
    except Exception:
        transport.call("DELETE", config_map)
        raise
    owner = {"apiVersion": model.API_VERSION, "kind": model.KIND, "name": job.name, "uid": job.uid,
             "controller": True, "blockOwnerDeletion": True}
    transport.call("PATCH", config_map, content_type="application/merge-patch+json",
                   body={"metadata": {"ownerReferences": [owner]}})
    return job
