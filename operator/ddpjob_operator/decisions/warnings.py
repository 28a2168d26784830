"""What the trainer's reports say about the script itself: a condition and one Warning event each, never a
failure (the job may still be right to run on).

- *World size mismatch*: a report whose world size no rendezvous of this job can have (fewer or more than
  `minReplicas..replicas` workers x `nprocPerNode`) comes from a framework that did not join torchrun's process
  group: each rank trains alone on all the data (the Hugging Face Trainer on CPU without `use_cpu=True`). Such
  reports are not taken as progress (status.progress keeps the last one that agreed) and condition
  `WorldSizeMismatch` is True until one agrees again.
- *Not reporting*: with a checkpoint interval, a generation whose workers have all run for
  Options.unreported_warning_seconds with no progress report ever, or whose reports pass two intervals with no
  checkpoint, was started from a script without the HF/Lightning callback or `job.report` / `job.save`: a kill
  would restart it from step 0. Condition `ProgressNotReported` is True until a report (with a checkpoint)
  arrives.

Pure: the clock is `plan.now`; a wait is a wakeup.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from .. import model
from .common import Plan, condition, set_condition
from .types import (CONDITION_NOT_REPORTING, CONDITION_WORLD_SIZE_MISMATCH, REASON_NO_CHECKPOINTS,
                    REASON_NO_PROGRESS_REPORTS, REASON_REPORTING, REASON_WORLD_SIZE_AGREES,
                    REASON_WORLD_SIZE_MISMATCH, TERMINAL_PHASES)

# A report this many checkpoint intervals past the start with no checkpoint: the script saves none.
INTERVALS_WITHOUT_CHECKPOINT = 2


def world_sizes(spec: model.DDPJobSpec) -> range:
    """Every world size a rendezvous of this job can have: whole workers of nprocPerNode processes each."""
    return range(spec.min_nodes * spec.nproc_per_node, spec.max_nodes * spec.nproc_per_node + 1,
                 spec.nproc_per_node)


def _flag(plan: Plan, type_: str, reason: str, message: str) -> None:
    """Condition True with one Warning event, when it turns True or its reason changes (its message is not
    rewritten while it holds: status is written only when it changes)."""
    previous = condition(plan.status, type_)
    if previous is not None and previous.status == "True" and previous.reason == reason:
        return
    plan.status.conditions = set_condition(plan.status.conditions, type_, "True", reason, message, plan.now,
                                           plan.job.metadata_generation)
    plan.event("Warning", reason, message)


def _clear(plan: Plan, type_: str, reason: str, message: str) -> None:
    """A condition that was True turns False; one never raised is not added."""
    previous = condition(plan.status, type_)
    if previous is not None and previous.status == "True":
        plan.status.conditions = set_condition(plan.status.conditions, type_, "False", reason, message, plan.now,
                                               plan.job.metadata_generation)


def refuse_foreign_world_size(plan: Plan, spec: model.DDPJobSpec) -> None:
    """Before record_progress: a report whose world size no rendezvous of the job has is dropped from this
    pass's observation (not progress, not a step for hang detection) and flagged."""
    p = plan.observed.progress
    if p is None or p.world_size is None or p.waiting_for_ranks:
        return  # waiting below minReplicas (decisions/degraded.py): short by its own word, not a foreign world
    sizes = world_sizes(spec)
    if plan.status.phase in TERMINAL_PHASES:
        if p.world_size not in sizes:  # after the end too: the last report that agreed stays shown
            plan.observed = dataclasses.replace(plan.observed, progress=None)
        return
    if p.world_size in sizes:
        _clear(plan, CONDITION_WORLD_SIZE_MISMATCH, REASON_WORLD_SIZE_AGREES,
               f"the trainer reports world size {p.world_size}, as rendezvous generation {p.generation} has")
        return
    expected = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}"
    workers = (f"{spec.min_nodes}" if spec.min_nodes == spec.max_nodes else f"{spec.min_nodes}-{spec.max_nodes}")
    _flag(plan, CONDITION_WORLD_SIZE_MISMATCH, REASON_WORLD_SIZE_MISMATCH,
          f"the trainer reports world size {p.world_size}, but this job's rendezvous has {expected} processes "
          f"({workers} workers x nprocPerNode {spec.nproc_per_node}): the framework did not join torchrun's process "
          f"group, so each rank trains alone on all the data and they overwrite each other's checkpoints. These "
          f"reports are not taken as progress. Likely fix: Hugging Face Trainer on CPU: "
          f"TrainingArguments(use_cpu=True); otherwise make the framework use torchrun's WORLD_SIZE")
    plan.observed = dataclasses.replace(plan.observed, progress=None)


def not_reporting(plan: Plan, spec: model.DDPJobSpec) -> None:
    """A running job with a checkpoint interval whose script reports no progress, or no checkpoint."""
    if spec.checkpoint is None or plan.status.phase != "Running":
        return
    mismatch = condition(plan.status, CONDITION_WORLD_SIZE_MISMATCH)
    if mismatch is not None and mismatch.status == "True":
        return  # it reports, in a world of its own: that condition says what is wrong
    interval = spec.checkpoint.interval_steps
    p, shown = plan.observed.progress, plan.status.progress
    reported = p is not None or (shown is not None and shown.step is not None)
    if reported:
        previous = condition(plan.status, CONDITION_NOT_REPORTING)
        saved = (p is not None and p.last_checkpoint_step is not None) or \
            (shown is not None and shown.last_checkpoint_step is not None)
        step = p.step if p is not None else shown.step  # type: ignore[union-attr]
        first_run = plan.status.generation == 0 and plan.status.restarts == 0 and plan.status.disruptions == 0
        if not saved and first_run and step is not None and step >= INTERVALS_WITHOUT_CHECKPOINT * interval:
            _flag(plan, CONDITION_NOT_REPORTING, REASON_NO_CHECKPOINTS,
                  f"the trainer reports step {step} but no checkpoint, although checkpoint.intervalSteps is "
                  f"{interval}: a kill would restart it from step 0. Likely cause: the script saves with neither "
                  f"the HF/Lightning callback (DDPJobCallback) nor job.save(...) (docs/your-own-script.md)")
        elif saved or (previous is not None and previous.reason == REASON_NO_PROGRESS_REPORTS):
            _clear(plan, CONDITION_NOT_REPORTING, REASON_REPORTING,
                   "the trainer reports progress" + (" and checkpoints" if saved else ""))
        return
    current = [w for w in plan.current() if w.index < spec.replicas]
    if len(current) < spec.min_nodes or not all(w.live and w.started_at is not None for w in current):
        return  # not every worker runs yet: the clock has not started
    due = max(w.started_at for w in current) + timedelta(  # type: ignore[type-var]
        seconds=plan.options.unreported_warning_seconds)
    if plan.now < due:
        plan.wake_at(due)
        return
    _flag(plan, CONDITION_NOT_REPORTING, REASON_NO_PROGRESS_REPORTS,
          f"the workers have run {plan.options.unreported_warning_seconds:.0f}s with checkpoint.intervalSteps "
          f"{interval} and the trainer has sent no progress report: nothing is checkpointed at that interval and a "
          f"kill restarts from step 0. Likely cause: the script lacks the HF/Lightning callback "
          f"(hf.DDPJobCallback / lightning DDPJobCallback in the Trainer's callbacks) or never calls job.report(step=...) "
          f"(docs/your-own-script.md, docs/hf-and-lightning.md)")
