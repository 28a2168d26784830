"""The DDPJob API: one typed, validated model that is also the source of the CRD schema.

Every rule lives here once. Field constraints (types, ranges, enums, patterns) become the
OpenAPI schema; cross-field rules are CEL expressions that the API server evaluates at
`kubectl apply` (x-kubernetes-validations) and that `validate_cel_rules` evaluates locally
with the same text, so `ddpjob validate` and the cluster agree.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_origin

import celpy
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic.alias_generators import to_camel

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
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

# torchrun and the operator own these; a user value would silently break rendezvous.
RESERVED_ENV_NAMES = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
)
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "DDPJOB_")


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One cross-field rule, in the shape of a CRD `x-kubernetes-validations` entry."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def free_form(description: str) -> Any:
    """A Kubernetes object passed through as-is (affinity, tolerations, volumes...)."""
    return Field(default=None, description=description,
                 json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"})


class APIModel(BaseModel):
    """camelCase on the wire, unknown fields rejected, CEL rules checked after field validation."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True)
    cel_rules: ClassVar[tuple[dict[str, str], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.cel_rules:
            extra = dict(cls.model_config.get("json_schema_extra") or {})
            extra["x-kubernetes-validations"] = [dict(r) for r in cls.cel_rules]
            cls.model_config = {**cls.model_config, "json_schema_extra": extra}

    @model_validator(mode="after")
    def _check_cel_rules(self) -> "APIModel":
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
        cel("!(self.name in " + str(list(RESERVED_ENV_NAMES)) + ") && "
            + " && ".join(f"!self.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES),
            "env name is reserved for torchrun and the operator (MASTER_ADDR, MASTER_PORT, RANK, "
            "WORLD_SIZE, LOCAL_RANK, GROUP_RANK, PET_*, TORCHELASTIC_*, DDPJOB_*): rename the variable; "
            "rendezvous and ranks are wired automatically", ".name"),
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
    gpu_resource_name: str = Field(default="nvidia.com/gpu", min_length=1, description=(
        "Extended resource name for the GPU device plugin."))
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
    )


class PodTemplate(APIModel):
    labels: dict[str, str] | None = Field(default=None, description="Extra labels for worker pods.")
    annotations: dict[str, str] | None = Field(default=None,
                                               description="Extra annotations for worker pods.")
    node_selector: dict[str, str] | None = Field(default=None, description=(
        "Node selector for worker pods (and the rendezvous store pod, unless "
        "rendezvous.storeTemplate.nodeSelector is set)."))
    tolerations: list[dict[str, Any]] | None = Field(default=None, description=(
        "Tolerations for worker pods (and the rendezvous store pod, unless "
        "rendezvous.storeTemplate.tolerations is set). The operator adds the GPU toleration when "
        "resources.gpu is true, and NoExecute tolerations for node.kubernetes.io/not-ready and "
        "node.kubernetes.io/unreachable (failurePolicy.nodeLossTimeoutSeconds) unless an entry here "
        "has that key."),
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}})
    affinity: dict[str, Any] | None = free_form("Affinity rules for worker pods, as in a Pod.")
    service_account_name: str | None = Field(default=None, pattern=DNS_1123_SUBDOMAIN_PATTERN,
                                             max_length=253, description=(
                                                 "Service account the workers and the rendezvous "
                                                 "store run as."))
    priority_class_name: str | None = Field(default=None, max_length=253, description=(
        "PriorityClass of the worker pods (and the rendezvous store pod, unless "
        "rendezvous.storeTemplate.priorityClassName is set)."))
    volumes: list[dict[str, Any]] | None = Field(default=None, description=(
        "Extra volumes, as in a Pod; mount them with volumeMounts."),
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}})
    volume_mounts: list[dict[str, Any]] | None = Field(default=None, description=(
        "Extra volume mounts for the trainer container, as in a Container."),
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}})
    fs_group: int = Field(default=1000, ge=1, le=2147483647, description=(
        "Group that owns the mounted volumes (pod securityContext.fsGroup). Every container process "
        "gets it as a supplemental group, so a non-root trainer of any uid can write checkpoints."))
    termination_grace_period_seconds: int = Field(default=60, ge=0, le=3600, description=(
        "Time a worker has after SIGTERM (suspend, scale-down, deletion) to write its final checkpoint."))


