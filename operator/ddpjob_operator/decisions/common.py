"""Pure helpers shared by the decision concerns: time, conditions, messages, the per-call plan, and
the phase/terminal/cleanup steps every concern ends with."""

from __future__ import annotations

import re
import signal
from datetime import datetime, timedelta, timezone
from typing import Literal

from .. import model, naming
from ..agent.contract import GENERATION_MARK_PATTERN, RENDEZVOUS_CLOSED_MARK
from .types import (INCIDENT_HISTORY, MISSING, NODE_LOST_REASONS, Action, DeleteJob, DeleteStore, DeleteWorker, Event, JobView,
                    Observed, Options, REASON_CLEANUP, REASON_STUCK_TERMINATING, WorkerObservation)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


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


def condition(status: model.DDPJobStatus, type_: str) -> model.Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


# Termination messages (and the server's refusals) go into conditions, Events, the rank status and the local
# summary as one line: its cause and any log tail within MESSAGE_LIMIT characters, its fix on top, whole.
MESSAGE_LIMIT = 300
FIX_LIMIT = 300  # a "fix" longer than this is no sentence (a log tail runs on after it): its middle goes too
_CUT = " ... "
_FIX = re.compile(r"\b[Ff]ix: ")
_MARKS = re.compile(r"(?: \[generation \d{1,12}\])?(?: " + re.escape(RENDEZVOUS_CLOSED_MARK) + ")?$")


def short_message(text: str | None) -> str | None:
    """One line that keeps what a reader acts on. A message is its cause, maybe a fix (from the last "Fix: " to
    the end) and the launcher's marks (" [generation N] [rendezvous closed]"); or a log tail (the kubelet's
    FallbackToLogsOnError), whose last words say the most. What gives way is the middle of what comes before
    the fix, cut to MESSAGE_LIMIT with the marks (its start names the failure, its end holds the words just
    before the fix, or the tail's last ones); the fix and the marks stay whole."""
    line = " ".join((text or "").split())
    if len(line) <= MESSAGE_LIMIT:
        return line or None
    marks = _MARKS.search(line)
    assert marks is not None  # every part of the pattern is optional: it matches at the end of any line
    body, end = line[:marks.start()], line[marks.start():]
    fixes = list(_FIX.finditer(body))
    head, fix = (body[:fixes[-1].start()].rstrip(), body[fixes[-1].start():]) if fixes else (body, "")
    head = _cut_middle(head, MESSAGE_LIMIT - len(end))
    return " ".join(part for part in (head, _cut_middle(fix, FIX_LIMIT)) if part) + end


def _cut_middle(text: str, limit: int) -> str:
    """At most `limit` characters of `text`: its start and its end, with " ... " for what was between."""
    if len(text) <= limit:
        return text
    half = max(limit - len(_CUT), 2) // 2
    return f"{text[:half]}{_CUT}{text[-half:]}"


_LAUNCHER_MARK = re.compile(GENERATION_MARK_PATTERN + "|" + re.escape(RENDEZVOUS_CLOSED_MARK))


def launcher_message(message: str | None) -> bool:
    """The launcher's own termination message (every one ends with its marks), not the log tail the kubelet
    puts there when it wrote none (FallbackToLogsOnError)."""
    return bool(message) and _LAUNCHER_MARK.search(message) is not None


def killed(w: WorkerObservation) -> str | None:
    """What explains an exit that the launcher could not tell (it was killed itself): the kernel's OOM kill,
    a signal (exit code 128+N); None for any other exit."""
    how = None
    if w.exit_code is not None and 128 < w.exit_code < 128 + signal.NSIG:
        number = w.exit_code - 128
        try:
            how = f"killed by signal {number} ({signal.Signals(number).name})"
        except ValueError:
            how = f"killed by signal {number}"
    if w.reason == "OOMKilled":  # the kubelet's word for the kernel's OOM kill
        return "out of memory" + (f": {how}" if how else "")
    return how


