"""The recovery timeline of each incident (`status.incidents[].recovery`; docs/operator.md, "Recovery timeline").

Each point is filled in the pass that first sees it and never rewritten, so the status is the record (an
operator restart neither loses nor repeats one):

- failureSeenTime: the pass that records the incident. An incident that ended the job has no recovery.
- replacementTime, spare: the pass whose actions create a worker for a later generation, or give one of the
  incident's lost ranks to a warm spare (spare: true).
- path, fallbackReason, rendezvousTime, firstStepTime, stepsLost: from the trainer's `recovery` report
  (RecoveryReport: rank 0 of the first generation after the incident that sent one). Its times are the
  trainer's clock: one before failureSeenTime - CLOCK_SKEW_SECONDS or after now + CLOCK_SKEW_SECONDS is
  ignored. stepsLost is the step last reported before the incident (Incident.step) minus the step the new
  generation resumed from, at least 0.
- seconds: failureSeenTime to firstStepTime (at least 0), with the one Normal `Recovered` event; the
  operator observes it once in ddpjob_recovery_seconds (`recovered`: the status before and after its write).
- steps (elastic in place): the survivors' regroup without the lost rank (`Shrink`: they train on short at
  once) and the replacement's later `Join`, each once, with rank 0's time and world size, from its `recovery`
  reports of kind Shrink and Join. Those keep the generation the survivors started in (the incident's own, or
  an older one), so they are matched by time: a Shrink to the incident without one, of a generation no older
  than the report's, seen closest to it within the clock bounds of its failure; a Join to the oldest
  incident that shrank before it and has not been joined, else to the newest with no step (a scale up's new
  ranks joining in place). The Shrink is also the incident's recovery (path, rendezvousTime,
  firstStepTime, seconds, stepsLost): training goes on from it.

A second failure during the hand-over (the next generation fails before it trains) leaves the first
incident open: it and the second one are both filled from the generation that finally trains, so each
says how long the job did not train because of it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from .. import model
from ..model.status import RecoveryStep
from .common import Plan, incident_key, parse_time, promoted_to
from .types import REASON_RECOVERED, TERMINAL_PHASES, CreateWorker, RecoveryReport

PATHS = ("InProcess", "Restart")
CLOCK_SKEW_SECONDS = 60.0  # cluster nodes are NTP-synced: a trainer's time further off than this is wrong
FALLBACK_REASON_LIMIT = 512
# The earliest and latest unix times a report may carry (datetime's range, with a day to spare either side).
_UNIX_RANGE = (86400.0, (datetime.max.replace(tzinfo=timezone.utc) - timedelta(days=1)).timestamp())


def unix_time(value: object) -> datetime | None:
    """A trainer's `time.time()` -> an aware datetime; None for anything that is not a plausible one
    (a bool, NaN, infinity, a negative or astronomically large number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if not _UNIX_RANGE[0] <= value <= _UNIX_RANGE[1]:
        return None
    return datetime.fromtimestamp(value, tz=timezone.utc)


def precise_time(moment: datetime) -> str:
    """RFC 3339 with milliseconds: a recovery of a few seconds is measured, not rounded to whole ones."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _time(text: str | None) -> datetime | None:
    try:
        return parse_time(text)
    except ValueError:
        return None  # a status someone edited: that point is unknown, never a failed reconcile


def follow_recovery(plan: Plan) -> None:
    """Fill the timelines this pass can tell (called last, once every concern has acted)."""
    _open(plan)
    _replacements(plan)
    _regroups(plan)
    for incident in plan.status.incidents:
        if incident.recovery is not None:
            _reported(plan, incident, incident.recovery)


def _open(plan: Plan) -> None:
    """Incidents recorded in this pass: their failure is seen now."""
    ended = plan.status.phase in TERMINAL_PHASES
    for incident in plan.recorded:
        if ended:
            incident.recovery = None  # it ended the job: nothing recovers
            continue
        incident.recovery = model.IncidentRecovery(failure_seen_time=precise_time(plan.now))


def _replacements(plan: Plan) -> None:
    """A worker created for a later generation, or a lost rank's place given to a spare in this pass."""
    created = [a.generation for a in plan.actions if isinstance(a, CreateWorker)]
    before = {r.index: r.uid for r in plan.job.status.ranks}
    promoted = {r.index: r.generation for r in plan.status.ranks
                if promoted_to(r, plan.job.name) and r.generation is not None and before.get(r.index) != r.uid}
    for incident in plan.status.incidents:
        recovery = incident.recovery
        if recovery is None or recovery.replacement_time is not None:
            continue
        spare = any(g > incident.generation for i, g in promoted.items() if i in incident.ranks)
        if spare or any(g > incident.generation for g in created):
            recovery.replacement_time, recovery.spare = precise_time(plan.now), spare


def _plausible(plan: Plan, recovery: model.IncidentRecovery, moment: datetime | None) -> bool:
    """A trainer's time within the clock bounds of the incident's failure and the operator's now."""
    seen, skew = _time(recovery.failure_seen_time), timedelta(seconds=CLOCK_SKEW_SECONDS)
    return moment is not None and seen is not None and seen - skew <= moment <= plan.now + skew


def _regroups(plan: Plan) -> None:
    """Shrink and Join reports -> the steps of the incidents they belong to, each report once."""
    p = plan.observed.progress
    reports = sorted((r for r in (p.recoveries if p is not None else ()) if r.kind and r.rendezvous_time),
                     key=lambda r: r.rendezvous_time)  # type: ignore[arg-type, return-value]
    taken = {(s.kind, s.time) for i in plan.status.incidents if i.recovery is not None for s in i.recovery.steps}
    for report in reports:
        assert report.rendezvous_time is not None
        step = RecoveryStep(kind=report.kind, time=precise_time(report.rendezvous_time), world_size=report.world_size)
        if (step.kind, step.time) in taken:
            continue
        incident = _owner(plan, report, step)
        if incident is not None and incident.recovery is not None:
            incident.recovery.steps.append(step)
            taken.add((step.kind, step.time))


def _owner(plan: Plan, report: RecoveryReport, step: RecoveryStep) -> model.Incident | None:
    """The incident a regroup belongs to, among those of a generation no older than the trainers' whose failure
    its time fits: a Shrink to the one without a Shrink whose failure was seen closest to it; a Join to the oldest
    that shrank before it and was not joined, else (a scale up's new ranks) the newest without any step."""
    assert report.rendezvous_time is not None
    moment = report.rendezvous_time
    candidates = [i for i in plan.status.incidents if i.recovery is not None and i.generation >= report.generation
                  and _plausible(plan, i.recovery, moment)]

    def steps(incident: model.Incident) -> dict[str, str]:
        assert incident.recovery is not None
        return {s.kind: s.time for s in incident.recovery.steps}

    if step.kind == "Shrink":
        return min((i for i in candidates if "Shrink" not in steps(i)), default=None,
                   key=lambda i: abs((_time(i.recovery.failure_seen_time) - moment).total_seconds()))  # type: ignore
    shrunk = [i for i in candidates if "Join" not in steps(i) and steps(i).get("Shrink", step.time) < step.time]
    return shrunk[0] if shrunk else next((i for i in reversed(candidates) if not steps(i)), None)


def _shrink_of(plan: Plan, recovery: model.IncidentRecovery) -> RecoveryReport | None:
    """The Shrink report the incident's survivors regrouped in (its step on record), while it is still kept."""
    shrink = next((s.time for s in recovery.steps if s.kind == "Shrink"), None)
    p = plan.observed.progress
    return next((r for r in (p.recoveries if p is not None else ()) if r.kind == "Shrink" and r.rendezvous_time
                 and precise_time(r.rendezvous_time) == shrink), None) if shrink else None


def _report_for(plan: Plan, incident: model.Incident) -> RecoveryReport | None:
    """The Shrink its survivors trained on from, else the first generation after the incident whose rank 0 said
    how it came back."""
    assert incident.recovery is not None
    shrink = _shrink_of(plan, incident.recovery)
    if shrink is not None:
        return shrink if shrink.path in PATHS else None
    p = plan.observed.progress
    later = [r for r in (p.recoveries if p is not None else ()) if r.generation > incident.generation and not r.kind]
    first = min(later, key=lambda r: r.generation, default=None)
    return first if first is not None and first.path in PATHS else None


def _reported(plan: Plan, incident: model.Incident, recovery: model.IncidentRecovery) -> None:
    report = _report_for(plan, incident)
    seen = _time(recovery.failure_seen_time)
    if report is None or seen is None:
        return
    if not recovery.path:
        recovery.path = report.path
        if report.path == "Restart":
            recovery.fallback_reason = " ".join(report.reason.split())[:FALLBACK_REASON_LIMIT]
    if recovery.steps_lost is None and report.path == "InProcess":
        # Every completed step stayed in memory (the survivors', or a peer's by broadcast); the step the operator
        # saw at the failure may be later than the shrink's, the survivors having trained on before it looked.
        recovery.steps_lost = 0
    elif recovery.steps_lost is None and incident.step is not None and report.resumed_step is not None:
        recovery.steps_lost = max(0, incident.step - report.resumed_step)
    skew = timedelta(seconds=CLOCK_SKEW_SECONDS)

    def plausible(moment: datetime | None) -> bool:
        return moment is not None and seen - skew <= moment <= plan.now + skew

    if recovery.rendezvous_time is None and plausible(report.rendezvous_time):
        assert report.rendezvous_time is not None
        recovery.rendezvous_time = precise_time(report.rendezvous_time)
    if recovery.first_step_time is None and plausible(report.first_step_time):
        assert report.first_step_time is not None
        recovery.first_step_time = precise_time(report.first_step_time)
        recovery.seconds = round(max(0.0, (report.first_step_time - seen).total_seconds()), 3)
        how = recovery.path + (f" ({recovery.fallback_reason})" if recovery.fallback_reason else "")
        lost = "steps lost unknown" if recovery.steps_lost is None else \
            f"{recovery.steps_lost} step{'' if recovery.steps_lost == 1 else 's'} lost"
        who = (f"the survivors trained on short ({report.world_size} ranks), not waiting for the replacement"
               if report.kind == "Shrink" else f"rendezvous generation {report.generation} trained its first step")
        plan.event("Normal", REASON_RECOVERED,
                   f"recovered from the incident of rendezvous generation {incident.generation} "
                   f"({incident.reason or incident.cause}) in {recovery.seconds:g}s: {who}; path {how}; {lost}")


def recovered(old: model.DDPJobStatus, new: model.DDPJobStatus) -> list[model.IncidentRecovery]:
    """Timelines whose seconds the status `new` holds and `old` (the stored status it replaces) did not: what
    ddpjob_recovery_seconds observes after the write, once per incident also across operator restarts."""
    done = {incident_key(i) for i in old.incidents if i.recovery is not None and i.recovery.seconds is not None}
    return [i.recovery for i in new.incidents
            if i.recovery is not None and i.recovery.seconds is not None and incident_key(i) not in done]
