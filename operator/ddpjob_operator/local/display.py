"""What a local run shows: the live table's snapshot and the summary at the end, from the runner's state (the
decision layer's status, the processes, the trainer's newest report), read through a `RunView` (run_view.py).
view.py draws them."""

from __future__ import annotations

from datetime import datetime

from .. import decisions, model
from .logs import RESULT_FILE
from .run_view import RunView
from .view import Snapshot, Summary, WorkerRow


def snapshot(runner: RunView, now: datetime) -> Snapshot:
    """The live table: the job's phase and progress, a row per worker."""
    progress = runner.files.progress()
    shown = runner.status.progress
    ranks = {r.index: r for r in runner.status.ranks}
    rows = []
    for index in sorted(set(ranks) | {w.index for w in runner.workers.values() if w.index >= 0}):
        name = runner.pod_of(index)
        w, rank, tail = runner.workers.get(name), ranks.get(index), runner.tails.get(name)
        code = w.process.poll(now) if w else None
        if w is None or w.held:
            state = "Pending"
        elif w.process.terminating_since is not None and code is None:
            state = "Terminating"
        else:
            state = "Running" if code is None else ("Succeeded" if code == 0 else "Failed")
        rows.append(WorkerRow(name=name, state=state, restarts=rank.restarts if rank else 0,
                              exit_code=code if code is not None else (rank.last_exit_code if rank else None),
                              step=tail.step if tail else None, loss=tail.loss if tail else None))
    return Snapshot(job=runner.name, phase=runner.status.phase or "Pending", message=runner.status.message or "",
                    restarts=runner.status.restarts, max_restarts=runner.spec.failure_policy.max_restarts,
                    elapsed_s=(now - runner.created_at).total_seconds(), step=progress.get("step"),
                    loss=progress.get("loss"), world_size=progress.get("world_size"),
                    last_checkpoint_step=progress.get("last_checkpoint_step"), workers=tuple(rows),
                    percent=shown.percent if shown else None, eta=shown.eta if shown else None,
                    stalled=_raised(runner.status, decisions.CONDITION_STALLED),
                    desired_world_size=runner.status.desired_world_size or None,
                    degraded=_raised(runner.status, decisions.CONDITION_DEGRADED))


def summary(runner: RunView) -> Summary:
    """What is printed once the run ended: how it ended, what it cost, where its checkpoints and logs are."""
    phase = runner.status.phase or "Pending"
    condition = next((c for c in runner.status.conditions if c.type == phase), None)
    message = runner.status.message or ""
    if condition is not None and condition.reason != phase:
        message = f"{condition.reason}: {message}"
    newest = runner.files.newest_checkpoint()
    if runner.interrupted:
        kept = (f"the workers checkpointed (newest: step {newest[0]}), continue with --resume" if newest is not None
                else "no checkpoint was written (the trainer saved none), --resume would start over")
        message = f"stopped by {runner.stopped_by} while {phase}; {kept}"
        phase = "Interrupted"
    notes = tuple(f"{what} never fired: the trainer reported no step that far (job.report(step=...), the "
                  f"HF/Lightning callback, or rank 0's `step=N epoch=E loss=L` lines)"
                  for what in runner.waiting_on_steps())
    # What the trainer's reports said about the script (decisions/warnings.py), again where it is read last.
    notes += tuple(f"Warning {c.reason}: {c.message}" for c in runner.status.conditions
                   if c.type in (decisions.CONDITION_WORLD_SIZE_MISMATCH, decisions.CONDITION_NOT_REPORTING)
                   and c.status == "True")
    # One left by an earlier run in a kept directory is not this run's.
    result = runner.files.report(RESULT_FILE, since=runner.created_at.timestamp())
    return Summary(job=runner.name, phase=phase, message=message,
                   elapsed_s=(runner.clock() - runner.created_at).total_seconds(),
                   restarts=runner.status.restarts, disruptions=runner.status.disruptions,
                   worker_restarts={r.pod: r.restarts for r in runner.status.ranks}, result=result,
                   progress=runner.status.progress,
                   stalls=sum(1 for i in runner.status.incidents if i.reason == decisions.REASON_STALLED),
                   checkpoint_dir=str(runner.checkpoint_dir) if runner.checkpoint_dir else None,
                   log_dir=str(runner.log_dir), notes=notes, incidents=tuple(runner.status.incidents),
                   newest_checkpoint=(newest[0], str(newest[1])) if newest is not None else None)


def _raised(status: model.DDPJobStatus, type_: str) -> str | None:
    """A condition's message while it is True (Stalled: hang detection; Degraded: training short)."""
    condition = next((c for c in status.conditions if c.type == type_), None)
    return condition.message if condition is not None and condition.status == "True" else None
