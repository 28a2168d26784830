"""How a job ends: success, deadline, pods that can never start, objects the API server refuses,
an invalid stored spec, and what a finished job keeps doing (cleanup, TTL)."""

from __future__ import annotations

from datetime import timedelta

from .. import model
from .accounting import rendezvous_failed
from .common import (Plan, cleanup, condition, describe_failure, enter_terminal, fail, force_stuck, parse_time,
                     record_failure, set_condition, set_phase, short_message, ttl, update_counts)
from .types import (CANNOT_START_REASONS, REASON_FAILED_MOUNT, CONDITION_CREATE_BLOCKED, CONDITION_SPEC_REJECTED, REASON_CANNOT_START,
                    REASON_DEADLINE, REASON_FAILED_AFTER_COMPLETION, REASON_INVALID_SPEC, REASON_NAME_CONFLICT,
                    REASON_GANG_SCHEDULER_MISSING, REASON_POD_REJECTED, REASON_QUOTA, REASON_SUCCEEDED, REASON_VOLUME_UNAVAILABLE, TERMINAL_PHASES,
                    Waiting, WorkerObservation)


def invalid_spec(plan: Plan) -> None:
    errors = "; ".join(str(e) for e in plan.job.spec_errors) or "the spec cannot be parsed"
    status = plan.status
    if status.phase in TERMINAL_PHASES:
        cleanup(plan, "Running")
        force_stuck(plan)
        return
    if status.start_time is None and status.phase in (None, "Pending"):
        # Never started (created before the CRD schema caught the problem): no pods, ever.
        enter_terminal(plan, "Failed", REASON_INVALID_SPEC, f"spec cannot be run: {errors}")
        cleanup(plan, "All")
        return
    # A running job keeps its pods; the bad update (e.g. a scale outside min/max) is not applied.
    previous = condition(status, CONDITION_SPEC_REJECTED)
    message = f"spec update not applied: {errors}"
    if previous is None or previous.status != "True" or previous.message != message:
        plan.event("Warning", REASON_INVALID_SPEC, message)
    status.conditions = set_condition(status.conditions, CONDITION_SPEC_REJECTED, "True", REASON_INVALID_SPEC,
                                      message, plan.now, plan.job.metadata_generation)


def finished(plan: Plan, spec: model.DDPJobSpec) -> None:
    """Terminal jobs stay terminal: keep cleaning up (idempotently) and honour the TTL."""
    policy = spec.run_policy.clean_pod_policy
    if plan.status.phase == "Succeeded" and policy == "None":
        policy = "Running"
    cleanup(plan, policy)
    force_stuck(plan)
    ttl(plan, spec)


def deadline_passed(plan: Plan, spec: model.DDPJobSpec) -> bool:
    deadline = spec.run_policy.active_deadline_seconds
    start = parse_time(plan.status.start_time)
    if deadline is None or start is None:
        return False
    ends = start + timedelta(seconds=deadline)
    if plan.now < ends:
        plan.wake_at(ends)
        return False
    fail(plan, spec, REASON_DEADLINE, f"job ran longer than activeDeadlineSeconds={deadline}")
    return True


def succeeded(plan: Plan, spec: model.DDPJobSpec) -> bool:
    """The success policy, on the current generation. True when the job ended or is completing.

    A worker that never trained in the final round (still Pending, or whose rendezvous failed because
    the finished agents had closed it) does not hold success back: training is over."""
    current = plan.current()
    by_index = {w.index: w for w in current if w.index < spec.replicas}
    if not any(w.phase == "Succeeded" for w in by_index.values()):
        return False

    def never_trained(w: WorkerObservation) -> bool:
        return w.phase == "Pending" or (w.phase == "Failed" and rendezvous_failed(w.message))

    if spec.run_policy.success_policy == "RankZero":
        done = 0 in by_index and by_index[0].phase == "Succeeded"
    else:
        done = all(w.phase == "Succeeded" or never_trained(w) for w in by_index.values())
    if done:
        enter_terminal(plan, "Succeeded", REASON_SUCCEEDED,
                       f"training finished (successPolicy {spec.run_policy.success_policy})")
        # "then the rest are stopped": running workers always go; finished ones per cleanPodPolicy.
        cleanup(plan, "All" if spec.run_policy.clean_pod_policy == "All" else "Running")
        return True
    lost = [w for w in by_index.values() if (w.phase == "Failed" and not never_trained(w)) or w.terminating_since]
    if lost:
        # Some ranks completed, so their agents closed the rendezvous: a replacement could only meet
        # RendezvousClosedError. The job ends here instead of wedging.
        record_failure(plan, lost[0])
        fail(plan, spec, REASON_FAILED_AFTER_COMPLETION,
             f"{describe_failure(lost[0])} after other workers had completed")
        return True
    update_counts(plan, spec, current)
    set_phase(plan, "Running", "Completing", "some workers have completed; waiting for the rest")
    return True


