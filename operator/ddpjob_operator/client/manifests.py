"""Manifests checked with the model the CRD is generated from, before anything is sent: a bad one fails with
exactly what `ddpjob validate` prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .. import model, validation
from ..validation import FieldError
from .errors import InvalidManifest


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
