"""Issue 25 on the API tier: restartScope Pod replaces the failed rank, not the gang.

The real operator against the API double; the test plays scheduler and kubelets (test_scenarios.Nodes).
With restartScope Pod a survivor's launcher keeps its pod and joins the next generation in place, so the
kubelets here leave survivors Running: only the failed rank's pod is deleted and created again, the
survivors keep their uid, and the status names each survivor (by uid) as a member of the new generation.
"""

from __future__ import annotations

import asyncio

import pytest

from ddpjob_operator import naming

from .conftest import eventually, passes
from .test_scenarios import (NO_BACKOFF, PEER_LOST, assert_outcome, creations, deletions, nodes, operator,  # noqa: F401
                             started, uids)

pytestmark = pytest.mark.timeout(60)

SEGFAULT = "rank 0 (local rank 0) exited with code 139: killed by SIGSEGV [generation {generation}]"


def carried(status: dict, index: int) -> tuple[str | None, int | None]:
    rank = next(r for r in status["ranks"] if r["index"] == index)
    return rank.get("uid"), rank.get("generation")


async def test_a_killed_worker_is_replaced_and_the_survivors_keep_their_pods(harness, operator, nodes):
    await started(harness, nodes, "keep", replicas=3, failurePolicy={"maxRestarts": 3, **NO_BACKOFF})
    before = uids(harness, "keep")
    await nodes.exit("keep-worker-1", 137)
    await nodes.generation_running("keep", 1, 3)
    after = uids(harness, "keep")
    assert after["keep-worker-0"] == before["keep-worker-0"] and after["keep-worker-2"] == before["keep-worker-2"]
    assert after["keep-worker-1"] != before["keep-worker-1"]
    status = assert_outcome(harness, "keep", phase="Running", reason="Running", restarts=1, disruptions=0,
                            generation=1, incident=("Retryable", True, [1]))
    assert carried(status, 0) == (before["keep-worker-0"], 1) and carried(status, 2) == (before["keep-worker-2"], 1)
    assert carried(status, 1) == (after["keep-worker-1"], 1)
    assert creations(harness, "keep") == {"keep-worker-0": 1, "keep-worker-1": 2, "keep-worker-2": 1, "keep-rdzv": 1}
    assert deletions(harness, "keep-worker-0") == [] and deletions(harness, "keep-worker-2") == []
    assert harness.pods("keep")["keep-worker-1"]["metadata"]["labels"][naming.LABEL_GENERATION] == "1"


async def test_two_workers_killed_at_once_are_one_incident_and_two_new_pods(harness, operator, nodes):
    """Workers 1 and 2 die in the same instant while worker 0 keeps running: one charged incident naming
    both, one new generation, the survivor carried into it in place, and exactly the two lost ranks' pods
    created again (nothing for the survivor, nothing twice)."""
    await started(harness, nodes, "pair", replicas=3, failurePolicy={"maxRestarts": 3, **NO_BACKOFF})
    before = uids(harness, "pair")
    created = sum(creations(harness, "pair").values())
    await asyncio.gather(nodes.exit("pair-worker-1", 137), nodes.exit("pair-worker-2", 137))
    await nodes.generation_running("pair", 1, 3)
    await passes(operator)  # nothing more happens
    after = uids(harness, "pair")
    assert after["pair-worker-0"] == before["pair-worker-0"]
    assert after["pair-worker-1"] != before["pair-worker-1"] and after["pair-worker-2"] != before["pair-worker-2"]
    status = assert_outcome(harness, "pair", phase="Running", reason="Running", restarts=1, disruptions=0,
                            generation=1, incident=("Retryable", True, [1, 2]))
    assert len(status["incidents"]) == 1
    assert carried(status, 0) == (before["pair-worker-0"], 1)
    assert sum(creations(harness, "pair").values()) - created == 2
    assert creations(harness, "pair") == {"pair-worker-0": 1, "pair-worker-1": 2, "pair-worker-2": 2, "pair-rdzv": 1}
    assert deletions(harness, "pair-worker-0") == []


async def test_restart_scope_all_replaces_every_pod(harness, operator, nodes):
    await started(harness, nodes, "gang", replicas=3,
                  failurePolicy={"maxRestarts": 3, "restartScope": "All", **NO_BACKOFF})
    before = uids(harness, "gang")
    await nodes.exit("gang-worker-1", 137)
    await nodes.generation_running("gang", 1, 3)
    assert not set(uids(harness, "gang").values()) & set(before.values())
    assert creations(harness, "gang") == {"gang-worker-0": 2, "gang-worker-1": 2, "gang-worker-2": 2, "gang-rdzv": 1}