class Toleration(APIModel):
    """A toleration, as in a Pod's spec.tolerations."""

    key: str | None = Field(default=None, min_length=1, max_length=316, description=(
        "Taint key to tolerate. Unset with operator Exists tolerates every taint."))
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description=(
        "Equal: the taint's value must equal value. Exists: any value (leave value unset)."))
    value: str | None = Field(default=None, max_length=63, description="Taint value, for operator Equal.")
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
    node_selector: dict[str, str] | None = Field(default=None, description=(
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
    store_image: str | None = Field(default=None, min_length=1, description=(
        "Image of the rendezvous store pod (must have torch). Defaults to spec.image."))
    store_template: StoreTemplate = Field(default_factory=StoreTemplate, description=(
        "Scheduling and resources of the rendezvous store pod. Unset fields take the workers' values "
        "(service account included), so the store schedules wherever the workers do."))


class ClaimTemplate(APIModel):
    size: str = Field(pattern=QUANTITY_PATTERN, description="Requested storage, e.g. `20Gi`.")
    storage_class_name: str | None = Field(default=None, description="StorageClass of the claim.")
    access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        default_factory=lambda: ["ReadWriteMany"], min_length=1, description=(
            "Access modes. Workers on different nodes need ReadWriteMany."))


class Checkpoint(APIModel):
    claim_name: str | None = Field(default=None, pattern=DNS_1123_SUBDOMAIN_PATTERN, max_length=253,
                                   description="An existing PersistentVolumeClaim for checkpoints.")
    claim_template: ClaimTemplate | None = Field(default=None, description=(
        "Create a PersistentVolumeClaim `<job>-checkpoints` owned by the job."))
    mount_path: str = Field(default="/checkpoints", pattern=r"^/.*", description=(
        "Where the checkpoint volume is mounted in every worker (DDPJOB_CHECKPOINT_DIR)."))
    interval_steps: int = Field(default=100, ge=1, description="Save every N optimizer steps.")
    keep: int = Field(default=3, ge=2, le=100, description=(
        "Complete checkpoints to keep (at least 2, so a corrupt newest one never leaves none)."))

    cel_rules = (
        cel("has(self.claimName) != has(self.claimTemplate)",
            "set exactly one of checkpoint.claimName (an existing PVC) or checkpoint.claimTemplate "
            "(a PVC the operator creates)", ".claimName"),
    )


class Backoff(APIModel):
    initial_seconds: int = Field(default=5, ge=0, le=3600,
                                 description="Delay before the first replacement.")
    max_seconds: int = Field(default=300, ge=0, le=86400, description="Upper bound of the delay.")
    factor: float = Field(default=2.0, ge=1.0, le=10.0, description="Growth factor per restart.")


ExitCode = Annotated[int, Field(ge=1, le=255)]


class FailurePolicy(APIModel):
    max_restarts: int = Field(default=3, ge=0, le=1000, description=(
        "Restart budget: replacements of failed workers (and torchrun's in-pod restarts) before the "
        "job fails. Disruptions (eviction, preemption, node loss) do not spend it."))
    restart_scope: Literal["Pod", "All"] = Field(default="Pod", description=(
        "Pod: replace only the failed worker; survivors re-form the group via elastic rendezvous. "
        "All: restart the whole gang with a new rendezvous generation."))
    backoff: Backoff = Field(default_factory=Backoff, description="Exponential backoff between restarts.")
    retryable_exit_codes: list[ExitCode] = Field(default_factory=list, max_length=64, description=(
        "Exit codes to retry although they are in 1-127 (user errors are permanent by default)."))
    permanent_exit_codes: list[ExitCode] = Field(default_factory=list, max_length=64, description=(
        "Exit codes that fail the job at once although they are 128+ (signals retry by default)."))
    node_loss_timeout_seconds: int = Field(default=60, ge=5, le=3600, description=(
        "How long a worker on an unresponsive node (NotReady or unreachable) is kept before Kubernetes "
        "evicts it and the operator replaces it (a disruption, not charged). Kubernetes' default is "
        "300. Set as the tolerationSeconds of the workers' and the store's NoExecute tolerations for "
        "node.kubernetes.io/not-ready and node.kubernetes.io/unreachable; a template.tolerations entry "
        "for either key (or a keyless Exists one) wins."))

    cel_rules = (
        cel("self.retryableExitCodes.all(c, !(c in self.permanentExitCodes))",
            "an exit code cannot be both retryable and permanent: remove it from one of "
            "failurePolicy.retryableExitCodes or failurePolicy.permanentExitCodes",
            ".retryableExitCodes"),
        cel("self.backoff.initialSeconds <= self.backoff.maxSeconds",
            "backoff.initialSeconds must not exceed backoff.maxSeconds", ".backoff.initialSeconds"),
    )


class RunPolicy(APIModel):
    active_deadline_seconds: int | None = Field(default=None, ge=1, description=(
        "Fail the job with reason DeadlineExceeded when it runs longer than this."))
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, description=(
        "Delete the finished DDPJob (and, through ownership, everything it owns) this long after it ends."))
    suspend: bool = Field(default=False, description=(
        "Suspend: delete the workers (they checkpoint on SIGTERM) and keep the checkpoint volume. "
        "Set back to false to resume from the last checkpoint."))
    clean_pod_policy: Literal["None", "Running", "All"] = Field(default="Running", description=(
        "Which pods to delete when the job ends: None, Running (still running ones), All."))
    success_policy: Literal["AllWorkers", "RankZero"] = Field(default="AllWorkers", description=(
        "AllWorkers: succeed when every worker exited 0. RankZero: succeed when worker 0 exited 0."))


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
    image: str = Field(min_length=1, description="Trainer image (must contain torch).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy for the trainer and store images.")
    entrypoint: str = Field(min_length=1, pattern=r"^[^\s]+$", description=(
        "What torchrun runs: a Python module (`ddp_trainer`, run with -m) or a script path ending "
        "in .py."))
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
    )

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

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    name: str = Field(min_length=1, max_length=MAX_JOB_NAME_LENGTH, pattern=DNS_1035_PATTERN,
                      description="DNS-1035 label: lowercase letters, digits and '-', starting with a letter.")


