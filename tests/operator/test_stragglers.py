"""Issue 22: straggler detection. The pure scoring (decisions/stragglers.py) as tables, the decision layer's
condition, event and Replace, and the API tier: the real operator's progress endpoint receiving per-pod own
step times (`step_seconds`), against the emulator, with the test playing the trainers, scheduler and kubelets."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from datetime import datetime, timedelta, timezone

import pytest

from ddpjob_operator import decisions, model, naming
from ddpjob_operator import progress as progress_module
from ddpjob_operator.decisions import stragglers as st

from .conftest import NAMESPACE, eventually
from .test_avoided_nodes import anti_affinity
from .test_progress import AUDIENCE, metric, operator, reporter  # noqa: F401 - fixtures
from .test_scenarios import nodes, started  # noqa: F401 - fixtures

T0 = datetime(2026, 11, 22, tzinfo=timezone.utc)


def history(per_rank: dict[int, list[float]], *, every: float = 1.0, generation: int = 0,
            start: datetime = T0) -> tuple[decisions.RankTimings, ...]:
    """One report per `every` seconds per rank, from `start`."""
    h = st.TimingHistory()
    for i, values in per_rank.items():
        for n, seconds in enumerate(values):
            h.add(i, generation, n + 1, seconds, start + timedelta(seconds=n * every))
    return h.snapshot()


# ---------------------------------------------------------------- scoring (pure)

@pytest.mark.parametrize("what, ranks, window, now, named", [
    ("a worker 2x slower for the whole window is named",
     {0: [0.1] * 40, 1: [0.1] * 40, 2: [0.2] * 40}, 30, 39, 2),
    ("not before it has been watched for a whole window",
     {0: [0.1] * 20, 1: [0.1] * 20, 2: [0.2] * 20}, 30, 19, None),
    ("equal workers: nobody", {0: [0.1] * 40, 1: [0.1] * 40, 2: [0.1] * 40}, 30, 39, None),
    ("1.3x is below the default threshold", {0: [0.1] * 40, 1: [0.1] * 40, 2: [0.13] * 40}, 30, 39, None),
    ("slow in a quarter of the window (checkpoint writes, a noisy burst): nobody",
     {0: [0.1] * 40, 1: [0.1] * 40, 2: ([0.1] * 3 + [0.3]) * 10}, 30, 39, None),
    ("slow in the older half of the window only: nobody",
     {0: [0.1] * 40, 1: [0.1] * 40, 2: [0.3] * 25 + [0.1] * 15}, 30, 39, None),
    ("two workers: the slower one", {0: [0.1] * 40, 1: [0.25] * 40}, 30, 39, 1),
    ("one worker has no peers", {0: [0.5] * 40}, 30, 39, None),
    ("the slowest of two slow ones", {0: [0.1] * 40, 1: [0.1] * 40, 2: [0.2] * 40, 3: [0.3] * 40, 4: [0.1] * 40},
     30, 39, 3),
])
def test_scoring(what, ranks, window, now, named):
    scores = st.score(history(ranks), 0, T0 + timedelta(seconds=now), window)
    assert st.judge(scores, None, 1.5) == named, (what, scores)


def test_hysteresis_a_named_worker_is_released_only_half_way_back():
    scores = {i: st.Score(i, 0.1, 1.0, 1.0, True) for i in (0, 1)}
    for ratio, stays in ((1.45, True), (1.3, True), (1.25, True), (1.24, False), (1.0, False)):
        scores[2] = st.Score(2, 0.1 * ratio, ratio, ratio, True)
        assert (st.judge(scores, 2, 1.5) == 2) is stays, ratio
    # Never named in the first place at 1.45: the threshold must be crossed for a whole window.
    scores[2] = st.Score(2, 0.145, 1.45, 1.45, True)
    assert st.judge(scores, None, 1.5) is None


def test_history_keeps_one_generation_per_worker_and_ignores_heartbeats():
    h = st.TimingHistory(max_samples=3)
    h.add(0, 1, 10, 0.1, T0)
    h.add(0, 1, 10, 0.9, T0 + timedelta(seconds=5))  # a heartbeat repeats step 10: nothing new
    h.add(0, 0, 11, 0.9, T0 + timedelta(seconds=6))  # an old generation's pod, still stopping
    assert [s.seconds for s in h.snapshot()[0].samples] == [0.1]
    for step in range(11, 16):
        h.add(0, 1, step, 0.2, T0 + timedelta(seconds=step))
    assert len(h.snapshot()[0].samples) == 3  # bounded
    h.add(0, 2, 1, 0.3, T0 + timedelta(seconds=30))  # a new generation starts afresh
    rank = h.snapshot()[0]
    assert rank.generation == 2 and rank.since == T0 + timedelta(seconds=30) and len(rank.samples) == 1


def test_a_report_rejects_a_bad_step_time_naming_the_field():
    assert progress_module.parse_report(b'{"step": 1, "step_seconds": 0.25}').step_seconds == 0.25
    for bad in (b'-1', b'"fast"', b'1e9', b'true'):
        with pytest.raises(progress_module.BadReport, match="step_seconds") as e:
            progress_module.parse_report(b'{"step": 1, "step_seconds": ' + bad + b'}')
        assert e.value.status == 422


# ---------------------------------------------------------------- the decision layer

SPEC = model.DDPJobSpec.model_validate({
    "replicas": 3, "image": "img", "entrypoint": "ddp_trainer",
    "failurePolicy": {"stragglerWindowSeconds": 30}}, strict=False)


def running_job(spec: model.DDPJobSpec, **status) -> decisions.JobView:
    return decisions.JobView(name="j", namespace="ns", uid="u", metadata_generation=1, created_at=T0, spec=spec,
                             status=model.DDPJobStatus(phase="Running", start_time="2026-11-22T00:00:00Z", **status))


def workers(n: int = 3) -> tuple[decisions.WorkerObservation, ...]:
    return tuple(decisions.WorkerObservation(index=i, name=f"j-worker-{i}", generation=0, phase="Running",
                                             ready=True, node=f"node-{i}", uid=f"uid-{i}") for i in range(n))


def observe(ranks: dict[int, list[float]], now: float) -> decisions.Observed:
    timings = history(ranks)
    progress = decisions.ProgressObservation(generation=0, step=40, last_advance=T0 + timedelta(seconds=now),
                                             timings=timings)
    return decisions.Observed(workers=workers(), store=decisions.StoreObservation(phase="Running", ready=True),
                              now=T0 + timedelta(seconds=now), progress=progress)


SLOW_2 = {0: [0.1] * 40, 1: [0.1] * 40, 2: [0.2] * 40}


def events(decision: decisions.Decision, reason: str) -> list[decisions.Event]:
    return [a for a in decision.actions if isinstance(a, decisions.Event) and a.reason == reason]


def test_report_names_the_rank_pod_node_and_ratio_once():
    d = decisions.decide(running_job(SPEC), observe(SLOW_2, 39))
    cond = next(c for c in d.status.conditions if c.type == "Straggler")
    assert cond.status == "True" and cond.reason == "Straggler"
    for words in ("worker 2", "pod j-worker-2", "node node-2", "2.00x"):
        assert words in cond.message, cond.message
    assert [e.type for e in events(d, "Straggler")] == ["Warning"]
    assert d.status.step_times.slowest == "2 (2.00x)" and d.status.step_times.straggler == 2
    # Each to the median of its own peers: a healthy worker's peers include the straggler.
    assert [(r.index, r.ratio) for r in d.status.step_times.ranks] == [(0, 0.67), (1, 0.67), (2, 2.0)]
    # Report only: nothing is deleted, nothing charged.
    assert not [a for a in d.actions if isinstance(a, decisions.DeleteWorker)]
    assert d.status.restarts == 0 and d.status.disruptions == 0 and d.status.generation == 0
    # The next pass says nothing new: one event per straggler, not one per pass.
    again = decisions.decide(running_job(SPEC, **_carry(d.status)), observe(SLOW_2, 40))
    assert events(again, "Straggler") == []


def _carry(status: model.DDPJobStatus) -> dict:
    return {"conditions": status.conditions, "step_times": status.step_times, "ranks": status.ranks}


def test_a_run_without_a_straggler_raises_nothing():
    d = decisions.decide(running_job(SPEC), observe({0: [0.1] * 40, 1: [0.11] * 40, 2: [0.095] * 40}, 39))
    assert not [c for c in d.status.conditions if c.type == "Straggler"]
    assert events(d, "Straggler") == [] and d.status.step_times.straggler is None


def test_the_condition_clears_when_the_worker_recovers():
    named = decisions.decide(running_job(SPEC), observe(SLOW_2, 39)).status
    recovered = decisions.decide(running_job(SPEC, **_carry(named)),
                                 observe({0: [0.1] * 80, 1: [0.1] * 80, 2: [0.2] * 40 + [0.1] * 40}, 79))
    cond = next(c for c in recovered.status.conditions if c.type == "Straggler")
    assert cond.status == "False" and cond.reason == "NoStraggler"


def test_replace_is_an_uncharged_disruption_that_deletes_only_the_straggler():
    spec = SPEC.model_copy(update={"failure_policy": SPEC.failure_policy.model_copy(update={"stragglers": "Replace"})})
    d = decisions.decide(running_job(spec), observe(SLOW_2, 39))
    deleted = [a for a in d.actions if isinstance(a, decisions.DeleteWorker)]
    assert [(a.name, a.reason) for a in deleted] == [("j-worker-2", "StragglerReplaced")]
    assert d.status.restarts == 0 and d.status.disruptions == 1 and d.status.generation == 1
    incident = d.status.incidents[-1]
    assert (incident.cause, incident.reason, incident.charged, incident.ranks) == \
        ("Disruption", "StragglerReplaced", False, [2])
    # The survivors are carried into generation 1 in place; the straggler's node is noted as evidence.
    ranks = {r.index: r for r in d.status.ranks}
    assert (ranks[0].uid, ranks[0].generation) == ("uid-0", 1) and (ranks[1].uid, ranks[1].generation) == ("uid-1", 1)
    assert ranks[2].restarts == 1
    assert [(f.node, f.reason) for f in d.status.node_failures] == [("node-2", "StragglerReplaced")]
    assert d.status.phase == "Restarting" and events(d, "StragglerReplaced")


REPLACE = SPEC.model_copy(update={"failure_policy": SPEC.failure_policy.model_copy(
    update={"stragglers": "Replace", "avoid_node_seconds": 600})})


def _failure(node: str, reason: str) -> model.NodeFailure:
    return model.NodeFailure(node=node, time="2026-11-22T00:00:00Z", reason=reason, pod_uid=f"old-{node}")


@pytest.mark.parametrize("what, spec, before, avoided", [
    ("the straggler's node is avoided at once, not after a second failure", REPLACE, {}, ["node-2"]),
    ("a crash on another node is another kind of failure: still avoided", REPLACE,
     {"node_failures": [_failure("node-0", "Signal")]}, ["node-2"]),
    ("a straggler replaced on another node as well: the slowness follows the rank, not the node", REPLACE,
     {"node_failures": [_failure("node-7", "StragglerReplaced")]}, []),
    ("already avoided: one mark", REPLACE,
     {"avoided_nodes": [model.AvoidedNode(node="node-2", reason="r", since="2026-11-22T00:00:00Z",
                                          until="2026-11-22T00:30:00Z")]}, ["node-2"]),
    ("avoidNodeSeconds 0 turns it off",
     REPLACE.model_copy(update={"failure_policy": REPLACE.failure_policy.model_copy(
         update={"avoid_node_seconds": 0})}), {}, []),
])
def test_replace_moves_the_straggler_off_its_node(what, spec, before, avoided):
    d = decisions.decide(running_job(spec, **before), observe(SLOW_2, 39))
    assert [a.node for a in d.status.avoided_nodes] == avoided, what
    marked = [a for a in d.status.avoided_nodes if a.since == "2026-11-22T00:00:39Z"]
    assert [e.type for e in events(d, "NodeAvoided")] == ["Warning"] * len(marked), what
    if marked:  # newly marked: expiring avoidNodeSeconds from now, and the operator wakes up for it
        assert marked[0].until == "2026-11-22T00:10:39Z" and "StragglerReplaced" in marked[0].reason, what
    # The next pass, the straggler's pod gone: its replacement keeps off the avoided node.
    survivors = tuple(w for w in workers() if w.index != 2)
    after = decisions.decide(dataclasses.replace(running_job(spec), status=d.status),
                             decisions.Observed(workers=survivors, now=T0 + timedelta(seconds=40),
                                                store=decisions.StoreObservation(phase="Running", ready=True)))
    created = [a for a in after.actions if isinstance(a, decisions.CreateWorker)]
    assert [(c.index, c.avoid_nodes) for c in created] == [(2, tuple(avoided))], what


# ---------------------------------------------------------------- API tier: the real operator

async def _train(harness, reporter, job: str, seconds: dict[int, float], until, timeout: float, what: str):
    """Play the trainers: every pod reports a step and its own step time about twice a second (the client's
    pace) until `until()` holds."""
    tokens = {i: harness.cluster.issue_token(NAMESPACE, f"{job}-worker-{i}", (AUDIENCE,)) for i in seconds}
    steps = itertools.count(1)

    async def loop() -> None:
        while True:
            step = next(steps)
            for i, token in tokens.items():
                status, body = await reporter.post(job, token, {"step": step, "rank": 0 if i == 0 else i,
                                                                "step_seconds": seconds[i]})
                assert status == 204, body
            await asyncio.sleep(0.6)  # the trainer's pace, not a wait for the operator
    task = asyncio.get_running_loop().create_task(loop())
    try:
        return await eventually(until, timeout, what)
    finally:
        task.cancel()


async def test_api_a_slowed_worker_is_named_with_its_node_and_the_job_keeps_running(harness, operator, reporter,
                                                                                    nodes):
    await started(harness, nodes, "slow", replicas=3, failurePolicy={"stragglerWindowSeconds": 10})
    cond = await _train(harness, reporter, "slow", {0: 0.1, 1: 0.1, 2: 0.2},
                        lambda: (c := harness.condition("slow", "Straggler")) and c["status"] == "True" and c, 30,
                        "the Straggler condition")
    assert "worker 2 (pod slow-worker-2, node node-2)" in cond["message"] and "2.00x" in cond["message"], cond
    await eventually(lambda: [e for e in harness.events("slow") if e["reason"] == "Straggler"
                              and e["type"] == "Warning" and "node node-2" in e["message"]], what="the Straggler Event")
    status = harness.status("slow")
    assert status["stepTimes"]["slowest"] == "2 (2.00x)" and status["phase"] == "Running"
    assert status["restarts"] == 0 and status["disruptions"] == 0 and status["generation"] == 0
    assert metric(operator, "ddpjob_rank_step_seconds", ddpjob="slow", rank="2") == 0.2
    assert metric(operator, "ddpjob_rank_step_seconds", ddpjob="slow", rank="0") == 0.1
    assert all(not p["metadata"].get("deletionTimestamp") for p in harness.pods("slow").values())


async def test_api_replace_moves_the_straggler_off_its_node_as_an_uncharged_disruption(harness, operator, reporter,
                                                                                       nodes):
    await started(harness, nodes, "swap", replicas=3,
                  failurePolicy={"stragglerWindowSeconds": 10, "stragglers": "Replace", "maxRestarts": 0})
    before = {n: p["metadata"]["uid"] for n, p in harness.pods("swap").items()}
    await _train(harness, reporter, "swap", {0: 0.1, 1: 0.3, 2: 0.1},
                 lambda: harness.status("swap").get("disruptions") == 1, 30, "the straggler's replacement")
    status = harness.status("swap")
    assert status["restarts"] == 0 and status["generation"] == 1  # maxRestarts 0: a charge would have failed it
    incident = status["incidents"][-1]
    assert (incident["cause"], incident["reason"], incident["charged"], incident["ranks"]) == \
        ("Disruption", "StragglerReplaced", False, [1])
    await eventually(lambda: [e for e in harness.events("swap") if e["reason"] == "StragglerReplaced"
                              and "node node-1" in e["message"]], what="the StragglerReplaced Event")
    # Only the straggler's pod goes; the survivors keep theirs and join generation 1 in place.
    await nodes.generation_running("swap", 1, 3)
    after = {n: p["metadata"]["uid"] for n, p in harness.pods("swap").items()}
    assert after["swap-worker-0"] == before["swap-worker-0"] and after["swap-worker-2"] == before["swap-worker-2"]
    assert after["swap-worker-1"] != before["swap-worker-1"]
    assert harness.pods("swap")["swap-worker-1"]["metadata"]["labels"][naming.LABEL_GENERATION] == "1"
    assert harness.status("swap")["phase"] == "Running"
    # Off its node: the straggler's node is avoided at once, and only the replacement is kept off it.
    assert [a["node"] for a in harness.status("swap")["avoidedNodes"]] == ["node-1"]
    assert anti_affinity(harness.pods("swap")["swap-worker-1"]) == ["node-1"]
    assert [anti_affinity(harness.pods("swap")[f"swap-worker-{i}"]) for i in (0, 2)] == [[], []]
    await eventually(lambda: [e for e in harness.events("swap") if e["reason"] == "NodeAvoided"
                              and e["type"] == "Warning" and "node node-1" in e["message"]],
                     what="the NodeAvoided Event")
