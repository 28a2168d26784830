"""Creating a DDPJob: the API server first judges it and every object the operator creates for it (a dry run),
so a refusal names the DDPJob field with nothing created."""

from __future__ import annotations

from typing import Any

from .. import job_manifests, kube, naming, server_fields, validation
from ..validation import FieldError
from .errors import ApiError, DDPJobError, InvalidManifest, JobExists
from .job import Job
from .transport import Transport


def create(transport: Transport, body: dict[str, Any], namespace: str, *, judge: bool = True) -> Job:
    """`body` (a checked manifest) created in `namespace` (checked), judged first unless `judge` is False."""
    body["metadata"]["namespace"] = namespace
    if judge:
        judge_objects(transport, body, namespace)
    return post(transport, body, namespace)


def judge_objects(transport: Transport, body: dict[str, Any], namespace: str) -> list[str]:
    """Have the API server dry-run (`dryRun=All`: admission and validation, nothing kept) the DDPJob and the
    objects the operator creates for it (Services, claim, store and worker pods): InvalidManifest naming the
    DDPJob field when it refuses one. Returns notes on what could not be judged (no permission)."""
    body["metadata"]["namespace"] = namespace
    post(transport, body, namespace, dry_run=True)
    parsed = validation.parse_job(body)
    notes, errors = [], []
    for manifest in job_manifests.all_manifests(naming.JobRef.preview(parsed.metadata.name, namespace), parsed.spec):
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        try:
            transport.call("POST", kube.KINDS[(manifest["apiVersion"], kind)].path(namespace), body=manifest,
                           params={"dryRun": "All"})
        except ApiError as exc:
            if exc.status == 403 and "cannot create resource" in exc.message:
                notes.append(f"{kind} {name} not judged: you may not create {kind}s (the operator may)")
            elif exc.status == 404 and kind == "PodGroup":
                continue  # the operator reports a missing gang scheduler, with its fix
            elif exc.status == 409:
                errors.append(FieldError(f"ddpjob {parsed.metadata.name}", f"{kind} {name} already exists in "
                                         f"{namespace}", f"rename the DDPJob or delete that {kind}"))
            elif exc.status in (400, 403, 422):
                field = server_fields.ddpjob_field(kind, exc.message,
                                                   store_pod=name == naming.store_pod_name(parsed.metadata.name))
                errors.append(FieldError(f"ddpjob {parsed.metadata.name}" + (f": {field}" if field else ""),
                                         f"the API server would refuse {kind} {name}: {exc.message}",
                                         "fix that DDPJob field, or ask about the namespace's admission policy"))
            else:
                raise
    if errors:
        raise InvalidManifest(errors)
    return notes


def post(transport: Transport, body: dict[str, Any], namespace: str, *, dry_run: bool = False) -> Job:
    """The DDPJob created (or only dry-run) as it is: JobExists for a 409, the CRD's refusal as InvalidManifest."""
    meta = body["metadata"]
    try:
        return Job(transport.call("POST", kube.DDPJOBS.path(namespace), body=body,
                                  params={"dryRun": "All"} if dry_run else None))
    except ApiError as exc:
        if exc.status == 409:
            raise JobExists(namespace, meta["name"]) from None
        if exc.status == 422:
            raise InvalidManifest([FieldError(f"ddpjob {meta['name']}", exc.message)]) from None
        if exc.status == 404:
            raise DDPJobError(f"the cluster has no DDPJob API or no namespace {namespace} (404: {exc.message}). "
                              f"Fix: install the chart (docs/install.md) or create the namespace") from None
        raise
