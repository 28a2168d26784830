"""A whole DDPJob manifest as `kubectl apply` sends it: its metadata, its spec, and the rules that need both
(the worker's hostname length depends on the job's name and namespace)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from .. import k8s_fields as k8s
from .. import pod_rules
from .base import DNS_1035_PATTERN, APIModel, CelRuleError, cel
from .spec import DDPJobSpec

# Every generated name must stay a DNS-1123 label (<= 63): the longest is worker pod (and hostname)
# `<job>-worker-<i>` with i <= 1023, so 50 + 12 = 62; Services `<job>-workers` / `<job>-rdzv`, the
# claim `<job>-checkpoints` and the job-name label value are shorter (test_builders checks them all).
MAX_JOB_NAME_LENGTH = 50


class JobMetadata(APIModel):
    """The part of metadata the schema may constrain (the API server owns the rest)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=True)
    name: str = Field(min_length=1, max_length=MAX_JOB_NAME_LENGTH, pattern=DNS_1035_PATTERN,
                      description="DNS-1035 label: lowercase letters, digits and '-', starting with a letter.")
    # Read by `ddpjob validate` and `render` (the worker FQDN's length depends on it); the API server sets it.
    namespace: str | None = Field(default=None, min_length=1, max_length=63, pattern=k8s.DNS_1123_LABEL,
                                  description="Namespace of the job (a DNS-1123 label).")
    labels: dict[str, str] | None = Field(default=None, description="The job's own labels.")
    annotations: dict[str, str] | None = Field(default=None, description="The job's own annotations.")

    @model_validator(mode="after")
    def _check_labels_and_annotations(self) -> "JobMetadata":
        """The API server's rules for any object's labels and annotations (not in the CRD: it validates them itself)."""
        found = pod_rules.object_meta_problems(self.labels, self.annotations)
        if found:
            raise CelRuleError({"rule": "", "fieldPath": f".{found[0][0]}", "message": found[0][1]})
        return self


# A worker's FQDN with setHostnameAsFQDN: `<job>-worker-<i>.<job>-workers.<ns>.svc.<cluster domain>`; the kubelet
# refuses to start a pod whose FQDN is longer than a Linux hostname (64).
MAX_FQDN_LENGTH = 64
DEFAULT_CLUSTER_DOMAIN = "cluster.local"


def worker_fqdn_length(name: str, namespace: str, max_replicas: int,
                       cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> int:
    """Length of the longest worker FQDN (the last index at maxReplicas)."""
    index = str(max_replicas - 1)
    return len(f"{name}-worker-{index}.{name}-workers.{namespace}.svc.{cluster_domain}")


# With the shortest namespace (one letter): longer is refused whatever the namespace.
_FQDN_FIXED = worker_fqdn_length("", "n", 1) - 1  # all but 2 x name and the index digits


class DDPJob(APIModel):
    """A whole manifest as `kubectl apply` sends it."""

    cel_rules = (
        cel("!has(self.spec.template) || !has(self.spec.template.podSpec) || "
            "!has(self.spec.template.podSpec.setHostnameAsFQDN) || !self.spec.template.podSpec.setHostnameAsFQDN || "
            "2 * size(self.metadata.name) + size(string((has(self.spec.maxReplicas) ? self.spec.maxReplicas : "
            f"self.spec.replicas) - 1)) + {_FQDN_FIXED} <= {MAX_FQDN_LENGTH}",
            f"with spec.template.podSpec.setHostnameAsFQDN the worker's hostname is <job>-worker-<i>.<job>-workers."
            f"<namespace>.svc.{DEFAULT_CLUSTER_DOMAIN}, longer than {MAX_FQDN_LENGTH} characters for this name at "
            f"maxReplicas (the kubelet would not start the pod): shorten metadata.name or remove setHostnameAsFQDN",
            ".metadata.name"),
    )

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=True)
    api_version: Literal["elastic.ddp.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["DDPJob"]
    metadata: JobMetadata
    spec: DDPJobSpec

    @model_validator(mode="after")
    def _check_fqdn_in_namespace(self) -> "DDPJob":
        """The rule above assumes the shortest namespace; a manifest that names its own is checked in it."""
        pod_spec, namespace = self.spec.template.pod_spec, self.metadata.namespace
        if namespace is None or pod_spec is None or not pod_spec.set_hostname_as_fqdn:
            return self
        longest = worker_fqdn_length(self.metadata.name, namespace, self.spec.max_nodes)
        if longest > MAX_FQDN_LENGTH:
            raise CelRuleError({"rule": "", "fieldPath": ".metadata.name", "message": (
                f"with spec.template.podSpec.setHostnameAsFQDN the FQDN of worker {self.spec.max_nodes - 1} in "
                f"namespace {namespace} has {longest} characters (the kubelet starts none over {MAX_FQDN_LENGTH}): "
                f"shorten metadata.name or metadata.namespace, or remove setHostnameAsFQDN")})
        return self
