"""DDPJobStatus, what the operator observed and decided: phase, conditions, ranks, spares, progress,
incidents and their recovery, step times and the nodes it avoids."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import StatusModel

Phase = Literal["Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


class Condition(StatusModel):
    type: str = Field(description=(
        "Created, Running, Restarting, Suspended, Succeeded, Failed, Degraded (fewer ranks train than a whole "
        "world has), Stalled, ..."))
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


class RecoveryStep(StatusModel):
    """One regroup of the training in place after an incident: the survivors trained on short, or a rank joined."""

    kind: Literal["Shrink", "Join"] = Field(description="Shrink or Join.")
    time: str = Field(description="When its process group was complete, as rank 0 reported (RFC 3339).")
    world_size: int | None = Field(default=None, ge=0, description="Ranks training after it, as rank 0 reported.")


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
    steps: list[RecoveryStep] = Field(default_factory=list, max_length=2, description=(
        "Training in place: the survivors' shrink (they trained on short at once) and the later join of the "
        "replacement, each with its time; neither is charged."))


class Incident(StatusModel):
    """One failure or disruption of a rendezvous generation, with every exit it caused: charged at most once."""

    generation: int = Field(description="Rendezvous generation it ended or disturbed.")
    time: str = Field(description="When it began (RFC 3339).")
    cause: str = Field(description=(
        "Retryable (charged), Permanent (the job failed), Disruption, Consequence (not charged), or what moved "
        "the job to a fresh generation without a failure: RendezvousStoreLost, ScaleDown, NodeRangeChanged, "
        "ScaledInPlace (`kubectl scale` with in-process recovery: nobody stopped)."))
    reason: str = Field(default="", description="CamelCase reason (WorkerFailed, Evicted, PodVanished, ...).")
    charged: bool = Field(default=False, description="Whether it spent one restart of failurePolicy.maxRestarts.")
    message: str = Field(default="", description="The first failure and how many workers exited with it.")
    ranks: list[int] = Field(default_factory=list, description="Replica indices that exited or were lost in it.")
    step: int | None = Field(default=None, description=(
        "The highest training step any worker had reported in its generation when it was recorded, if any: a charged "
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
    world_size: int = Field(default=0, description=(
        "Ranks training (the WORLD column): as rank 0 reports it while the job runs, else running workers x "
        "nprocPerNode; below desiredWorldSize while the job trains short (condition Degraded)."))
    desired_world_size: int = Field(default=0, description="Ranks of a whole world: replicas x nprocPerNode.")
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
