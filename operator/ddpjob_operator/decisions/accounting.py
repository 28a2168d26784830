"""Failure accounting: exited and lost workers -> incidents -> at most one charge each.

An *incident* is the first failure or disruption of a generation together with every exit it causes
(a dead peer makes every survivor's trainer fail on its next collective, and with `--max-restarts=0`
their agents exit too). It is charged once, by its cause:

- any member disrupted (eviction, preemption, node loss, a deletion the operator did not ask for)
  -> a disruption: `status.disruptions` + 1, never the budget;
- else any member failed retryably (a signal, OOMKilled, `retryableExitCodes`, a failed rendezvous)
  -> `status.restarts` + 1, or the job fails when the budget is spent;
- else any member's own code failed (exit codes 1-127) -> the user's error: the job fails at once,
  nothing charged;
- else (only survivors whose collective failed because a peer did, by the Gloo/NCCL error in their
  termination message, and no cause seen within the settle time: a hung peer, a node lost silently)
  -> charged as retryable; when their collective timed out on a peer still seen Running on a node,
  the settle time is `Options.silent_peer_settle_seconds`: long enough for the node controller to
  declare that node lost (then the peer's eviction makes the incident a disruption);
- a replacement that only met a rendezvous its peers had closed, or that timed out waiting for a
  peer the scheduler cannot place, caused nothing: nothing is charged.

Peers' exits may reach the operator before the exit that caused them (each pod's status comes from
its own kubelet), so an incident that would fail the job, or keep the survivors, waits for the rest
of the generation to exit, at most `Options.incident_settle_seconds` after it began.
"""

from __future__ import annotations

import re
from datetime import timedelta

from .. import model
from ..agent.contract import (CHECKPOINT_VOLUME_EXIT_CODE, CHECKPOINT_VOLUME_PREFIXES, GENERATION_MARK_PATTERN,
                              PEER_FAILURE_PATTERN, REJOIN_FAILED_PREFIX, RENDEZVOUS_CLOSED_MARK,
                              RENDEZVOUS_FAILED_PREFIX)
from .common import Plan, describe_failure, fail, launcher_message, parse_time, record_failure, rfc3339
from .progress import stalled
from .spares import promote
from .types import (CONSEQUENCE, DISRUPTION, MISSING, PEER_FAILURE, PERMANENT, REASON_BUDGET_EXHAUSTED,
                    REASON_GANG_RESTART, REASON_PERMANENT_ERROR, REASON_POD_DELETED, REASON_POD_VANISHED,
                    REASON_CHECKPOINT_VOLUME, REASON_RENDEZVOUS_CLOSED, REASON_REPLACE, REASON_SPARE_TAKES_OVER,
                    REASON_STORE_LOST, REASON_WORKER_DISRUPTED, REASON_WORKER_FAILED,
                    RETRYABLE, FailureClass, WorkerObservation)

CLOSED_ERROR = "RendezvousClosedError"
PEER_FAILURE_TEXT = re.compile(PEER_FAILURE_PATTERN, re.IGNORECASE)
PEER_SILENT_TEXT = re.compile(r"timed out|timeout", re.IGNORECASE)  # Gloo's and NCCL's words for a silent peer
STORE_UNREACHABLE = "RendezvousConnectionError"
GENERATION_MARK = re.compile(GENERATION_MARK_PATTERN)


def rendezvous_failed(message: str | None) -> bool:
    """The launcher's word that torchrun never formed the group (not the trainer's failure)."""
    message = original_failure(message)
    return bool(message) and message.startswith(RENDEZVOUS_FAILED_PREFIX)


def rendezvous_closed(message: str | None) -> bool:
    """The launcher's word that its exit closed the generation's rendezvous for every agent."""
    return bool(message) and message.rstrip().endswith(RENDEZVOUS_CLOSED_MARK)


def original_failure(message: str | None) -> str | None:
    """A survivor that gave up waiting in place says so first: what it exited with comes after."""
    if message and message.startswith(REJOIN_FAILED_PREFIX):
        return message.partition("; ")[2] or message
    return message


