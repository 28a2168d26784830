"""Warm spares (failurePolicy.spares): a pool of pods that imported torch and wait outside every
rendezvous. When an incident replaces workers in place (restartScope Pod), a ready spare takes a lost
rank's place in the next generation at once: the status names it as the rank's pod (`ranks[i].pod`,
`.uid`, `.generation`), which is also what its launcher is told when it asks for its assignment. From
then on it is that rank's worker in every respect; the pool is refilled in the background. Spares are
named by slot (`<job>-spare-<k>`, the lowest k no pod of the job holds), so a create repeated before
its pod is seen is the same name (409: done), never a second spare.

A spare is ready (counted in readySpares, eligible for promotion) only while its pod runs with its Ready
condition True: its readiness probe passes once its launcher imported what a worker imports and got a valid
answer from the operator's assignment route (job_manifests.spare_pod; locally the runner checks the same mark).
A spare that merely started, or can never reach the operator (a NetworkPolicy, a CA it cannot verify), is
not ready: a lost rank gets a worker pod instead.

A promoted spare has a bounded time to take its place (`release_untaken`): one that is never seen training
as its rank's worker (it cannot reach the operator for its assignment, its launcher hangs, it never joins
the rendezvous) would hold the rank forever while its peers wait for it. The evidence that it took its
place is the trainer's progress reports: a report from its rank in a generation it serves (locally, where
reports carry no rank, the job's reports in such a generation). The SpareTakingOver condition keeps what
was seen across operator restarts (the reports it saw are in its memory only): True from the promotion
(its lastTransitionTime starts the clock) until the spare is seen training or is released. Jobs whose
trainer reports no progress are never judged: nothing would tell a spare that trains from one that hangs."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from .. import model, naming
from .common import Plan, condition, parse_time, promoted_to, set_condition, set_phase, short_message
from .types import (MISSING, REASON_SPARE_EXITED, REASON_SPARE_SURPLUS, REASON_SPARE_TAKES_OVER, TERMINAL_PHASES,
                    CreateSpare, DeleteWorker, Observed, ProgressObservation, WorkerObservation)

# True from the pass that gives spares lost ranks' places until each is seen training there (False,
# SpareJoined), is released by the bound (False, SpareAbandoned), or left its place otherwise (False,
# SpareReleased: it failed, vanished, or the job moved on without it).
CONDITION_SPARE_TAKING_OVER = "SpareTakingOver"
REASON_SPARE_JOINED = "SpareJoined"
REASON_SPARE_ABANDONED = "SpareAbandoned"  # also the promoted rank's lastReason, its Event and its pod's deletion
REASON_SPARE_RELEASED = "SpareReleased"


def with_promoted(status: model.DDPJobStatus, observed: Observed) -> Observed:
    """Spares the status names as a rank's pod become that rank's workers (attempt: the rank's count)."""
    ranks = {r.uid: r for r in status.ranks if r.uid is not None}
    promoted, idle = [], []
    for spare in observed.spares:
        rank = ranks.get(spare.uid)
        if rank is not None and rank.pod == spare.name:
            promoted.append(dataclasses.replace(spare, index=rank.index, attempt=rank.restarts))
        else:
            idle.append(spare)
    if not promoted:
        return observed
    workers = sorted((*observed.workers, *promoted), key=lambda w: (w.index, w.generation))
    return dataclasses.replace(observed, workers=tuple(workers), spares=tuple(idle))


def forget_vanished(plan: Plan) -> None:
    """A spare promoted in a pass whose pod then vanished before it was ever seen as the rank's worker:
    the rank is free again (a worker is created for it). Then the bound on a promoted spare that never
    took its place (release_untaken)."""
    seen = {w.uid for w in plan.observed.workers} | {s.uid for s in plan.observed.spares}
    for rank in plan.status.ranks:
        if promoted_to(rank, plan.job.name) and rank.uid not in seen:
            plan.release(rank.index)
    release_untaken(plan)


def reports_progress(status: model.DDPJobStatus) -> bool:
    """The job's trainer reports progress (some report reached the status): only then can a spare be
    seen training."""
    return status.progress is not None and status.progress.updated_time is not None


def promoted_into(status: model.DDPJobStatus, index: int) -> int | None:
    """The generation the spare holding rank `index` was given its place in: the one after the newest
    incident the rank was part of (a later incident with the rank in it would have released the spare)."""
    incident = next((i for i in reversed(status.incidents) if index in i.ranks), None)
    return incident.generation + 1 if incident is not None else None


def took_place(progress: ProgressObservation | None, index: int, generation: int) -> bool:
    """Seen training as worker `index` in `generation` or later: a report of its own (the operator
    attributes a promoted spare's reports to its rank), or, where reports carry no rank (local runs), the
    job's."""
    if progress is None:
        return False
    if progress.ranks:
        return any(r.index == index and r.generation >= generation for r in progress.ranks)
    return progress.generation >= generation


def _settle_condition(plan: Plan, reason: str, message: str) -> None:
    plan.status.conditions = set_condition(plan.status.conditions, CONDITION_SPARE_TAKING_OVER, "False", reason,
                                           message, plan.now, plan.job.metadata_generation)


def release_untaken(plan: Plan) -> None:
    """A promoted spare not seen training in its place within Options.cannot_start_seconds of its promotion
    (counted from when every other rank's pod of the generation runs: until then the group cannot form
    anyway) is released: its pod is force-deleted, its rank records SpareAbandoned and gets a
    `<job>-worker-<i>` pod in the same generation, part of the incident that promoted it (never charged
    again, no new generation: the survivors still wait for that one). Pure."""
    spec, status = plan.job.spec, plan.status
    held = condition(status, CONDITION_SPARE_TAKING_OVER)
    if spec is None or held is None or held.status != "True" or status.phase in TERMINAL_PHASES \
            or spec.run_policy.suspend:
        return
    # Ranks past a scale-down are not judged here: the resize replaces them.
    promoted = {r.index: promoted_into(status, r.index) for r in status.ranks
                if r.index < spec.replicas and promoted_to(r, plan.job.name)}
    promoted = {i: g for i, g in sorted(promoted.items()) if g is not None}
    # Every promoted spare not seen training since its promotion, an earlier one still waiting included. (One
    # that trained long ago and has not reported to this operator process since it started is judged with the
    # others: released only if no spare's generation trains within the bound, when it costs one pod, no charge.)
    waiting = [i for i, g in promoted.items() if not took_place(plan.observed.progress, i, g)]
    if not waiting:
        if promoted:
            _settle_condition(plan, REASON_SPARE_JOINED, "; ".join(
                f"the spare in worker {i}'s place trains in rendezvous generation {g}" for i, g in promoted.items()))
        else:
            _settle_condition(plan, REASON_SPARE_RELEASED, "no spare waits to take a place (it failed, vanished, "
                                                           "or the job moved on without it)")
        return
    current = {w.index: w for w in plan.current() if w.index < spec.replicas}
    if any(current.get(i) is None or not current[i].live or current[i].phase != "Running"
           for i in range(spec.replicas)):
        return  # a rank has no running pod (a spare that exited is an incident): the group cannot form yet
    since = parse_time(held.last_transition_time) or plan.now
    since = max([since] + [current[i].started_at for i in range(spec.replicas)
                           if i not in waiting and current[i].started_at is not None])
    limit = plan.options.cannot_start_seconds
    deadline = since + timedelta(seconds=limit)
    if plan.now < deadline:
        plan.wake_at(deadline)
        return
    gone = []
    for i in waiting:
        spare = current[i]
        message = (f"spare {spare.name} was given the place of worker {i} in rendezvous generation {promoted[i]} and "
                   f"was not seen training there within {limit:g}s (it cannot fetch its assignment or join the "
                   f"rendezvous, or it hangs): it is removed and worker {i} gets a new pod in the same generation, "
                   f"part of the same incident (not charged again)")
        rank = plan.rank(i)
        rank.restarts += 1  # replaced again: on record before the pod calls (decisions.accounting)
        rank.last_exit_code, rank.last_reason, rank.last_message = None, REASON_SPARE_ABANDONED, short_message(message)
        plan.release(i)
        rank.phase = MISSING  # released by the operator, not lost behind its back
        plan.act(DeleteWorker(spare.name, REASON_SPARE_ABANDONED, force=True))
        plan.event("Warning", REASON_SPARE_ABANDONED, message)
        gone.append(dataclasses.replace(spare, index=-1, terminating_since=plan.now))
    # Being deleted: no longer the rank's worker, and never an idle spare again.
    names = {s.name for s in gone}
    plan.observed = dataclasses.replace(plan.observed,
                                        workers=tuple(w for w in plan.observed.workers if w.name not in names),
                                        spares=(*plan.observed.spares, *gone))
    _settle_condition(plan, REASON_SPARE_ABANDONED, "; ".join(s.name for s in gone) + " released: not seen "
                      f"training within {limit:g}s of taking a place")
    set_phase(plan, "Restarting", REASON_SPARE_ABANDONED,
              f"replacing the spare{'s' if len(gone) > 1 else ''} that did not take worker "
              f"{', '.join(str(i) for i in waiting)}'s place")


def is_ready(spare: WorkerObservation) -> bool:
    """Warm and able to take a place: its pod runs, is not being deleted, and is Ready (its probe passed)."""
    return spare.live and spare.phase == "Running" and spare.ready


def _idle(plan: Plan) -> list[WorkerObservation]:
    taken = {r.uid for r in plan.status.ranks if r.uid is not None}
    return [s for s in plan.observed.spares if s.uid not in taken]


def promote(plan: Plan, indices: list[int]) -> list[int]:
    """Ready idle spares take the places of `indices` in the generation in use; returns those taken."""
    if not plan.options.spares_enabled:
        return []
    ready = sorted((s for s in _idle(plan) if is_ready(s)), key=lambda s: s.name)
    taken = []
    for index, spare in zip(sorted(indices), ready):
        rank = plan.rank(index)
        rank.pod, rank.uid, rank.generation = spare.name, spare.uid, plan.status.generation
        taken.append(index)
    if taken and reports_progress(plan.status):
        # The bound's clock starts now (release_untaken), also for an earlier spare still waiting.
        others = [c for c in plan.status.conditions if c.type != CONDITION_SPARE_TAKING_OVER]
        plan.status.conditions = set_condition(
            others, CONDITION_SPARE_TAKING_OVER, "True", REASON_SPARE_TAKES_OVER,
            "; ".join(f"spare {plan.rank(i).pod} takes the place of worker {i}" for i in taken)
            + f" in rendezvous generation {plan.status.generation}; not seen training there yet",
            plan.now, plan.job.metadata_generation)
    return taken


def keep_pool(plan: Plan, spec: model.DDPJobSpec | None) -> None:
    """Keep failurePolicy.spares idle spares (none once the job is finished, suspended or has no spec)."""
    status = plan.status
    wanted = 0
    if spec is not None and plan.options.spares_enabled and status.phase not in ("Succeeded", "Failed") \
            and not spec.run_policy.suspend:
        wanted = spec.failure_policy.spares
    usable = []
    for spare in sorted(_idle(plan), key=lambda s: s.name):
        if spare.terminating_since is not None:
            continue
        if spare.exited:
            plan.act(DeleteWorker(spare.name, REASON_SPARE_EXITED, force=True))
        elif len(usable) < wanted:
            usable.append(spare)
        else:
            plan.act(DeleteWorker(spare.name, REASON_SPARE_SURPLUS))
    held = {s.name for s in plan.observed.spares} | {w.name for w in plan.observed.workers} | \
        {r.pod for r in status.ranks}
    slot = 0
    for _ in range(wanted - len(usable)):
        while naming.spare_name(plan.job.name, slot) in held:
            slot += 1
        held.add(naming.spare_name(plan.job.name, slot))
        plan.act(CreateSpare(slot, status.generation))
    status.spares = [model.SpareStatus(pod=s.name, phase=s.phase, ready=is_ready(s), node=s.node) for s in usable]
    status.ready_spares = sum(1 for s in status.spares if s.ready)
