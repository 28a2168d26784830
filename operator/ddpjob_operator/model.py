"""The DDPJob API: one typed, validated model that is also the source of the CRD schema.

Every rule lives here once. Field constraints (types, ranges, enums, patterns) become the
OpenAPI schema; cross-field rules are CEL expressions that the API server evaluates at
`kubectl apply` (x-kubernetes-validations) and that `validate_cel_rules` evaluates locally
with the same text, so `ddpjob validate` and the cluster agree.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_origin

import celpy
from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, TypeAdapter, ValidationError, WithJsonSchema,
                      model_validator)
from pydantic_core import PydanticCustomError
from pydantic.alias_generators import to_camel

from . import k8s_fields as k8s
from . import pod_rules
from .agent.contract import FORK_TRAINER_ENV

GROUP = "elastic.ddp.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DDPJob"
PLURAL = "ddpjobs"
SINGULAR = "ddpjob"
SHORT_NAMES = ["ddpj"]

# Every generated name must stay a DNS-1123 label (<= 63): the longest is worker pod (and hostname)
# `<job>-worker-<i>` with i <= 1023, so 50 + 12 = 62; Services `<job>-workers` / `<job>-rdzv`, the
# claim `<job>-checkpoints` and the job-name label value are shorter (test_builders checks them all).
MAX_JOB_NAME_LENGTH = 50
DNS_1035_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUANTITY_PATTERN = k8s.NONNEGATIVE_QUANTITY
ENV_NAME_PATTERN = k8s.ENV_NAME
# An entrypoint starting with `-` would be parsed by torchrun as its own flag (--standalone, --max-restarts).
ENTRYPOINT_PATTERN = r"^[^-\s]\S*$"

# torchrun and the operator own these; a user value would silently break rendezvous.
RESERVED_ENV_NAMES = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
)
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "DDPJOB_")
# Set by the builders for every worker (builders.worker_env): a user value would replace the operator's.
OPERATOR_ENV_NAMES = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTHONUNBUFFERED", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
# ...except these, which the launcher reads for the user to set (docs/launch-contract.md).
USER_SETTABLE_ENV_NAMES = (FORK_TRAINER_ENV,)


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One cross-field rule, in the shape of a CRD `x-kubernetes-validations` entry."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def cel_string(text: str) -> str:
    """`text` as a CEL string literal: a regex's backslashes doubled (`\\.` alone is an invalid escape in
    CEL's grammar, and an API server would refuse the CRD)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def free_form(description: str) -> Any:
    """A Kubernetes object passed through as-is (affinity, tolerations, volumes...)."""
    return Field(default=None, description=description,
                 json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"})


class APIModel(BaseModel):
    """camelCase on the wire, unknown fields rejected, CEL rules checked after field validation."""

    # strict: no true -> 1 or "2" -> 2, as the API server's `type: integer` refuses both.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True, strict=True)
    cel_rules: ClassVar[tuple[dict[str, str], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.cel_rules:
            extra = dict(cls.model_config.get("json_schema_extra") or {})
            extra["x-kubernetes-validations"] = [dict(r) for r in cls.cel_rules]
            cls.model_config = {**cls.model_config, "json_schema_extra": extra}

    @model_validator(mode="after")
    def _check_cel_rules(self) -> "APIModel":
        # First what the CRD declares for pass-through objects (maxLength of a volume's name, ...): the
        # model's types do not check it, the API server does, and the rules below rely on it.
        for name, field in type(self).model_fields.items():
            value, declared = getattr(self, name), field.json_schema_extra
            if value is None or not isinstance(declared, dict):
                continue
            key = field.alias or name
            problem = k8s.schema_problem({k: v for k, v in declared.items() if k != "type"} if isinstance(
                value, list) else declared, value, key)
            if problem:
                raise CelRuleError({"rule": "", "message": f"{problem[0]}: {problem[1]}", "fieldPath": f".{key}"})
        if self.cel_rules:
            wire = self.model_dump(by_alias=True, exclude_none=True, mode="json")
            for rule in self.cel_rules:
                if not evaluate_cel(rule["rule"], wire):
                    raise CelRuleError(rule)
        return self

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, no nulls)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class inside a field annotation such as `Backoff`, `list[EnvVar]` or `X | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = model_in(arg)
        if found is not None:
            return found
    return None


M = TypeVar("M", bound=BaseModel)


def salvage(model_cls: type[M], raw: Any) -> M | None:
    """`model_cls` from `raw`, keeping every valid field (for data read back, such as a stored status).

    Unknown keys are ignored; an invalid field is dropped alone (its default applies); in a list of
    objects only the entries that cannot be built are dropped; nested objects are salvaged the same
    way. None when `raw` is not a mapping or a required field is missing or invalid.
    """
    if not isinstance(raw, Mapping):
        return None
    kept: dict[str, Any] = {}
    for name, field in model_cls.model_fields.items():
        key = field.alias or name
        if key not in raw and name not in raw:
            continue
        value = raw[key] if key in raw else raw[name]
        inner = model_in(field.annotation)
        if inner is not None:
            if isinstance(value, list) and _is_list(field.annotation):
                value = [item for item in (salvage(inner, v) for v in value) if item is not None]
            elif isinstance(value, Mapping):
                value = salvage(inner, value)
                if value is None:
                    continue
        try:
            kept[name] = _field_adapter(model_cls, name).validate_python(value)
        except ValidationError:
            continue
    try:
        return model_cls.model_validate(kept)
    except ValidationError:
        return None


def _is_list(annotation: Any) -> bool:
    if get_origin(annotation) is list:
        return True
    return any(_is_list(arg) for arg in getattr(annotation, "__args__", ()) or ())


@functools.lru_cache(maxsize=None)
def _field_adapter(model_cls: type[BaseModel], name: str) -> TypeAdapter[Any]:
    field = model_cls.model_fields[name]  # its type and constraints (ge, pattern...), not its alias
    return TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)


class CelRuleError(ValueError):
    """A failed cross-field rule; carries the rule so the error can name its field."""

    def __init__(self, rule: dict[str, str]):
        self.rule = rule
        super().__init__(rule["message"])


@functools.lru_cache(maxsize=None)
def _cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def evaluate_cel(rule: str, value: Any) -> bool:
    return bool(_cel_program(rule).evaluate({"self": celpy.json_to_cel(value)}))


# ---------------------------------------------------------------- spec pieces


class EnvVar(APIModel):
    cel_rules = (
        cel("self.name in " + str(list(USER_SETTABLE_ENV_NAMES)) + " || (!(self.name in "
            + str(list(RESERVED_ENV_NAMES + OPERATOR_ENV_NAMES)) + ") && "
            + " && ".join(f"!self.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES) + ")",
            "env name is reserved for torchrun and the operator (MASTER_ADDR, MASTER_PORT, RANK, "
            "WORLD_SIZE, LOCAL_RANK, GROUP_RANK, PET_*, TORCHELASTIC_*, DDPJOB_*, "
            + ", ".join(OPERATOR_ENV_NAMES) + "): rename the variable; rendezvous, ranks and these "
            "settings are wired automatically", ".name"),
        cel("!(has(self.value) && has(self.valueFrom))",
            "set either value or valueFrom, not both", ".valueFrom"),
    )

    name: str = Field(description="Environment variable name.", min_length=1, max_length=253,
                      pattern=ENV_NAME_PATTERN)
    value: str | None = Field(default=None, description="Literal value.")
    value_from: dict[str, Any] | None = free_form(
        "Source for the value (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef), as in a Pod.")


class Resources(APIModel):
    gpu: bool = Field(default=False, description=(
        "Request GPUs: each worker pod gets `gpuCount` GPUs (default: nprocPerNode), the GPU taint "
        "toleration and NCCL. When false, workers train on CPU with Gloo."))
    gpu_count: int | None = Field(default=None, ge=1, le=64, description=(
        "GPUs per worker pod when gpu is true. Defaults to nprocPerNode; must not be below it "
        "(every training process needs its own GPU)."))
    gpu_resource_name: str = Field(default="nvidia.com/gpu", min_length=1, max_length=253,
                                   pattern=k8s.EXTENDED_RESOURCE_NAME, description=(
        "Extended resource name for the GPU device plugin (domain-qualified, e.g. nvidia.com/gpu, amd.com/gpu; "
        "never cpu, memory or a kubernetes.io/ name)."))
    cpu: str | None = Field(default=None, pattern=QUANTITY_PATTERN,
                            description="CPU request and limit per worker pod, e.g. `4` or `500m`.")
    memory: str | None = Field(default=None, pattern=QUANTITY_PATTERN,
                               description="Memory request and limit per worker pod, e.g. `16Gi`.")
    shared_memory: str = Field(default="1Gi", pattern=QUANTITY_PATTERN, description=(
        "Size of the memory-backed /dev/shm volume (NCCL and DataLoader workers need more than "
        "the container default of 64Mi)."))

    cel_rules = (
        cel("!has(self.gpuCount) || self.gpu", "gpuCount needs gpu: true; set resources.gpu: true "
            "or remove gpuCount", ".gpuCount"),
        cel("!self.gpuResourceName.contains('kubernetes.io/') && !self.gpuResourceName.startsWith('requests.')",
            "gpuResourceName must be a device plugin's extended resource (such as nvidia.com/gpu), not a "
            "kubernetes.io/ or requests. name: use the name your GPU device plugin advertises", ".gpuResourceName"),
    )


# ---------------------------------------------------------------- the pod template beyond the typed fields

# The worker pod's only container, and the volumes, paths and labels the operator owns.
TRAINER_CONTAINER = "trainer"
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"
CHECKPOINT_VOLUME = "checkpoints"
# Volumes named `ddpjob-*` and mounts under this directory are the operator's (the progress token, ...).
OPERATOR_VOLUME_PREFIX = "ddpjob-"
OPERATOR_SECRETS_DIR = "/var/run/secrets/ddpjob"
TERMINATION_LOG = "/dev/termination-log"
OPERATOR_LABEL_PREFIX = f"{GROUP}/"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# Gang scheduling keys the operator sets on worker pods (runPolicy.schedulingPolicy).
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _k8s_object(description: str, *, alias: str | None = None, **properties: dict[str, Any]) -> Any:
    """A Kubernetes object passed through as-is; `properties` declares the parts rules look at."""
    extra: dict[str, Any] = dict(_OBJECT)
    if properties:
        extra["properties"] = properties
    return Field(default=None, description=description, alias=alias, json_schema_extra=extra)


def _k8s_list(description: str, *, max_items: int = 64, alias: str | None = None,
              **properties: dict[str, Any]) -> Any:
    """A list of Kubernetes objects passed through as-is (at most `max_items`)."""
    items: dict[str, Any] = dict(_OBJECT)
    if properties:
        items["properties"] = properties
    return Field(default=None, description=description, alias=alias, max_length=max_items,
                 json_schema_extra={"items": items})


def _scalar(description: str, *, alias: str | None = None, **constraints: Any) -> Any:
    return Field(default=None, description=description, alias=alias, **constraints)


def _not_here(field: str, why: str) -> dict[str, str]:
    """A rule rejecting `field` with the reason (and where to set it instead)."""
    return cel(f"!has(self.{field})", f"{field} {why}", f".{field}")


_NAME = {"type": "string", "description": "Name."}


class PodSpecOverrides(APIModel):
    """Pod-level fields of the worker pods beyond the typed ones, as in a Pod's spec."""

    # Passed through to every worker pod as written.
    image_pull_secrets: list[dict[str, Any]] | None = _k8s_list(
        "Secrets for pulling the trainer image (and the store image: the store pod gets them too), as in a Pod.")
    init_containers: list[dict[str, Any]] | None = _k8s_list(
        "Init containers (data download, setup), as in a Pod. A native sidecar (log shipper, proxy) is an init "
        "container with `restartPolicy: Always` (Kubernetes 1.29+): it runs beside the trainer and stops when "
        "the trainer exits, so it never keeps a finished worker running. Not named `trainer`.",
        max_items=32, name={"type": "string", "description": "Container name.", "maxLength": 63},
        volumeMounts={"type": "array", "maxItems": 64, "description": "As in a Container: of template.volumes.",
                      "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {"name": {"type": "string", "maxLength": 63,
                                                        "description": "Name of a volume."}}}})
    security_context: dict[str, Any] | None = _k8s_object(
        "Pod security context (runAsUser, runAsNonRoot, seccompProfile, sysctls, ...), as in a Pod. The "
        "rendezvous store pod gets it too, so both pass the namespace's Pod Security level. fsGroup: use "
        "template.fsGroup.",
        fsGroup={"type": "integer", "description": "Use template.fsGroup.", "maximum": k8s.MAX_INT64})
    host_network: bool | None = _scalar(
        "Use the node's network (RDMA / EFA without a CNI plugin). The operator then sets dnsPolicy "
        "ClusterFirstWithHostNet (unless set), so workers still resolve the rendezvous Service, and keeps "
        "workers of the job on different nodes (each publishes its node's IP to the rendezvous).")
    host_ipc: bool | None = _scalar("Use the node's IPC namespace.", alias="hostIPC")
    host_pid: bool | None = _scalar("Use the node's process ID namespace.", alias="hostPID")
    host_users: bool | None = _scalar("false: run the pod in its own user namespace.")
    topology_spread_constraints: list[dict[str, Any]] | None = _k8s_list(
        "How workers spread over zones or nodes, as in a Pod. Select the job's workers with the label "
        "elastic.ddp.dev/job-name.")
    runtime_class_name: str | None = _scalar("RuntimeClass of the worker pods (e.g. nvidia, kata).",
                                             max_length=253, pattern=DNS_1123_SUBDOMAIN_PATTERN)
    scheduler_name: str | None = _scalar(
        "Scheduler of the worker pods. With runPolicy.schedulingPolicy, set its schedulerName instead.",
        max_length=253, pattern=DNS_1123_SUBDOMAIN_PATTERN)
    dns_policy: str | None = _scalar(
        "ClusterFirst (default), ClusterFirstWithHostNet or None (with dnsConfig). Not Default: workers must "
        "resolve the rendezvous Service.")
    dns_config: dict[str, Any] | None = _k8s_object(
        "DNS options, as in a Pod.",
        nameservers={"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 45},
                     "description": "Up to 3 DNS server IP addresses."},
        searches={"type": "array", "maxItems": 32, "items": {"type": "string", "maxLength": 253},
                  "description": "Up to 32 search domains."})
    host_aliases: list[dict[str, Any]] | None = _k8s_list("Extra /etc/hosts entries, as in a Pod.")
    node_name: str | None = _scalar("Run every worker on this node, bypassing the scheduler.",
                                    max_length=253, pattern=DNS_1123_SUBDOMAIN_PATTERN)
    automount_service_account_token: bool | None = _scalar("Mount the service account token.")
    enable_service_links: bool | None = _scalar("Inject Service environment variables.")
    share_process_namespace: bool | None = _scalar("Share one process namespace between the containers.")
    set_hostname_as_fqdn: bool | None = _scalar("Use the pod's FQDN as its hostname.", alias="setHostnameAsFQDN")
    preemption_policy: Literal["PreemptLowerPriority", "Never"] | None = _scalar("PreemptLowerPriority or Never.")
    readiness_gates: list[dict[str, Any]] | None = _k8s_list("Extra readiness conditions, as in a Pod.")
    resource_claims: list[dict[str, Any]] | None = _k8s_list("Dynamic resource claims, as in a Pod.")
    scheduling_gates: list[dict[str, Any]] | None = _k8s_list("Scheduling gates, as in a Pod.")
    os: dict[str, Any] | None = _k8s_object("The pods' operating system, as in a Pod.")
    overhead: dict[str, Any] | None = _k8s_object("Pod overhead (normally set by the RuntimeClass).")
    resources: dict[str, Any] | None = _k8s_object("Pod-level resources (Kubernetes 1.32+), as in a Pod.")
    # The operator's, or set elsewhere in the spec: declared so that setting one is a clear error.
    containers: list[dict[str, Any]] | None = _k8s_list("Not allowed: see the rule's message.")
    restart_policy: str | None = _scalar("Not allowed: the operator's (Never).")
    hostname: str | None = _scalar("Not allowed: the operator's (<job>-worker-<i>).")
    subdomain: str | None = _scalar("Not allowed: the operator's (<job>-workers).")
    node_selector: dict[str, str] | None = _scalar("Not allowed: use template.nodeSelector.")
    tolerations: list[dict[str, Any]] | None = _k8s_list("Not allowed: use template.tolerations.")
    affinity: dict[str, Any] | None = _k8s_object("Not allowed: use template.affinity.")
    service_account_name: str | None = _scalar("Not allowed: use template.serviceAccountName.")
    service_account: str | None = _scalar("Not allowed: use template.serviceAccountName.")
    priority_class_name: str | None = _scalar("Not allowed: use template.priorityClassName.")
    priority: int | None = _scalar("Not allowed: the API server sets it from the priority class.",
                                   ge=-k8s.MAX_INT32 - 1, le=k8s.MAX_INT32)
    volumes: list[dict[str, Any]] | None = _k8s_list("Not allowed: use template.volumes.")
    termination_grace_period_seconds: int | None = _scalar(
        "Not allowed: use template.terminationGracePeriodSeconds.", ge=0, le=k8s.MAX_INT64)
    active_deadline_seconds: int | None = _scalar("Not allowed: use runPolicy.activeDeadlineSeconds.",
                                                  ge=0, le=k8s.MAX_INT64)
    ephemeral_containers: list[dict[str, Any]] | None = _k8s_list("Not allowed: added by kubectl debug.")

    cel_rules = (
        _not_here("containers", "is not allowed: the operator builds the one container, `trainer`, from spec.image, "
                  "spec.entrypoint, spec.args, spec.env and spec.resources; set its other fields in "
                  "spec.template.trainer, and run sidecars as native sidecars (spec.template.podSpec.initContainers "
                  "with restartPolicy: Always), which stop when the trainer exits"),
        _not_here("restartPolicy", "is the operator's (Never): it replaces failed workers itself, charging "
                  "failurePolicy.maxRestarts; remove it"),
        _not_here("hostname", "is the operator's (<job>-worker-<i>, the worker's stable DNS name); remove it"),
        _not_here("subdomain", "is the operator's (the headless Service <job>-workers); remove it"),
        _not_here("nodeSelector", "is not set here: use spec.template.nodeSelector (the rendezvous store follows it)"),
        _not_here("tolerations", "is not set here: use spec.template.tolerations (the rendezvous store follows them)"),
        _not_here("affinity", "is not set here: use spec.template.affinity"),
        _not_here("serviceAccountName", "is not set here: use spec.template.serviceAccountName"),
        _not_here("serviceAccount", "is deprecated and not set here: use spec.template.serviceAccountName"),
        _not_here("priorityClassName", "is not set here: use spec.template.priorityClassName (the rendezvous "
                  "store follows it)"),
        _not_here("priority", "is set by the API server from the priority class: use "
                  "spec.template.priorityClassName"),
        _not_here("volumes", "is not set here: use spec.template.volumes"),
        _not_here("terminationGracePeriodSeconds", "is not set here: use "
                  "spec.template.terminationGracePeriodSeconds (torchrun's shutdown timeout follows it)"),
        _not_here("activeDeadlineSeconds", "is not set here: use spec.runPolicy.activeDeadlineSeconds (a pod "
                  "deadline would kill one worker, not end the job)"),
        _not_here("ephemeralContainers", "cannot be set when a pod is created (kubectl debug adds them); remove it"),
        cel("!has(self.securityContext) || !has(self.securityContext.fsGroup)",
            "securityContext.fsGroup is not set here: use spec.template.fsGroup", ".securityContext.fsGroup"),
        cel("!has(self.dnsPolicy) || self.dnsPolicy != 'Default'",
            "dnsPolicy Default uses the node's resolver, which cannot resolve the rendezvous Service "
            "<job>-rdzv: use ClusterFirst (ClusterFirstWithHostNet with hostNetwork, the operator's default "
            "then) or None with a dnsConfig that points at the cluster DNS", ".dnsPolicy"),
        cel("!has(self.initContainers) || self.initContainers.all(c, !has(c.name) || c.name != 'trainer')",
            "initContainers: the name `trainer` is the trainer container's; rename the init container",
            ".initContainers"),
        cel("!has(self.dnsPolicy) || self.dnsPolicy in ['ClusterFirst', 'ClusterFirstWithHostNet', 'None', "
            "'Default']", "dnsPolicy must be ClusterFirst, ClusterFirstWithHostNet or None (with dnsConfig)",
            ".dnsPolicy"),
        cel("!has(self.dnsPolicy) || self.dnsPolicy != 'None' || (has(self.dnsConfig) && "
            "has(self.dnsConfig.nameservers) && size(self.dnsConfig.nameservers) > 0)",
            "dnsPolicy None takes the pod's DNS servers from dnsConfig only: add dnsConfig.nameservers (the "
            "cluster DNS, so workers resolve the rendezvous Service) or use dnsPolicy ClusterFirst", ".dnsConfig"),
    )


def _quantity(value: Any) -> int | str:
    """A non-negative quantity as the API server takes it: a whole number, or a string such as 500m or 2Gi."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= k8s.MAX_INT64:
        return value
    if isinstance(value, str) and re.fullmatch(QUANTITY_PATTERN, value):
        return value
    raise PydanticCustomError("quantity", "must be a non-negative quantity such as 1, 500m or 2Gi (got {value})",
                              {"value": repr(value)})


# One error for a bad value (an int | str union would report it twice, once per member).
Quantity = Annotated[Any, PlainValidator(_quantity),
                     WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN,
                                     "description": "A quantity, e.g. 1, 500m, 2Gi."})]


def _resource_names(part: str) -> dict[str, str]:
    return cel(f"!has(self.{part}) || self.{part}.all(k, k.matches({cel_string(k8s.CONTAINER_RESOURCE_NAME)}))",
               f"{part}: a resource name is ephemeral-storage, hugepages-<size> or a domain-qualified extended "
               f"resource such as rdma/hca (cpu, memory and GPUs come from spec.resources)", f".{part}")


class ContainerResources(APIModel):
    requests: dict[str, Quantity] | None = Field(default=None, max_length=32, description=(
        "Extra resource requests of the trainer container (RDMA / EFA devices, hugepages-2Mi, "
        "ephemeral-storage), added to spec.resources'."), json_schema_extra={"maxProperties": 32})
    limits: dict[str, Quantity] | None = Field(default=None, max_length=32, description=(
        "Extra resource limits of the trainer container, added to spec.resources'."),
        json_schema_extra={"maxProperties": 32})
    claims: list[dict[str, Any]] | None = _k8s_list("Dynamic resource claims the trainer uses, as in a Container.")

    cel_rules = tuple(
        cel(f"!has(self.{part}) || !('{name}' in self.{part})",
            f"{part}.{name} is set by spec.resources.{name} (requests and limits alike): set it there",
            f".{part}")
        for part in ("requests", "limits") for name in ("cpu", "memory")) + (
        _resource_names("requests"), _resource_names("limits"))


class TrainerContainer(APIModel):
    """Container-level fields of the trainer container beyond what the spec builds, as in a Container."""

    security_context: dict[str, Any] | None = _k8s_object(
        "Security context of the trainer container (capabilities such as IPC_LOCK for RDMA, runAsNonRoot, "
        "allowPrivilegeEscalation, readOnlyRootFilesystem), as in a Container.")
    resources: ContainerResources | None = Field(default=None, description=(
        "Extra requests and limits (RDMA devices, hugepages); cpu, memory and GPUs come from spec.resources."))
    env_from: list[dict[str, Any]] | None = _k8s_list(
        "Environment from config maps and secrets, as in a Container (spec.env and the operator's variables win). "
        "A prefix must not be able to produce a variable of torchrun's or the operator's (PET_*, TORCHELASTIC_*, "
        "DDPJOB_*, MASTER_ADDR, RANK, ...).",
        prefix={"type": "string", "maxLength": 253, "description": "Prepended to every key of the source."})
    ports: list[dict[str, Any]] | None = _k8s_list("Ports (metrics, profiling), as in a Container.")
    liveness_probe: dict[str, Any] | None = _k8s_object("Liveness probe, as in a Container.")
    readiness_probe: dict[str, Any] | None = _k8s_object("Readiness probe, as in a Container.")
    startup_probe: dict[str, Any] | None = _k8s_object("Startup probe, as in a Container.")
    lifecycle: dict[str, Any] | None = _k8s_object("postStart / preStop hooks, as in a Container.")
    working_dir: str | None = _scalar("Working directory of the trainer.")
    volume_devices: list[dict[str, Any]] | None = _k8s_list("Raw block devices, as in a Container.")
    resize_policy: list[dict[str, Any]] | None = _k8s_list("In-place resize policy, as in a Container.")
    stdin: bool | None = _scalar("Allocate a stdin buffer.")
    stdin_once: bool | None = _scalar("Close stdin after the first attach.")
    tty: bool | None = _scalar("Allocate a TTY.")
    # The operator's, or set elsewhere in the spec.
    name: str | None = _scalar("Not allowed: always `trainer`.")
    image: str | None = _scalar("Not allowed: use spec.image.")
    image_pull_policy: str | None = _scalar("Not allowed: use spec.imagePullPolicy.")
    command: list[str] | None = _scalar("Not allowed: the operator's launcher.")
    args: list[str] | None = _scalar("Not allowed: use spec.args.")
    env: list[dict[str, Any]] | None = _k8s_list("Not allowed: use spec.env.")
    volume_mounts: list[dict[str, Any]] | None = _k8s_list("Not allowed: use template.volumeMounts.")
    termination_message_path: str | None = _scalar("Not allowed: the launcher writes the failure there.")
    termination_message_policy: str | None = _scalar("Not allowed: the operator's (FallbackToLogsOnError).")
    restart_policy: str | None = _scalar("Not allowed: the trainer is never restarted in place.")

    cel_rules = (
        _not_here("name", "is always `trainer` (the operator reads the trainer's exit by it); remove it"),
        _not_here("image", "is not set here: use spec.image"),
        _not_here("imagePullPolicy", "is not set here: use spec.imagePullPolicy"),
        _not_here("command", "is the operator's: its launcher runs torchrun with the rendezvous flags; set "
                  "spec.entrypoint and spec.args"),
        _not_here("args", "is not set here: use spec.args (arguments of spec.entrypoint)"),
        _not_here("env", "is not set here: use spec.env (rendezvous and rank variables are reserved)"),
        _not_here("volumeMounts", "is not set here: use spec.template.volumeMounts (/dev/shm and the checkpoint "
                  "mount are the operator's)"),
        _not_here("terminationMessagePath", "is the operator's: the launcher writes the failure to "
                  "/dev/termination-log; remove it"),
        _not_here("terminationMessagePolicy", "is the operator's (FallbackToLogsOnError); remove it"),
        _not_here("restartPolicy", "is not allowed on the trainer: it is never restarted in place; remove it"),
        cel("!has(self.envFrom) || self.envFrom.all(e, !has(e.prefix) || e.prefix == '' || "
            f"(e.prefix.matches({cel_string(k8s.ENV_NAME)}) && "
            f"!{list(RESERVED_ENV_NAMES + OPERATOR_ENV_NAMES + RESERVED_ENV_PREFIXES)}"
            ".exists(r, r.startsWith(e.prefix)) && "
            + " && ".join(f"!e.prefix.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES) + "))",
            "envFrom: a prefix could produce a variable of torchrun's or the operator's (PET_*, TORCHELASTIC_*, "
            "DDPJOB_*, MASTER_ADDR, RANK, ...), which would rewire the rendezvous: use a prefix such as APP_",
            ".envFrom"),
    )


LabelValue = Annotated[str, Field(max_length=63, pattern=k8s.LABEL_VALUE)]


def _qualified_keys(field: str, what: str) -> dict[str, str]:
    """A rule: every key of the map `field` is a qualified name (label and annotation keys, node selectors)."""
    return cel(f"!has(self.{field}) || self.{field}.all(k, k.matches({cel_string(k8s.QUALIFIED_NAME)}) && "
               f"k.matches({cel_string(k8s.QUALIFIED_NAME_PREFIX_LENGTH)}))",
               f"{field}: every {what} key is an optional DNS subdomain prefix and '/' and a name of at most 63 "
               f"letters, digits, '-', '_' and '.' that starts and ends with a letter or digit (such as "
               f"example.com/team): rename the key", f".{field}")


def _mount_path_rule(path: str, where: str) -> list[dict[str, str]]:
    """Rules for one mount path expression `path` (a string in `where`)."""
    return [
        cel(f"{path}.matches({cel_string(k8s.NORMALIZED_PATH)})",
            f"{where}: a mountPath is an absolute path without a trailing slash, '//', '.' or '..' (the "
            f"container runtime would normalise it onto another mount): write it like /data", ""),
        cel(f"{path} != '{SHM_PATH}' && {path} != '{TERMINATION_LOG}' && {path} != '{OPERATOR_SECRETS_DIR}' "
            f"&& !{path}.startsWith('{OPERATOR_SECRETS_DIR}/')",
            f"{where}: {SHM_PATH} (size it with spec.resources.sharedMemory), {TERMINATION_LOG} and "
            f"{OPERATOR_SECRETS_DIR} are the operator's: mount elsewhere", ""),
    ]


class PodTemplate(APIModel):
    labels: dict[str, LabelValue] | None = Field(default=None, max_length=64, description=(
        f"Extra labels for worker pods (at most 64; not the operator's {OPERATOR_LABEL_PREFIX}* keys)."))
    annotations: dict[str, str] | None = Field(default=None, max_length=64, description=(
        "Extra annotations for worker pods (at most 64)."))
    node_selector: dict[str, LabelValue] | None = Field(default=None, max_length=64, description=(
        "Node selector for worker pods (and the rendezvous store pod, unless "
        "rendezvous.storeTemplate.nodeSelector is set)."))
    tolerations: list[dict[str, Any]] | None = Field(default=None, description=(
        "Tolerations for worker pods (and the rendezvous store pod, unless "
        "rendezvous.storeTemplate.tolerations is set). The operator adds the GPU toleration when "
        "resources.gpu is true, and NoExecute tolerations for node.kubernetes.io/not-ready and "
        "node.kubernetes.io/unreachable (failurePolicy.nodeLossTimeoutSeconds) unless an entry here "
        "has that key."), max_length=64,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {
            "key": {"type": "string", "maxLength": 316, "description": "Taint key (unset: every taint, Exists)."},
            "operator": {"type": "string", "maxLength": 16, "description": "Exists or Equal (default)."},
            "value": {"type": "string", "maxLength": 63, "description": "Taint value, for operator Equal."},
            "effect": {"type": "string", "maxLength": 32, "description": "NoSchedule, PreferNoSchedule, NoExecute."},
            "tolerationSeconds": {"type": "integer", "maximum": k8s.MAX_INT64,
                                  "description": "effect NoExecute only: how long to stay after the taint."}}}})
    affinity: dict[str, Any] | None = free_form("Affinity rules for worker pods, as in a Pod.")
    service_account_name: str | None = Field(default=None, pattern=DNS_1123_SUBDOMAIN_PATTERN,
                                             max_length=253, description=(
                                                 "Service account the workers and the rendezvous "
                                                 "store run as."))
    priority_class_name: str | None = Field(default=None, max_length=253, description=(
        "PriorityClass of the worker pods (and the rendezvous store pod, unless "
        "rendezvous.storeTemplate.priorityClassName is set)."))
    volumes: list[dict[str, Any]] | None = _k8s_list(
        f"Extra volumes, as in a Pod; mount them with volumeMounts (init containers and sidecars may too). "
        f"Not named {SHM_VOLUME}, {CHECKPOINT_VOLUME} or {OPERATOR_VOLUME_PREFIX}* (the operator's).", max_items=64,
        name={"type": "string", "description": "Volume name.", "maxLength": 63})
    volume_mounts: list[dict[str, Any]] | None = _k8s_list(
        f"Extra volume mounts for the trainer container, as in a Container. Not at {SHM_PATH}, the checkpoint "
        f"mountPath, {TERMINATION_LOG} or under {OPERATOR_SECRETS_DIR} (the operator's).", max_items=64,
        name={"type": "string", "description": "Name of a volume.", "maxLength": 63},
        mountPath={"type": "string", "description": "Where the volume is mounted.", "maxLength": 4096})
    fs_group: int = Field(default=1000, ge=1, le=2147483647, description=(
        "Group that owns the mounted volumes (pod securityContext.fsGroup). Every container process "
        "gets it as a supplemental group, so a non-root trainer of any uid can write checkpoints."))
    termination_grace_period_seconds: int = Field(default=60, ge=0, le=3600, description=(
        "Time a worker has after SIGTERM (suspend, scale-down, deletion) to write its final checkpoint."))
    pod_spec: PodSpecOverrides | None = Field(default=None, description=(
        "Any other pod-level field of the worker pods, as in a Pod's spec: imagePullSecrets, initContainers "
        "(and native sidecars), securityContext, hostNetwork, hostIPC, topologySpreadConstraints, "
        "runtimeClassName, schedulerName, dnsPolicy, ... Fields the operator owns (containers, restartPolicy, "
        "hostname, subdomain) or that have a field above are rejected, naming where they go."))
    trainer: TrainerContainer | None = Field(default=None, description=(
        "Any other field of the trainer container, as in a Container: securityContext, extra resources "
        "(RDMA devices, hugepages), envFrom, ports, probes, lifecycle, workingDir. Its command, args, env, "
        "image and mounts come from the spec and are rejected here."))

    cel_rules = (
        cel("!has(self.labels) || self.labels.all(k, !k.startsWith('" + OPERATOR_LABEL_PREFIX + "') && k != '"
            + MANAGED_BY_LABEL + "')",
            f"labels with the prefix {OPERATOR_LABEL_PREFIX} and {MANAGED_BY_LABEL} are the operator's (it "
            f"selects its pods by them): rename the label", ".labels"),
        cel(f"!has(self.labels) || !('{COSCHEDULING_GROUP_LABEL}' in self.labels)",
            f"the label {COSCHEDULING_GROUP_LABEL} is set by spec.runPolicy.schedulingPolicy (gangScheduler "
            f"Coscheduling): remove it and set the policy", ".labels"),
        cel(f"!has(self.labels) || !('{KUEUE_QUEUE_LABEL}' in self.labels)",
            f"the label {KUEUE_QUEUE_LABEL} belongs on the DDPJob itself (metadata.labels), not on its pods: "
            f"Kueue admits the whole job through spec.runPolicy.suspend", ".labels"),
        cel(f"!has(self.annotations) || !('{VOLCANO_GROUP_ANNOTATION}' in self.annotations)",
            f"the annotation {VOLCANO_GROUP_ANNOTATION} is set by spec.runPolicy.schedulingPolicy (gangScheduler "
            f"Volcano): remove it and set the policy", ".annotations"),
        cel("!has(self.volumes) || self.volumes.all(v, has(v.name) && "
            f"v.name.matches({cel_string(k8s.DNS_1123_LABEL)}))",
            "volumes: every volume needs a name of lowercase letters, digits and '-' (a DNS-1123 label): "
            "rename the volume", ".volumes"),
        cel(f"!has(self.volumes) || self.volumes.all(v, !has(v.name) || (v.name != '{SHM_VOLUME}' "
            f"&& v.name != '{CHECKPOINT_VOLUME}' && !v.name.startsWith('{OPERATOR_VOLUME_PREFIX}')))",
            f"volume names {SHM_VOLUME}, {CHECKPOINT_VOLUME} and {OPERATOR_VOLUME_PREFIX}* are the operator's "
            f"(/dev/shm, the checkpoint claim, the progress token): rename the volume", ".volumes"),
        cel("!has(self.volumes) || self.volumes.all(v, !has(v.name) || "
            "self.volumes.exists_one(w, has(w.name) && w.name == v.name))",
            "volumes: names must be unique: rename or remove the duplicate volume", ".volumes"),
        cel("!has(self.volumeMounts) || self.volumeMounts.all(m, has(m.name) && has(m.mountPath))",
            "volumeMounts: every mount needs name (a volume of template.volumes) and mountPath", ".volumeMounts"),
        *[dict(rule, rule="!has(self.volumeMounts) || self.volumeMounts.all(m, !has(m.mountPath) || "
               + rule["rule"] + ")", fieldPath=".volumeMounts")
          for rule in _mount_path_rule("m.mountPath", "volumeMounts")],
        cel("!has(self.volumeMounts) || self.volumeMounts.all(m, !has(m.mountPath) || "
            "self.volumeMounts.exists_one(n, has(n.mountPath) && n.mountPath == m.mountPath))",
            "volumeMounts: mountPath must be unique: mount the duplicate elsewhere or remove it", ".volumeMounts"),
        cel("!has(self.tolerations) || self.tolerations.all(t, !has(t.key) || t.key == '' || "
            f"(t.key.matches({cel_string(k8s.QUALIFIED_NAME)}) && "
            f"t.key.matches({cel_string(k8s.QUALIFIED_NAME_PREFIX_LENGTH)})))",
            "tolerations: a key is a label key (an optional DNS subdomain prefix and '/', then a name such as "
            "nvidia.com/gpu): fix the key", ".tolerations"),
        cel("!has(self.tolerations) || self.tolerations.all(t, (has(t.key) && t.key != '') || "
            "(has(t.operator) && t.operator == 'Exists'))",
            "tolerations: an entry without key must use operator: Exists (it tolerates every taint): add key or "
            "set operator: Exists", ".tolerations"),
        cel("!has(self.tolerations) || self.tolerations.all(t, (!has(t.operator) || t.operator in ['Exists', "
            "'Equal', '']) && (!has(t.effect) || t.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute', '']))",
            "tolerations: operator is Exists or Equal, effect NoSchedule, PreferNoSchedule or NoExecute",
            ".tolerations"),
        cel("!has(self.tolerations) || self.tolerations.all(t, !has(t.value) || t.value == '' || "
            f"((!has(t.operator) || t.operator != 'Exists') && t.value.matches({cel_string(k8s.LABEL_VALUE)})))",
            "tolerations: a value is a label value, and operator Exists takes none: fix the value or use "
            "operator: Equal", ".tolerations"),
        cel("!has(self.tolerations) || self.tolerations.all(t, !has(t.tolerationSeconds) || "
            "(has(t.effect) && t.effect == 'NoExecute'))",
            "tolerations: tolerationSeconds needs effect: NoExecute: set it or remove tolerationSeconds",
            ".tolerations"),
        _qualified_keys("labels", "label"),
        _qualified_keys("annotations", "annotation"),
        _qualified_keys("nodeSelector", "node selector"),
    )


class Toleration(APIModel):
    """A toleration, as in a Pod's spec.tolerations."""

    key: str | None = Field(default=None, min_length=1, max_length=316, pattern=k8s.QUALIFIED_NAME, description=(
        "Taint key to tolerate. Unset with operator Exists tolerates every taint."))
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description=(
        "Equal: the taint's value must equal value. Exists: any value (leave value unset)."))
    value: str | None = Field(default=None, max_length=63, pattern=k8s.LABEL_VALUE,
                              description="Taint value, for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(default=None, description=(
        "Taint effect to tolerate: NoSchedule, PreferNoSchedule or NoExecute. Unset matches every effect."))
    toleration_seconds: int | None = Field(default=None, ge=0, le=86400 * 365, description=(
        "effect NoExecute only: how long the pod stays on a node after the taint appears before it is "
        "evicted. Unset: forever."))

    cel_rules = (
        cel("has(self.key) || self.operator == 'Exists'",
            "a toleration without key must use operator: Exists (it tolerates every taint): add key or "
            "set operator: Exists", ".key"),
        cel("self.operator != 'Exists' || !has(self.value)",
            "operator Exists takes no value: remove value or use operator: Equal", ".value"),
        cel("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds needs effect: NoExecute: set effect: NoExecute or remove tolerationSeconds",
            ".tolerationSeconds"),
    )


class StoreResources(APIModel):
    cpu: str = Field(default="100m", pattern=QUANTITY_PATTERN, description=(
        "CPU request of the rendezvous store pod, e.g. `100m`."))
    memory: str = Field(default="256Mi", pattern=QUANTITY_PATTERN, description=(
        "Memory request of the rendezvous store pod, e.g. `256Mi`."))


class StoreTemplate(APIModel):
    cel_rules = (_qualified_keys("nodeSelector", "node selector"),)

    node_selector: dict[str, LabelValue] | None = Field(default=None, max_length=64, description=(
        "Node selector of the rendezvous store pod. Unset: the workers' (template.nodeSelector); `{}`: "
        "any node."))
    tolerations: list[Toleration] | None = Field(default=None, max_length=64, description=(
        "Tolerations of the rendezvous store pod. Unset: the workers' (template.tolerations and, with "
        "resources.gpu, the GPU toleration), so the store can run on a tainted GPU-only pool. Either "
        "way the store also gets the workers' node-loss tolerations "
        "(failurePolicy.nodeLossTimeoutSeconds) for keys not listed here."))
    priority_class_name: str | None = Field(default=None, max_length=253, description=(
        "PriorityClass of the rendezvous store pod. Unset: the workers' (template.priorityClassName), "
        "so the store is not preempted before the workers that depend on it."))
    resources: StoreResources = Field(default_factory=StoreResources, description=(
        "CPU and memory requests of the rendezvous store pod (a TCPStore needs little; not the "
        "workers' resources)."))


class Rendezvous(APIModel):
    backend: Literal["c10d"] = Field(default="c10d", description=(
        "torchrun rendezvous backend. c10d is served by a dedicated store pod that outlives every worker."))
    port: int = Field(default=29400, ge=1024, le=65535, description="Port of the rendezvous store.")
    join_timeout_seconds: int = Field(default=600, ge=10, le=86400, description=(
        "How long a worker waits for at least minReplicas workers to join before failing."))
    last_call_timeout_seconds: int = Field(default=15, ge=1, le=3600, description=(
        "Once minReplicas have joined, how long to wait for more (up to maxReplicas) before starting."))
    read_timeout_seconds: int = Field(default=60, ge=5, le=3600, description=(
        "Timeout of a single rendezvous store operation."))
    keep_alive_interval_seconds: int = Field(default=5, ge=1, le=300, description=(
        "How often each worker's agent sends a rendezvous heartbeat. A worker whose heartbeats stop "
        "for keepAliveIntervalSeconds x keepAliveMaxAttempts is dropped, so the survivors re-form the "
        "group without it; smaller values detect a lost worker sooner."))
    keep_alive_max_attempts: int = Field(default=3, ge=1, le=100, description=(
        "Missed heartbeats after which a worker counts as dead in the rendezvous."))
    store_image: str | None = Field(default=None, min_length=1, max_length=4096, pattern=k8s.NO_WHITESPACE,
                                    description=(
        "Image of the rendezvous store pod (must have torch). Defaults to spec.image."))
    store_template: StoreTemplate = Field(default_factory=StoreTemplate, description=(
        "Scheduling and resources of the rendezvous store pod. Unset fields take the workers' values "
        "(service account included), so the store schedules wherever the workers do."))


class ClaimTemplate(APIModel):
    size: str = Field(pattern=k8s.POSITIVE_QUANTITY, max_length=64, description="Requested storage, e.g. `20Gi`.")
    storage_class_name: str | None = Field(default=None, description="StorageClass of the claim.")
    access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        default_factory=lambda: ["ReadWriteMany"], min_length=1, description=(
            "Access modes. Workers on different nodes need ReadWriteMany."))


class Checkpoint(APIModel):
    claim_name: str | None = Field(default=None, pattern=DNS_1123_SUBDOMAIN_PATTERN, max_length=253,
                                   description="An existing PersistentVolumeClaim for checkpoints.")
    claim_template: ClaimTemplate | None = Field(default=None, description=(
        "Create a PersistentVolumeClaim `<job>-checkpoints` owned by the job."))
    mount_path: str = Field(default="/checkpoints", max_length=4096, pattern=k8s.NORMALIZED_PATH, description=(
        "Where the checkpoint volume is mounted in every worker (DDPJOB_CHECKPOINT_DIR)."))
    interval_steps: int = Field(default=100, ge=1, le=k8s.MAX_INT32, description="Save every N optimizer steps.")
    keep: int = Field(default=3, ge=2, le=100, description=(
        "Complete checkpoints to keep (at least 2, so a corrupt newest one never leaves none)."))

    cel_rules = (
        *[dict(rule, fieldPath=".mountPath") for rule in _mount_path_rule("self.mountPath", "mountPath")[1:]],
        cel("has(self.claimName) != has(self.claimTemplate)",
            "set exactly one of checkpoint.claimName (an existing PVC) or checkpoint.claimTemplate "
            "(a PVC the operator creates)", ".claimName"),
    )


class Backoff(APIModel):
    """Delays between charged restarts that made no training progress (a crash loop). A failure after
    the job trained beyond the step of the previous charged failure is replaced at once."""

    initial_seconds: int = Field(default=5, ge=0, le=3600, description=(
        "Delay before replacing a worker after a charged failure without training progress since the "
        "previous one (or before any step was reported)."))
    max_seconds: int = Field(default=300, ge=0, le=86400, description="Upper bound of the delay.")
    factor: float = Field(default=2.0, ge=1.0, le=10.0, description=(
        "Growth factor per further charged failure in a row without progress."))


ExitCode = Annotated[int, Field(ge=1, le=255)]


class FailurePolicy(APIModel):
    max_restarts: int = Field(default=3, ge=0, le=1000, description=(
        "Restart budget: replacements of failed workers (and torchrun's in-pod restarts) before the "
        "job fails. Disruptions (eviction, preemption, node loss) do not spend it."))
    restart_scope: Literal["Pod", "All"] = Field(default="Pod", description=(
        "Pod: replace only the failed worker; the survivors keep their pods and join the next rendezvous "
        "generation in place. All: replace every worker pod in the next generation."))
    recovery: Literal["Restart", "InProcess"] = Field(default="Restart", description=(
        "How survivors of a peer's failure recover (restartScope Pod). Restart: their trainers restart and "
        "every rank resumes from the rescue checkpoint on the volume. InProcess: their trainer processes "
        "survive (model, optimizer and data position stay in memory), rebuild the process group of the next "
        "generation and continue; a replacement or spare receives the state by broadcast from a survivor. "
        "Needs a trainer on the runtime library (the bundled trainer, or a script using Job.carry); anything "
        "else, and any case the runtime cannot leave the old group cleanly, takes the Restart path and says "
        "why in the pod's log and the incident."))
    spares: int = Field(default=0, ge=0, le=64, description=(
        "Warm standby pods (restartScope Pod): each has imported torch and waits, in no rendezvous and "
        "outside the world size; when a worker is lost, a ready spare takes its place in the next "
        "generation at once and the pool is refilled in the background. Needs the operator's progress "
        "endpoint (the chart enables it) or a local run."))
    backoff: Backoff = Field(default_factory=Backoff, description="Exponential backoff between restarts.")
    retryable_exit_codes: list[ExitCode] = Field(default_factory=list, max_length=64, description=(
        "Exit codes to retry although they are in 1-127 (user errors are permanent by default)."))
    permanent_exit_codes: list[ExitCode] = Field(default_factory=list, max_length=64, description=(
        "Exit codes that fail the job at once although they are 128+ (signals retry by default)."))
    node_loss_timeout_seconds: int = Field(default=5, ge=5, le=3600, description=(
        "How long a worker on an unresponsive node (NotReady or unreachable) is kept before Kubernetes "
        "evicts it and the operator replaces it (a disruption, not charged), counted from when the node "
        "controller declares the node so (node-monitor-grace-period, 40-50 s, after its last heartbeat). "
        "Kubernetes' default is 300; raise it to ride out longer node outages in place. Set as the "
        "tolerationSeconds of the workers' and the store's NoExecute tolerations for "
        "node.kubernetes.io/not-ready and node.kubernetes.io/unreachable; a template.tolerations entry "
        "for either key (or a keyless Exists one) wins."))
    stragglers: Literal["Report", "Replace"] = Field(default="Report", description=(
        "What to do about a straggler, a worker whose own time per step (apart from waiting for the others "
        "in collectives) stays above stragglerThreshold x the median of its peers for stragglerWindowSeconds. "
        "Report: a Straggler condition and Event naming the rank, pod, node and ratio. Replace: also move "
        "that worker off its node (its pod is deleted and replaced like an eviction: a disruption, never "
        "charged; the survivors keep their pods with restartScope Pod)."))
    straggler_threshold: float = Field(default=1.5, ge=1.1, le=10.0, description=(
        "A worker is a straggler when its own step time is above this many times the median of its peers' "
        "(its lower quartile over the window, so a few slow steps are not enough); it stops being one below "
        "half way back to 1 (1.25 for 1.5), so a noisy worker does not flap."))
    straggler_window_seconds: int = Field(default=300, ge=10, le=86400, description=(
        "How long a worker must stay above stragglerThreshold before it is named (and how much of its "
        "recent timing is judged)."))
    avoid_node_seconds: int = Field(default=3600, ge=0, le=604800, description=(
        "A node where two of this job's workers failed with an infrastructure-looking cause (a signal, an "
        "NCCL, Xid or ECC error) within this many seconds, or where a straggler was replaced "
        "(failurePolicy.stragglers Replace: one is enough), is listed in status.avoidedNodes for this long, "
        "and the job's new workers get required node anti-affinity against it. 0 turns it off. A user "
        "error (exit 1-127) never marks a node."))

    cel_rules = (
        cel("self.retryableExitCodes.all(c, !(c in self.permanentExitCodes))",
            "an exit code cannot be both retryable and permanent: remove it from one of "
            "failurePolicy.retryableExitCodes or failurePolicy.permanentExitCodes",
            ".retryableExitCodes"),
        cel("self.recovery == 'Restart' || self.restartScope == 'Pod'",
            "failurePolicy.recovery InProcess needs restartScope: Pod (with All every worker is replaced): "
            "set recovery: Restart or restartScope: Pod", ".recovery"),
        cel("self.spares == 0 || self.restartScope == 'Pod'",
            "failurePolicy.spares needs restartScope: Pod (with All every worker is replaced anyway): set "
            "spares: 0 or restartScope: Pod", ".spares"),
        cel("self.backoff.initialSeconds <= self.backoff.maxSeconds",
            "backoff.initialSeconds must not exceed backoff.maxSeconds", ".backoff.initialSeconds"),
    )


# Gang schedulers: the PodGroup API each one reads, and the name it schedules under by default.
GANG_SCHEDULERS = {
    "Volcano": ("scheduling.volcano.sh/v1beta1", "volcano"),
    "Coscheduling": ("scheduling.x-k8s.io/v1alpha1", "scheduler-plugins-scheduler"),
}


class SchedulingPolicy(APIModel):
    gang_scheduler: Literal["Volcano", "Coscheduling"] = Field(description=(
        "Volcano: a scheduling.volcano.sh/v1beta1 PodGroup, pods annotated scheduling.k8s.io/group-name. "
        "Coscheduling (the scheduler-plugins coscheduling plugin): a scheduling.x-k8s.io/v1alpha1 PodGroup, "
        "pods labelled scheduling.x-k8s.io/pod-group. The operator creates and owns the PodGroup `<job>`; "
        "the job fails with reason GangSchedulerNotInstalled when the cluster lacks its CRD."))
    scheduler_name: str | None = Field(default=None, min_length=1, max_length=253, description=(
        "schedulerName of the worker pods. Default: volcano (Volcano), scheduler-plugins-scheduler "
        "(Coscheduling, the scheduler-plugins chart's second scheduler)."))
    min_available: int | None = Field(default=None, ge=1, le=1024, description=(
        "Workers that must be schedulable together before any starts (the PodGroup's minMember). "
        "Default: minReplicas. At most replicas."))
    queue: str | None = Field(default=None, min_length=1, max_length=253, description=(
        "Volcano only: the Volcano queue of the PodGroup."))
    priority_class: str | None = Field(default=None, min_length=1, max_length=253, description=(
        "Volcano only: priorityClassName of the PodGroup. Default: template.priorityClassName."))
    schedule_timeout_seconds: int | None = Field(default=None, ge=1, le=86400 * 7, description=(
        "Coscheduling only: how long the scheduler waits for the whole group before giving up a round."))

    cel_rules = (
        cel("!has(self.queue) || self.gangScheduler == 'Volcano'",
            "queue is a Volcano queue: remove it, or use gangScheduler: Volcano (for Kueue, label the DDPJob "
            "kueue.x-k8s.io/queue-name instead)", ".queue"),
        cel("!has(self.priorityClass) || self.gangScheduler == 'Volcano'",
            "priorityClass is for Volcano PodGroups (scheduler-plugins PodGroups have none): remove it; "
            "pods take spec.template.priorityClassName", ".priorityClass"),
        cel("!has(self.scheduleTimeoutSeconds) || self.gangScheduler == 'Coscheduling'",
            "scheduleTimeoutSeconds is for Coscheduling PodGroups (Volcano PodGroups have none): remove it",
            ".scheduleTimeoutSeconds"),
    )

    @property
    def api_version(self) -> str:
        return GANG_SCHEDULERS[self.gang_scheduler][0]

    @property
    def effective_scheduler_name(self) -> str:
        return self.scheduler_name or GANG_SCHEDULERS[self.gang_scheduler][1]


class RunPolicy(APIModel):
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=k8s.MAX_DURATION_SECONDS, description=(
        "Fail the job with reason DeadlineExceeded when it runs longer than this (at most ten years, "
        f"{k8s.MAX_DURATION_SECONDS})."))
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=k8s.MAX_DURATION_SECONDS, description=(
        "Delete the finished DDPJob (and, through ownership, everything it owns) this long after it ends "
        f"(at most ten years, {k8s.MAX_DURATION_SECONDS})."))
    suspend: bool = Field(default=False, description=(
        "Suspend: delete the workers (they checkpoint on SIGTERM) and keep the checkpoint volume. "
        "Set back to false to resume from the last checkpoint."))
    clean_pod_policy: Literal["None", "Running", "All"] = Field(default="Running", description=(
        "Which pods to delete when the job ends: None, Running (still running ones), All."))
    success_policy: Literal["AllWorkers", "RankZero"] = Field(default="AllWorkers", description=(
        "AllWorkers: succeed when every worker exited 0. RankZero: succeed when worker 0 exited 0."))
    progress_deadline_seconds: int | None = Field(default=None, ge=10, le=604800, description=(
        "Hang detection (off when unset): when the reported step has not advanced for this long, the job gets a "
        "Stalled condition and a Warning event naming the ranks that stopped reporting, and every worker is "
        "restarted in a new rendezvous generation, charged to failurePolicy.maxRestarts (reason Stalled). The "
        "clock starts at the first step a generation reports, so data loading and compilation are not hangs. "
        "Must exceed the time between two of the trainer's reports (10..604800)."))
    scheduling_policy: SchedulingPolicy | None = Field(default=None, description=(
        "Gang scheduling with Volcano or the scheduler-plugins coscheduling plugin: the workers start "
        "together or not at all. (Kueue needs no policy here: label the DDPJob kueue.x-k8s.io/queue-name; "
        "Kueue admits and preempts it through suspend.)"))


class DDPJobSpec(APIModel):
    replicas: int = Field(ge=1, le=1024, description=(
        "Desired number of worker pods (torchrun nodes), at most 1024. `kubectl scale` changes it within "
        "minReplicas..maxReplicas; a new value starts a new rendezvous generation (all workers stop "
        "gracefully and restart from the checkpoint, nothing charged)."))
    min_replicas: int | None = Field(default=None, ge=1, le=1024, description=(
        "Fewest workers a rendezvous round may start with: every agent gets `--nnodes=minReplicas:replicas` "
        "(pods carry it as label elastic.ddp.dev/nnodes, `<min>-<max>`), so a round completes when all "
        "replicas have joined, or with at least minReplicas after rendezvous.lastCallTimeoutSeconds. "
        "Defaults to replicas."))
    max_replicas: int | None = Field(default=None, ge=1, le=1024, description=(
        "Most workers the job may scale to (`kubectl scale`). Defaults to replicas; at most 1024."))
    nproc_per_node: int = Field(default=1, ge=1, le=64, description=(
        "Training processes per worker pod, normally its GPU count."))
    image: str = Field(min_length=1, max_length=4096, pattern=k8s.NO_WHITESPACE,
                       description="Trainer image (must contain torch).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy for the trainer and store images.")
    entrypoint: str = Field(min_length=1, max_length=4096, pattern=ENTRYPOINT_PATTERN, description=(
        "What torchrun runs: a Python module (`ddp_trainer`, run with -m) or a script path ending "
        "in .py. Not starting with `-` (torchrun would read it as one of its own flags)."))
    args: list[str] = Field(default_factory=list, max_length=1024,
                            description="Arguments passed to the entrypoint.")
    env: list[EnvVar] = Field(default_factory=list, max_length=128, description=(
        "Extra environment for the trainer. Rendezvous and rank variables are reserved."))
    resources: Resources = Field(default_factory=Resources, description="Per-worker resources.")
    template: PodTemplate = Field(default_factory=PodTemplate, description="Worker pod overrides.")
    rendezvous: Rendezvous = Field(default_factory=Rendezvous, description="torchrun rendezvous.")
    checkpoint: Checkpoint | None = Field(default=None, description=(
        "Shared checkpoint volume. Without it, restarts begin from step 0."))
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy,
                                          description="Restarts and exit-code rules.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy,
                                  description="Deadlines, TTL, suspend, cleanup and success.")

    cel_rules = (
        cel("!has(self.minReplicas) || self.minReplicas <= self.replicas",
            "minReplicas must be <= replicas: lower minReplicas or raise replicas", ".minReplicas"),
        cel("!has(self.maxReplicas) || self.replicas <= self.maxReplicas",
            "replicas must be <= maxReplicas: lower replicas (kubectl scale) or raise maxReplicas",
            ".replicas"),
        cel("self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            "env names must be unique: remove the duplicate entry", ".env"),
        cel("!has(self.resources) || !has(self.resources.gpuCount) "
            "|| self.resources.gpuCount >= self.nprocPerNode",
            "resources.gpuCount must be >= nprocPerNode (every training process needs its own GPU): "
            "raise resources.gpuCount, lower nprocPerNode, or remove gpuCount (it defaults to "
            "nprocPerNode)", ".resources.gpuCount"),
        cel("!has(self.template) || !has(self.template.trainer) || !has(self.template.trainer.resources) || "
            "((!has(self.template.trainer.resources.requests) || !(self.resources.gpuResourceName in "
            "self.template.trainer.resources.requests)) && (!has(self.template.trainer.resources.limits) || "
            "!(self.resources.gpuResourceName in self.template.trainer.resources.limits)))",
            "GPUs are requested with spec.resources.gpu (and gpuCount), which also sets NCCL and the GPU "
            "toleration: remove the GPU resource from template.trainer.resources", ".template.trainer.resources"),
        cel("!has(self.template) || !has(self.template.volumeMounts) || self.template.volumeMounts.all(m, "
            f"!has(m.name) || m.name == '{SHM_VOLUME}' || (has(self.checkpoint) && m.name == '{CHECKPOINT_VOLUME}') || "
            "(has(self.template.volumes) && self.template.volumes.exists(v, has(v.name) && v.name == m.name)))",
            "a volumeMount's name must be a volume of template.volumes (or dshm, or checkpoints with spec.checkpoint): "
            "add the volume to template.volumes or fix the name", ".template.volumeMounts"),
        cel("!has(self.template) || !has(self.template.podSpec) || !has(self.template.podSpec.initContainers) || "
            "self.template.podSpec.initContainers.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, "
            f"!has(m.name) || m.name == '{SHM_VOLUME}' || (has(self.checkpoint) && m.name == '{CHECKPOINT_VOLUME}') || "
            "(has(self.template.volumes) && self.template.volumes.exists(v, has(v.name) && v.name == m.name))))",
            "an init container's volumeMount names a volume of template.volumes (or dshm, or checkpoints with "
            "spec.checkpoint): add the volume to template.volumes or fix the name",
            ".template.podSpec.initContainers"),
        cel("!has(self.checkpoint) || !has(self.template) || !has(self.template.volumeMounts) || "
            "self.template.volumeMounts.all(m, !has(m.mountPath) || m.mountPath != self.checkpoint.mountPath)",
            "the checkpoint volume is mounted at checkpoint.mountPath: mount this volume elsewhere, or change "
            "checkpoint.mountPath", ".template.volumeMounts"),
        cel("!has(self.runPolicy) || !has(self.runPolicy.schedulingPolicy) || !has(self.template) || "
            "!has(self.template.podSpec) || !has(self.template.podSpec.schedulerName)",
            "with runPolicy.schedulingPolicy the scheduler is its schedulerName: remove "
            "template.podSpec.schedulerName (or set runPolicy.schedulingPolicy.schedulerName)",
            ".template.podSpec.schedulerName"),
        cel("!has(self.runPolicy) || !has(self.runPolicy.schedulingPolicy) || "
            "!has(self.runPolicy.schedulingPolicy.minAvailable) || "
            "self.runPolicy.schedulingPolicy.minAvailable <= self.replicas",
            "runPolicy.schedulingPolicy.minAvailable must be <= replicas (a larger gang never schedules): lower "
            "it, or leave it unset (it defaults to minReplicas)", ".runPolicy.schedulingPolicy.minAvailable"),
        cel("!has(self.checkpoint) || !has(self.checkpoint.claimTemplate) || "
            "self.checkpoint.claimTemplate.accessModes != ['ReadWriteOncePod'] || "
            "(has(self.maxReplicas) ? self.maxReplicas : self.replicas) == 1",
            "a ReadWriteOncePod claim can be used by one pod only, and this job may run several workers: use "
            "ReadWriteMany (see docs/install.md, \"Checkpoint storage\")", ".checkpoint.claimTemplate.accessModes"),
    )

    @model_validator(mode="after")
    def _check_container_resources(self) -> "DDPJobSpec":
        """The API server's quantity rules for the trainer's merged requests and limits (beyond a schema's reach:
        the operator refuses these with the same message when the CRD let one through)."""
        extra = self.template.trainer.resources if self.template.trainer is not None else None
        if extra is None:
            return self
        merged = {part: dict(getattr(extra, part) or {}) for part in ("requests", "limits")}
        for where, problem in k8s.container_resource_problems(
                merged, has_cpu_or_memory=bool(self.resources.cpu or self.resources.memory)):
            raise CelRuleError({"rule": "", "message": f"{where}: {problem}",
                                "fieldPath": f".template.trainer.resources.{where.split('.')[0]}"})
        return self

    @model_validator(mode="after")
    def _check_pod_rules(self) -> "DDPJobSpec":
        """The API server's and kubelet's rules for the pass-through pod fields (pod_rules: beyond a schema)."""
        found = pod_rules.problems(self.wire())
        if found:
            raise CelRuleError({"rule": "", "fieldPath": found[0][0], "message": found[0][1]})
        return self

    @property
    def min_available(self) -> int:
        """Workers of the gang (runPolicy.schedulingPolicy.minAvailable, default minReplicas)."""
        policy = self.run_policy.scheduling_policy
        if policy is not None and policy.min_available is not None:
            return policy.min_available
        return self.min_nodes

    @property
    def min_nodes(self) -> int:
        return self.min_replicas if self.min_replicas is not None else self.replicas

    @property
    def max_nodes(self) -> int:
        return self.max_replicas if self.max_replicas is not None else self.replicas

    @property
    def gpus_per_pod(self) -> int:
        if not self.resources.gpu:
            return 0
        return self.resources.gpu_count or self.nproc_per_node


class JobMetadata(APIModel):
    """The part of metadata the schema may constrain (the API server owns the rest)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=True)
    name: str = Field(min_length=1, max_length=MAX_JOB_NAME_LENGTH, pattern=DNS_1035_PATTERN,
                      description="DNS-1035 label: lowercase letters, digits and '-', starting with a letter.")
    # Read by `ddpjob validate` and `render` (the worker FQDN's length depends on it); the API server sets it.
    namespace: str | None = Field(default=None, min_length=1, max_length=63, pattern=k8s.DNS_1123_LABEL,
                                  description="Namespace of the job (a DNS-1123 label).")


# ---------------------------------------------------------------- status


class StatusModel(APIModel):
    """What the operator writes: built in code, so not strict (the spec's models are, as the API server is)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True, strict=False)

Phase = Literal["Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


class Condition(StatusModel):
    type: str = Field(description="Created, Running, Restarting, Suspended, Succeeded or Failed.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Spec generation seen.")


class SpareStatus(StatusModel):
    pod: str = Field(description="The spare pod, `<job>-spare-<n>`.")
    phase: str = Field(description="Pod phase (Pending, Running, ...).")
    ready: bool = Field(default=False, description=(
        "Running and Ready (imports done, the operator's endpoint answered): warm, ready to take a lost worker's "
        "place."))
    node: str | None = Field(default=None, description="Node the spare runs on.")


class RankStatus(StatusModel):
    index: int = Field(description="Replica index i of `<job>-worker-<i>`.")
    pod: str = Field(description="Current pod name (`<job>-worker-<i>`, or the spare that took its place).")
    phase: str = Field(description="Pod phase (Pending, Running, Succeeded, Failed, Missing).")
    ready: bool = Field(default=False, description="Pod is Ready.")
    node: str | None = Field(default=None, description="Node the pod runs on.")
    restarts: int = Field(default=0, description="Times this rank was replaced.")
    uid: str | None = Field(default=None, max_length=64, description=(
        "UID of the pod serving this rank (a survivor keeps its pod across generations)."))
    generation: int | None = Field(default=None, ge=0, le=2**31 - 1, description=(
        "Rendezvous generation this rank's pod serves: the one it was created for, or a later one a "
        "survivor joined in place (restartScope Pod)."))
    last_exit_code: int | None = Field(default=None, description="Exit code of its last failure.")
    last_reason: str | None = Field(default=None, description="Reason of its last failure.")
    last_message: str | None = Field(default=None, description=(
        "Termination message of its last failure (failed process, exit code, error), shortened."))


class Progress(StatusModel):
    """What the trainer last reported (docs/launch-contract.md, "Progress"), kept after the job ends."""

    step: int | None = Field(default=None, description="Last optimizer step the trainer reported.")
    total_steps: int | None = Field(default=None, description=(
        "Planned optimizer steps at the current world size, when the trainer knows them."))
    percent: int | None = Field(default=None, description="step / totalSteps in percent (the PROGRESS column).")
    eta: str | None = Field(default=None, description=(
        "Estimated time left at the recent step rate, e.g. 12m30s (the ETA column); empty when unknown."))
    epoch: int | None = Field(default=None, description="Epoch of that step.")
    loss: float | None = Field(default=None, description="Training loss at that step, averaged over ranks.")
    samples_per_second: float | None = Field(default=None, description="Training throughput over all ranks.")
    last_checkpoint_step: int | None = Field(default=None, description="Step of the newest checkpoint.")
    world_size: int | None = Field(default=None, description="Training processes that reported the step.")
    updated_time: str | None = Field(default=None, description=(
        "When the operator last received a report (RFC 3339); at most about 10 s old while training runs."))


class IncidentRecovery(StatusModel):
    """The timeline of one incident's recovery (docs/operator.md, "Recovery timeline")."""

    path: str = Field(default="", max_length=32, description=(
        "InProcess (the survivors kept their trainer processes; the state came from a peer) or Restart (the "
        "trainers restarted and resumed from a checkpoint); empty until a trainer of the next generation "
        "reports."))
    fallback_reason: str = Field(default="", max_length=1024, description=(
        "Why recovery InProcess took the Restart path, in the trainer's words."))
    failure_seen_time: str | None = Field(default=None, description=(
        "When the operator saw the failure (RFC 3339)."))
    replacement_time: str | None = Field(default=None, description=(
        "When the replacement worker was created or a spare assigned (RFC 3339)."))
    spare: bool = Field(default=False, description="Whether a warm spare took the lost worker's place.")
    rendezvous_time: str | None = Field(default=None, description=(
        "When the next generation's process group was complete, as its rank 0 reported (RFC 3339)."))
    first_step_time: str | None = Field(default=None, description=(
        "When the next generation's first training step was reported (RFC 3339)."))
    seconds: float | None = Field(default=None, description=(
        "failureSeenTime to firstStepTime: the recovery's cost in seconds (ddpjob_recovery_seconds)."))
    steps_lost: int | None = Field(default=None, description=(
        "Steps trained again: the step last reported before the failure minus the step the next "
        "generation resumed from (0 when nothing was lost)."))


class Incident(StatusModel):
    """One failure or disruption of a rendezvous generation, with every exit it caused: charged at most once."""

    generation: int = Field(description="Rendezvous generation it ended or disturbed.")
    time: str = Field(description="When it began (RFC 3339).")
    cause: str = Field(description=(
        "Retryable (charged), Permanent (the job failed), Disruption, Consequence (not charged), or what moved "
        "the job to a fresh generation without a failure: RendezvousStoreLost, ScaleDown, NodeRangeChanged."))
    reason: str = Field(default="", description="CamelCase reason (WorkerFailed, Evicted, PodVanished, ...).")
    charged: bool = Field(default=False, description="Whether it spent one restart of failurePolicy.maxRestarts.")
    message: str = Field(default="", description="The first failure and how many workers exited with it.")
    ranks: list[int] = Field(default_factory=list, description="Replica indices that exited or were lost in it.")
    step: int | None = Field(default=None, description=(
        "Training step last reported when it was recorded (status.progress.step), if any: a charged "
        "incident beyond the previous one's step is restarted without backoff."))
    recovery: IncidentRecovery | None = Field(default=None, description=(
        "How the job came back from it: the path taken and its timeline, filled in as the operator sees "
        "each point (absent for an incident that ended the job)."))


class NodeFailure(StatusModel):
    """One infrastructure-looking failure of this job's worker on a node: the evidence for avoidedNodes."""

    node: str = Field(max_length=253, description="Node name.")
    time: str = Field(description="When it happened (RFC 3339).")
    reason: str = Field(default="", max_length=128, description=(
        "Signal, NCCLError, XidError, ECCError, NodeLost or StragglerReplaced."))
    pod_uid: str | None = Field(default=None, max_length=64, description="The worker pod that failed there.")


class AvoidedNode(StatusModel):
    """A node this job's new workers are kept off (required node anti-affinity), until `until`."""

    node: str = Field(max_length=253, description="Node name.")
    reason: str = Field(default="", max_length=1024, description="The failures that marked it.")
    since: str = Field(description="When it was marked (RFC 3339).")
    until: str = Field(description="When the mark expires (RFC 3339).")


class RankStepTime(StatusModel):
    index: int = Field(description="Replica index i of `<job>-worker-<i>`.")
    seconds: float = Field(description="Its own time per step (median over the straggler window), in seconds.")
    ratio: float = Field(description="seconds / the median of its peers' (1.0: typical).")


class StepTimes(StatusModel):
    """Each worker's own time per step, apart from waiting for the others (docs/operator.md, "Stragglers")."""

    generation: int = Field(description="Rendezvous generation the timings belong to.")
    slowest: str | None = Field(default=None, max_length=64, description=(
        "The slowest worker and its ratio to its peers' median, e.g. `1 (2.03x)` (the SLOWEST column)."))
    straggler: int | None = Field(default=None, description=(
        "Replica index of the worker named a straggler (the Straggler condition), if any."))
    ranks: list[RankStepTime] = Field(default_factory=list, max_length=1024, description="Per worker.")


class DDPJobStatus(StatusModel):
    phase: Phase | None = Field(default=None, description="Lifecycle phase.")
    message: str | None = Field(default=None, description="Why the job is in this phase.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.",
                                        json_schema_extra={"x-kubernetes-list-type": "map",
                                                           "x-kubernetes-list-map-keys": ["type"]})
    replicas: int = Field(default=0, description="Worker pods that exist.")
    ready_replicas: int = Field(default=0, description="Worker pods that are Ready.")
    world_size: int = Field(default=0, description="replicas x nprocPerNode of running workers.")
    restarts: int = Field(default=0, description="Budget spent: restarts charged to failurePolicy.maxRestarts.")
    disruptions: int = Field(default=0, description="Replacements after evictions or node loss (not charged).")
    generation: int = Field(default=0, description="Rendezvous generation (bumped by gang restarts).")
    ranks: list[RankStatus] = Field(default_factory=list, description="Per-replica state.")
    spares: list[SpareStatus] = Field(default_factory=list, description=(
        "Idle warm spares (failurePolicy.spares); a spare that takes a worker's place moves to ranks."))
    ready_spares: int = Field(default=0, description="Idle spares that are Running and Ready (the SPARES column).")
    start_time: str | None = Field(default=None, description="When the first worker was created.")
    completion_time: str | None = Field(default=None, description="When the job reached Succeeded or Failed.")
    observed_generation: int | None = Field(default=None, description="metadata.generation last reconciled.")
    last_reconcile_time: str | None = Field(default=None, description=(
        "When an operator last reconciled the job, refreshed about once a minute while it runs (not once it "
        "finished): older than a few minutes means no operator is acting and the rest of the status may be stale."))
    selector: str | None = Field(default=None, description="Label selector of the worker pods (scale subresource).")
    progress: Progress | None = Field(default=None, description="Training progress reported by the trainer.")
    incidents: list[Incident] = Field(default_factory=list, description=(
        "The last 10 restarts, newest last: each failure or disruption (charged or not) and each move to a fresh "
        "rendezvous generation, with its cause."))
    step_times: StepTimes | None = Field(default=None, description=(
        "Each worker's own time per step and its ratio to its peers' (straggler detection)."))
    node_failures: list[NodeFailure] = Field(default_factory=list, max_length=16, description=(
        "Recent infrastructure-looking failures of this job's workers by node (the newest 16, within "
        "failurePolicy.avoidNodeSeconds): the evidence behind avoidedNodes."))
    avoided_nodes: list[AvoidedNode] = Field(default_factory=list, max_length=8, description=(
        "Nodes where this job's workers failed twice with an infrastructure-looking cause, or a straggler "
        "was replaced: new workers get "
        "required node anti-affinity against them until each expires (at most 8)."))


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
