"""The decision layer's vocabulary: its inputs (what was observed), its outputs (actions, the
decision) and the one spelling of every reason it writes. No logic here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Union

from .. import model
from ..validation import FieldError

# Failure classes of one exited or lost worker.
PERMANENT = "Permanent"
RETRYABLE = "Retryable"
DISRUPTION = "Disruption"
# An exit that another member of the incident caused (a replacement that met a rendezvous its
# peers had closed): never the incident's cause.
CONSEQUENCE = "Consequence"
# A trainer whose collective failed because another rank did (its Gloo/NCCL error says so): weaker
# evidence than any other exit of the incident, charged as Retryable when it is all there is.
PEER_FAILURE = "PeerFailure"
FailureClass = Literal["Permanent", "Retryable", "Disruption", "Consequence", "PeerFailure"]

# Reasons (status conditions, events, RankStatus.last_reason, incidents). One spelling each.
REASON_INVALID_SPEC = "InvalidSpec"
REASON_PERMANENT_ERROR = "PermanentError"
REASON_BUDGET_EXHAUSTED = "RestartBudgetExhausted"
REASON_DEADLINE = "DeadlineExceeded"
REASON_STORE_LOST = "RendezvousStoreLost"
REASON_FAILED_AFTER_COMPLETION = "FailedAfterCompletion"
REASON_SUCCEEDED = "Succeeded"
REASON_SCALED = "Scaled"
REASON_WORKER_FAILED = "WorkerFailed"
REASON_WORKER_DISRUPTED = "WorkerDisrupted"
REASON_GANG_RESTART = "GangRestart"
REASON_STUCK_TERMINATING = "StuckTerminating"
REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
REASON_OLD_GENERATION = "OldGeneration"
REASON_CLEANUP = "JobFinished"
REASON_SCALE_DOWN = "ScaleDown"
REASON_RANGE_CHANGED = "NodeRangeChanged"
REASON_REPLACE = "Replace"
REASON_CANNOT_START = "ContainerCannotStart"
REASON_VOLUME_UNAVAILABLE = "VolumeUnavailable"
REASON_POD_VANISHED = "PodVanished"
REASON_POD_DELETED = "PodDeleted"
REASON_RENDEZVOUS_CLOSED = "RendezvousClosed"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_POD_REJECTED = "PodRejected"
REASON_NAME_CONFLICT = "NameConflict"
REASON_QUOTA = "QuotaExceeded"
REASON_GANG_SCHEDULER_MISSING = "GangSchedulerNotInstalled"
REASON_CHECKPOINT_VOLUME = "CheckpointVolumeFailed"  # exit 75: the checkpoint volume is full or unreadable
REASON_SPARE_TAKES_OVER = "SpareTakesOver"
REASON_SPARE_EXITED = "SpareExited"  # an idle spare's pod ended: replaced, never an incident
REASON_SPARE_SURPLUS = "SpareSurplus"  # failurePolicy.spares lowered, or the job finished
REASON_STALLED = "Stalled"  # the step stopped advancing for runPolicy.progressDeadlineSeconds
REASON_PROGRESSING = "Progressing"
REASON_STRAGGLER = "Straggler"  # a worker's own step time stays above the threshold x its peers' median
REASON_NO_STRAGGLER = "NoStraggler"
REASON_STRAGGLER_REPLACED = "StragglerReplaced"  # failurePolicy.stragglers Replace: moved off its node
REASON_NODE_AVOIDED = "NodeAvoided"  # status.avoidedNodes gained a node
# The trainer's reports (decisions/warnings.py): conditions and one Warning event each, never a failure.
REASON_WORLD_SIZE_MISMATCH = "WorldSizeMismatch"  # reports of a world size no rendezvous of the job has
REASON_WORLD_SIZE_AGREES = "WorldSizeAgrees"
REASON_NO_PROGRESS_REPORTS = "NoProgressReports"  # running a while with a checkpoint interval, no report
REASON_NO_CHECKPOINTS = "NoCheckpointsReported"  # reports, steps past two intervals, no checkpoint
REASON_REPORTING = "Reporting"
REASON_RECOVERED = "Recovered"  # an incident's recovery completed: the next generation trained its first step
# Elastic in place (decisions/degraded.py): the survivors train on short while a lost rank's replacement comes.
REASON_TRAINING_SHORT = "TrainingShort"  # fewer ranks train than a whole world has
REASON_WAITING_FOR_RANKS = "WaitingForRanks"  # below minReplicas: nobody trains until more ranks come
REASON_WHOLE = "Whole"  # every rank of a whole world trains again
REASON_NOT_TRAINING = "NotTraining"  # the job ended or was suspended while short: nothing trains any more

# Container waiting reasons that never clear by themselves (a wrong image, a missing secret); a pod
# stuck in one past Options.cannot_start_seconds fails the job instead of leaving it Pending forever.
CANNOT_START_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                                  "CreateContainerConfigError", "CreateContainerError"})

# The taint manager deletes a pod only from a node that stopped answering: no kubelet will ever
# confirm that deletion, so waiting for the stuck-terminating timeout only delays the replacement.
NODE_LOST_REASONS = frozenset({"DeletionByTaintManager"})
# The kubelet's event when a volume cannot be mounted (a missing config map, secret or claim): the pod
# waits in ContainerCreating with no message of its own.
REASON_FAILED_MOUNT = "FailedMount"

TERMINAL_PHASES = ("Succeeded", "Failed")
PHASE_CONDITIONS = ("Running", "Restarting", "Suspended", "Succeeded", "Failed")
CONDITION_SPEC_REJECTED = "SpecRejected"
CONDITION_UNSCHEDULABLE = "PodsUnschedulable"
CONDITION_CREATE_BLOCKED = "CreateBlocked"
# Whether every worker can mount the checkpoint claim (validation.checkpoint_sharing): False warns of a
# ReadWriteOnce claim that workers on different nodes cannot all attach.
CONDITION_CHECKPOINT_SHARED = "CheckpointVolumeShared"
# Hang detection (decisions/progress.py): True from a stall until a later generation advances again.
CONDITION_STALLED = "Stalled"
# Straggler detection (decisions/stragglers.py): True while a worker is named a straggler.
CONDITION_STRAGGLER = "Straggler"
# True while the trainer reports a world size that no rendezvous of the job has (decisions/warnings.py).
CONDITION_WORLD_SIZE_MISMATCH = "WorldSizeMismatch"
# True while a job with a checkpoint interval runs without reports or checkpoints (decisions/warnings.py).
CONDITION_NOT_REPORTING = "ProgressNotReported"
# True while fewer ranks train than a whole world has, or none while below minReplicas (decisions/degraded.py).
CONDITION_DEGRADED = "Degraded"
# Pod phases of a worker that has stopped on its own.
EXITED = ("Succeeded", "Failed")
MISSING = "Missing"
# status.incidents keeps this many, newest last.
INCIDENT_HISTORY = 10

# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    uid: str
    metadata_generation: int
    created_at: datetime
    spec: model.DDPJobSpec | None  # None when the stored spec cannot be run: see spec_errors
    status: model.DDPJobStatus = field(default_factory=model.DDPJobStatus)
    spec_errors: tuple[FieldError, ...] = ()
    deleting: bool = False


@dataclass(frozen=True)
class Waiting:
    """A container that has not started: kubelet's waiting reason, its message, since when."""

    reason: str
    message: str | None
    since: datetime


