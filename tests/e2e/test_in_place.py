"""Issue 25 on a real cluster: restartScope Pod replaces the failed rank, not the gang.

A worker SIGKILLed through the fault command: its pod is created again, every surviving pod keeps its
uid and its container's restartCount (the launcher joined the next generation in place, in the same
container), the status names each survivor as a member of the new generation, and training resumes at
the same world size from the survivors' rescue checkpoint, back within RECOVERED_WITHIN of the kill. With
restartScope All every pod is new. With recovery InProcess (issue 29) the survivors' trainer processes
themselves train on and the replacement gets the state from one of them."""

from __future__ import annotations

import re
import time

import pytest

from . import cluster
from .scenario import GENERATION_LINE, RECOVERED_WITHIN, Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def _policy(scope: str) -> dict:
    return {"maxRestarts": 3, "restartScope": scope, "backoff": {"initialSeconds": 1, "maxSeconds": 10}}


def _training_again(t: Training, generation: int, after: int, killed_at: float) -> None:
    """A training step past `after` in `generation` within RECOVERED_WITHIN of the kill (polled every
    second); prints the time seen."""
    t.wait(lambda: t.latest_step(generation) > after, f"a training step in generation {generation}",
           max(killed_at + RECOVERED_WITHIN - time.monotonic(), 1), interval=1)
    print(f"SIGKILL to a training step of generation {generation} in {time.monotonic() - killed_at:.1f} s "
          f"(polled every second; deadline {RECOVERED_WITHIN} s)")


@pytest.mark.parametrize("scope", ["Pod", "All"])
def test_a_killed_worker_is_replaced_and_only_with_all_the_gang(faults, namespace, operator, scope):
    t = Training(namespace, digits_job(f"in-place-{scope.lower()}", replicas=3, failure_policy=_policy(scope))).start()
    before = t.wait_training()
    g0 = t.generation
    survivors_before = t.containers()
    victim = next(r for r in t.current(g0) if r.uid != t.rank0_pod().uid)  # rank 0's pod survives

    killed_at = time.monotonic()
    cluster.fault("kill", f"{namespace}/{victim.name}", "--signal", "9")
    _training_again(t, g0 + 1, before, killed_at)
    t.wait_running_world(g0 + 1, 3)

    after = t.containers()
    kept = {name for name, state in survivors_before.items() if after.get(name) == state}
    if scope == "Pod":
        # Every survivor: same pod, same container (never restarted); the victim: a new pod.
        assert kept == set(survivors_before) - {victim.name}, (survivors_before, after)
        carried = {r["pod"]: r.get("generation") for r in t.status.get("ranks", [])}
        assert all(carried[name] == g0 + 1 for name in survivors_before), t.status.get("ranks")
    else:
        assert not kept, (survivors_before, after)
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=g0 + 1)
    # The survivors' rescue checkpoint: no step seen before the kill is lost.
    t.assert_resumed(g0 + 1, world=3, not_before=before, lost=0)
    t.assert_no_duplicates(replacements=True)


def test_a_warm_spare_takes_the_killed_workers_place(faults, namespace, operator):
    """failurePolicy.spares 1: a ready spare becomes worker 1 in the next generation; no worker pod is
    created for it, the survivor keeps its pod, the pool is refilled and training resumes at full size
    within RECOVERED_WITHIN."""
    policy = {**_policy("Pod"), "spares": 1}
    t = Training(namespace, digits_job("warm", replicas=2, failure_policy=policy)).start()
    before = t.wait_training()
    t.wait(lambda: t.status.get("readySpares") == 1, "a ready spare", 600)
    g0, before = t.generation, t.latest_step()  # training went on while the spare warmed up
    survivor = t.containers()["warm-worker-0"]
    spare = t.status["spares"][0]["pod"]

    killed_at = time.monotonic()
    cluster.fault("kill", f"{namespace}/warm-worker-1", "--signal", "9")
    _training_again(t, g0 + 1, before, killed_at)
    t.wait(lambda: next(r for r in t.status.get("ranks", []) if r["index"] == 1)["pod"] == spare,
           f"{spare} in worker 1's place", 60)
    t.wait_running_world(g0 + 1, 2)
    t.wait_progress_past(t.latest_step(g0 + 1))  # the spare's reports are taken (issue 31: progress froze)
    t.wait(lambda: t.status.get("readySpares") == 1 and t.status["spares"][0]["pod"] != spare,
           "the pool refilled", 600)
    assert t.containers()["warm-worker-0"] == survivor
    assert not any(r.name == "warm-worker-1" and r.generation > g0 for r in t.records.values()), \
        "a worker pod was created for the rank the spare took"
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=g0 + 1)
    t.assert_final_progress()
    t.assert_resumed(g0 + 1, world=2, not_before=before, lost=0)