# ---------------------------------------------------------------- status

Phase = Literal["Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


class Condition(APIModel):
    type: str = Field(description="Created, Running, Restarting, Suspended, Succeeded or Failed.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Spec generation seen.")


class RankStatus(APIModel):
    index: int = Field(description="Replica index i of `<job>-worker-<i>`.")
    pod: str = Field(description="Current pod name.")
    phase: str = Field(description="Pod phase (Pending, Running, Succeeded, Failed, Missing).")
    ready: bool = Field(default=False, description="Pod is Ready.")
    node: str | None = Field(default=None, description="Node the pod runs on.")
    restarts: int = Field(default=0, description="Times this rank was replaced.")
    last_exit_code: int | None = Field(default=None, description="Exit code of its last failure.")
    last_reason: str | None = Field(default=None, description="Reason of its last failure.")
    last_message: str | None = Field(default=None, description=(
        "Termination message of its last failure (failed process, exit code, error), shortened."))


class Progress(APIModel):
    step: int | None = Field(default=None, description="Last optimizer step the trainer reported.")
    epoch: int | None = Field(default=None, description="Epoch of that step.")
    loss: float | None = Field(default=None, description="Training loss at that step.")
    last_checkpoint_step: int | None = Field(default=None, description="Step of the newest checkpoint.")


class Incident(APIModel):
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


class DDPJobStatus(APIModel):
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


class DDPJob(APIModel):
    """A whole manifest as `kubectl apply` sends it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    api_version: Literal["elastic.ddp.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["DDPJob"]
    metadata: JobMetadata
    spec: DDPJobSpec