@dataclass(frozen=True)
class WorkerObservation:
    index: int
    name: str
    generation: int  # the generation it was created for (its label); a survivor serves later ones too
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    attempt: int = 0  # the rank's replacement count when this pod/process was created
    ready: bool = False
    exit_code: int | None = None  # 128+N for signal N
    reason: str | None = None  # OOMKilled, Evicted, Error, ...
    message: str | None = None  # the termination message: failed rank, exit code, error
    disruption: bool = False  # eviction, preemption, node loss: not the user's fault
    # Being stopped; the stuck timeout counts from here: for a pod, the end of its grace period.
    terminating_since: datetime | None = None
    node: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    waiting: Waiting | None = None
    node_range: str | None = None  # the `--nnodes` its agent was started with ("2-4")
    unschedulable: Waiting | None = None  # the scheduler's PodScheduled=False reason and message
    uid: str | None = None  # this pod, not the next one of the same name (status.ranks[].uid)

    @property
    def exited(self) -> bool:
        return self.phase in EXITED

    @property
    def live(self) -> bool:
        return not self.exited and self.terminating_since is None


@dataclass(frozen=True)
class StoreObservation:
    phase: str
    ready: bool = False
    terminating_since: datetime | None = None
    reason: str | None = None  # the control plane's disruption reason (DeletionByTaintManager, ...)
    waiting: Waiting | None = None
    unschedulable: Waiting | None = None

    @property
    def usable(self) -> bool:
        return self.phase not in EXITED and self.terminating_since is None


