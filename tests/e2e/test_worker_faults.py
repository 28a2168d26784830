"""Crashes, against the failure-semantics contract (docs/operator.md, "What users can rely on"):
containers SIGKILLed through the fault command (one worker, two at once, rank 0's pod, the
rendezvous store) and trainers that crash inside a live agent (the trainer's fault-injection flags).

Every scenario ends with exact values: terminal phase and reason, status.restarts,
status.disruptions, status.generation, the world size training resumed at (status.worldSize and
the trainer's "resumed from checkpoint" line) and the resumed step at most one checkpoint interval
behind the step reached before the fault."""

from __future__ import annotations

import pytest

from ddpjob_operator.naming import store_pod_name

from . import cluster
from .scenario import Training, digits_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def _kill(namespace: str, pod: str) -> tuple[str, ...]:
    return ("kill", f"{namespace}/{pod}", "--signal", "9")


def _recovers(t: Training, *, before: int, g0: int, world: int, restarts: int, disruptions: int,
              lost: int | None = 0) -> None:
    """The common end of a crash scenario: one new generation resumes at the same world size and trains
    to the end. By default a worker survived the kill and saved its replica (a rescue checkpoint) at the
    step it had reached, which is at or past `before`: no step seen before the fault is lost (`lost`
    None: up to one checkpoint interval)."""
    t.wait_running_world(g0 + 1, world)
    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=restarts, disruptions=disruptions,
                     generation=g0 + 1)
    t.assert_resumed(g0 + 1, world=world, not_before=before, lost=lost)


@pytest.mark.parametrize("scope", ["Pod", "All"])
def test_sigkilled_worker_costs_one_restart_and_resumes_at_the_same_world_size(faults, namespace, operator, scope):
    t = Training(namespace, digits_job("kill-one", failure_policy={
        "maxRestarts": 3, "restartScope": scope, "backoff": {"initialSeconds": 1, "maxSeconds": 10}})).start()
    before = t.wait_training()
    g0 = t.generation
    victim = next(r for r in t.current(g0) if r.uid != t.rank0_pod().uid)  # a worker that does not host rank 0

    cluster.fault(*_kill(namespace, victim.name))

    _recovers(t, before=before, g0=g0, world=2, restarts=1, disruptions=0)


def test_two_workers_sigkilled_in_the_same_instant_are_one_incident(faults, namespace, operator):
    t = Training(namespace, digits_job("kill-two", replicas=3)).start()
    before = t.wait_training()
    g0 = t.generation

    cluster.faults_at_once(_kill(namespace, t.pod(1)["metadata"]["name"]),
                           _kill(namespace, t.pod(2)["metadata"]["name"]))

    _recovers(t, before=before, g0=g0, world=3, restarts=1, disruptions=0)


def test_killing_the_pod_that_hosts_rank_0_is_an_ordinary_restart(faults, namespace, operator):
    t = Training(namespace, digits_job("kill-rank0")).start()
    before = t.wait_training()
    g0 = t.generation
    host = t.rank0_pod()

    cluster.fault(*_kill(namespace, host.name))

    _recovers(t, before=before, g0=g0, world=2, restarts=1, disruptions=0)


def test_killed_rendezvous_store_moves_the_job_to_a_new_generation_uncharged(faults, namespace, operator):
    t = Training(namespace, digits_job("kill-store")).start()
    before = t.wait_training()
    g0 = t.generation
    store = cluster.store_pod(namespace, t.name)
    assert store is not None and store["status"].get("phase") == "Running", t.describe()

    cluster.fault(*_kill(namespace, store_pod_name(t.name)))

    t.wait(lambda: cluster.store_pod(namespace, t.name) is not None
           and cluster.store_pod(namespace, t.name)["metadata"]["uid"] != store["metadata"]["uid"],
           "a fresh rendezvous store pod", timeout=600)
    # Every trainer lives on, but each agent lost the store: they stop their trainers (SIGTERM: a final
    # checkpoint, if they agree on the stop in time).
    _recovers(t, before=before, g0=g0, world=2, restarts=0, disruptions=1, lost=None)


# ---------------------------------------------------------------- trainers crashing inside a live agent
# The trainer's fault injection: `--fault-exit-code CODE --fault-at-step N` makes the trainer of global
# rank `--fault-rank` (default 0) exit with CODE when it reaches step N, in generation 0 only
# (DDPJOB_GENERATION == "0"), or in every generation with `--fault-every-generation`.

FAULT_STEP = 95  # not a checkpoint step: the newest checkpoint before it is at step 90


def _exit_codes(t: Training) -> set[int | None]:
    return {r.get("lastExitCode") for r in t.status.get("ranks", [])}


def test_trainer_segfault_is_one_charged_restart_then_success(namespace, operator):
    t = Training(namespace, digits_job("crash-139", trainer_args=[
        "--fault-exit-code", "139", "--fault-at-step", str(FAULT_STEP)])).start()

    t.wait_running_world(1, 2)
    t.wait_terminal()

    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    t.assert_resumed(1, world=2, not_before=FAULT_STEP, not_after=FAULT_STEP)
    assert 139 in _exit_codes(t), t.status.get("ranks")


def test_retryable_exit_code_every_generation_spends_the_budget(namespace, operator):
    t = Training(namespace, digits_job("crash-75", trainer_args=[
        "--fault-exit-code", "75", "--fault-at-step", str(FAULT_STEP), "--fault-every-generation"],
        failure_policy={"maxRestarts": 1, "restartScope": "Pod", "retryableExitCodes": [75],
                        "backoff": {"initialSeconds": 1, "maxSeconds": 10}})).start()

    t.wait_terminal()

    t.assert_outcome(phase="Failed", reason="RestartBudgetExhausted", restarts=1, disruptions=0)
    assert 75 in _exit_codes(t), t.status.get("ranks")
    # The one charged restart ran a second generation: it resumed from step 90 and crashed again at 95.
    t.assert_resumed(1, world=2, not_before=FAULT_STEP, not_after=FAULT_STEP)


def test_user_error_fails_at_once_without_restarts(namespace, operator):
    t = Training(namespace, digits_job("crash-1", trainer_args=[
        "--fault-exit-code", "1", "--fault-at-step", str(FAULT_STEP)])).start()

    t.wait_terminal()

    t.assert_outcome(phase="Failed", reason="PermanentError", restarts=0, disruptions=0)
    assert 1 in _exit_codes(t), t.status.get("ranks")
    assert {r.generation for r in t.records.values()} == {0}, "a permanent error must not start another generation"
