"""The pure decision layer: (job, observed workers and store, now) -> new status + actions.

Shared by the operator (pods) and the local runner (processes): no I/O, no kopf, no manifests,
no clock (`now` comes in). Level-based: the same inputs always give the same decision, and
re-running a decision after its actions half-happened converges (failure accounting is keyed on
each pod's `attempt` and `generation`, so a failure is charged exactly once).

Vocabulary: a *rank* is a replica index i (`<job>-worker-i`); the *generation* is the rendezvous
generation (rdzv id `<uid>-g<generation>`), bumped by a gang restart or when the store is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Literal, Union

from . import builders, model
from .validation import FieldError

# Exit-code classes.
PERMANENT = "Permanent"
RETRYABLE = "Retryable"
DISRUPTION = "Disruption"
FailureClass = Literal["Permanent", "Retryable", "Disruption"]

# Reasons (status conditions, events, RankStatus.last_reason). One spelling each.
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
REASON_REPLACE = "Replace"
REASON_CANNOT_START = "ContainerCannotStart"

# Container waiting reasons that never clear by themselves (a wrong image, a missing secret); a pod
# stuck in one past Options.cannot_start_seconds fails the job instead of leaving it Pending forever.
CANNOT_START_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                                  "CreateContainerConfigError", "CreateContainerError"})
REASON_POD_VANISHED = "PodVanished"

TERMINAL_PHASES = ("Succeeded", "Failed")
PHASE_CONDITIONS = ("Running", "Restarting", "Suspended", "Succeeded", "Failed")
CONDITION_SPEC_REJECTED = "SpecRejected"
# Pod phases of a worker that has stopped on its own.
EXITED = ("Succeeded", "Failed")
MISSING = "Missing"

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
    generation: int
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
    waiting: Waiting | None = None

    @property
    def usable(self) -> bool:
        return self.phase not in EXITED and self.terminating_since is None


@dataclass(frozen=True)
class Observed:
    workers: tuple[WorkerObservation, ...]
    store: StoreObservation | None
    now: datetime


@dataclass(frozen=True)
class Options:
    """Operator-wide knobs (from operator settings), not part of any job."""

    stuck_terminating_seconds: float = 300.0
    cannot_start_seconds: float = 300.0  # a pod waiting on CANNOT_START_REASONS this long fails the job


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


Action = Union[CreateStore, DeleteStore, CreateWorker, DeleteWorker, Event, DeleteJob]


@dataclass(frozen=True)
class Decision:
    status: model.DDPJobStatus
    actions: tuple[Action, ...] = ()
    requeue_after: float | None = None  # seconds until the decision may change without any event

    def status_changed(self, old: model.DDPJobStatus) -> bool:
        return self.status.wire() != old.wire()


# ---------------------------------------------------------------- small pure helpers


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def accounting(status: model.DDPJobStatus) -> tuple[object, ...]:
    """The status fields that record charged failures: durable before the actions they cause."""
    return (status.restarts, status.disruptions, status.generation, tuple((r.index, r.restarts) for r in status.ranks))


def rendezvous_failed(message: str | None) -> bool:
    """The launcher's word that torchrun never formed the group (not the trainer's failure)."""
    return bool(message) and message.startswith(builders.RENDEZVOUS_FAILED_PREFIX)


def classify_exit(exit_code: int | None, reason: str | None, disruption: bool,
                  policy: model.FailurePolicy, message: str | None = None) -> FailureClass:
    """Which kind of failure this is, by the job's exit-code rules (explicit lists win)."""
    if disruption:
        return DISRUPTION
    if exit_code is not None and exit_code in policy.permanent_exit_codes:
        return PERMANENT
    if exit_code is not None and exit_code in policy.retryable_exit_codes:
        return RETRYABLE
    if reason == "OOMKilled" or rendezvous_failed(message):
        return RETRYABLE
    if exit_code is None or exit_code >= 128:
        return RETRYABLE  # killed by a signal, or the pod died without a container exit code
    return PERMANENT  # 1-127: the user's program said no


