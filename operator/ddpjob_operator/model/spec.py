"""DDPJobSpec, the desired state of a job, and its parts: resources, rendezvous, checkpoint, failure and
run policies (the pod template's pass-through fields are in kubernetes.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from .. import k8s_fields as k8s
from .. import pod_rules
from .base import DNS_1123_SUBDOMAIN_PATTERN, QUANTITY_PATTERN, APIModel, CelRuleError, cel, distinct
from .kubernetes import (CHECKPOINT_VOLUME, SHM_VOLUME, EnvVar, LabelValue, PodTemplate, Toleration,
                         mount_path_rules, qualified_keys_rule)

# An entrypoint starting with `-` would be parsed by torchrun as its own flag (--standalone, --max-restarts).
ENTRYPOINT_PATTERN = r"^[^-\s]\S*$"


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


class StoreResources(APIModel):
    cpu: str = Field(default="100m", pattern=QUANTITY_PATTERN, description=(
        "CPU request of the rendezvous store pod, e.g. `100m`."))
    memory: str = Field(default="256Mi", pattern=QUANTITY_PATTERN, description=(
        "Memory request of the rendezvous store pod, e.g. `256Mi`."))


class StoreTemplate(APIModel):
    cel_rules = (qualified_keys_rule("nodeSelector", "node selector"),)

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
        *[dict(rule, fieldPath=".mountPath") for rule in mount_path_rules("self.mountPath", "mountPath")[1:]],
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
    recovery: Literal["Restart", "InProcess"] | None = Field(default=None, description=(
        "How survivors of a peer's failure recover. Restart: their trainers restart and every rank resumes "
        "from the rescue checkpoint on the volume. InProcess (restartScope Pod only): their trainer processes "
        "survive (model, optimizer and data position stay in memory), rebuild the process group of the next "
        "generation and continue; a replacement or spare receives the state by broadcast from a survivor. "
        "Default: InProcess with restartScope Pod, Restart with All (the worker's DDPJOB_INPROCESS, shown by "
        "`ddpjob render`, says which). InProcess needs a trainer on the runtime library (the bundled trainer, "
        "or a script using Job.carry); the Hugging Face and Lightning callbacks, and any case the runtime "
        "cannot leave the old group cleanly, take the Restart path by themselves and say why in the pod's log "
        "and the incident."))
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
        cel("!has(self.recovery) || self.recovery == 'Restart' || self.restartScope == 'Pod'",
            "failurePolicy.recovery InProcess needs restartScope: Pod (with All every worker is replaced): "
            "set recovery: Restart or restartScope: Pod", ".recovery"),
        cel("self.spares == 0 || self.restartScope == 'Pod'",
            "failurePolicy.spares needs restartScope: Pod (with All every worker is replaced anyway): set "
            "spares: 0 or restartScope: Pod", ".spares"),
        cel("self.backoff.initialSeconds <= self.backoff.maxSeconds",
            "backoff.initialSeconds must not exceed backoff.maxSeconds", ".backoff.initialSeconds"),
    )

    @property
    def effective_recovery(self) -> Literal["Restart", "InProcess"]:
        """`recovery`, or its default: InProcess where survivors keep their pods (restartScope Pod), else Restart
        (a CRD default cannot depend on another field, so the one place that resolves it is here)."""
        if self.recovery is not None:
            return self.recovery
        return "InProcess" if self.restart_scope == "Pod" else "Restart"


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


def _mounts_name_volumes(spec: dict[str, Any], mounts: list[dict[str, Any]]) -> bool:
    """The verdict of the rules below that every mount names a volume, in linear time. Names are strings here: the
    CRD's schema (maxLength of a string) is checked before any rule."""
    template = spec.get("template", {})
    known = {v["name"] for v in template.get("volumes", []) if "name" in v} | {SHM_VOLUME}
    if "checkpoint" in spec:
        known.add(CHECKPOINT_VOLUME)
    return all("name" not in m or m["name"] in known for m in mounts)


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
            "env names must be unique: remove the duplicate entry", ".env",
            offline=lambda spec: "env" in spec and all("name" in e for e in spec["env"]) and distinct(spec["env"],
                                                                                                  "name")),
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
            "add the volume to template.volumes or fix the name", ".template.volumeMounts",
            offline=lambda spec: _mounts_name_volumes(spec, spec.get("template", {}).get("volumeMounts", []))),
        cel("!has(self.template) || !has(self.template.podSpec) || !has(self.template.podSpec.initContainers) || "
            "self.template.podSpec.initContainers.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, "
            f"!has(m.name) || m.name == '{SHM_VOLUME}' || (has(self.checkpoint) && m.name == '{CHECKPOINT_VOLUME}') || "
            "(has(self.template.volumes) && self.template.volumes.exists(v, has(v.name) && v.name == m.name))))",
            "an init container's volumeMount names a volume of template.volumes (or dshm, or checkpoints with "
            "spec.checkpoint): add the volume to template.volumes or fix the name",
            ".template.podSpec.initContainers",
            offline=lambda spec: _mounts_name_volumes(spec, [
                m for c in spec.get("template", {}).get("podSpec", {}).get("initContainers", [])
                for m in c.get("volumeMounts", [])])),
        # A conditional, not `||`: celpy evaluates both sides of `||`, and an absent checkpoint's error in every
        # entry of all() nests exponentially (cel-go short-circuits; both evaluate a conditional lazily).
        cel("has(self.checkpoint) && has(self.template) && has(self.template.volumeMounts) ? "
            "self.template.volumeMounts.all(m, !has(m.mountPath) || m.mountPath != self.checkpoint.mountPath) : true",
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
