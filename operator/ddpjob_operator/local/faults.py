"""What a local run does to itself on request, as a person or a cluster would to a job: faults (a killed
process tree, a pod deleted behind the runner's back, a killed store) and spec changes (`kubectl scale`,
`suspend`), each once its moment came: a time since the start, a step the trainer reported, a world size, a
phase. The runner hands itself (a `RunView`) to `inject` and `apply_changes` once a pass; what follows is the decision
layer's, as it would be in a cluster."""

from __future__ import annotations

from datetime import datetime
from typing import Callable

from ..validation import InvalidJob
from .options import KILL, KILL_STORE, NO_PROGRESS_WARNING_SECONDS, FaultInjection, SpecChange
from .pods import WorkerProcess
from .processes import LocalProcess, kill_together
from .run_view import RunView


class Schedule:
    """The faults and spec changes still to come. Faults due in the same pass strike in the same instant (every
    tree is frozen before any is killed); changes apply one after the other, each once all its conditions hold."""

    def __init__(self, faults: tuple[FaultInjection, ...], changes: tuple[SpecChange, ...], started_at: datetime,
                 event: Callable[[str], None]):
        self.faults, self.changes = list(faults), list(changes)
        self.started_at, self.event = started_at, event
        self._warned_no_progress = False

    def waiting_on_steps(self) -> list[str]:
        """The faults and spec changes still waiting for a training step, as the command line gives them."""
        return ([f"--kill-at-step {f.at_step}" for f in self.faults if f.at_step is not None]
                + [f"--scale-at-step {c.at_step}" for c in self.changes if c.at_step is not None])

    def _due(self, at_step: int | None, after_seconds: float | None, step: int | None, now: datetime) -> bool:
        elapsed = (now - self.started_at).total_seconds()
        return (after_seconds is not None and elapsed >= after_seconds) or \
               (at_step is not None and (step or 0) >= at_step)

    def _warn_without_progress(self, step: int | None, now: datetime) -> None:
        if self._warned_no_progress or step is not None or not self.waiting_on_steps():
            return
        if (now - self.started_at).total_seconds() >= NO_PROGRESS_WARNING_SECONDS:
            self._warned_no_progress = True
            self.event(f"Warning: {', '.join(self.waiting_on_steps())} waits for the trainer to report a step, "
                       f"and it has reported none after {NO_PROGRESS_WARNING_SECONDS:.0f}s: call "
                       f"job.report(step=...) (or use the HF/Lightning callback), print `step=N epoch=E "
                       f"loss=L` lines on rank 0, or use --kill-after SECONDS")

    def inject(self, runner: RunView, now: datetime) -> None:
        """Every fault due now, in the same instant (all trees frozen before any is killed)."""
        progress = runner.files.progress()
        step = runner.reported_step(progress)
        self._warn_without_progress(step, now)
        elapsed = (now - self.started_at).total_seconds()
        kills: list[tuple[WorkerProcess, FaultInjection]] = []
        stores: list[LocalProcess] = []
        deletes: list[WorkerProcess] = []
        for fault in list(self.faults):
            if not self._due(fault.at_step, fault.after_seconds, step, now):
                continue
            if fault.kind == KILL_STORE:
                store = runner.store
                if store is None or store.poll(now) is not None or store.terminating_since:
                    continue
                stores.append(store)
            else:
                target = runner.workers.get(runner.pod_of(fault.index))
                if target is None or target.deleted or target.held or target.process.poll(now) is not None:
                    continue
                if fault.kind == KILL:
                    kills.append((target, fault))
                else:
                    deletes.append(target)
            self.faults.remove(fault)
        if kills or stores:
            killed = [*((w.process, fault.at_step) for w, fault in kills), *((s, None) for s in stores)]
            kill_together(*(process for process, _ in killed))
            # Read once the trees are gone, not a poll before: the survivors cannot complete a step without the
            # killed rank, so the newest report now is the last step the job completed.
            last = runner.reported_step(runner.files.progress())
            for process, asked in killed:
                at = "before the trainer reported any step" if last is None else f"trainer step {last}"
                if asked is not None and last is not None and last != asked:
                    at += (f" (asked for step {asked}: steps are seen as the trainer reports them, a poll apart; "
                           f"{last} is the newest one reported when the kill struck)")
                self.event(f"fault injection: killed {process.name} (SIGKILL to its whole process tree) "
                           f"at {elapsed:.1f}s, {at}")
        for w in deletes:
            w.deleted = True  # the pod object is being deleted: it vanishes once its processes are gone
            w.process.terminate(now)
            self.event(f"fault injection: deleted {w.process.name} gracefully (SIGTERM, like kubectl "
                       f"delete pod) at {elapsed:.1f}s, "
                       + ("before the trainer reported any step" if step is None else f"trainer step {step}"))

    def apply_changes(self, runner: RunView, now: datetime) -> None:
        """Each spec change whose moment came, in order, validated as the API server would."""
        progress = runner.files.progress()
        elapsed = (now - self.started_at).total_seconds()
        while self.changes:
            change = self.changes[0]
            waiting = [change.at_step is not None and (progress.get("step") or 0) < change.at_step,
                       change.world_size is not None and progress.get("world_size") != change.world_size,
                       change.after_seconds is not None and elapsed < change.after_seconds,
                       change.in_phase is not None and (runner.status.phase != change.in_phase
                                                        or bool(runner.workers))]
            if any(waiting):
                return
            self.changes.pop(0)
            what = []
            try:
                if change.replicas is not None:
                    runner.scale(change.replicas)
                    what.append(f"replicas={change.replicas}")
                if change.suspend is not None:
                    runner.set_suspend(change.suspend)
                    what.append(f"suspend={str(change.suspend).lower()}")
            except InvalidJob as rejected:
                self.event(f"spec change rejected (as the API server would): {rejected}")
                continue
            self.event(f"spec change: {', '.join(what)} (metadata.generation {runner.metadata_generation}) "
                       f"at {elapsed:.1f}s, trainer step {progress.get('step')}")
