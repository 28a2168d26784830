"""Generations: when the job moves to a fresh rendezvous without charging anything (a lost store, a
new node range, a scale down, suspend), and how the pods of the generation in use are brought to
the desired set (replacements after the backoff, old generations removed, missing ranks created)."""

from __future__ import annotations

from datetime import datetime, timedelta

from .. import model, naming
from . import scaling
from .accounting import backoff_seconds
from .common import Plan, force_stuck, promoted_to, rfc3339, set_condition, set_phase, short_message, update_counts
from .types import (CONDITION_UNSCHEDULABLE, DISRUPTION, EXITED, REASON_OLD_GENERATION, REASON_RANGE_CHANGED,
                    REASON_REPLACE, REASON_SCALE_DOWN, REASON_SCALED, REASON_STORE_LOST, REASON_SUSPENDED,
                    REASON_UNSCHEDULABLE, CreateStore, CreateWorker, DeleteStore, DeleteWorker, WorkerObservation)


def _new_generation(plan: Plan, spec: model.DDPJobSpec, reason: str, message: str, *,
                    disruption: bool = False) -> None:
    """Every live worker of the generation in use is stopped gracefully (they checkpoint on SIGTERM);
    new ones start in generation + 1, with a fresh rendezvous id. Never charged."""
    status = plan.status
    plan.record_incident(model.Incident(generation=status.generation, time=rfc3339(plan.now),
                                        cause=DISRUPTION if disruption else reason, reason=reason,
                                        charged=False, message=message,
                                        ranks=sorted(w.index for w in plan.current() if w.live)))
    status.generation += 1
    if disruption:
        status.disruptions += 1
    plan.event("Warning" if disruption else "Normal", reason,
               f"{message}; moving every worker to rendezvous generation {status.generation} (not charged)")
    for w in plan.observed.workers:
        if w.terminating_since is None and not w.exited:
            plan.act(DeleteWorker(w.name, REASON_OLD_GENERATION))
    update_counts(plan, spec, [])  # the ranks now belong to the new, still empty generation
    set_phase(plan, "Restarting", reason, message)


def store_lost(plan: Plan, spec: model.DDPJobSpec) -> bool:
    """A lost store is recreated under its name (the workers reach it through its Service). With in-process
    recovery the workers keep training: a formed process group no longer uses the store, and their agents and
    trainers reconnect to the new one and publish again what it held. Otherwise the rendezvous state is lost
    with it: every worker moves to a fresh generation."""
    store = plan.observed.store
    if store is not None and store.usable:
        return False
    if store is None:
        plan.act(CreateStore())
    elif store.terminating_since is None:
        # An exited store has nothing left to stop: removed at once, so its successor comes in the next pass.
        plan.act(DeleteStore(f"store pod is {store.phase}", force=store.phase in EXITED))
    if not any(w.live and w.phase == "Running" for w in plan.current()):
        # Nobody was using it (a pod not yet Running has no agent to have joined it, e.g. the workers just
        # created for a generation whose store then died): the new store serves the current generation.
        return False
    if spec.failure_policy.effective_recovery == "InProcess":
        if store is None:  # once per loss, however it went: the pass that creates its successor
            plan.event("Normal", REASON_STORE_LOST, "rendezvous store lost; recreating it under its Service: the "
                                                    "workers keep training and meet again there (not charged)")
        return False
    _new_generation(plan, spec, REASON_STORE_LOST,
                    f"rendezvous store lost ({'gone' if store is None else store.phase})", disruption=True)
    force_stuck(plan)  # a store evicted from a lost node: the fresh one need not wait for a confirmation
    return True


def resized(plan: Plan, spec: model.DDPJobSpec) -> bool:
    """Every agent of a generation must agree on `--nnodes` (minReplicas:replicas), and a shrinking gang
    loses its departing peers mid-collective: any new size starts a fresh generation, the old workers
    stopping gracefully (they checkpoint). With in-process recovery the survivors stay (decisions/scaling.py)."""
    if scaling.in_place(spec):
        scaling.scale_in_place(plan, spec)
        return False  # the pass goes on: a scale up's new pods are created in it
    live = [w for w in plan.current() if w.live]
    wanted = naming.node_range(spec)
    if any(w.index >= spec.replicas for w in live):
        _new_generation(plan, spec, REASON_SCALE_DOWN, f"scaling down to {spec.replicas} workers")
        return True
    if any(w.node_range not in (None, wanted) for w in live):
        _new_generation(plan, spec, REASON_RANGE_CHANGED,
                        f"the node range changed to {naming.nnodes(spec)} (minReplicas:replicas)")
        return True
    return False