def test_in_process_the_survivors_train_on_and_the_replacement_gets_the_state_from_a_peer(faults, namespace,
                                                                                          operator):
    """failurePolicy.recovery InProcess: after a SIGKILL of one of three workers the survivors keep their pods,
    their containers and their trainer processes (no trainer starts in them again; each trains on short at once,
    `recovered in process`, and takes the replacement in at a step boundary, `regrouped at step`), the replacement's trainer gets the state by broadcast (no checkpoint read), and the incident's
    recovery says InProcess, with its timeline and 0 steps lost, within RECOVERED_WITHIN of the kill."""
    policy = {**_policy("Pod"), "recovery": "InProcess"}
    t = Training(namespace, digits_job("in-process", replicas=3, failure_policy=policy)).start()
    t.wait_training()
    g0 = t.generation
    survivors_before = t.containers()
    victim = next(r for r in t.current(g0) if r.uid != t.rank0_pod().uid)
    trainers_started = {r.name: len(GENERATION_LINE.findall(r.log)) for r in t.current(g0) if r.uid != victim.uid}

    killed_at = time.monotonic()
    cluster.fault("kill", f"{namespace}/{victim.name}", "--signal", "9")

    def recovery() -> dict | None:
        """The killed generation's incident's recovery, once it reached its first step."""
        incident = next((i for i in reversed(t.status.get("incidents") or []) if i.get("generation") == g0), None)
        found = (incident or {}).get("recovery") or {}
        return found if found.get("firstStepTime") else None

    seen = t.wait(recovery, f"generation {g0}'s incident recovered (its first step)", RECOVERED_WITHIN, interval=1)
    print(f"SIGKILL to the recovery's first step seen in {time.monotonic() - killed_at:.1f} s; the operator's "
          f"timeline: {seen}")
    assert (seen.get("path"), seen.get("fallbackReason", ""), seen.get("stepsLost")) == ("InProcess", "", 0), seen
    assert not seen.get("spare") and seen.get("rendezvousTime") and seen.get("failureSeenTime"), seen
    t.wait_running_world(g0 + 1, 3)
    replacement = t.wait(lambda: next((r for r in t.current(g0 + 1) if r.name == victim.name and r.uid != victim.uid
                                       and "by broadcast" in r.log), None),
                         "the replacement's 'resumed from peer rank' line", 120)
    assert "resumed from peer rank" in replacement.log and "resumed from checkpoint" not in replacement.log

    after = t.containers()
    for name, started in trainers_started.items():
        assert after.get(name) == survivors_before[name], (name, survivors_before[name], after.get(name))
        log = next(r.log for r in t.current() if r.name == name and r.uid == survivors_before[name][0])
        # Issue 36: first the shrink (a short view of the same generation, no wait for the replacement), then the
        # join at a step boundary once the replacement's trainer arrived in generation g0 + 1.
        assert f"recovered in process: generation {g0} -> {g0}, rank" in log, log[-3000:]
        assert re.search(rf"regrouped at step \d+: view {g0}:\d+ -> {g0 + 1}:\d+", log), log[-3000:]
        assert len(GENERATION_LINE.findall(log)) == started, f"a trainer started again in {name}"
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=g0 + 1)
    t.assert_final_progress()
    t.assert_no_duplicates(replacements=True)