def backoff_seconds(restarts: int, backoff: model.Backoff) -> float:
    """Delay before the `restarts`-th charged restart (1-based) is carried out."""
    if restarts <= 0:
        return 0.0
    return float(min(backoff.initial_seconds * backoff.factor ** (restarts - 1), backoff.max_seconds))


def set_condition(conditions: list[model.Condition], type_: str, status: str, reason: str, message: str,
                  now: datetime, observed_generation: int | None) -> list[model.Condition]:
    """Upsert one condition; lastTransitionTime only moves when its status flips."""
    out, found = [], False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        moved = cond.status != status
        out.append(model.Condition(type=type_, status=status, reason=reason, message=message,
                                   last_transition_time=rfc3339(now) if moved else cond.last_transition_time,
                                   observed_generation=observed_generation))
    if not found:
        out.append(model.Condition(type=type_, status=status, reason=reason, message=message,
                                   last_transition_time=rfc3339(now), observed_generation=observed_generation))
    return out


# Termination messages go into conditions, events and the rank status: one short line.
MESSAGE_LIMIT = 300


def short_message(text: str | None) -> str | None:
    """One line of at most MESSAGE_LIMIT characters, keeping its start (the launcher's summary) and
    its end (the last words of a log tail)."""
    line = " ".join((text or "").split())
    if len(line) <= MESSAGE_LIMIT:
        return line or None
    half = (MESSAGE_LIMIT - 5) // 2
    return f"{line[:half]} ... {line[-half:]}"


def _describe_failure(w: WorkerObservation) -> str:
    code = "unknown exit code" if w.exit_code is None else f"exit code {w.exit_code}"
    described = f"worker {w.index} (pod {w.name}) failed with {code}, reason {w.reason or 'unknown'}"
    message = short_message(w.message)
    return f"{described} ({message})" if message else described


# ---------------------------------------------------------------- the decision


class _Plan:
    """Mutable scratch state of one decide() call; frozen into a Decision at the end."""

    def __init__(self, job: JobView, observed: Observed):
        self.job, self.observed, self.now = job, observed, observed.now
        self.status = job.status.model_copy(deep=True)
        self.actions: list[Action] = []
        self.wakeups: list[float] = []
        self.phase_reason = ""
        self.phase_message = ""

    def act(self, action: Action) -> None:
        self.actions.append(action)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.actions.append(Event(type_, reason, message))

    def wake_at(self, moment: datetime) -> None:
        self.wakeups.append(max(0.0, (moment - self.now).total_seconds()))

    def rank(self, index: int) -> model.RankStatus:
        for entry in self.status.ranks:
            if entry.index == index:
                return entry
        entry = model.RankStatus(index=index, pod=builders.worker_name(self.job.name, index), phase=MISSING)
        self.status.ranks.append(entry)
        return entry


def decide(job: JobView, observed: Observed, options: Options = Options()) -> Decision:
    plan = _Plan(job, observed)
    if job.deleting:
        return Decision(status=job.status)  # ownerReferences garbage-collect the children
    if job.spec is None:
        _invalid_spec(plan, options)
    elif job.status.phase in TERMINAL_PHASES:
        _finished(plan, job.spec, options)
    elif job.spec.run_policy.suspend:
        _prepare(plan)
        _suspend(plan, job.spec, options)
    else:
        _prepare(plan)
        _active(plan, job.spec, options)
    return _finish(plan)


def _invalid_spec(plan: _Plan, options: Options) -> None:
    errors = "; ".join(str(e) for e in plan.job.spec_errors) or "the spec cannot be parsed"
    status = plan.status
    if status.phase in TERMINAL_PHASES:
        _cleanup(plan, "Running")
        _force_stuck(plan, options)
        return
    if status.start_time is None and status.phase in (None, "Pending"):
        # Never started (created before the CRD schema caught the problem): no pods, ever.
        _enter_terminal(plan, "Failed", REASON_INVALID_SPEC, f"spec cannot be run: {errors}")
        _cleanup(plan, "All")
        return
    # A running job keeps its pods; the bad update (e.g. a scale outside min/max) is not applied.
    previous = next((c for c in status.conditions if c.type == CONDITION_SPEC_REJECTED), None)
    message = f"spec update not applied: {errors}"
    if previous is None or previous.status != "True" or previous.message != message:
        plan.event("Warning", REASON_INVALID_SPEC, message)
    status.conditions = set_condition(status.conditions, CONDITION_SPEC_REJECTED, "True", REASON_INVALID_SPEC,
                                      message, plan.now, plan.job.metadata_generation)


