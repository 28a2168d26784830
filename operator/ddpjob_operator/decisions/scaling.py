"""Scale in place (failurePolicy.recovery InProcess): `kubectl scale` within minReplicas..maxReplicas adds or
removes ranks while every survivor keeps its pod and its trainer processes. Never charged, no volume read.

A new size is a new rendezvous generation (the trainers' world is its node count x nprocPerNode), but no
survivor is stopped for it: the operator carries every survivor into it (status.ranks[].uid/.generation), and

- scale up: creates the new ranks' pods for it (the indices after the existing ones). Their agents publish
  the generation in the job's store when they start; the survivors' trainers take them in at a step boundary
  (the state by broadcast from a survivor).
- scale down: creates nothing. The survivors' agents learn the generation from the operator (the progress
  endpoint's `generation` route, agent.worker.follow_operator) and publish it; at the next step boundary the
  survivors' trainers move into it, and a departing rank (replica index >= replicas) has no seat there: its
  trainers exit 0. A departing pod is removed once it exited (force: nothing left to stop), or stopped once
  the survivors are seen training in the new generation (nothing it does can reach them any more) or
  Options.cannot_start_seconds after the scale (its trainers never left: a trainer without the protocol).
  Until then it stays out of the rest of the pass: it is neither an old generation to replace (a graceful
  stop of a pod still in the survivors' group would stop them all) nor a reason to say Restarting.

The size the job last ran at is the status's desiredWorldSize / nprocPerNode (written by every pass; else its
highest rank's index + 1):
a pass that grows replicas past it with live survivors scales up; one whose generation holds a live worker at
an index >= replicas scales down. Both are written in the status (generation, carried ranks, one uncharged
incident) before any pod is touched, so a repeated pass does nothing twice.

Pure: the clock is `plan.now`."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from .. import model
from .common import Plan, force_stuck, parse_time, rfc3339
from .spares import took_place
from .types import DeleteWorker, WorkerObservation

REASON_SCALED_IN_PLACE = "ScaledInPlace"  # the incident's cause, its event and a departing pod's deletion


def in_place(spec: model.DDPJobSpec) -> bool:
    return spec.failure_policy.effective_recovery == "InProcess"


def scale_in_place(plan: Plan, spec: model.DDPJobSpec) -> None:
    """Decide an in-place scale when replicas changed, then keep the departing pods out of the pass. The pass
    goes on (generations.replace_and_create creates a scale up's new pods in it)."""
    live = [w for w in plan.current() if w.live]
    # The size the last pass decided (a status from before desiredWorldSize: its ranks; neither: none yet). A
    # lost rank's index is a replacement's to fill, never a scale up's, whatever this pass's incident left live.
    status = plan.job.status
    last = status.desired_world_size // spec.nproc_per_node or max([r.index + 1 for r in status.ranks], default=0)
    before = max([last] + [w.index + 1 for w in live])
    departing = sorted(w.index for w in live if w.index >= spec.replicas)
    joining = list(range(before, spec.replicas)) if last else []
    if live and (departing or joining):
        _new_size(plan, spec, live, before, departing or joining)
    _departures(plan, spec)


def _new_size(plan: Plan, spec: model.DDPJobSpec, live: list[WorkerObservation], before: int,
              ranks: list[int]) -> None:
    status = plan.status
    message = f"scaled in place {before} -> {spec.replicas} workers"
    plan.record_incident(model.Incident(generation=status.generation, time=rfc3339(plan.now),
                                        cause=REASON_SCALED_IN_PLACE, reason=REASON_SCALED_IN_PLACE, charged=False,
                                        message=message, ranks=ranks))
    status.generation += 1
    for w in live:
        if w.index < spec.replicas:
            plan.carry(w, status.generation)
    who = ", ".join(map(str, ranks))
    change = f"workers {who} leave" if ranks[0] >= spec.replicas else f"new workers {who} join"
    plan.event("Normal", REASON_SCALED_IN_PLACE, f"{message} in rendezvous generation {status.generation}: {change}, "
                                                 "the survivors keep their pods and trainer processes (not charged)")


def _departures(plan: Plan, spec: model.DDPJobSpec) -> None:
    """Pods at an index >= replicas left in an older generation: each removed when it may go, and out of
    the rest of this pass either way."""
    status = plan.status
    departing = [w for w in plan.observed.workers
                 if w.index >= spec.replicas and plan.served_generation(w) < status.generation]
    if not departing:
        return
    scaled = next((i for i in reversed(status.incidents) if i.cause == REASON_SCALED_IN_PLACE), None)
    since = (parse_time(scaled.time) if scaled is not None else None) or plan.now
    deadline = since + timedelta(seconds=plan.options.cannot_start_seconds)
    moved = any(took_place(plan.observed.progress, i, status.generation) for i in range(spec.replicas))
    for w in departing:
        if w.terminating_since is not None:
            continue  # being stopped (force_stuck's bound, below)
        if w.exited:
            plan.act(DeleteWorker(w.name, REASON_SCALED_IN_PLACE, force=True))
        elif moved or plan.now >= deadline:
            plan.act(DeleteWorker(w.name, REASON_SCALED_IN_PLACE))
        else:
            plan.wake_at(deadline)
    force_stuck(plan)  # before they leave the observation: a departing pod stuck Terminating is forced too
    names = {w.name for w in departing}
    plan.observed = dataclasses.replace(plan.observed,
                                        workers=tuple(w for w in plan.observed.workers if w.name not in names))
