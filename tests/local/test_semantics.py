"""The failure-semantics contract (docs/operator.md, "What users can rely on") on the local runner.

Every scenario that needs no Kubernetes runs here with real torchrun agents and the real trainer
(Gloo, CPU): how torch itself reacts (survivors' trainers failing on the next collective, agents
closing the rendezvous, in-place membership restarts, exit codes) is whatever torch does, not a model
of it. Each test asserts exactly what the contract's table promises: the terminal phase and its
condition's reason, status.restarts, status.disruptions, status.generation, the world size training
resumed at, and that it resumed at most one checkpoint interval behind the step of the fault.

The runner runs in-process (its status is read directly); faults and spec changes come from its
schedule (FaultInjection, SpecChange, Unschedulable), so every run is deterministic in its steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpjob_operator import validation
from ddpjob_operator.local.processes import marked_pids
from ddpjob_operator.local.pods import ExitRecord, Resume
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import DELETE, KILL, KILL_STORE, FaultInjection, RunOptions, SpecChange, Unschedulable

from .harness import RESUMED_EVENT, TINY_DIGITS, TimelineView

INTERVAL = 10  # checkpoint.intervalSteps
MAX_STEPS = 150  # tens of steps per second here: training is short, starting a generation is not
# The real trainer on its synthetic workload, small: nothing to import beyond torch (sklearn's digits
# would add seconds to every start of every generation on a 2-core machine).
WORKLOAD = ["--workload", "synthetic", "--workload-option", "samples=2048", "--workload-option", "eval_samples=256",
            "--workload-option", "features=32", "--workload-option", "hidden=64", "--batch-size", "32",
            "--lr", "0.05", "--log-every", "1"]
TRAIN_ARGS = [*WORKLOAD, "--epochs", "1000", "--max-steps", str(MAX_STEPS)]
STEP_LINE = re.compile(r"^step=(\d+) ", re.MULTILINE)
RESUME_MARK = "resumed from checkpoint step="


def spec(*, elastic: bool = False, **overrides) -> dict:
    """Two workers, a checkpoint every INTERVAL steps, backoff 0, budget 2. Static (2:2) unless
    `elastic` (1:2): a static rendezvous forms as soon as both agents joined; an elastic one waits
    lastCallTimeoutSeconds for the second agent of a fresh generation, so the job resumes at its
    full size rather than growing by a membership change afterwards."""
    base = {key: value for key, value in TINY_DIGITS.items() if key not in ("minReplicas", "maxReplicas")}
    base.update({"replicas": 2, "args": TRAIN_ARGS,
                 "rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 3, "readTimeoutSeconds": 30},
                 "checkpoint": {"claimTemplate": {"size": "1Gi"}, "intervalSteps": INTERVAL, "keep": 3},
                 # The restart path, which these scenarios are about (in-process recovery, the default with
                 # restartScope Pod, is asked for by name where a test is about it).
                 "failurePolicy": {"maxRestarts": 2, "recovery": "Restart",
                                   "backoff": {"initialSeconds": 0, "maxSeconds": 1}}})
    if elastic:
        base.update({"minReplicas": 1, "maxReplicas": 2})
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


@dataclass
class Outcome:
    runner: LocalRunner
    view: TimelineView
    log_dir: Path

    @property
    def status(self):
        return self.runner.status

    @property
    def phase(self) -> str | None:
        return self.status.phase

    @property
    def reason(self) -> str | None:
        """The reason of the terminal condition (Succeeded or Failed); None while not terminal."""
        condition = next((c for c in self.status.conditions
                          if c.type in ("Succeeded", "Failed") and c.status == "True"), None)
        return condition.reason if condition else None

    @property
    def resumes(self) -> list[Resume]:
        return self.runner.resumes

    @property
    def exits(self) -> list[ExitRecord]:
        return self.runner.exits

    def step_before_first_resume(self) -> int:
        """The last step rank 0 logged before training first resumed (rank 0 logs every step)."""
        steps = []
        for log in self.log_dir.glob("*-worker-*.log"):
            head = log.read_text(errors="replace").partition(RESUME_MARK)[0]
            steps += [int(s) for s in STEP_LINE.findall(head)]
        assert steps, f"no training step was logged before the fault\n{self.describe()}"
        return max(steps)

    def recovery_seconds(self) -> float | None:
        """From the first fault or spec change to the first training step after the first resume."""
        start = next((t for t, e in self.view.events
                      if e.startswith(("fault injection", "spec change")) or "exited with code" in e), None)
        resumed = next((t for t, e in self.view.events if start is not None and t > start and RESUMED_EVENT in e), None)
        if resumed is None:
            return None
        step0 = self.resumes[0].step
        later = next((t for t, _, step, _ in self.view.samples if t > resumed and (step or 0) > step0), None)
        return None if later is None else round(later - start, 1)

    def describe(self) -> str:
        s = self.status
        exits = "\n".join(f"  {e.pod} gen {e.generation} attempt {e.attempt}: exit {e.exit_code}"
                          f"{' (deleted)' if e.deleted else ''}: {e.message or '-'}" for e in self.exits)
        resumes = ", ".join(f"{r.pod} (gen {r.generation}) step {r.step} world {r.world_size} (step before: {b})"
                            for r, b in zip(self.resumes, self.view.step_before_resume)) or "none"
        incidents = getattr(s, "incidents", None)
        return (f"observed: phase {s.phase}, reason {self.reason}, restarts {s.restarts}, disruptions "
                f"{s.disruptions}, generation {s.generation}, resumes [{resumes}], "
                f"fault to next step: {self.recovery_seconds()}s\n"
                f"exits:\n{exits}\nincidents: {incidents}\nevents:\n{self.view.transcript()}")


def run_job(tmp_path: Path, name: str, job_spec: dict, *, timeout: float = 150, **options) -> Outcome:
    """Run the job in-process to Succeeded or Failed (RunTimeout past `timeout` seconds)."""
    job = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                "metadata": {"name": name}, "spec": job_spec})
    view = TimelineView(timeout=timeout)
    runner = LocalRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob", **options), view)
    try:
        runner.run()
    finally:
        assert marked_pids(runner.run_marker) == [], "the run left processes behind"
    outcome = Outcome(runner, view, runner.log_dir)
    print(f"\n[{name}] {outcome.describe()}")
    return outcome


def expect(o: Outcome, *, phase: str, reason: str, restarts: int, disruptions: int, generation: int | None) -> None:
    s = o.status
    observed = (s.phase, o.reason, s.restarts, s.disruptions, s.generation if generation is not None else None)
    assert observed == (phase, reason, restarts, disruptions, generation), \
        f"expected phase {phase}, reason {reason}, restarts {restarts}, disruptions {disruptions}, " \
        f"generation {generation}\n{o.describe()}"


def expect_resumed(o: Outcome, *, world_size: int, fault_step: int | None = None, lost: int = INTERVAL) -> Resume:
    """Training resumed once, at `world_size`, at most `lost` steps behind the fault: one checkpoint
    interval when no replica survived it, 1 (the step in flight) when one did (a rescue checkpoint).
    Rank 0 logs every step; if it died between a step and its log line, a survivor is one step ahead."""
    assert o.resumes, f"training never resumed from a checkpoint\n{o.describe()}"
    resume = o.resumes[0]
    at_fault = o.step_before_first_resume() if fault_step is None else fault_step
    assert (resume.world_size, at_fault - lost <= resume.step <= at_fault + 1) == (world_size, True), \
        f"expected a resume at world size {world_size} from a step in [{at_fault - lost}, {at_fault + 1}] " \
        f"(fault at step {at_fault})\n{o.describe()}"
    return resume


def expect_completed(o: Outcome) -> None:
    result = o.runner.summary().result
    assert result and result["status"] == "completed" and result["step"] == MAX_STEPS, \
        f"the trainer did not finish: {result}\n{o.describe()}"


pytestmark = pytest.mark.slow


# ---- a worker (or the store) killed ---------------------------------------------------------------

@pytest.mark.parametrize("scope, index, elastic", [
    ("Pod", 1, True),  # the survivor alone would still satisfy minReplicas: no reason to keep its generation
    ("All", 1, False),
    ("Pod", 0, False),  # the worker whose agent was first to join, usually rank 0's (the store is elsewhere)
], ids=["Pod-elastic", "All", "worker-0"])
def test_one_worker_sigkilled_is_one_charged_restart_in_a_new_generation(tmp_path, scope, index, elastic):
    # Killed between periodic checkpoints: the survivor's rescue checkpoint loses at most the step in flight.
    o = run_job(tmp_path, f"kill-{scope.lower()}-{index}", spec(elastic=elastic, failurePolicy={"restartScope": scope}),
                faults=(FaultInjection(index=index, at_step=43, kind=KILL),))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    expect_resumed(o, world_size=2, lost=1)
    expect_completed(o)


def test_two_workers_sigkilled_in_the_same_instant_are_one_incident(tmp_path):
    o = run_job(tmp_path, "kill-two", spec(),
                faults=(FaultInjection(index=0, at_step=40, kind=KILL), FaultInjection(index=1, at_step=40, kind=KILL)))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    expect_resumed(o, world_size=2)
    expect_completed(o)


def test_rendezvous_store_killed_is_a_disruption_in_a_new_generation(tmp_path):
    o = run_job(tmp_path, "kill-store", spec(), faults=(FaultInjection(at_step=40, kind=KILL_STORE),))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=0, disruptions=1, generation=1)
    expect_resumed(o, world_size=2)
    expect_completed(o)


# ---- a trainer crashing inside a live agent ------------------------------------------------------

FAULT_STEP = 45  # not a multiple of INTERVAL: the newest checkpoint is FAULT_STEP - 5


def test_trainer_sigsegv_once_is_one_charged_restart(tmp_path):
    o = run_job(tmp_path, "segv", spec(args=[*TRAIN_ARGS, "--fault-at-step", str(FAULT_STEP),
                                             "--fault-exit-code", "139", "--fault-rank", "0"]))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    expect_resumed(o, world_size=2, fault_step=FAULT_STEP)
    assert o.step_before_first_resume() == FAULT_STEP, o.describe()
    expect_completed(o)


def test_retryable_exit_code_in_every_generation_exhausts_the_budget(tmp_path):
    o = run_job(tmp_path, "retry", spec(
        args=[*TRAIN_ARGS, "--fault-at-step", str(FAULT_STEP), "--fault-exit-code", "75", "--fault-rank", "0",
              "--fault-every-generation"],
        failurePolicy={"maxRestarts": 1, "retryableExitCodes": [75]}))
    expect(o, phase="Failed", reason="RestartBudgetExhausted", restarts=1, disruptions=0, generation=None)
    assert o.status.generation >= 1, o.describe()
    expect_resumed(o, world_size=2, fault_step=FAULT_STEP)


def test_user_error_fails_at_once_with_permanent_error(tmp_path):
    o = run_job(tmp_path, "usererr", spec(args=[*TRAIN_ARGS, "--fault-at-step", str(FAULT_STEP),
                                                "--fault-exit-code", "1", "--fault-rank", "1"]))
    expect(o, phase="Failed", reason="PermanentError", restarts=0, disruptions=0, generation=0)
    assert not o.resumes and not [e for e in o.exits if e.generation > 0], o.describe()


# ---- disruptions ---------------------------------------------------------------------------------

def test_graceful_deletion_of_a_worker_is_a_disruption_not_a_restart(tmp_path):
    o = run_job(tmp_path, "delete", spec(), faults=(FaultInjection(index=1, at_step=40, kind=DELETE),))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=0, disruptions=1, generation=1)
    # The trainers saved on SIGTERM: training goes on from the very step it stopped at.
    logs = "".join(p.read_text(errors="replace") for p in o.log_dir.glob("*-worker-*.log"))
    stopped = re.search(r"stop requested at step (\d+)", logs)
    assert stopped, o.describe()
    resume = expect_resumed(o, world_size=2)
    assert resume.step == int(stopped.group(1)), o.describe()
    expect_completed(o)


# ---- spec changes: scale, suspend ----------------------------------------------------------------

def test_elastic_scale_up_and_down_each_start_a_new_generation_at_the_new_size(tmp_path):
    # Scale-down once training runs at 3; steps to spare, so it does not finish first. (spec() names recovery
    # Restart; in place: test_scale_in_place_keeps_the_survivors_trainers.py.)
    o = run_job(tmp_path, "elastic", spec(minReplicas=1, maxReplicas=3, args=[*WORKLOAD, "--epochs", "1000",
                                                                             "--max-steps", str(2 * MAX_STEPS)]),
                changes=(SpecChange(replicas=3, at_step=40), SpecChange(replicas=1, world_size=3)), timeout=200)
    expect(o, phase="Succeeded", reason="Succeeded", restarts=0, disruptions=0, generation=2)
    # Every worker stopped gracefully (the trainers saved on SIGTERM) and restarted at the new size.
    assert [(r.generation, r.world_size) for r in o.resumes] == [(1, 3), (2, 1)], o.describe()
    for resume, before in zip(o.resumes, o.view.step_before_resume):
        assert before is not None and before - INTERVAL <= resume.step <= before, o.describe()
    result = o.runner.summary().result
    assert result and result["status"] == "completed" and result["step"] == 2 * MAX_STEPS, o.describe()


def test_static_scale_starts_a_new_generation_at_the_new_size(tmp_path):
    # minReplicas/maxReplicas unset: they follow replicas, so the scale changes the node range.
    o = run_job(tmp_path, "static", spec(), changes=(SpecChange(replicas=3, at_step=40),), timeout=200)
    expect(o, phase="Succeeded", reason="Succeeded", restarts=0, disruptions=0, generation=1)
    expect_resumed(o, world_size=3)
    expect_completed(o)


def test_suspend_then_resume_continues_from_the_checkpoint(tmp_path):
    o = run_job(tmp_path, "suspend", spec(),
                changes=(SpecChange(suspend=True, at_step=40), SpecChange(suspend=False, in_phase="Suspended")))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=0, disruptions=0, generation=1)
    assert o.view.first_event("-> Suspended"), o.describe()
    expect_resumed(o, world_size=2)
    expect_completed(o)


# ---- success while a replacement cannot be scheduled ---------------------------------------------

def test_training_finishes_while_a_replacement_is_still_pending(tmp_path):
    # successPolicy RankZero: the policy is met by worker 0 alone ("training finishes"). In process (the default
    # recovery), as users run it: the survivor trains on short while the replacement waits. On the restart path
    # the survivor would wait DDPJOB_REJOIN_TIMEOUT_SECONDS (120) for the generation the replacement publishes,
    # then be replaced itself (tests/operator/test_in_place.py, the survivor that died with the incident).
    o = run_job(tmp_path, "pending", spec(elastic=True, runPolicy={"successPolicy": "RankZero"},
                                          failurePolicy={"recovery": "InProcess"}),
                faults=(FaultInjection(index=1, at_step=40, kind=KILL),),
                unschedulable=(Unschedulable(index=1, from_creation=2),))
    expect(o, phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    assert "successPolicy RankZero" in o.status.message, o.describe()
    # (phase, generation, restarts) per worker: the survivor carried into generation 1 finished, the replacement
    # of the killed worker is still Pending.
    ranks = {r.index: (r.phase, r.generation, r.restarts) for r in o.status.ranks}
    assert ranks == {0: ("Succeeded", 1, 0), 1: ("Pending", 1, 1)}, f"ranks: {ranks}\n{o.describe()}"
    # The survivor kept its trainer (its first process's one exit, 0: no resume) and trained the rest alone.
    assert [(e.pod, e.generation, e.exit_code) for e in o.exits] == \
        [("pending-worker-1", 0, 137), ("pending-worker-0", 0, 0)] and not o.resumes, o.describe()
    survivor = (o.log_dir / "pending-worker-0.log").read_text(errors="replace")
    # The generation it moved to is 0 or 1: whichever came first, its own shrink or the operator's carry.
    recovered = re.search(r"recovered in process: generation 0 -> [01], rank 0 of 1, state kept", survivor)
    assert recovered and STEP_LINE.findall(survivor[recovered.end():])[-1:] == [str(MAX_STEPS)], \
        f"the survivor did not train on alone to step {MAX_STEPS}\n{o.describe()}"
    expect_completed(o)