def _prepare(plan: _Plan) -> None:
    status = plan.status
    status.selector = builders.selector_string(builders.worker_selector(plan.job.name))
    status.observed_generation = plan.job.metadata_generation
    # The highest generation seen wins: pods may be ahead of a status write that was lost.
    status.generation = max([status.generation] + [w.generation for w in plan.observed.workers])
    status.conditions = [c for c in status.conditions if c.type != CONDITION_SPEC_REJECTED]


def _active(plan: _Plan, spec: model.DDPJobSpec, options: Options) -> None:
    status, now = plan.status, plan.now
    if status.phase == "Suspended":
        plan.event("Normal", REASON_RESUMED, "resumed: recreating workers; training continues from the "
                                             "last checkpoint")
        status.start_time = None  # like a Job: the deadline counts from the resume

    start = parse_time(status.start_time)
    deadline = spec.run_policy.active_deadline_seconds
    if deadline is not None and start is not None:
        ends = start + timedelta(seconds=deadline)
        if now >= ends:
            _enter_terminal(plan, "Failed", REASON_DEADLINE,
                            f"job ran longer than activeDeadlineSeconds={deadline}")
            _cleanup(plan, spec.run_policy.clean_pod_policy)
            return
        plan.wake_at(ends)

    # Success first: a finished rendezvous is closed, nothing may join it any more.
    if _succeeded(plan, spec, _current(plan)):
        return
    if _cannot_start(plan, spec, options):
        return
    if _store_lost(plan, spec, _current(plan)):
        return
    if _account_failures(plan, spec, _current(plan)):
        return
    _replace_and_create(plan, spec, options)


def _current(plan: _Plan) -> list[WorkerObservation]:
    return [w for w in plan.observed.workers if w.generation == plan.status.generation]


def _succeeded(plan: _Plan, spec: model.DDPJobSpec, current: list[WorkerObservation]) -> bool:
    by_index = {w.index: w for w in current}
    if not any(w.phase == "Succeeded" for w in current):
        return False
    if spec.run_policy.success_policy == "RankZero":
        finished = by_index.get(0) is not None and by_index[0].phase == "Succeeded"
    else:
        finished = all(i in by_index and by_index[i].phase == "Succeeded" for i in range(spec.replicas))
    if finished:
        _enter_terminal(plan, "Succeeded", REASON_SUCCEEDED,
                        f"training finished (successPolicy {spec.run_policy.success_policy})")
        # "then the rest are stopped": running workers always go; finished ones per cleanPodPolicy.
        _cleanup(plan, "All" if spec.run_policy.clean_pod_policy == "All" else "Running")
        return True
    lost = [w for w in current if w.index < spec.replicas and (w.phase == "Failed" or w.terminating_since)]
    gone = [i for i in range(spec.replicas) if i not in by_index]
    if lost or gone:
        # Some ranks completed, so their agents closed the rendezvous: a replacement could only meet
        # RendezvousClosedError. The job ends here instead of wedging.
        what = _describe_failure(lost[0]) if lost else f"worker {gone[0]} disappeared"
        if lost:
            _record_failure(plan, lost[0])
        _enter_terminal(plan, "Failed", REASON_FAILED_AFTER_COMPLETION, f"{what} after other workers had completed")
        _cleanup(plan, spec.run_policy.clean_pod_policy)
        return True
    _update_counts(plan, spec, current)
    _set_phase(plan, "Running", "Completing", "some workers have completed; waiting for the rest")
    return True


