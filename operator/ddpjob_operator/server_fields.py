"""Which DDPJob field an API server's refusal of a created object came from.

The server names the field of its own object (`Pod "x" is invalid: spec.initContainers[0].image: Required
value`); the user edits the DDPJob, so a refusal is reported with the DDPJob field that field is built from
(job_manifests.py: the one container `trainer`, template.* and podSpec.* pass through).
"""

from __future__ import annotations

import re

_FIELD = re.compile(r"\b((?:spec|metadata)(?:\.[A-Za-z][\w-]*(?:\[[^\]]*\])*)+)")

# (the object's field prefix, the DDPJob field), first match wins: the trainer container's own fields first.
_POD = (
    ("spec.containers[0].args", "spec.args"),
    ("spec.containers[0].env", "spec.env"),
    ("spec.containers[0].image", "spec.image"),
    ("spec.containers[0].resources", "spec.resources (or spec.template.trainer.resources)"),
    ("spec.containers[0].volumeMounts", "spec.template.volumeMounts"),
    ("spec.containers[0].command", "spec.entrypoint"),
    ("spec.containers[0]", "spec.template.trainer"),
    ("spec.containers", "spec.template.trainer"),
    ("spec.initContainers", "spec.template.podSpec.initContainers"),
    ("spec.volumes", "spec.template.volumes"),
    ("spec.securityContext.fsGroup", "spec.template.fsGroup"),
    ("spec.terminationGracePeriodSeconds", "spec.template.terminationGracePeriodSeconds"),
    ("metadata.annotations", "spec.template.annotations"),
    ("metadata.labels", "spec.template.labels"),
    ("metadata.name", "metadata.name"),
)
_TEMPLATE_FIELDS = ("nodeSelector", "tolerations", "affinity", "serviceAccountName", "priorityClassName")
_CLAIM = (
    ("spec.storageClassName", "spec.checkpoint.claimTemplate.storageClassName"),
    ("spec.resources", "spec.checkpoint.claimTemplate.size"),
    ("spec.accessModes", "spec.checkpoint.claimTemplate.accessModes"),
)


def object_field(message: str) -> str | None:
    """The first field path the server's message names, if any."""
    after = message.split(" is invalid: ", 1)[-1]
    match = _FIELD.search(after)
    return match.group(1) if match else None


def ddpjob_field(kind: str, message: str, *, store_pod: bool = False) -> str:
    """The DDPJob field a refusal of one of the job's objects (`kind`) came from, "" when it cannot tell."""
    field = object_field(message)
    if field is None:
        return ""
    if kind == "PersistentVolumeClaim":
        return next((ours for theirs, ours in _CLAIM if field.startswith(theirs)), "spec.checkpoint.claimTemplate")
    if kind != "Pod":
        return "metadata.name" if field.startswith("metadata.name") else ""
    if store_pod:
        return "spec.rendezvous.storeTemplate (or the workers' spec.template it follows)"
    for theirs, ours in _POD:
        if field == theirs or field.startswith((theirs + ".", theirs + "[")):
            return ours
    name = field.split(".")[1].split("[")[0] if field.startswith("spec.") else ""
    if name in _TEMPLATE_FIELDS:
        return f"spec.template.{name}"
    return f"spec.template.podSpec.{name}" if name else ""
