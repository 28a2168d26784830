"""The DDPJob API: one typed, validated model that is also the source of the CRD schema.

Every rule lives here once, in the module of what it constrains: `group` (API group, version, names),
`base` (APIModel and StatusModel, the CEL machinery, `salvage`), `kubernetes` (the worker pod's
pass-through Kubernetes fields and the names the operator owns in it), `spec` (DDPJobSpec and its
parts), `job` (a whole manifest: metadata and spec), `status` (DDPJobStatus and its parts). The
operator reads them all from here: `from ddpjob_operator import model; model.DDPJobSpec`.
"""

from .. import k8s_fields as k8s  # model.k8s: the Kubernetes field rules the schema is written with
from .base import (DNS_1035_PATTERN, DNS_1123_SUBDOMAIN_PATTERN, QUANTITY_PATTERN, APIModel, CelRuleError,
                   StatusModel, cel, cel_string, evaluate_cel, free_form, model_in, salvage)
from .group import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from .job import DEFAULT_CLUSTER_DOMAIN, MAX_FQDN_LENGTH, MAX_JOB_NAME_LENGTH, DDPJob, JobMetadata, worker_fqdn_length
from .kubernetes import (CHECKPOINT_VOLUME, COSCHEDULING_GROUP_LABEL, ENV_NAME_PATTERN, KUEUE_QUEUE_LABEL,
                         MANAGED_BY_LABEL, OPERATOR_ENV_NAMES, OPERATOR_LABEL_PREFIX, OPERATOR_SECRETS_DIR,
                         OPERATOR_VOLUME_PREFIX, RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES, SHM_PATH, SHM_VOLUME,
                         TERMINATION_LOG, TRAINER_CONTAINER, USER_SETTABLE_ENV_NAMES, VOLCANO_GROUP_ANNOTATION,
                         ContainerResources, EnvVar, LabelValue, PodSpecOverrides, PodTemplate, Quantity,
                         Toleration, TrainerContainer)
from .spec import (ENTRYPOINT_PATTERN, GANG_SCHEDULERS, Backoff, Checkpoint, ClaimTemplate, DDPJobSpec, ExitCode,
                   FailurePolicy, Rendezvous, Resources, RunPolicy, SchedulingPolicy, StoreResources, StoreTemplate)
from .status import (PHASES, AvoidedNode, Condition, DDPJobStatus, Incident, IncidentRecovery, NodeFailure, Phase,
                     Progress, RankStatus, RankStepTime, SpareStatus, StepTimes)

__all__ = [
    "k8s",
    # group
    "API_VERSION", "GROUP", "KIND", "PLURAL", "SHORT_NAMES", "SINGULAR", "VERSION",
    # base
    "DNS_1035_PATTERN", "DNS_1123_SUBDOMAIN_PATTERN", "QUANTITY_PATTERN", "APIModel", "CelRuleError", "StatusModel",
    "cel", "cel_string", "evaluate_cel", "free_form", "model_in", "salvage",
    # kubernetes
    "CHECKPOINT_VOLUME", "COSCHEDULING_GROUP_LABEL", "ENV_NAME_PATTERN", "KUEUE_QUEUE_LABEL", "MANAGED_BY_LABEL",
    "OPERATOR_ENV_NAMES", "OPERATOR_LABEL_PREFIX", "OPERATOR_SECRETS_DIR", "OPERATOR_VOLUME_PREFIX",
    "RESERVED_ENV_NAMES", "RESERVED_ENV_PREFIXES", "SHM_PATH", "SHM_VOLUME", "TERMINATION_LOG", "TRAINER_CONTAINER",
    "USER_SETTABLE_ENV_NAMES", "VOLCANO_GROUP_ANNOTATION", "ContainerResources", "EnvVar", "LabelValue",
    "PodSpecOverrides", "PodTemplate", "Quantity", "Toleration", "TrainerContainer",
    # spec
    "ENTRYPOINT_PATTERN", "GANG_SCHEDULERS", "Backoff", "Checkpoint", "ClaimTemplate", "DDPJobSpec", "ExitCode",
    "FailurePolicy", "Rendezvous", "Resources", "RunPolicy", "SchedulingPolicy", "StoreResources", "StoreTemplate",
    # job
    "DEFAULT_CLUSTER_DOMAIN", "MAX_FQDN_LENGTH", "MAX_JOB_NAME_LENGTH", "DDPJob", "JobMetadata", "worker_fqdn_length",
    # status
    "PHASES", "AvoidedNode", "Condition", "DDPJobStatus", "Incident", "IncidentRecovery", "NodeFailure", "Phase",
    "Progress", "RankStatus", "RankStepTime", "SpareStatus", "StepTimes",
]