def _cannot_start(plan: _Plan, spec: model.DDPJobSpec, options: Options) -> bool:
    """A pod that cannot start (bad image, missing secret) fails the job with the field to fix."""
    waiting = [(f"worker {w.index} (pod {w.name})", "spec.image", w.waiting) for w in _current(plan)]
    store = plan.observed.store
    if store is not None:
        waiting.append(("the rendezvous store pod", "spec.rendezvous.storeImage (default spec.image)",
                        store.waiting))
    for who, field, wait in waiting:
        if wait is None or wait.reason not in CANNOT_START_REASONS:
            continue
        gives_up = wait.since + timedelta(seconds=options.cannot_start_seconds)
        if plan.now < gives_up:
            plan.wake_at(gives_up)
            continue
        detail = short_message(wait.message)
        _enter_terminal(plan, "Failed", REASON_CANNOT_START,
                        f"{who} cannot start: {wait.reason}{f' ({detail})' if detail else ''} for "
                        f"{options.cannot_start_seconds:g}s. Fix: check {field}, spec.imagePullPolicy, "
                        f"image pull secrets (template.serviceAccountName) and secrets named in spec.env")
        _cleanup(plan, spec.run_policy.clean_pod_policy)
        return True
    return False


def _store_lost(plan: _Plan, spec: model.DDPJobSpec, current: list[WorkerObservation]) -> bool:
    """A lost store means lost rendezvous state: move every worker to a fresh generation."""
    store, status = plan.observed.store, plan.status
    if store is not None and store.usable:
        return False
    if store is None:
        plan.act(CreateStore())
    elif store.terminating_since is None:
        plan.act(DeleteStore(f"store pod is {store.phase}"))
    if not any(w.live for w in current):
        return False  # nobody was using it: the new store serves the current generation
    status.generation += 1
    status.disruptions += 1
    message = (f"rendezvous store lost ({'gone' if store is None else store.phase}); moving all workers "
               f"to rendezvous generation {status.generation} (not charged to the restart budget)")
    plan.event("Warning", REASON_STORE_LOST, message)
    for w in current:
        if w.terminating_since is None:
            plan.act(DeleteWorker(w.name, REASON_OLD_GENERATION))
    _update_counts(plan, spec, [])  # the ranks now belong to the new, still empty generation
    _set_phase(plan, "Restarting", REASON_STORE_LOST, message)
    return True


def _record_failure(plan: _Plan, w: WorkerObservation) -> None:
    rank = plan.rank(w.index)
    rank.last_exit_code = w.exit_code
    rank.last_reason = w.reason
    rank.last_message = short_message(w.message)


def _fail(plan: _Plan, spec: model.DDPJobSpec, w: WorkerObservation, reason: str, message: str) -> None:
    _record_failure(plan, w)
    _enter_terminal(plan, "Failed", reason, message)
    _cleanup(plan, spec.run_policy.clean_pod_policy)