async def test_a_failure_during_the_generation_change_is_charged_once_and_keeps_the_survivors(harness, operator,
                                                                                             nodes):
    """The replacement dies before its generation ever trained: a second incident (its own charge), a
    third generation, and the survivors are carried along again; no pod is created twice for one purpose."""
    await started(harness, nodes, "change", replicas=3, failurePolicy={"maxRestarts": 3, **NO_BACKOFF})
    before = uids(harness, "change")
    await nodes.exit("change-worker-1", 137)
    await eventually(lambda: harness.pods("change").get("change-worker-1", {}).get("metadata", {}).get("labels", {})
                     .get(naming.LABEL_GENERATION) == "1", what="the replacement of worker 1")
    await nodes.start("change-worker-1")
    await nodes.exit("change-worker-1", 137)
    await nodes.generation_running("change", 2, 3)
    after = uids(harness, "change")
    assert after["change-worker-0"] == before["change-worker-0"] and after["change-worker-2"] == before["change-worker-2"]
    status = assert_outcome(harness, "change", phase="Running", reason="Running", restarts=2, disruptions=0,
                            generation=2, incident=("Retryable", True, [1]))
    assert [i["generation"] for i in status["incidents"]] == [0, 1]
    assert carried(status, 0) == (before["change-worker-0"], 2)
    assert creations(harness, "change") == {"change-worker-0": 1, "change-worker-1": 3, "change-worker-2": 1,
                                           "change-rdzv": 1}


async def test_a_survivor_that_died_with_the_incident_is_replaced_without_a_second_charge(harness, operator, nodes):
    """A survivor whose launcher exited after all (its trainer's error, a launcher that gave up waiting) is
    part of the incident that carried it: replaced in the new generation, never charged again."""
    await started(harness, nodes, "late", replicas=3, failurePolicy={"maxRestarts": 3, **NO_BACKOFF})
    await nodes.exit("late-worker-1", 137)
    await eventually(lambda: harness.status("late").get("generation") == 1, what="generation 1")
    await nodes.exit("late-worker-0", 1, PEER_LOST.format(rank=0))
    await nodes.exit("late-worker-2", 1, "rejoin failed: no rendezvous generation newer than 0 started within "
                                         "120 s; " + PEER_LOST.format(rank=2))
    await nodes.generation_running("late", 1, 3)
    # One incident, every rank it took: the two survivors that died with it are listed in it too.
    assert_outcome(harness, "late", phase="Running", reason="Running", restarts=1, disruptions=0, generation=1,
                   incident=("Retryable", True, [0, 1, 2]))
    assert creations(harness, "late") == {"late-worker-0": 2, "late-worker-1": 2, "late-worker-2": 2, "late-rdzv": 1}


async def test_a_later_failure_of_a_carried_survivor_is_a_new_incident(harness, operator, nodes):
    """The launcher marks the generation a failure happened in: a carried survivor crashing in the new
    generation is that generation's incident, charged on its own."""
    await started(harness, nodes, "again", replicas=2, failurePolicy={"maxRestarts": 3, **NO_BACKOFF})
    survivor = uids(harness, "again")["again-worker-0"]
    await nodes.exit("again-worker-1", 137)
    await nodes.generation_running("again", 1, 2)
    await nodes.exit("again-worker-0", 139, SEGFAULT.format(generation=1))
    await nodes.generation_running("again", 2, 2)
    status = assert_outcome(harness, "again", phase="Running", reason="Running", restarts=2, disruptions=0,
                            generation=2, incident=("Retryable", True, [0]))
    assert uids(harness, "again")["again-worker-0"] != survivor
    assert carried(status, 1)[1] == 2  # worker 1's replacement survived this time, and was carried


@pytest.mark.parametrize("original, expected", [
    ("rendezvous failed: RendezvousClosedError: the rendezvous was closed while this agent was in it", "Consequence"),
    ("rank 1 (local rank 0) exited with code 1: RuntimeError: Connection closed by peer", "PeerFailure"),
    ("rank 1 (local rank 0) exited with code 1: ValueError: bad batch", "Permanent"),
])
def test_a_launcher_that_gave_up_waiting_is_judged_by_the_failure_it_exited_with(original, expected):
    from ddpjob_operator import decisions as d
    from ddpjob_operator import model

    message = f"rejoin failed: no rendezvous generation newer than 3 started within 120 s; {original} [generation 3]"
    assert d.classify_exit(1, "Error", False, model.FailurePolicy(), message) == expected
