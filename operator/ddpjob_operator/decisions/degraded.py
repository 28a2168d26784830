"""Training short (issue 36, elastic in place): what rank 0's reports say about the world it trains in ->
condition `Degraded`, `status.worldSize` and `status.desiredWorldSize`, and a phase that never says Running
while nobody trains.

After a lost rank the survivors train on at once in a short view while the operator replaces the pod; the
replacement joins them live later. Rank 0 reports `desired_world_size`, `world_size` (ranks training),
`missing_ranks` and `short_since`, and `waiting_for_ranks` while below minReplicas and not training:

- short: `Degraded` True, reason TrainingShort, naming how many ranks train, which are missing, since when and
  why (the missing worker's pod as the operator sees it: Pending and unschedulable, waiting on its image, ...);
- waiting: `Degraded` True, reason WaitingForRanks, and the phase is not Running (Restarting, or Pending before
  the job ever ran);
- whole again: `Degraded` False, reason Whole; the job ended or was suspended: False, reason NotTraining.

A condition never raised is not added, and each is written only when it changes (set_condition keeps its
lastTransitionTime), with one Normal event (its reason and message) when its status or reason changes. Reports that say nothing of the world (an older runtime) leave all of it as it was.
"""

from __future__ import annotations

from .. import model, naming
from .common import Plan, condition, rfc3339, set_condition, set_phase, short_message
from .progress import reports_in_use
from .types import (CONDITION_DEGRADED, REASON_NOT_TRAINING, REASON_TRAINING_SHORT, REASON_WAITING_FOR_RANKS,
                    REASON_WHOLE, TERMINAL_PHASES, ProgressObservation, WorkerObservation)

MAX_NAMED = 8  # missing ranks named in the message; more are counted


def degraded(plan: Plan, spec: model.DDPJobSpec) -> None:
    """After every concern decided the phase and the pods of this pass (the reports may overrule its Running)."""
    status, p = plan.status, plan.observed.progress
    status.desired_world_size = spec.replicas * spec.nproc_per_node
    if status.phase in TERMINAL_PHASES or status.phase == "Suspended":
        _set(plan, "False", REASON_NOT_TRAINING, f"the job is {status.phase}: no ranks train", only_if_raised=True)
        return
    if p is None or p.desired_world_size is None or not reports_in_use(plan, p):
        return  # the trainer says nothing of its world, or nothing of the training in use
    if p.waiting_for_ranks:
        # No group while waiting (every rank counts as missing): the operator's pods say who is not there.
        since = f" since {rfc3339(p.short_since)}" if p.short_since is not None else ""
        message = (f"not training: waiting for {p.waiting_for_ranks} more rank{'s' if p.waiting_for_ranks > 1 else ''}"
                   f" to reach minReplicas={spec.min_nodes}{since}{_absent(plan, spec)}")
        _set(plan, "True", REASON_WAITING_FOR_RANKS, message)
        status.world_size = 0
        if status.phase == "Running":
            # Pods may all run while their trainers wait (a replacement still building its trainer).
            set_phase(plan, "Pending" if plan.job.status.phase in (None, "Pending") else "Restarting",
                      REASON_WAITING_FOR_RANKS, message)
        return
    if p.world_size is None:
        return
    if status.phase == "Running":
        status.world_size = p.world_size  # ranks training, not pods running: a replacement may run unjoined
    if p.missing_ranks or p.world_size < p.desired_world_size:
        _set(plan, "True", REASON_TRAINING_SHORT,
             f"{p.world_size} of {p.desired_world_size} ranks training{_missing(plan, spec, p)}")
    else:
        _set(plan, "False", REASON_WHOLE, f"all {p.desired_world_size} ranks training", only_if_raised=True)


def _set(plan: Plan, value: str, reason: str, message: str, only_if_raised: bool = False) -> None:
    """The condition, with one Normal event when its status or reason changes (not for each new detail)."""
    previous = condition(plan.status, CONDITION_DEGRADED)
    if only_if_raised and (previous is None or previous.status != "True"):
        return  # never degraded, or already told
    message = short_message(message) or reason
    if previous is not None and (previous.status, previous.reason, previous.message) == (value, reason, message):
        return
    if previous is None or (previous.status, previous.reason) != (value, reason):
        plan.event("Normal", reason, message)
    plan.status.conditions = set_condition(plan.status.conditions, CONDITION_DEGRADED, value, reason, message,
                                           plan.now, plan.job.metadata_generation)


def _missing(plan: Plan, spec: model.DDPJobSpec, p: ProgressObservation) -> str:
    """'; missing rank 2 (worker 2) since <time>: <why>' from the reported ranks and the operator's pods."""
    if not p.missing_ranks:
        return ""
    ranks = p.missing_ranks
    named = ", ".join(f"{r} (worker {r // spec.nproc_per_node})" for r in ranks[:MAX_NAMED])
    more = f" and {len(ranks) - MAX_NAMED} more" if len(ranks) > MAX_NAMED else ""
    since = f" since {rfc3339(p.short_since)}" if p.short_since is not None else ""
    workers = sorted({r // spec.nproc_per_node for r in ranks})
    return f"; missing rank{'s' if len(ranks) > 1 else ''} {named}{more}{since}: {_whys(plan, spec, workers)}"


def _absent(plan: Plan, spec: model.DDPJobSpec) -> str:
    """': <why>' for each worker without a running pod in the generation in use."""
    running = {w.index for w in plan.current() if w.live and w.phase == "Running"}
    absent = [i for i in range(spec.replicas) if i not in running]
    return f": {_whys(plan, spec, absent)}" if absent else ": every worker's pod runs; a trainer has not joined yet"


def _whys(plan: Plan, spec: model.DDPJobSpec, workers: list[int]) -> str:
    """Why these workers do not train: one worker's reason, or each one's named."""
    current = {w.index: w for w in plan.current()}
    whys = [_why(plan, i, current.get(i)) if i < spec.replicas else f"beyond spec.replicas={spec.replicas}"
            for i in workers[:MAX_NAMED]]
    return whys[0] if len(workers) == 1 else "; ".join(f"worker {i}: {w}" for i, w in zip(workers, whys))


def _why(plan: Plan, index: int, w: WorkerObservation | None) -> str:
    """Why worker `index` does not train, as its pod of the generation in use shows it."""
    if w is None:
        return f"its replacement pod {naming.worker_name(plan.job.name, index)} is being created"
    pod = f"its {'replacement ' if w.attempt else ''}pod {w.name}"
    if w.exited or w.terminating_since is not None:
        return f"{pod} is {w.phase if w.exited else 'Terminating'}; its replacement follows"
    if w.unschedulable is not None:
        return f"{pod} is Pending: {short_message(w.unschedulable.message) or w.unschedulable.reason}"
    if w.waiting is not None:
        detail = short_message(w.waiting.message)
        return f"{pod} is {w.phase}: {w.waiting.reason}" + (f" ({detail})" if detail else "")
    if w.phase == "Running":
        return f"{pod} is Running; its trainer has not joined yet"
    return f"{pod} is {w.phase}"
