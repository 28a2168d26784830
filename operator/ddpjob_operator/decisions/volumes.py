"""The checkpoint volume: can every worker mount it? A condition (and one Warning event), never a failure:
storage that pins its volumes to one node makes a ReadWriteOnce claim work (validation.checkpoint_sharing)."""

from __future__ import annotations

from .. import model
from ..validation import checkpoint_sharing
from .common import Plan, condition, set_condition
from .types import CONDITION_CHECKPOINT_SHARED


def checkpoint_volume(plan: Plan, spec: model.DDPJobSpec) -> None:
    status = plan.status
    verdict = checkpoint_sharing(spec)
    if verdict is not None and not verdict[0] and plan.options.one_node:
        verdict = (True, "OneNode", "every worker runs on this machine, which holds the checkpoint directory")
    if verdict is None:
        status.conditions = [c for c in status.conditions if c.type != CONDITION_CHECKPOINT_SHARED]
        return
    shared, reason, message = verdict
    previous = condition(status, CONDITION_CHECKPOINT_SHARED)
    if not shared and (previous is None or previous.status != "False"):
        plan.event("Warning", reason, message)
    status.conditions = set_condition(status.conditions, CONDITION_CHECKPOINT_SHARED, "True" if shared else "False",
                                      reason, message, plan.now, plan.job.metadata_generation)
