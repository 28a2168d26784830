"""Issue 36, "Scale in place", the decision layer (decisions/scaling.py): with in-process recovery a new size is
a new generation the survivors are carried into, no survivor's pod is stopped, nothing is charged; the departing
pods go once they exited, once the survivors train in the new generation, or after the bound. Restart recovery
keeps restarting every worker at the new size. Pure and table-driven."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ddpjob_operator import decisions as d
from ddpjob_operator.decisions.scaling import REASON_SCALED_IN_PLACE

from .test_decisions import SETTLED, T0, job, of, running_status, seen, spec, w

BOUND = SETTLED.cannot_start_seconds


def in_process(replicas: int, **policy) -> object:
    return spec(replicas=replicas, minReplicas=1, maxReplicas=4,
                failurePolicy={"recovery": "InProcess", **policy})


def ranks(n: int, generation: int = 0) -> list[dict]:
    return [{"index": i, "pod": f"j-worker-{i}", "phase": "Running", "uid": f"pod-{i}-g{generation}-a0",
             "generation": generation} for i in range(n)]


def carried(status, index: int) -> tuple[str | None, int | None]:
    rank = next(r for r in status.ranks if r.index == index)
    return rank.uid, rank.generation


# (before, after, the incident's ranks, the pods created for the new generation)
SCALES = [
    (3, 2, [2], []),
    (3, 1, [1, 2], []),
    (4, 2, [2, 3], []),
    (2, 3, [2], [2]),
    (1, 4, [1, 2, 3], [1, 2, 3]),
]


@pytest.mark.parametrize("before, after, moved, created", SCALES)
def test_a_new_size_is_a_new_generation_that_carries_every_survivor_and_stops_nobody(before, after, moved, created):
    out = d.decide(job(in_process(after), running_status(ranks=ranks(before)), generation=2),
                   seen(*(w(i) for i in range(before))), SETTLED)
    st = out.status
    assert (st.generation, st.restarts, st.disruptions, st.phase) == (1, 0, 0, "Running")
    assert not of(out, d.DeleteWorker)
    assert of(out, d.CreateWorker) == [d.CreateWorker(i, 1, 0) for i in created]
    for i in range(min(before, after)):
        assert carried(st, i) == (f"pod-{i}-g0-a0", 1)
    incident = st.incidents[-1]
    assert (incident.generation, incident.cause, incident.charged, incident.ranks) == \
        (0, REASON_SCALED_IN_PLACE, False, moved)
    assert incident.message == f"scaled in place {before} -> {after} workers"
    events = [e for e in of(out, d.Event) if e.reason == REASON_SCALED_IN_PLACE]
    assert len(events) == 1 and events[0].type == "Normal" and "not charged" in events[0].message
    assert [r.index for r in st.ranks] == list(range(after))


def after_scale_down(progress=None, departing_phase="Running", now=T0, **departing):
    """The pass after 3 -> 2 was decided: the survivors carried into generation 1, worker 2 still there."""
    first = d.decide(job(in_process(2), running_status(ranks=ranks(3)), generation=2),
                     seen(w(0), w(1), w(2)), SETTLED)
    workers = (w(0), w(1), w(2, departing_phase, **departing))
    return d.decide(job(in_process(2), first.status, generation=2),
                    d.Observed(workers=workers, store=seen().store, now=now, progress=progress), SETTLED)


def trained_in(generation: int) -> d.ProgressObservation:
    return d.ProgressObservation(generation=generation, step=7, last_advance=T0,
                                 ranks=(d.RankReport(0, generation, 7, T0), d.RankReport(1, generation, 7, T0)))


# (what the departing pod and the survivors are doing, what happens to the departing pod)
DEPARTURES = [
    ("its trainers have not left yet", {}, [], BOUND),
    ("its trainers exited 0: no seat in the new generation", {"departing_phase": "Succeeded", "exit_code": 0},
     [d.DeleteWorker("j-worker-2", REASON_SCALED_IN_PLACE, force=True)], None),
    ("it failed on its way out", {"departing_phase": "Failed", "exit_code": 1},
     [d.DeleteWorker("j-worker-2", REASON_SCALED_IN_PLACE, force=True)], None),
    ("the survivors train in the new generation", {"progress": trained_in(1)},
     [d.DeleteWorker("j-worker-2", REASON_SCALED_IN_PLACE)], None),
    ("the survivors still report the old generation", {"progress": trained_in(0)}, [], BOUND),
    ("the bound passed", {"now": T0 + timedelta(seconds=BOUND)},
     [d.DeleteWorker("j-worker-2", REASON_SCALED_IN_PLACE)], None),
]


@pytest.mark.parametrize("what, given, deleted, requeue", DEPARTURES, ids=[c[0] for c in DEPARTURES])
def test_a_departing_pod_goes_once_it_may_and_is_never_an_incident_nor_a_restart(what, given, deleted, requeue):
    out = after_scale_down(**given)
    st = out.status
    assert of(out, d.DeleteWorker) == deleted
    assert (st.generation, st.restarts, st.disruptions, st.phase) == (1, 0, 0, "Running"), st.message
    assert [i.cause for i in st.incidents] == [REASON_SCALED_IN_PLACE]
    assert not of(out, d.CreateWorker)
    assert [r.index for r in st.ranks] == [0, 1] and st.replicas == 2
    if requeue is not None:
        assert out.requeue_after == pytest.approx(requeue)


def test_a_scale_up_whose_pod_is_not_created_yet_is_created_again_in_the_same_generation():
    first = d.decide(job(in_process(3), running_status(ranks=ranks(2)), generation=2), seen(w(0), w(1)), SETTLED)
    again = d.decide(job(in_process(3), first.status, generation=2), seen(w(0), w(1)), SETTLED)
    assert again.status.generation == 1 and not again.status.incidents[:-1]
    assert of(again, d.CreateWorker) == [d.CreateWorker(2, 1, 0)]
    joined = d.decide(job(in_process(3), again.status, generation=2), seen(w(0), w(1), w(2, generation=1)), SETTLED)
    assert joined.status.generation == 1 and not joined.actions


def test_a_changed_minimum_alone_is_no_new_generation_in_process():
    """The trainers' world is the maximum of the node range: a new minReplicas changes nothing they use."""
    s = spec(replicas=2, minReplicas=2, maxReplicas=4, failurePolicy={"recovery": "InProcess"})
    out = d.decide(job(s, running_status(ranks=ranks(2)), generation=2),
                   seen(w(0, node_range="1-2"), w(1, node_range="1-2")), SETTLED)
    assert out.status.generation == 0 and not out.actions and not out.status.incidents


@pytest.mark.parametrize("before, after, cause", [(3, 2, d.REASON_SCALE_DOWN), (2, 3, d.REASON_RANGE_CHANGED)])
def test_restart_recovery_keeps_restarting_every_worker_at_the_new_size(before, after, cause):
    s = spec(replicas=after, minReplicas=1, maxReplicas=4, failurePolicy={"recovery": "Restart"})
    out = d.decide(job(s, running_status(ranks=ranks(before)), generation=2),
                   seen(*(w(i, node_range=f"1-{before}") for i in range(before))), SETTLED)
    assert out.status.generation == 1 and out.status.incidents[-1].cause == cause
    assert {a.name for a in of(out, d.DeleteWorker)} == {f"j-worker-{i}" for i in range(before)}
