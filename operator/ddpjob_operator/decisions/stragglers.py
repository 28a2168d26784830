"""Straggler detection: each worker's own time per step -> the slowest worker, a `Straggler` condition and
Event, and (failurePolicy.stragglers Replace) its pod moved off its node as an uncharged disruption (the node
avoided at once, so the replacement lands elsewhere).

DDP runs at the speed of its slowest rank, so every rank's *step* time is the same; what differs is how much
of it was the rank's own work and how much it waited for the others in collectives. Trainers report the
own part (docs/launch-contract.md, "Progress": `step_seconds`); the caller keeps a bounded history per
worker and generation (`TimingHistory`) and hands it in with the progress observation.

Scoring, per worker of the generation in use, over the last `failurePolicy.stragglerWindowSeconds`:

- its *median* own time, and the median of its peers' medians (the reference);
- it is a straggler when it has been observed for the whole window and even its *lower quartile* is above
  `stragglerThreshold` x the reference: three quarters of its reports were slow, so a few slow steps (a
  checkpoint write, a noisy neighbour's burst, garbage collection) never name a worker;
- hysteresis: a named worker stays named until its median falls below half way back to 1
  (1 + (threshold - 1) / 2), so a worker hovering at the threshold does not flap.

Pure: `now` comes from the caller, so the same inputs always give the same answer.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from statistics import median

from .. import model
from . import nodes
from .common import Plan, condition, rfc3339, set_condition, set_phase, update_counts
from .types import (CONDITION_STRAGGLER, DISRUPTION, REASON_NO_STRAGGLER, REASON_OLD_GENERATION, REASON_STRAGGLER,
                    REASON_STRAGGLER_REPLACED, DeleteWorker, RankTimings, StepTiming)

MAX_SAMPLES = 256  # per worker and generation: a window of reports every log interval, bounded


class TimingHistory:
    """Per-worker step timings of the newest generation each worker reported in (the operator's tracker and
    the local runner keep one per job). A heartbeat repeating a step adds nothing."""

    def __init__(self, max_samples: int = MAX_SAMPLES):
        self.max_samples = max_samples
        self.ranks: dict[int, RankTimings] = {}

    def add(self, index: int, generation: int, step: int, seconds: float, now: datetime) -> None:
        rank = self.ranks.get(index)
        if rank is not None and generation < rank.generation:
            return  # a pod of a generation left behind
        if rank is None or generation > rank.generation:
            rank = RankTimings(index=index, generation=generation, since=now, samples=())
        if rank.samples and step <= rank.samples[-1].step:
            return
        samples = (rank.samples + (StepTiming(at=now, step=step, seconds=seconds),))[-self.max_samples:]
        self.ranks[index] = replace(rank, samples=samples)

    def snapshot(self) -> tuple[RankTimings, ...]:
        return tuple(self.ranks[i] for i in sorted(self.ranks))


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Score:
    __slots__ = ("index", "seconds", "ratio", "low_ratio", "covered")

    def __init__(self, index: int, seconds: float, ratio: float, low_ratio: float, covered: bool):
        self.index, self.seconds, self.ratio, self.low_ratio, self.covered = index, seconds, ratio, low_ratio, covered

    def __repr__(self) -> str:
        return f"Score({self.index}, {self.seconds:.4g}s, x{self.ratio:.3g}, low x{self.low_ratio:.3g}, {self.covered})"


def score(timings: tuple[RankTimings, ...] | list[RankTimings], generation: int, now: datetime,
          window_seconds: float, replicas: int | None = None) -> dict[int, Score]:
    """Each worker's median own time over the window and its ratio to the median of its peers' medians.
    Empty with fewer than two workers reporting (no peers to compare with)."""
    start = now - timedelta(seconds=window_seconds)
    per: dict[int, tuple[list[float], bool]] = {}
    for rank in timings:
        if rank.generation != generation or (replicas is not None and rank.index >= replicas):
            continue
        xs = [s.seconds for s in rank.samples if s.at >= start and s.seconds >= 0]
        if xs:
            per[rank.index] = (xs, rank.since <= start)
    if len(per) < 2:
        return {}
    medians = {i: median(xs) for i, (xs, _) in per.items()}
    out = {}
    for i, (xs, covered) in per.items():
        reference = median([m for j, m in medians.items() if j != i])
        if reference <= 0:
            continue
        out[i] = Score(i, medians[i], medians[i] / reference, _quantile(xs, 0.25) / reference, covered)
    return out


def judge(scores: dict[int, Score], named: int | None, threshold: float) -> int | None:
    """The straggler after this evaluation: the named one while it stays above the release level, else the
    slowest worker whose whole window is above the threshold."""
    release = 1.0 + (threshold - 1.0) / 2.0
    if named is not None and named in scores and scores[named].ratio >= release:
        return named
    slow = [s for s in scores.values() if s.covered and s.low_ratio > threshold]
    return max(slow, key=lambda s: (s.ratio, -s.index)).index if slow else None


def detect_stragglers(plan: Plan, spec: model.DDPJobSpec) -> bool:
    """Publish step times, name a straggler; True when one was replaced in this pass (Replace)."""
    status, p, policy = plan.status, plan.observed.progress, spec.failure_policy
    if status.step_times is not None and status.step_times.generation != status.generation:
        status.step_times = None  # timings of a generation left behind
    previous = condition(status, CONDITION_STRAGGLER)
    if p is None:
        return False
    scores = score(p.timings, status.generation, plan.now, policy.straggler_window_seconds, spec.replicas)
    if not scores:
        if previous is not None and previous.status == "True" and status.step_times is None:
            status.conditions = set_condition(status.conditions, CONDITION_STRAGGLER, "False", REASON_NO_STRAGGLER,
                                              f"no timings yet in rendezvous generation {status.generation}",
                                              plan.now, plan.job.metadata_generation)
        return False
    named_before = status.step_times.straggler if status.step_times is not None else None
    named = judge(scores, named_before, policy.straggler_threshold)
    slowest = max(scores.values(), key=lambda s: (s.ratio, -s.index))
    status.step_times = model.StepTimes(
        generation=status.generation, slowest=f"{slowest.index} ({slowest.ratio:.2f}x)", straggler=named,
        ranks=[model.RankStepTime(index=s.index, seconds=round(s.seconds, 6), ratio=round(s.ratio, 2))
               for s in sorted(scores.values(), key=lambda s: s.index)])
    if named is None:
        if previous is not None and previous.status == "True":
            status.conditions = set_condition(
                status.conditions, CONDITION_STRAGGLER, "False", REASON_NO_STRAGGLER,
                f"no worker's own step time is above {policy.straggler_threshold}x its peers' median", plan.now,
                plan.job.metadata_generation)
        return False

    s = scores[named]
    worker = next((w for w in plan.current() if w.index == named), None)
    pod = worker.name if worker is not None else f"{plan.job.name}-worker-{named}"
    node = worker.node if worker is not None and worker.node else "unknown"
    peers = s.seconds / s.ratio
    message = (f"worker {named} (pod {pod}, node {node}) is a straggler: its own time per step is {s.seconds:.4g}s, "
               f"{s.ratio:.2f}x the median of its peers ({peers:.4g}s), for over "
               f"{policy.straggler_window_seconds}s (failurePolicy.stragglerThreshold {policy.straggler_threshold})")
    if previous is None or previous.status != "True" or named_before != named:
        plan.event("Warning", REASON_STRAGGLER, message)
    status.conditions = set_condition(status.conditions, CONDITION_STRAGGLER, "True", REASON_STRAGGLER, message,
                                      plan.now, plan.job.metadata_generation)
    if policy.stragglers != "Replace" or worker is None or not worker.live or status.phase != "Running":
        return False
    live = [w for w in plan.current() if w.live and w.phase == "Running" and w.index < spec.replicas]
    if len(live) < spec.replicas:
        return False  # a gang still forming or restarting: judge it again once whole
    _replace(plan, spec, worker, message)
    return True


def _replace(plan: Plan, spec: model.DDPJobSpec, straggler, message: str) -> None:
    """Move the straggler off its node like an eviction: a disruption, never charged; with restartScope Pod
    the survivors keep their pods and join the next generation in place, the replacement resumes from the
    rescue checkpoint (SIGTERM: the straggler checkpoints first). Its node is avoided at once
    (status.avoidedNodes, decisions/nodes.py), so the replacement gets required anti-affinity against it."""
    status = plan.status
    survivors = [w for w in plan.current() if w.live and w.index != straggler.index and w.index < spec.replicas]
    plan.record_incident(model.Incident(
        generation=status.generation, time=rfc3339(plan.now), cause=DISRUPTION, reason=REASON_STRAGGLER_REPLACED,
        charged=False, message=message, ranks=[straggler.index],
        step=status.progress.step if status.progress else None))
    status.disruptions += 1
    status.generation += 1
    plan.rank(straggler.index).restarts += 1
    plan.act(DeleteWorker(straggler.name, REASON_STRAGGLER_REPLACED))
    if spec.failure_policy.restart_scope == "All":
        for w in survivors:
            plan.act(DeleteWorker(w.name, REASON_OLD_GENERATION))
        carried: list = []
    else:
        for w in survivors:
            plan.carry(w, status.generation)
        carried = survivors
    if straggler.node:  # avoided at once: its replacement must not land on the same slow node
        nodes.record(plan, spec, straggler.node, REASON_STRAGGLER_REPLACED, nodes.failure_key(straggler),
                     at_once=True)
    plan.event("Warning", REASON_STRAGGLER_REPLACED,
               f"{message}; replacing it in rendezvous generation {status.generation} (failurePolicy.stragglers "
               f"Replace; a disruption, not charged)")
    status.step_times = None
    status.conditions = set_condition(status.conditions, CONDITION_STRAGGLER, "False", REASON_STRAGGLER_REPLACED,
                                      f"worker {straggler.index} was replaced (node {straggler.node or 'unknown'})",
                                      plan.now, plan.job.metadata_generation)
    update_counts(plan, spec, carried)
    set_phase(plan, "Restarting", REASON_STRAGGLER_REPLACED,
              f"replacing straggler worker {straggler.index} in rendezvous generation {status.generation}")