def _account_failures(plan: _Plan, spec: model.DDPJobSpec, current: list[WorkerObservation]) -> bool:
    """Charge each new failure once; fail the job or plan the restart. True when the job ended."""
    status, policy = plan.status, spec.failure_policy
    new_failures: list[tuple[WorkerObservation, FailureClass]] = []
    for w in sorted(current, key=lambda o: o.index):
        if w.index >= spec.replicas:
            continue
        rank = plan.rank(w.index)
        rank.restarts = max(rank.restarts, w.attempt)
        # Terminating while we never asked (we delete only failed, scaled-away or old-generation
        # pods): node loss or eviction.
        lost_while_running = w.terminating_since is not None and not w.exited
        if (w.phase == "Failed" or lost_while_running) and w.attempt == rank.restarts:
            kind = DISRUPTION if lost_while_running else classify_exit(w.exit_code, w.reason, w.disruption, policy,
                                                                            w.message)
            new_failures.append((w, kind))
    present = {w.index for w in current}
    for index in range(spec.replicas):
        rank = plan.rank(index)
        if index not in present and rank.phase in ("Pending", "Running"):
            # Seen alive, now gone, and we never delete such a pod: force-deleted behind our back
            # (kubectl delete --force, node garbage collection). A disruption.
            gone = WorkerObservation(index=index, name=rank.pod, generation=status.generation, phase=MISSING,
                                     attempt=rank.restarts, reason=REASON_POD_VANISHED, disruption=True)
            new_failures.append((gone, DISRUPTION))
    if not new_failures:
        return False

    for w, kind in new_failures:
        if kind == PERMANENT:
            _fail(plan, spec, w, REASON_PERMANENT_ERROR,
                  f"{_describe_failure(w)}: a permanent error by failurePolicy (exit codes 1-127 unless "
                  f"listed in retryableExitCodes)")
            return True
    charged = [w for w, kind in new_failures if kind == RETRYABLE]
    gang = policy.restart_scope == "All"
    # A gang restart is one restart however many ranks died with it.
    needed = min(len(charged), 1) if gang else len(charged)
    if status.restarts + needed > policy.max_restarts:
        _fail(plan, spec, charged[0], REASON_BUDGET_EXHAUSTED,
              f"{_describe_failure(charged[0])}; the restart budget failurePolicy.maxRestarts="
              f"{policy.max_restarts} is spent")
        return True

    for w, kind in new_failures:
        _record_failure(plan, w)
        plan.rank(w.index).restarts += 1
        if kind == DISRUPTION:
            status.disruptions += 1
            plan.event("Warning", REASON_WORKER_DISRUPTED,
                       f"worker {w.index} (pod {w.name}) was disrupted ({w.reason or 'node lost'}); "
                       f"replacing it without charging the restart budget")
        else:
            plan.event("Warning", REASON_WORKER_FAILED, f"{_describe_failure(w)}; retrying")
    status.restarts += needed

    survivors = [w for w in current if w.live and w.index < spec.replicas]
    broken_rendezvous = any(rendezvous_failed(w.message) for w in charged)
    if gang or len(survivors) < spec.min_nodes or broken_rendezvous:
        # Below minReplicas the survivors' rendezvous cannot go on, and a closed or timed-out one
        # never reopens: a fresh generation always forms, instead of RendezvousClosedError forever.
        status.generation += 1
        why = ("restartScope All" if gang else "the rendezvous failed" if broken_rendezvous
               else f"fewer than minReplicas={spec.min_nodes} workers left")
        plan.event("Normal", REASON_GANG_RESTART,
                   f"restarting all workers in rendezvous generation {status.generation} ({why})")
    return False


def _failure_gate(plan: _Plan, spec: model.DDPJobSpec, w: WorkerObservation) -> datetime:
    """When a failed pod may be removed (its replacement follows): after the backoff."""
    if w.disruption or w.finished_at is None:
        return plan.now
    return w.finished_at + timedelta(seconds=backoff_seconds(plan.status.restarts, spec.failure_policy.backoff))


