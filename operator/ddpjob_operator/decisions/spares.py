"""Warm spares (failurePolicy.spares): a pool of pods that imported torch and wait outside every
rendezvous. When an incident replaces workers in place (restartScope Pod), a ready spare takes a lost
rank's place in the next generation at once: the status names it as the rank's pod (`ranks[i].pod`,
`.uid`, `.generation`), which is also what its launcher is told when it asks for its assignment. From
then on it is that rank's worker in every respect; the pool is refilled in the background. Spares are
named by slot (`<job>-spare-<k>`, the lowest k no pod of the job holds), so a create repeated before
its pod is seen is the same name (409: done), never a second spare."""

from __future__ import annotations

import dataclasses

from .. import builders, model
from .common import Plan, promoted_to
from .types import (REASON_SPARE_EXITED, REASON_SPARE_SURPLUS, CreateSpare, DeleteWorker, Observed,
                    WorkerObservation)


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
    the rank is free again (a worker is created for it)."""
    seen = {w.uid for w in plan.observed.workers} | {s.uid for s in plan.observed.spares}
    for rank in plan.status.ranks:
        if promoted_to(rank, plan.job.name) and rank.uid not in seen:
            plan.release(rank.index)


def _idle(plan: Plan) -> list[WorkerObservation]:
    taken = {r.uid for r in plan.status.ranks if r.uid is not None}
    return [s for s in plan.observed.spares if s.uid not in taken]


def promote(plan: Plan, indices: list[int]) -> list[int]:
    """Ready idle spares take the places of `indices` in the generation in use; returns those taken."""
    if not plan.options.spares_enabled:
        return []
    ready = sorted((s for s in _idle(plan) if s.live and s.phase == "Running" and s.ready), key=lambda s: s.name)
    taken = []
    for index, spare in zip(sorted(indices), ready):
        rank = plan.rank(index)
        rank.pod, rank.uid, rank.generation = spare.name, spare.uid, plan.status.generation
        taken.append(index)
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
        while builders.spare_name(plan.job.name, slot) in held:
            slot += 1
        held.add(builders.spare_name(plan.job.name, slot))
        plan.act(CreateSpare(slot, status.generation))
    status.spares = [model.SpareStatus(pod=s.name, phase=s.phase, ready=s.ready and s.phase == "Running", node=s.node)
                     for s in usable]
    status.ready_spares = sum(1 for s in status.spares if s.ready)