@dataclass(frozen=True)
class CreateRejected:
    """The API server refused to create one of the job's objects (admission, validation, quota, or
    a name held by an object that is not the job's)."""

    kind: str  # Pod, Service, PersistentVolumeClaim
    name: str
    status: int  # HTTP status
    reason: str  # the server's reason (Forbidden, Invalid, AlreadyExists, ...)
    message: str
    at: datetime
    not_owned: bool = False  # 409 on a name that belongs to another object


@dataclass(frozen=True)
class RankReport:
    """What one worker (replica index) last reported, in the generation of its pod."""

    index: int
    generation: int
    step: int
    last_seen: datetime  # its last report (a heartbeat repeats the step)


@dataclass(frozen=True)
class StepTiming:
    """One worker's own time per step (apart from waiting in collectives), as it reported it."""

    at: datetime  # when the operator (runner) received it
    step: int
    seconds: float


@dataclass(frozen=True)
class RankTimings:
    """A worker's recent step timings in one generation (decisions/stragglers.py judges them)."""

    index: int
    generation: int
    since: datetime  # its first timing in this generation (the window must be covered before it is judged)
    samples: tuple[StepTiming, ...]  # oldest first, bounded by the caller


@dataclass(frozen=True)
class RecoveryReport:
    """How a generation came back from the incident before it, as its rank 0 reported it (the report's sticky
    `recovery` object; docs/operator.md, "Recovery timeline"): the newest such report of the generation. Times
    are the trainer's wall clock, already converted (decisions.recovery.unix_time); the decision layer bounds
    them against its own."""

    generation: int  # the generation that reported it (attributed like every report)
    path: str  # "InProcess" or "Restart"; anything else makes the report unusable
    # A regroup within the generation (elastic in place): "Shrink" (the survivors train on short) or "Join" (a
    # rank joined them live); None: the generation's own start after the incident, as before.
    kind: str | None = None
    reason: str = ""  # why Restart where InProcess was asked for
    resumed_step: int | None = None  # the step the generation trains from
    rendezvous_time: datetime | None = None  # its process group was complete
    first_step_time: datetime | None = None  # its first optimizer step finished
    world_size: int | None = None  # ranks training, in the report that carried it


@dataclass(frozen=True)
class ProgressObservation:
    """The trainer's reports as the operator (or the local runner) received them: the job-level values
    to show (already rate-limited by the caller) and, for hang detection, when the step last advanced."""

    generation: int  # of the reports below; older generations' reports are never used for a stall
    step: int
    last_advance: datetime  # when this generation's step last grew (its first report starts the clock)
    total_steps: int | None = None
    epoch: int | None = None
    loss: float | None = None
    samples_per_second: float | None = None
    last_checkpoint_step: int | None = None
    world_size: int | None = None
    steps_per_second: float | None = None  # the recent step rate (for the ETA)
    updated_at: datetime | None = None  # the newest report shown
    ranks: tuple[RankReport, ...] = ()  # per worker; empty where reports carry no worker (local runs)
    last_refused: datetime | None = None  # the operator last could not take one of the job's reports
    timings: tuple[RankTimings, ...] = ()  # per worker, as last published (straggler detection)
    recoveries: tuple[RecoveryReport, ...] = ()  # the newest per recent generation and kind, oldest first (not rate limited)
    # The live view rank 0 reports (issue 36): a whole world's ranks, the global ranks missing from it, since
    # when it trains short, and how many more ranks it waits for while below minReplicas and not training.
    desired_world_size: int | None = None
    missing_ranks: tuple[int, ...] = ()
    short_since: datetime | None = None
    waiting_for_ranks: int | None = None
    # The newest report's trainers train on in place (short, or joined after a shrink): their generation is the
    # one they started in, which may be older than the operator's while a replacement is on its way.
    in_place: bool = False