def _replace_and_create(plan: _Plan, spec: model.DDPJobSpec, options: Options) -> None:
    status, now, generation = plan.status, plan.now, plan.status.generation
    current = _current(plan)
    stale = [w for w in plan.observed.workers if w.generation != generation]
    restarting = bool(stale)
    # Pods that have exited are removed at once (force: nothing is left to stop), so their
    # replacements can be created in this same pass; DeleteWorker actions run before CreateWorker.
    freed: set[str] = set()

    for w in current + stale:
        if w.terminating_since is not None:
            restarting = restarting or w.index < spec.replicas  # a lost rank awaiting its replacement
            continue
        if w.phase == "Failed":
            # Failed pods stay until their backoff passes; the replacement follows their removal.
            restarting = True
            gate = _failure_gate(plan, spec, w)
            if now >= gate:
                plan.act(DeleteWorker(w.name, REASON_REPLACE, force=True))
                freed.add(w.name)
            else:
                plan.wake_at(gate)
        elif w.generation != generation:
            plan.act(DeleteWorker(w.name, REASON_OLD_GENERATION, force=w.exited))
            if w.exited:
                freed.add(w.name)
        elif w.index >= spec.replicas and not w.exited:
            # Scale down: the highest indices go, gracefully, so they can checkpoint.
            plan.act(DeleteWorker(w.name, REASON_SCALE_DOWN))
    _force_stuck(plan, options)

    # New workers only once the old generation is entirely gone (a gang never mixes generations
    # and the backoff holds for every rank) and while the store is not being replaced.
    store = plan.observed.store
    store_ready_or_coming = store is None or store.usable
    remaining = [w for w in plan.observed.workers if w.name not in freed]
    if not any(w.generation != generation for w in remaining) and store_ready_or_coming:
        occupied = {w.index for w in remaining}
        missing = [i for i in range(spec.replicas) if i not in occupied]
        for i in missing:
            plan.act(CreateWorker(i, generation, plan.rank(i).restarts))
        if missing and status.start_time is None:
            status.start_time = rfc3339(now)

    old = plan.job.status
    if old.observed_generation not in (None, plan.job.metadata_generation) and old.ranks \
            and len(old.ranks) != spec.replicas:
        plan.event("Normal", REASON_SCALED, f"scaling from {len(old.ranks)} to {spec.replicas} workers")

    _update_counts(plan, spec, current)
    running = sum(1 for w in current if w.phase == "Running" and w.live and w.index < spec.replicas)
    if restarting:
        _set_phase(plan, "Restarting", REASON_REPLACE, "replacing failed or old-generation workers")
    elif running >= spec.min_nodes:
        _set_phase(plan, "Running", "Running", f"{running} of {spec.replicas} workers running")
    elif status.phase == "Restarting":
        _set_phase(plan, "Restarting", REASON_REPLACE,
                   f"waiting for minReplicas={spec.min_nodes} workers to run again ({running} running)")
    else:
        _set_phase(plan, "Pending", "Starting", f"{running} of {spec.replicas} workers running")


def _force_stuck(plan: _Plan, options: Options) -> None:
    """Pods stuck Terminating (unreachable node) are force-deleted after the configured timeout."""
    limit = timedelta(seconds=options.stuck_terminating_seconds)
    stuck: list[tuple[datetime, Action]] = [
        (w.terminating_since, DeleteWorker(w.name, REASON_STUCK_TERMINATING, force=True))
        for w in plan.observed.workers if w.terminating_since is not None]
    store = plan.observed.store
    if store is not None and store.terminating_since is not None:
        stuck.append((store.terminating_since, DeleteStore(REASON_STUCK_TERMINATING, force=True)))
    for since, action in stuck:
        if plan.now >= since + limit:
            plan.act(action)
        else:
            plan.wake_at(since + limit)


def _update_counts(plan: _Plan, spec: model.DDPJobSpec, current: list[WorkerObservation]) -> None:
    status = plan.status
    live = [w for w in current if w.live]
    status.replicas = len(live)
    status.ready_replicas = sum(1 for w in live if w.ready)
    status.world_size = sum(1 for w in live if w.phase == "Running") * spec.nproc_per_node
    observed = {w.index: w for w in current}
    ranks = []
    for i in sorted(set(range(spec.replicas)) | set(observed)):
        rank, w = plan.rank(i), observed.get(i)
        rank.pod = builders.worker_name(plan.job.name, i)
        rank.phase = MISSING if w is None else ("Terminating" if w.terminating_since else w.phase)
        rank.ready = bool(w and w.ready)
        rank.node = w.node if w else None
        ranks.append(rank)
    status.ranks = ranks


def _suspend(plan: _Plan, spec: model.DDPJobSpec, options: Options) -> None:
    if plan.status.phase != "Suspended":
        # The stopped pods become an old generation: on resume they are never mistaken for lost
        # ranks, new workers wait until they are gone, and the fresh store gets a fresh rendezvous id.
        plan.status.generation += 1
    for w in plan.observed.workers:
        if w.terminating_since is None:
            plan.act(DeleteWorker(w.name, REASON_SUSPENDED))
    store = plan.observed.store
    if store is not None and store.terminating_since is None:
        plan.act(DeleteStore(REASON_SUSPENDED))
    _force_stuck(plan, options)
    _update_counts(plan, spec, _current(plan))
    _set_phase(plan, "Suspended", REASON_SUSPENDED,
               "suspended: workers stopped (they checkpoint on SIGTERM); the checkpoint volume is kept")


