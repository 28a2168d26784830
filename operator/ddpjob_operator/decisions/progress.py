"""Training progress and hang detection: the trainer's reports -> `status.progress`, and a stalled step ->
one charged incident and a fresh generation.

Pure like the rest of the layer: the caller (the operator's progress endpoint, the local runner's
progress.json reader) turns reports into a `ProgressObservation` with its own clock, already rate
limited, so the same observation always gives the same status (no write per reconcile).

A *stall* is `runPolicy.progressDeadlineSeconds` without the step advancing in the generation in use,
counted from that generation's first reported step (loading data and compiling are not hangs). It is
a retryable failure of the whole gang: one incident, reason `Stalled`, charged to the budget once; every
worker is stopped (a hung collective never recovers by itself) and the job moves to a fresh generation,
which resumes from the newest checkpoint. The Stalled condition stays True until a later generation
reports a step again. While the operator refuses the job's reports (its review budget spent, a review
failed) no stall is charged: the deadline counts again from the last refusal.
"""

from __future__ import annotations

from datetime import timedelta

from .. import model
from .common import Plan, condition, fail, parse_time, rfc3339, set_condition, set_phase, update_counts
from .types import (CONDITION_STALLED, REASON_BUDGET_EXHAUSTED, REASON_PROGRESSING, REASON_STALLED, RETRYABLE,
                    TERMINAL_PHASES, DeleteWorker, ProgressObservation)


def format_eta(seconds: float) -> str:
    """12m30s, 2h5m, 3d4h: two units at most, like kubectl's ages."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60}m" if (s % 3600) // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{(s % 86400) // 3600}h" if (s % 86400) // 3600 else f"{s // 86400}d"


def progress_status(p: ProgressObservation, finished: bool) -> model.Progress:
    """The status block for one observation: percent and ETA follow from it alone."""
    percent = eta = None
    if p.total_steps:
        percent = max(0, min(100, (100 * p.step) // p.total_steps))
        left = max(0, p.total_steps - p.step)
        if finished or left == 0:
            eta = None
        elif p.steps_per_second and p.steps_per_second > 0:
            eta = format_eta(left / p.steps_per_second)
    return model.Progress(step=p.step, total_steps=p.total_steps, percent=percent, eta=eta, epoch=p.epoch,
                          loss=p.loss, samples_per_second=p.samples_per_second,
                          last_checkpoint_step=p.last_checkpoint_step, world_size=p.world_size,
                          updated_time=rfc3339(p.updated_at) if p.updated_at else None)


def record_progress(plan: Plan) -> None:
    """status.progress from the newest observation; without one the last written block is kept (also
    after the job ended: the final step, loss and checkpoint stay visible)."""
    p = plan.observed.progress
    if p is None:
        return
    plan.status.progress = progress_status(p, plan.status.phase in TERMINAL_PHASES)


def reports_in_use(plan: Plan, p: ProgressObservation) -> bool:
    """The reports tell of the training in use: of the generation in use, or of an older one whose survivors
    train on in place (elastic in place: they keep the generation they started in while their pods serve the
    next, whose replacement may be Pending for hours). A trainer of an older generation that does not say so is
    one left behind, still stopping."""
    if p.generation == plan.status.generation:
        return True
    carried = any(plan.served_generation(w) > w.generation for w in plan.current() if w.live)
    return p.in_place and p.generation < plan.status.generation and carried


def stalled(plan: Plan, spec: model.DDPJobSpec) -> bool:
    """Hang detection. True when the job was stalled in this pass (restarting or failed)."""
    status, p = plan.status, plan.observed.progress
    if p is None or not reports_in_use(plan, p):
        return False  # nothing reported yet in the generation in use: its clock has not started
    previous = condition(status, CONDITION_STALLED)
    since = parse_time(previous.last_transition_time) if previous is not None else None
    if previous is not None and previous.status == "True" and since is not None and p.last_advance > since:
        status.conditions = set_condition(status.conditions, CONDITION_STALLED, "False", REASON_PROGRESSING,
                                          f"step {p.step} reported in rendezvous generation {p.generation}",
                                          plan.now, plan.job.metadata_generation)
    deadline = spec.run_policy.progress_deadline_seconds
    live = [w for w in plan.current() if w.live and w.index < spec.replicas]
    if deadline is None or status.phase != "Running" or not live:
        return False
    expires = p.last_advance + timedelta(seconds=deadline)
    if p.last_refused is not None:
        # The operator refused (or could not review) reports of this job: their silence is its own, so a
        # full deadline of reports it could take must pass before a stall is charged.
        expires = max(expires, p.last_refused + timedelta(seconds=deadline))
    if plan.now < expires:
        plan.wake_at(expires)
        return False

    silent = silent_ranks(plan, spec, p, deadline)
    if p.ranks:
        who = (f"ranks that stopped reporting: {', '.join(f'worker {i}' for i in silent)}" if silent else
               "every worker still reports, so a collective, the data loader or the step itself hangs")
    else:
        who = "per-worker reports are not available here"
    message = (f"no training progress for {deadline}s (runPolicy.progressDeadlineSeconds): step {p.step} of "
               f"generation {status.generation} last advanced at {rfc3339(p.last_advance)}; {who}")
    policy = spec.failure_policy
    budget_spent = status.restarts + 1 > policy.max_restarts
    plan.record_incident(model.Incident(
        generation=status.generation, time=rfc3339(expires), cause=RETRYABLE, reason=REASON_STALLED,
        charged=not budget_spent, message=message, ranks=silent or sorted(w.index for w in live)))
    status.conditions = set_condition(status.conditions, CONDITION_STALLED, "True", REASON_STALLED, message,
                                      plan.now, plan.job.metadata_generation)
    plan.event("Warning", REASON_STALLED, message)
    if budget_spent:
        fail(plan, spec, REASON_BUDGET_EXHAUSTED,
             f"{message}; the restart budget failurePolicy.maxRestarts={policy.max_restarts} is spent")
        return True
    status.restarts += 1
    status.generation += 1
    for w in plan.observed.workers:
        if w.terminating_since is None and not w.exited:
            plan.act(DeleteWorker(w.name, REASON_STALLED))
    update_counts(plan, spec, [])  # the ranks now belong to the new, still empty generation
    set_phase(plan, "Restarting", REASON_STALLED,
              f"stalled: restarting every worker in rendezvous generation {status.generation} (restart "
              f"{status.restarts} of {policy.max_restarts})")
    return True


def silent_ranks(plan: Plan, spec: model.DDPJobSpec, p: ProgressObservation, deadline: float) -> list[int]:
    """Workers of the generation in use with no report, or none for report_silence_seconds (at most 3/4 of
    the deadline, so a rank that froze when the step stopped is always named)."""
    if not p.ranks:
        return []
    limit = timedelta(seconds=min(plan.options.report_silence_seconds, 0.75 * deadline))
    seen = {r.index: r.last_seen for r in p.ranks if r.generation == p.generation}
    return [i for i in range(spec.replicas) if i not in seen or plan.now - seen[i] > limit]