@dataclass(frozen=True)
class Observed:
    workers: tuple[WorkerObservation, ...]
    store: StoreObservation | None
    now: datetime
    rejected: tuple[CreateRejected, ...] = ()
    progress: ProgressObservation | None = None
    # Warm spares (failurePolicy.spares), index -1; a spare the status names as a rank's pod (by uid) is
    # that rank's worker: decisions.spares.with_promoted moves it to `workers`.
    spares: tuple[WorkerObservation, ...] = ()


@dataclass(frozen=True)
class Options:
    """Operator-wide knobs (from operator settings), not part of any job."""

    stuck_terminating_seconds: float = 300.0
    cannot_start_seconds: float = 300.0  # a pod waiting on CANNOT_START_REASONS this long fails the job
    # An incident stays open this long after its first failure for the exits it causes (a peer's
    # trainer fails on its next collective) to be counted with it, not as incidents of their own.
    incident_settle_seconds: float = 10.0
    # Survivors whose collective timed out on a peer that still looks Running on its node: that node may
    # have stopped answering, which the node controller declares only after node-monitor-grace-period
    # (40-50 s), then the taint manager evicts the pod (failurePolicy.nodeLossTimeoutSeconds): a
    # disruption. The incident waits this long for that verdict before charging the silence as a hang.
    silent_peer_settle_seconds: float = 60.0
    # A worker whose last progress report is older than this "stopped reporting" (reporters heartbeat
    # every few seconds): the stall event names such ranks.
    report_silence_seconds: float = 15.0
    # Spares need a way to learn their assignment: the operator's progress endpoint, or a local run.
    spares_enabled: bool = True
    # Failures on one node within failurePolicy.avoidNodeSeconds that mark it avoided.
    node_failures_to_avoid: int = 2
    # A generation whose workers have all run this long with a checkpoint interval and no progress report
    # yet is warned of (the HF/Lightning callback or job.report missing: a kill would restart from step 0).
    unreported_warning_seconds: float = 180.0
    # Every worker runs on one machine (a local run): a ReadWriteOnce checkpoint claim cannot bite.
    one_node: bool = False


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class CreateStore:
    pass


@dataclass(frozen=True)
class DeleteStore:
    reason: str
    force: bool = False


@dataclass(frozen=True)
class CreateWorker:
    index: int
    generation: int
    attempt: int
    avoid_nodes: tuple[str, ...] = ()  # status.avoidedNodes: required node anti-affinity (NotIn hostname)


@dataclass(frozen=True)
class CreateSpare:
    slot: int  # the pod is `<job>-spare-<slot>`
    generation: int


@dataclass(frozen=True)
class DeleteWorker:
    name: str
    reason: str
    force: bool = False  # grace period 0: for pods stuck terminating on an unreachable node


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class DeleteJob:
    reason: str


Action = Union[CreateStore, DeleteStore, CreateWorker, CreateSpare, DeleteWorker, Event, DeleteJob]


@dataclass(frozen=True)
class Decision:
    status: model.DDPJobStatus
    actions: tuple[Action, ...] = ()
    requeue_after: float | None = None  # seconds until the decision may change without any event

    def status_changed(self, old: model.DDPJobStatus) -> bool:
        return self.status.wire() != old.wire()