def _cleanup(plan: _Plan, clean_pod_policy: str) -> None:
    """Stop pods of a finished job: workers per cleanPodPolicy, the store always."""
    for w in plan.observed.workers:
        if w.terminating_since is not None:
            continue
        if clean_pod_policy == "All" or (clean_pod_policy == "Running" and not w.exited):
            plan.act(DeleteWorker(w.name, REASON_CLEANUP))
    store = plan.observed.store
    if store is not None and store.terminating_since is None:
        plan.act(DeleteStore(REASON_CLEANUP))


def _finished(plan: _Plan, spec: model.DDPJobSpec, options: Options) -> None:
    """Terminal jobs stay terminal: keep cleaning up (idempotently) and honour the TTL."""
    policy = spec.run_policy.clean_pod_policy
    if plan.status.phase == "Succeeded" and policy == "None":
        policy = "Running"
    _cleanup(plan, policy)
    _force_stuck(plan, options)
    _ttl(plan, spec)


def _ttl(plan: _Plan, spec: model.DDPJobSpec) -> None:
    ttl = spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(plan.status.completion_time)
    if ttl is None or finished is None:
        return
    expires = finished + timedelta(seconds=ttl)
    if plan.now >= expires:
        plan.act(DeleteJob(f"ttlSecondsAfterFinished={ttl} passed since completion"))
    else:
        plan.wake_at(expires)


def _enter_terminal(plan: _Plan, phase: str, reason: str, message: str) -> None:
    plan.status.completion_time = plan.status.completion_time or rfc3339(plan.now)
    _set_phase(plan, phase, reason, message)
    if plan.job.spec is not None:
        _update_counts(plan, plan.job.spec, _current(plan))
        _ttl(plan, plan.job.spec)


def _set_phase(plan: _Plan, phase: str, reason: str, message: str) -> None:
    plan.status.phase = phase  # type: ignore[assignment]
    plan.status.message = message
    plan.phase_reason, plan.phase_message = reason, message


def _finish(plan: _Plan) -> Decision:
    """Conditions and the transition event follow from the phase; unchanged ones keep their time."""
    old, status, now = plan.job.status, plan.status, plan.now
    generation = plan.job.metadata_generation
    conditions = list(status.conditions)
    if any(isinstance(a, CreateWorker) for a in plan.actions) or any(c.type == "Created" for c in conditions):
        conditions = set_condition(conditions, "Created", "True", "WorkersCreated",
                                   "worker pods were created", now, generation)
    if plan.phase_reason:  # the phase was (re)decided in this pass
        for type_ in PHASE_CONDITIONS:
            previous = next((c for c in conditions if c.type == type_), None)
            if type_ == status.phase:
                conditions = set_condition(conditions, type_, "True", plan.phase_reason, plan.phase_message,
                                           now, generation)
            elif previous is not None and previous.status == "True":
                conditions = set_condition(conditions, type_, "False", previous.reason, previous.message,
                                           now, generation)
    status.conditions = conditions
    if status.phase != old.phase:
        warning = status.phase in ("Failed", "Restarting")
        plan.event("Warning" if warning else "Normal", plan.phase_reason,
                   f"{old.phase or 'New'} -> {status.phase}: {plan.phase_message}")
    requeue = min(plan.wakeups) if plan.wakeups else None
    return Decision(status=status, actions=tuple(_dedupe(plan.actions)), requeue_after=requeue)


def _dedupe(actions: list[Action]) -> list[Action]:
    """Keep the first action per target (two rules may pick the same pod in one pass)."""
    seen: set[object] = set()
    out = []
    for action in actions:
        key: object = action
        if isinstance(action, DeleteWorker):
            key = ("worker", action.name, action.force)
        elif isinstance(action, DeleteStore):
            key = ("store", action.force)
        if key not in seen:
            seen.add(key)
            out.append(action)
    return out