def classify_exit(exit_code: int | None, reason: str | None, disruption: bool,
                  policy: model.FailurePolicy, message: str | None = None) -> FailureClass:
    """Which kind of failure one exit is, by the job's exit-code rules (explicit lists win)."""
    message = original_failure(message)
    if disruption:
        return DISRUPTION
    if rendezvous_failed(message) and CLOSED_ERROR in (message or ""):
        return CONSEQUENCE  # it joined a generation its peers had already closed
    if exit_code is not None and exit_code in policy.permanent_exit_codes:
        return PERMANENT
    if exit_code is not None and exit_code in policy.retryable_exit_codes:
        return RETRYABLE
    if checkpoint_volume_failed(exit_code, message):
        return RETRYABLE  # a full or failing checkpoint volume: the infrastructure's, retried within the budget
    if reason == "OOMKilled" or rendezvous_failed(message):
        return RETRYABLE
    if exit_code is None or exit_code >= 128:
        return RETRYABLE  # killed by a signal, or the pod died without a container exit code
    if peer_failed(message):
        return PEER_FAILURE  # its collective failed because another rank did: that rank's exit is the cause
    return PERMANENT  # 1-127: the user's program said no


def checkpoint_volume_failed(exit_code: int | None, message: str | None) -> bool:
    """The trainer runtime's exit for a checkpoint volume that is full or keeps failing reads."""
    return exit_code == CHECKPOINT_VOLUME_EXIT_CODE and any(prefix in (message or "")
                                                             for prefix in CHECKPOINT_VOLUME_PREFIXES)


def peer_failed(message: str | None) -> bool:
    """The trainer's error says a collective failed because of a peer (Gloo/NCCL), not its own bug."""
    return bool(message) and PEER_FAILURE_TEXT.search(message) is not None


def backoff_seconds(incidents: list[model.Incident], backoff: model.Backoff) -> float:
    """Delay before the restart of the newest charged incident is carried out. None after training
    progress (its step beyond the previous charged incident's): a job that trains between failures
    never waits. The k-th charged incident in a row without progress (a crash loop, or a trainer
    that reports no steps) waits initialSeconds x factor^(k-1), at most maxSeconds."""
    charged = [i for i in incidents if i.charged]
    in_a_row = 0
    for newer, older in zip(reversed(charged), [*reversed(charged[:-1]), None]):
        if newer.step is not None and (older is None or older.step is None or newer.step > older.step):
            break
        in_a_row += 1
    if in_a_row == 0:
        return 0.0
    return float(min(backoff.initial_seconds * backoff.factor ** (in_a_row - 1), backoff.max_seconds))


def _member_class(plan: Plan, spec: model.DDPJobSpec, w: WorkerObservation) -> FailureClass:
    if w.terminating_since is not None:
        # The operator never deletes a live worker of the current generation below `replicas`: someone
        # else did (kubectl delete pod, the taint manager), whatever the exit code it then ended with.
        return DISRUPTION
    if rendezvous_failed(w.message) and STORE_UNREACHABLE in (w.message or ""):
        # Its agent lost the rendezvous store, whose own pod status may not have arrived yet: a store
        # loss (or the network to it), never the user's failure.
        return DISRUPTION
    kind = classify_exit(w.exit_code, w.reason, w.disruption, spec.failure_policy, w.message)
    if kind == RETRYABLE and rendezvous_failed(w.message) and _capacity_wait(plan):
        return CONSEQUENCE  # it timed out waiting for a peer the scheduler cannot place: queueing
    return kind


def _capacity_wait(plan: Plan) -> bool:
    store = plan.observed.store
    return any(w.unschedulable is not None for w in plan.observed.workers) or \
        (store is not None and store.unschedulable is not None)


# Exits this close to an incident's first one happened in the same instant (container timestamps have
# whole seconds): two workers killed at once. A survivor that died later, with no word of its own (a
# SIGKILL), may well have trained in the new generation already: that is a new incident.
SAME_INSTANT_SECONDS = 1.0


def _left_behind(plan: Plan, w: WorkerObservation) -> bool:
    """A survivor carried into the generation in use whose exit belongs to the incident that carried it:
    its failure happened in an older generation (the launcher's generation mark), it gave up waiting
    for the new one, or it ended (a SIGKILL leaves no message) in the same instant as that incident."""
    if plan.served_generation(w) == w.generation and w.generation == plan.status.generation:
        return False  # created for this generation: its exits are this generation's
    mark = GENERATION_MARK.search(w.message or "")
    if mark is not None:
        return int(mark.group(1)) < plan.status.generation
    if (w.message or "").startswith(REJOIN_FAILED_PREFIX):
        return True
    carried_by = next((i for i in reversed(plan.status.incidents) if i.generation == plan.status.generation - 1), None)
    began = parse_time(carried_by.time) if carried_by is not None else None
    return began is not None and w.finished_at is not None and \
        w.finished_at <= began + timedelta(seconds=SAME_INSTANT_SECONDS)