def _volume_missing(unschedulable: Waiting | None) -> bool:
    text = (unschedulable.message or "") if unschedulable else ""
    return "persistentvolumeclaim" in text and "not found" in text


def cannot_start(plan: Plan, spec: model.DDPJobSpec) -> bool:
    """A pod that cannot start (bad image, missing secret, missing claim) fails the job with the field
    to fix, after Options.cannot_start_seconds (the user may still be creating what is missing)."""
    candidates = [(f"worker {w.index} (pod {w.name})", "spec.image", w.waiting, w.unschedulable)
                  for w in plan.current()]
    store = plan.observed.store
    if store is not None:
        candidates.append(("the rendezvous store pod", "spec.rendezvous.storeImage (default spec.image)",
                           store.waiting, store.unschedulable))
    limit = plan.options.cannot_start_seconds
    for who, field, wait, unschedulable in candidates:
        if _volume_missing(unschedulable):
            assert unschedulable is not None
            wait, field, reason = unschedulable, "spec.checkpoint.claimName (or template.volumes)", \
                REASON_VOLUME_UNAVAILABLE
        elif wait is not None and wait.reason == REASON_FAILED_MOUNT:
            field, reason = "template.volumes (and the config maps, secrets or claims they name) or " \
                            "spec.checkpoint", REASON_VOLUME_UNAVAILABLE
        elif wait is not None and wait.reason in CANNOT_START_REASONS:
            reason = REASON_CANNOT_START
            field = (f"{field}, spec.imagePullPolicy, image pull secrets (template.serviceAccountName) and "
                     f"secrets named in spec.env")
        else:
            continue
        gives_up = wait.since + timedelta(seconds=limit)
        if plan.now < gives_up:
            plan.wake_at(gives_up)
            continue
        detail = short_message(wait.message)
        fail(plan, spec, reason, f"{who} cannot start: {wait.reason}{f' ({detail})' if detail else ''} for "
                                 f"{limit:g}s. Fix: check {field}")
        return True
    return False


def rejected(plan: Plan, spec: model.DDPJobSpec) -> bool:
    """Objects the API server refused to create. True when the job failed or must wait."""
    for r in plan.observed.rejected:
        what = f"{r.kind} {r.name}"
        if r.not_owned:
            fail(plan, spec, REASON_NAME_CONFLICT,
                 f"{what} already exists and does not belong to this DDPJob. Fix: rename the DDPJob, or delete "
                 f"that {r.kind}")
            return True
        if r.status == 429 or (r.status == 403 and "exceeded quota" in r.message):
            # Quota frees up by itself; retry with the job's backoff, visibly.
            retry_at = r.at + timedelta(seconds=max(1, spec.failure_policy.backoff.initial_seconds))
            plan.status.conditions = set_condition(
                plan.status.conditions, CONDITION_CREATE_BLOCKED, "True", REASON_QUOTA,
                f"creating {what} was refused: {short_message(r.message)}; retrying", plan.now,
                plan.job.metadata_generation)
            if plan.now < retry_at:
                plan.wake_at(retry_at)
                return True
            continue
        policy = spec.run_policy.scheduling_policy
        if r.status == 404 and r.kind == "PodGroup" and policy is not None:
            # The PodGroup is created before any pod: nothing of the job runs half-scheduled.
            installer = "Volcano" if policy.gang_scheduler == "Volcano" else \
                "the scheduler-plugins coscheduling plugin"
            fail(plan, spec, REASON_GANG_SCHEDULER_MISSING,
                 f"spec.runPolicy.schedulingPolicy.gangScheduler is {policy.gang_scheduler}, but the cluster does not "
                 f"serve {policy.api_version} PodGroups (creating {what}: HTTP 404 {short_message(r.message)}). Fix: "
                 f"install {installer} (its CRDs), or remove spec.runPolicy.schedulingPolicy")
            return True
        fail(plan, spec, REASON_POD_REJECTED,
             f"the API server refused to create {what}: {short_message(r.message)} (HTTP {r.status} {r.reason}). "
             f"Fix the DDPJob field the message names (spec.template, spec.resources, spec.env, ...) or the "
             f"namespace's admission policy")
        return True
    plan.status.conditions = [c for c in plan.status.conditions if c.type != CONDITION_CREATE_BLOCKED]
    return False