def suspend(plan: Plan, spec: model.DDPJobSpec) -> None:
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
    force_stuck(plan)
    update_counts(plan, spec, plan.current())
    set_phase(plan, "Suspended", REASON_SUSPENDED,
              "suspended: workers stopped (they checkpoint on SIGTERM); the checkpoint volume is kept")


def _failure_gate(plan: Plan, spec: model.DDPJobSpec, w: WorkerObservation) -> datetime:
    """When a failed pod may be removed (its replacement follows): after the backoff."""
    if w.disruption or w.finished_at is None:
        return plan.now
    return w.finished_at + timedelta(seconds=backoff_seconds(plan.status.incidents, spec.failure_policy.backoff))


def _unschedulable(plan: Plan, current: list[WorkerObservation]) -> str | None:
    waiting = [(f"worker {w.index}", w.unschedulable) for w in current if w.unschedulable is not None]
    store = plan.observed.store
    if store is not None and store.unschedulable is not None:
        waiting.append(("the rendezvous store", store.unschedulable))
    if not waiting:
        return None
    who, wait = waiting[0]
    return f"{who} cannot be scheduled: {short_message(wait.message) or wait.reason}"


def replace_and_create(plan: Plan, spec: model.DDPJobSpec) -> None:
    status, now, generation = plan.status, plan.now, plan.status.generation
    current = plan.current()
    stale = [w for w in plan.observed.workers if plan.served_generation(w) != generation]
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
        elif plan.served_generation(w) != generation:
            plan.act(DeleteWorker(w.name, REASON_OLD_GENERATION, force=w.exited))
            if w.exited:
                freed.add(w.name)
    force_stuck(plan)

    # New workers only once the old generation is entirely gone (a gang never mixes generations
    # and the backoff holds for every rank) and while the store is not being replaced.
    store = plan.observed.store
    store_ready_or_coming = store is None or store.usable
    remaining = [w for w in plan.observed.workers if w.name not in freed]
    if not any(plan.served_generation(w) != generation for w in remaining) and store_ready_or_coming:
        # A spare promoted in this pass holds its rank although it is not among the workers yet.
        occupied = {w.index for w in remaining} | {r.index for r in status.ranks if promoted_to(r, plan.job.name)}
        for i in range(spec.replicas):
            if i not in occupied:
                plan.act(CreateWorker(i, generation, plan.rank(i).restarts))

    old = plan.job.status
    if old.observed_generation not in (None, plan.job.metadata_generation) and old.ranks \
            and len(old.ranks) != spec.replicas:
        plan.event("Normal", REASON_SCALED, f"scaling from {len(old.ranks)} to {spec.replicas} workers")

    update_counts(plan, spec, current)
    waiting_for = _unschedulable(plan, current)
    if waiting_for:
        if (c := next((c for c in status.conditions if c.type == CONDITION_UNSCHEDULABLE), None)) is None \
                or c.message != waiting_for:
            plan.event("Warning", REASON_UNSCHEDULABLE, waiting_for)
        status.conditions = set_condition(status.conditions, CONDITION_UNSCHEDULABLE, "True",
                                          REASON_UNSCHEDULABLE, waiting_for, now, plan.job.metadata_generation)
    else:
        status.conditions = [c for c in status.conditions if c.type != CONDITION_UNSCHEDULABLE]
    running = sum(1 for w in current if w.phase == "Running" and w.live and w.index < spec.replicas)
    suffix = f"; {waiting_for}" if waiting_for else ""
    if restarting:
        set_phase(plan, "Restarting", REASON_REPLACE, "replacing failed or old-generation workers" + suffix)
    elif running >= spec.min_nodes:
        set_phase(plan, "Running", "Running", f"{running} of {spec.replicas} workers running" + suffix)
    elif status.phase == "Restarting":
        set_phase(plan, "Restarting", REASON_REPLACE,
                  f"waiting for minReplicas={spec.min_nodes} workers to run again ({running} running)" + suffix)
    else:
        set_phase(plan, "Pending", "Starting", f"{running} of {spec.replicas} workers running" + suffix)