def describe_failure(w: WorkerObservation) -> str:
    if w.exit_code is None and not w.exited:
        # Deleted or lost before it exited (its exit code, if any, was never seen).
        how = f"was deleted ({w.reason})" if w.reason else "was deleted by someone else while running"
        return f"worker {w.index} (pod {w.name}) {how}"
    code = "unknown exit code" if w.exit_code is None else f"exit code {w.exit_code}"
    described = f"worker {w.index} (pod {w.name}) failed with {code}, reason {w.reason or 'unknown'}"
    message = w.message
    explained = None if w.disruption or launcher_message(message) else killed(w)
    if explained:
        # A kill leaves no word of the launcher's: what the kubelet has instead is the log's tail, whose last
        # line (a progress client's warning, say) has nothing to do with the exit. (A disruption's message
        # is the control plane's own, which does.)
        message = explained
    message = short_message(message)
    return f"{described} ({message})" if message else described


class Plan:
    """Mutable scratch state of one decide() call; frozen into a Decision at the end."""

    def __init__(self, job: JobView, observed: Observed, options: Options):
        self.job, self.observed, self.now, self.options = job, observed, observed.now, options
        self.status = job.status.model_copy(deep=True)
        self.actions: list[Action] = []
        self.wakeups: list[float] = []
        self.phase_reason = ""
        self.phase_message = ""
        self.recorded: list[model.Incident] = []  # incidents recorded in this pass (decisions/recovery.py)

    def act(self, action: Action) -> None:
        self.actions.append(action)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.actions.append(Event(type_, reason, message))

    def last_step(self, generation: int, step: int | None) -> int | None:
        """The highest step reported in `generation`, `step` included: each worker's newest report is fresher
        than status.progress, which is published at a bounded rate."""
        p = self.observed.progress
        steps = [step] if step is not None else []
        if p is not None:
            steps += [r.step for r in p.ranks if r.generation == generation]
            steps += [p.step] if p.generation == generation else []
        return max(steps, default=None)

    def wake_at(self, moment: datetime) -> None:
        self.wakeups.append(max(0.0, (moment - self.now).total_seconds()))

    def rank(self, index: int) -> model.RankStatus:
        for entry in self.status.ranks:
            if entry.index == index:
                return entry
        entry = model.RankStatus(index=index, pod=naming.worker_name(self.job.name, index), phase=MISSING)
        self.status.ranks.append(entry)
        return entry

    def served_generation(self, w: WorkerObservation) -> int:
        """The generation a pod serves: the one it was created for, or a later one its rank's survivor
        was carried into (restartScope Pod: the status names the pod by uid)."""
        rank = next((r for r in self.status.ranks if r.index == w.index), None)
        if rank is not None and w.uid is not None and rank.uid == w.uid and rank.generation is not None:
            return max(rank.generation, w.generation)
        return w.generation

    def current(self) -> list[WorkerObservation]:
        """Workers of the generation in use."""
        return [w for w in self.observed.workers if self.served_generation(w) == self.status.generation]

    def carry(self, w: WorkerObservation, generation: int) -> None:
        """A survivor keeps its pod and joins `generation` in place (its agent learns it from the store)."""
        rank = self.rank(w.index)
        rank.uid, rank.generation = w.uid, generation

    def release(self, index: int) -> None:
        """The rank's pod, accounted as ended, serves no generation any more: a carried survivor or a
        promoted spare falls back to the generation of its label (left behind), and is never taken for the
        rank's worker again."""
        rank = self.rank(index)
        rank.uid = rank.generation = None
        rank.pod = naming.worker_name(self.job.name, index)

    def record_incident(self, incident: model.Incident) -> None:
        incident.step = self.last_step(incident.generation, incident.step)
        self.recorded.append(incident)
        self.status.incidents = (self.status.incidents + [incident])[-INCIDENT_HISTORY:]


def incident_key(incident: model.Incident) -> tuple[object, ...]:
    """An incident's identity across status writes (its recovery timeline fills in later)."""
    return (incident.generation, incident.time, incident.cause, incident.reason)


def new_incidents(old: model.DDPJobStatus, new: model.DDPJobStatus) -> list[model.Incident]:
    """The incidents `new` records that `old` (the status it replaces) did not: what the counters count."""
    known = {incident_key(i) for i in old.incidents}
    return [i for i in new.incidents if incident_key(i) not in known]


def promoted_to(rank: model.RankStatus, job_name: str) -> bool:
    """The rank's pod is a spare that took its place (decisions/spares.py: its name is not the rank's own)."""
    return rank.uid is not None and rank.pod != naming.worker_name(job_name, rank.index)


def set_phase(plan: Plan, phase: str, reason: str, message: str) -> None:
    plan.status.phase = phase  # type: ignore[assignment]
    plan.status.message = message
    plan.phase_reason, plan.phase_message = reason, message


