"""The pure decision layer: (job, observed workers and store, now) -> new status + actions.

Shared by the operator (pods) and the local runner (processes): no I/O, no kopf, no manifests,
no clock (`now` comes in). Level-based: the same inputs always give the same decision, and
re-running a decision after its actions half-happened converges (an incident is charged once: the
generation it ends is left behind, and same-generation replacements are keyed on each pod's
`attempt`).

Vocabulary: a *rank* is a replica index i (`<job>-worker-i`); the *generation* is the rendezvous generation
(rdzv id `<uid>-g<generation>`); an *incident* is one failure or disruption of a generation with every exit it
causes. The concerns live in their own modules: `accounting` (incidents and the budget), `generations` (fresh
rendezvous, replacement, scaling, suspend), `scaling` (a scale done in place with in-process recovery),
`completion` (success, deadlines, pods that cannot start, refused objects, finished jobs), `warnings` (what
the trainer's reports say about the script: a foreign world size, no reports or checkpoints), `recovery` (each
incident's recovery timeline), `degraded` (training short: fewer ranks than a whole world).
"""

from __future__ import annotations

from .. import model, naming
from .accounting import (account_incident, backoff_seconds, classify_exit, rendezvous_closed,
                         rendezvous_failed)
from .common import (FIX_LIMIT, MESSAGE_LIMIT, Plan, new_incidents, parse_time, rfc3339, set_condition,
                     short_message)
from .completion import cannot_start, deadline_passed, finished, invalid_spec, rejected, succeeded
from .degraded import degraded
from . import spares
from .generations import replace_and_create, resized, store_lost, suspend
from .recovery import follow_recovery, recovered, unix_time
from .progress import format_eta, progress_status, record_progress, stalled
from .nodes import avoid_nodes, record_node_failures
from .stragglers import TimingHistory, detect_stragglers
from .volumes import checkpoint_volume
from .warnings import not_reporting, refuse_foreign_world_size
from .types import *  # noqa: F403 - the layer's vocabulary is part of its interface
from .types import (CONDITION_SPEC_REJECTED, PHASE_CONDITIONS, REASON_RESUMED, TERMINAL_PHASES, CreateWorker,
                    Decision, DeleteStore, DeleteWorker, JobView, Observed, Options)

__all__ = ["decide", "accounting", "classify_exit", "backoff_seconds", "rendezvous_failed", "rendezvous_closed",
           "parse_time", "rfc3339", "set_condition", "short_message", "MESSAGE_LIMIT", "FIX_LIMIT", "format_eta",
           "progress_status",
           "TimingHistory", "new_incidents", "recovered", "unix_time"]


def accounting(status: model.DDPJobStatus) -> tuple[object, ...]:
    """The status fields that must be on record before the actions they cause: charged incidents,
    generations, rank counters, and the start time (a resume's deadline and its one event)."""
    return (status.restarts, status.disruptions, status.generation, status.start_time,
            tuple((r.index, r.restarts) for r in status.ranks))


def decide(job: JobView, observed: Observed, options: Options = Options()) -> Decision:
    plan = Plan(job, spares.with_promoted(job.status, observed), options)
    if job.deleting:
        return Decision(status=job.status)  # ownerReferences garbage-collect the children
    spares.forget_vanished(plan)
    if job.spec is not None:
        refuse_foreign_world_size(plan, job.spec)  # such reports are not progress
    record_progress(plan)
    if job.spec is None:
        invalid_spec(plan)
    elif job.status.phase in TERMINAL_PHASES:
        finished(plan, job.spec)
    elif job.spec.run_policy.suspend:
        _prepare(plan)
        checkpoint_volume(plan, job.spec)
        suspend(plan, job.spec)
    else:
        _prepare(plan)
        checkpoint_volume(plan, job.spec)
        _active(plan, job.spec)
        not_reporting(plan, job.spec)
        avoid_nodes(plan)
    if job.spec is not None:
        degraded(plan, job.spec)  # the reports' world: the condition, worldSize, and no Running while none trains
    spares.keep_pool(plan, job.spec)
    follow_recovery(plan)  # last: it reads what every concern recorded and did in this pass
    return _finish(plan)


def _prepare(plan: Plan) -> None:
    status = plan.status
    status.selector = naming.selector_string(naming.worker_selector(plan.job.name))
    status.observed_generation = plan.job.metadata_generation
    # The highest generation seen wins: pods may be ahead of a status write that was lost.
    status.generation = max([status.generation] + [w.generation for w in plan.observed.workers])
    status.conditions = [c for c in status.conditions if c.type != CONDITION_SPEC_REJECTED]


def _active(plan: Plan, spec: model.DDPJobSpec) -> None:
    status = plan.status
    if status.phase == "Suspended":
        plan.event("Normal", REASON_RESUMED, "resumed: recreating workers; training continues from the "
                                             "last checkpoint")
        status.start_time = None  # like a Job: the deadline counts from the resume
    if status.start_time is None:
        status.start_time = rfc3339(plan.now)  # written before the workers it starts (see accounting)
    # Success first: a finished rendezvous is closed, nothing may join it any more. Then what ends
    # the job, then what moves it to a fresh generation, then the incident, then a stalled step (hang
    # detection, decisions/progress.py), then a straggler (decisions/stragglers.py), then the desired pods.
    # Failures that blame a node are noted first, while their pods are still observed (decisions/nodes.py).
    record_node_failures(plan, spec)
    for step in (succeeded, deadline_passed, rejected, cannot_start, account_incident, store_lost, resized, stalled,
                 detect_stragglers):
        if step(plan, spec):
            return
    replace_and_create(plan, spec)


def _finish(plan: Plan) -> Decision:
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


def _dedupe(actions: list) -> list:
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