def _replace_left_behind(plan: Plan, current: list[WorkerObservation]) -> list[WorkerObservation]:
    """Survivors that died with the incident that carried them: replaced in the generation in use
    (whose round cannot have completed without them), never charged again. The rest is returned."""
    rest = []
    for w in current:
        rank = plan.rank(w.index)
        ended = w.phase == "Failed" or (w.phase != "Succeeded" and w.terminating_since is not None)
        if ended and w.attempt == rank.restarts and _left_behind(plan, w):
            record_failure(plan, w)
            rank.restarts += 1
            plan.release(w.index)
            carried_by = next((i for i in reversed(plan.status.incidents)
                               if i.generation == plan.status.generation - 1), None)
            if carried_by is not None:  # one incident, every rank it took
                carried_by.ranks = sorted({*carried_by.ranks, w.index})
            plan.event("Normal", REASON_RENDEZVOUS_CLOSED,
                       f"{describe_failure(w)}: it ended with the incident of generation "
                       f"{plan.status.generation - 1}; replacing it in generation {plan.status.generation} "
                       f"(not charged again)")
            continue
        rest.append(w)
    return rest


def _members(plan: Plan, spec: model.DDPJobSpec, current: list[WorkerObservation],
             present: set[int]) -> list[tuple[WorkerObservation, FailureClass]]:
    """The exited or lost workers of the generation not accounted for yet (`present`: the indices
    that have a pod in it)."""
    members = []
    for w in current:
        rank = plan.rank(w.index)
        rank.restarts = max(rank.restarts, w.attempt)
        ended = w.phase == "Failed" or (w.phase != "Succeeded" and w.terminating_since is not None)
        if ended and w.attempt == rank.restarts:
            members.append((w, _member_class(plan, spec, w)))
    for index in range(spec.replicas):
        rank = plan.rank(index)
        if index not in present and rank.phase in ("Pending", "Running"):
            # Seen alive, now gone, and the operator never deletes such a pod: force-deleted behind its
            # back (kubectl delete --force, node garbage collection). A disruption.
            gone = WorkerObservation(index=index, name=rank.pod, generation=plan.status.generation, phase=MISSING,
                                     attempt=rank.restarts, reason=REASON_POD_VANISHED, disruption=True)
            members.append((gone, DISRUPTION))
    return members


def _settle_seconds(plan: Plan, cause: FailureClass, members: list[tuple[WorkerObservation, FailureClass]],
                    survivors: list[WorkerObservation]) -> float:
    # Survivors that gave up waiting in place have already waited longer than a node controller's verdict.
    waited = all((w.message or "").startswith(REJOIN_FAILED_PREFIX) for w, _ in members)
    silent_peer = cause == PEER_FAILURE and any(PEER_SILENT_TEXT.search(w.message or "") for w, _ in members) \
        and any(w.node is not None for w in survivors) and not waited
    return plan.options.silent_peer_settle_seconds if silent_peer else plan.options.incident_settle_seconds


def _own_error(members: list[tuple[WorkerObservation, FailureClass]]) -> bool:
    """A permanent exit in the launcher's own words (the trainer's traceback, no peer's error): the user's
    program failed by itself. No exit still on its way can change that verdict, so it fails the job at once;
    a log tail or no message at all (the launcher itself was killed) may hide a kill whose exit is coming."""
    return any(kind == PERMANENT and launcher_message(w.message) for w, kind in members)