def update_counts(plan: Plan, spec: model.DDPJobSpec, current: list[WorkerObservation]) -> None:
    status = plan.status
    live = [w for w in current if w.live]
    status.replicas = len(live)
    status.ready_replicas = sum(1 for w in live if w.ready)
    status.world_size = sum(1 for w in live if w.phase == "Running") * spec.nproc_per_node
    observed = {w.index: w for w in current}
    ranks = []
    for i in sorted(set(range(spec.replicas)) | set(observed)):
        rank, w = plan.rank(i), observed.get(i)
        # A spare promoted in this pass is not among the workers yet: the status keeps naming it.
        spare_pending = w is None and promoted_to(rank, plan.job.name)
        rank.pod = w.name if w else (rank.pod if spare_pending else naming.worker_name(plan.job.name, i))
        rank.phase = MISSING if w is None else ("Terminating" if w.terminating_since else w.phase)
        rank.ready = bool(w and w.ready)
        rank.node = w.node if w else None
        if not spare_pending:
            rank.uid = w.uid if w else None
            rank.generation = plan.served_generation(w) if w else None
        ranks.append(rank)
    status.ranks = ranks


def record_failure(plan: Plan, w: WorkerObservation) -> None:
    rank = plan.rank(w.index)
    rank.last_exit_code = w.exit_code
    rank.last_reason = w.reason
    rank.last_message = short_message(w.message)


def enter_terminal(plan: Plan, phase: str, reason: str, message: str) -> None:
    plan.status.completion_time = plan.status.completion_time or rfc3339(plan.now)
    set_phase(plan, phase, reason, message)
    if plan.job.spec is not None:
        update_counts(plan, plan.job.spec, plan.current())
        ttl(plan, plan.job.spec)


def fail(plan: Plan, spec: model.DDPJobSpec, reason: str, message: str,
         worker: WorkerObservation | None = None) -> None:
    if worker is not None:
        record_failure(plan, worker)
    enter_terminal(plan, "Failed", reason, message)
    cleanup(plan, spec.run_policy.clean_pod_policy)


def cleanup(plan: Plan, clean_pod_policy: str) -> None:
    """Stop pods of a finished job: workers per cleanPodPolicy, the store always."""
    for w in plan.observed.workers:
        if w.terminating_since is not None:
            continue
        if clean_pod_policy == "All" or (clean_pod_policy == "Running" and not w.exited):
            plan.act(DeleteWorker(w.name, REASON_CLEANUP))
    store = plan.observed.store
    if store is not None and store.terminating_since is None:
        plan.act(DeleteStore(REASON_CLEANUP))


def ttl(plan: Plan, spec: model.DDPJobSpec) -> None:
    seconds = spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(plan.status.completion_time)
    if seconds is None or finished is None:
        return
    expires = finished + timedelta(seconds=seconds)
    if plan.now >= expires:
        plan.act(DeleteJob(f"ttlSecondsAfterFinished={seconds} passed since completion"))
    else:
        plan.wake_at(expires)


def force_stuck(plan: Plan) -> None:
    """Pods stuck Terminating (unreachable node) are force-deleted after the configured timeout."""
    limit = timedelta(seconds=plan.options.stuck_terminating_seconds)

    def counted_from(terminating_since: datetime, reason: str | None, ready: bool) -> datetime:
        # Evicted by the taint manager and not Ready: its node stopped answering, no kubelet will confirm,
        # so nothing is gained by waiting (the taint manager also evicts from healthy nodes with a
        # NoExecute maintenance taint, where the kubelet lets the pod stop gracefully).
        return plan.now - limit if reason in NODE_LOST_REASONS and not ready else terminating_since

    stuck: list[tuple[datetime, Action]] = [
        (counted_from(w.terminating_since, w.reason, w.ready),
         DeleteWorker(w.name, REASON_STUCK_TERMINATING, force=True))
        for w in plan.observed.workers if w.terminating_since is not None]
    store = plan.observed.store
    if store is not None and store.terminating_since is not None:
        stuck.append((counted_from(store.terminating_since, store.reason, store.ready),
                      DeleteStore(REASON_STUCK_TERMINATING, force=True)))
    for since, action in stuck:
        if plan.now >= since + limit:
            plan.act(action)
        else:
            plan.wake_at(since + limit)
