"""Kubernetes fields of the worker pod passed through as in a Pod: the template, the trainer container's
extra fields, tolerations, env; and the names, volumes, paths and labels of the pod the operator owns.

Each type declares, for the CRD, the parts of a pass-through object its rules look at, and rejects the
fields the operator owns or that another part of the spec sets, naming where they go instead.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from .. import k8s_fields as k8s
from ..agent.contract import FORK_TRAINER_ENV
from .base import DNS_1123_SUBDOMAIN_PATTERN, QUANTITY_PATTERN, APIModel, cel, cel_string, distinct, free_form
from .group import GROUP

ENV_NAME_PATTERN = k8s.ENV_NAME

# torchrun and the operator own these; a user value would silently break rendezvous.
RESERVED_ENV_NAMES = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
)
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "DDPJOB_")
# Set by the builders for every worker (launch.worker_env): a user value would replace the operator's.
OPERATOR_ENV_NAMES = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTHONUNBUFFERED", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
# ...except these, which the launcher reads for the user to set (docs/launch-contract.md).
USER_SETTABLE_ENV_NAMES = (FORK_TRAINER_ENV,)


class EnvVar(APIModel):
    cel_rules = (
        cel("self.name in " + str(list(USER_SETTABLE_ENV_NAMES)) + " || (!(self.name in "
            + str(list(RESERVED_ENV_NAMES + OPERATOR_ENV_NAMES)) + ") && "
            + " && ".join(f"!self.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES) + ")",
            "env name is reserved for torchrun and the operator (MASTER_ADDR, MASTER_PORT, RANK, "
            "WORLD_SIZE, LOCAL_RANK, GROUP_RANK, PET_*, TORCHELASTIC_*, DDPJOB_*, "
            + ", ".join(OPERATOR_ENV_NAMES) + "): rename the variable; rendezvous, ranks and these "
            "settings are wired automatically", ".name"),
        # An empty value with valueFrom is accepted by the API server (validateEnvVarValueFrom).
        cel("!(has(self.value) && self.value != '' && has(self.valueFrom))",
            "set either value or valueFrom, not both", ".valueFrom"),
    )

    name: str = Field(description="Environment variable name.", min_length=1, max_length=253,
                      pattern=ENV_NAME_PATTERN)
    value: str | None = Field(default=None, description="Literal value.")
    value_from: dict[str, Any] | None = free_form(
        "Source for the value (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef), as in a Pod.")


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



def qualified_names_rule(field: str, key: str, what: str) -> dict[str, str]:
    """A rule: every entry of the list `field` has `key`, a qualified name (readiness and scheduling gates)."""
    return cel(f"!has(self.{field}) || self.{field}.all(g, has(g.{key}) && "
               f"g.{key}.matches({cel_string(k8s.QUALIFIED_NAME)}) && "
               f"g.{key}.matches({cel_string(k8s.QUALIFIED_NAME_PREFIX_LENGTH)}))",
               f"{what} is an optional DNS subdomain prefix and '/' and a name of at most 63 letters, digits, '-', "
               f"'_' and '.' that starts and ends with a letter or digit (such as example.com/ready): fix it",
               f".{field}", offline=lambda obj: all(
                   key in g and k8s.is_qualified_name(g[key]) for g in obj.get(field, [])))


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
    readiness_gates: list[dict[str, Any]] | None = _k8s_list(
        "Extra readiness conditions, as in a Pod.",
        conditionType={"type": "string", "maxLength": 316, "description": "A qualified name."})
    resource_claims: list[dict[str, Any]] | None = _k8s_list("Dynamic resource claims, as in a Pod.")
    scheduling_gates: list[dict[str, Any]] | None = _k8s_list(
        "Scheduling gates, as in a Pod.", name={"type": "string", "maxLength": 316, "description": "A qualified name."})
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
        cel("!has(self.hostUsers) || self.hostUsers || !((has(self.hostNetwork) && self.hostNetwork) || "
            "(has(self.hostPID) && self.hostPID) || (has(self.hostIPC) && self.hostIPC))",
            "hostUsers false (a user namespace of its own) cannot go with hostNetwork, hostPID or hostIPC (the API "
            "server refuses the pod): remove hostUsers or the host namespaces", ".hostUsers"),
        qualified_names_rule("readinessGates", "conditionType", "readinessGates: every conditionType"),
        qualified_names_rule("schedulingGates", "name", "schedulingGates: every name"),
        cel("!has(self.schedulingGates) || self.schedulingGates.all(g, "
            "!has(g.name) || self.schedulingGates.exists_one(h, has(h.name) && h.name == g.name))",
            "schedulingGates: names must be unique: remove the duplicate gate", ".schedulingGates",
            offline=lambda pod_spec: distinct(pod_spec.get("schedulingGates", []), "name")),
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
        # A conditional: an absent prefix must not reach the inner exists() (see spec.py's checkpoint mountPath rule).
        cel("!has(self.envFrom) || self.envFrom.all(e, !has(e.prefix) || e.prefix == '' ? true : "
            f"(e.prefix.matches({cel_string(k8s.ENV_NAME)}) && "
            f"!{list(RESERVED_ENV_NAMES + OPERATOR_ENV_NAMES + RESERVED_ENV_PREFIXES)}"
            ".exists(r, r.startsWith(e.prefix)) && "
            + " && ".join(f"!e.prefix.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES) + "))",
            "envFrom: a prefix could produce a variable of torchrun's or the operator's (PET_*, TORCHELASTIC_*, "
            "DDPJOB_*, MASTER_ADDR, RANK, ...), which would rewire the rendezvous: use a prefix such as APP_",
            ".envFrom"),
    )


LabelValue = Annotated[str, Field(max_length=63, pattern=k8s.LABEL_VALUE)]


def qualified_keys_rule(field: str, what: str) -> dict[str, str]:
    """A rule: every key of the map `field` is a qualified name (label and annotation keys, node selectors)."""
    return cel(f"!has(self.{field}) || self.{field}.all(k, k.matches({cel_string(k8s.QUALIFIED_NAME)}) && "
               f"k.matches({cel_string(k8s.QUALIFIED_NAME_PREFIX_LENGTH)}))",
               f"{field}: every {what} key is an optional DNS subdomain prefix and '/' and a name of at most 63 "
               f"letters, digits, '-', '_' and '.' that starts and ends with a letter or digit (such as "
               f"example.com/team): rename the key", f".{field}",
               offline=lambda obj: all(k8s.is_qualified_name(k) for k in obj.get(field, {})))


def mount_path_rules(path: str, where: str) -> list[dict[str, str]]:
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
            "volumes: names must be unique: rename or remove the duplicate volume", ".volumes",
            offline=lambda template: distinct(template.get("volumes", []), "name")),
        cel("!has(self.volumeMounts) || self.volumeMounts.all(m, has(m.name) && has(m.mountPath))",
            "volumeMounts: every mount needs name (a volume of template.volumes) and mountPath", ".volumeMounts"),
        *[dict(rule, rule="!has(self.volumeMounts) || self.volumeMounts.all(m, !has(m.mountPath) || "
               + rule["rule"] + ")", fieldPath=".volumeMounts")
          for rule in mount_path_rules("m.mountPath", "volumeMounts")],
        cel("!has(self.volumeMounts) || self.volumeMounts.all(m, !has(m.mountPath) || "
            "self.volumeMounts.exists_one(n, has(n.mountPath) && n.mountPath == m.mountPath))",
            "volumeMounts: mountPath must be unique: mount the duplicate elsewhere or remove it", ".volumeMounts",
            offline=lambda template: distinct(template.get("volumeMounts", []), "mountPath")),
        cel("!has(self.tolerations) || self.tolerations.all(t, !has(t.key) || t.key == '' || "
            f"(t.key.matches({cel_string(k8s.QUALIFIED_NAME)}) && "
            f"t.key.matches({cel_string(k8s.QUALIFIED_NAME_PREFIX_LENGTH)})))",
            "tolerations: a key is a label key (an optional DNS subdomain prefix and '/', then a name such as "
            "nvidia.com/gpu): fix the key", ".tolerations", offline=lambda template: all(
                "key" not in t or t["key"] == "" or k8s.is_qualified_name(t["key"])
                for t in template.get("tolerations", []))),
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
        qualified_keys_rule("labels", "label"),
        qualified_keys_rule("annotations", "annotation"),
        qualified_keys_rule("nodeSelector", "node selector"),
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