def account_incident(plan: Plan, spec: model.DDPJobSpec) -> bool:
    """Charge the generation's open incident once. True when there is nothing more to do in this
    pass: the job failed, or the incident is still gathering the exits it causes."""
    status, policy = plan.status, spec.failure_policy
    current = [w for w in plan.current() if w.index < spec.replicas]
    present = {w.index for w in current}
    current = _replace_left_behind(plan, current)
    members = _members(plan, spec, current, present)
    if not members:
        return False
    classes = {kind for _, kind in members}
    cause = next(k for k in (DISRUPTION, RETRYABLE, PERMANENT, PEER_FAILURE, CONSEQUENCE) if k in classes)
    in_incident = {w.name for w, _ in members}
    survivors = [w for w in current if w.live and w.name not in in_incident]
    gang = policy.restart_scope == "All"
    # restartScope Pod: the survivors keep their pods and join the next generation in place, so they
    # are not waited for; their exits that still follow are left-behind ones (_replace_left_behind).
    store_lost = cause == DISRUPTION and any(STORE_UNREACHABLE in (w.message or "") for w, kind in members
                                             if kind == DISRUPTION)
    in_place = not gang and bool(survivors) and cause in (RETRYABLE, DISRUPTION, CONSEQUENCE) \
        and not store_lost
    finished = [w.finished_at for w, _ in members]
    if survivors and None not in finished and cause in (PERMANENT, PEER_FAILURE) and not _own_error(members):
        # The exit that caused these may still be on its way (a peer's failure reaches the operator
        # after the survivors' own), and survivors may be about to follow.
        settle = _settle_seconds(plan, cause, members, survivors)
        settles = min(finished) + timedelta(seconds=settle)  # type: ignore[type-var]
        if plan.now < settles:
            # Survivors' collectives timed out on a peer: a hang. When the step also stopped for the
            # progress deadline meanwhile, the hang is told as a stall (one story: `Stalled`, its evidence
            # these timeouts); the members are left behind with the generation it ends.
            if cause == PEER_FAILURE and stalled(plan, spec):
                return True
            plan.wake_at(settles)
            return True

    root = min((w for w, kind in members if kind == cause),
               key=lambda w: (w.finished_at or plan.now, w.index))
    if cause == PEER_FAILURE:
        # Only survivors' collective errors, and no cause in sight (a hung peer, a node lost silently):
        # charged like a retryable failure, so a peer that hangs at the same step every time still ends
        # in the budget.
        cause = RETRYABLE
    began = min((t for t in finished if t is not None), default=plan.now)
    others = len(members) - 1
    summary = describe_failure(root) + (f" (and {others} more worker{'s' if others > 1 else ''} of generation "
                                        f"{status.generation} with it)" if others else "")
    charged = cause == RETRYABLE
    budget_spent = charged and status.restarts + 1 > policy.max_restarts
    store_lost = cause == DISRUPTION and STORE_UNREACHABLE in (root.message or "")  # the root's own words
    reason = {DISRUPTION: REASON_STORE_LOST if store_lost else root.reason or REASON_POD_DELETED,
              RETRYABLE: REASON_CHECKPOINT_VOLUME if checkpoint_volume_failed(root.exit_code, root.message)
              else REASON_WORKER_FAILED,
              PERMANENT: REASON_PERMANENT_ERROR, CONSEQUENCE: REASON_RENDEZVOUS_CLOSED}[cause]
    plan.record_incident(model.Incident(
        generation=status.generation, time=rfc3339(began), cause=cause, reason=reason,
        charged=charged and not budget_spent, message=summary, ranks=sorted({w.index for w, _ in members}),
        step=status.progress.step if status.progress else None))
    if cause == PERMANENT:
        fail(plan, spec, REASON_PERMANENT_ERROR,
             f"{summary}: a permanent error by failurePolicy (exit codes 1-127 unless listed in "
             f"retryableExitCodes)", root)
        return True
    if budget_spent:
        fail(plan, spec, REASON_BUDGET_EXHAUSTED,
             f"{summary}; the restart budget failurePolicy.maxRestarts={policy.max_restarts} is spent", root)
        return True

    for w, _ in members:
        record_failure(plan, w)
        plan.rank(w.index).restarts += 1
        plan.release(w.index)
    if charged:
        status.restarts += 1
        plan.event("Warning", REASON_WORKER_FAILED,
                   f"{summary}; restarting (restart {status.restarts} of {policy.max_restarts})")
    elif cause == DISRUPTION:
        status.disruptions += 1
        plan.event("Warning", REASON_WORKER_DISRUPTED,
                   f"{summary}: disrupted ({root.reason or 'deleted'}); replacing it without charging the "
                   f"restart budget")
    else:
        plan.event("Normal", REASON_RENDEZVOUS_CLOSED,
                   f"{summary}: the generation's rendezvous was closed; starting a fresh one (not charged)")

    # Every incident ends its generation's rendezvous (a peer's failure fails every survivor's next
    # collective): the next one has a fresh id.
    status.generation += 1
    if in_place:
        for w in survivors:
            plan.carry(w, status.generation)
        taken = promote(plan, sorted({w.index for w, _ in members if w.index < spec.replicas}))
        if taken:
            plan.event("Normal", REASON_SPARE_TAKES_OVER,
                       "; ".join(f"spare {plan.rank(i).pod} takes the place of worker {i}" for i in taken)
                       + f" in rendezvous generation {status.generation}")
        plan.event("Normal", REASON_REPLACE,
                   f"replacing worker{'s' if len(members) > 1 else ''} "
                   f"{', '.join(str(i) for i in sorted({w.index for w, _ in members}))} in rendezvous generation "
                   f"{status.generation}; {len(survivors)} surviving worker{'s' if len(survivors) > 1 else ''} "
                   f"keep their pods and join it in place")
    else:
        why = ("restartScope All" if gang else "no worker survived" if not survivors
               else "the rendezvous store was lost" if store_lost else "the rendezvous cannot continue")
        plan.event("Normal", REASON_GANG_RESTART,
                   f"restarting all workers in rendezvous generation {status.generation} ({why})")
    return False
