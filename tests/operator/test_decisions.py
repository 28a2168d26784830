"""Decision layer: (job, observed, now) -> status + actions. Pure and table-driven."""

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from ddpjob_operator import decisions as d
from ddpjob_operator import model
from ddpjob_operator.decisions.common import describe_failure
from ddpjob_operator.validation import InvalidJob, parse_spec

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
UID = "uid-1"


def spec(**overrides) -> model.DDPJobSpec:
    base = {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer",
            "failurePolicy": {"maxRestarts": 3, "backoff": {"initialSeconds": 10, "maxSeconds": 60}}}
    for key, value in overrides.items():
        base[key] = {**base[key], **value} if isinstance(base.get(key), dict) else value
    return model.DDPJobSpec.model_validate(base)


def job(s=None, status=None, generation=1, **kw) -> d.JobView:
    return d.JobView(name="j", namespace="ns", uid=UID, metadata_generation=generation, created_at=T0,
                     spec=s if s is not None else spec(), status=status or model.DDPJobStatus(), **kw)


def w(index, phase="Running", generation=0, **kw) -> d.WorkerObservation:
    kw.setdefault("ready", phase == "Running")
    kw.setdefault("uid", f"pod-{index}-g{generation}-a{kw.get('attempt', 0)}")  # every pod has its own
    return d.WorkerObservation(index=index, name=f"j-worker-{index}", generation=generation, phase=phase, **kw)


STORE = d.StoreObservation("Running", ready=True)
# Most tables look at one pass after an incident has settled; test_incidents.py covers settling.
SETTLED = d.Options(incident_settle_seconds=0)


def decide(job_view, observed, options=SETTLED):
    return d.decide(job_view, observed, options)


def seen(*workers, store=STORE, now=T0) -> d.Observed:
    return d.Observed(workers=tuple(workers), store=store, now=now)


def running_status(**kw) -> model.DDPJobStatus:
    base = {"phase": "Running", "startTime": d.rfc3339(T0), "observedGeneration": 1}
    return model.DDPJobStatus.model_validate({**base, **kw})


def of(decision, kind):
    return [a for a in decision.actions if isinstance(a, kind)]


def failed(index, code, reason="Error", generation=0, at=T0, **kw):
    return w(index, "Failed", generation, exit_code=code, reason=reason, finished_at=at, **kw)


# ---------------------------------------------------------------- exit classification

POLICY = model.FailurePolicy(retryable_exit_codes=[75], permanent_exit_codes=[137])


@pytest.mark.parametrize("code, reason, disruption, expected", [
    (1, "Error", False, d.PERMANENT),
    (127, "Error", False, d.PERMANENT),
    (75, "Error", False, d.RETRYABLE),  # listed retryable
    (143, "Error", False, d.RETRYABLE),  # SIGTERM
    (139, "Error", False, d.RETRYABLE),  # SIGSEGV
    (137, "OOMKilled", False, d.PERMANENT),  # explicit list wins over OOMKilled
    (None, "NodeLost", False, d.RETRYABLE),
    (1, "Evicted", True, d.DISRUPTION),
    (137, "Error", True, d.DISRUPTION),
])
def test_classify_exit(code, reason, disruption, expected):
    assert d.classify_exit(code, reason, disruption, POLICY) == expected


@pytest.mark.parametrize("message, expected", [
    ("rendezvous failed: RendezvousTimeoutError: timed out", d.RETRYABLE),
    ("rendezvous failed: RendezvousClosedError: ", d.CONSEQUENCE),  # its peers had closed it: never a cause
    ("rank 0 (local rank 0) exited with code 1: ValueError: bad", d.PERMANENT),
    (None, d.PERMANENT),
])
def test_a_failed_rendezvous_is_not_a_user_error_although_torchrun_exits_1(message, expected):
    assert d.classify_exit(1, "Error", False, model.FailurePolicy(), message) == expected


@pytest.mark.parametrize("message, charged", [
    ("rendezvous failed: RendezvousClosedError: ", 0),  # its peers had closed it: nobody's failure
    ("rendezvous failed: RendezvousTimeoutError: timed out", 1),
])
def test_a_failed_rendezvous_moves_to_a_fresh_generation_the_survivor_joining_in_place(message, charged):
    """A closed or timed-out rendezvous never reopens: rejoining it would fail forever. The survivor keeps
    its pod and joins the fresh generation (restartScope Pod)."""
    st = running_status(ranks=[{"index": 0, "pod": "j-worker-0", "phase": "Running"},
                               {"index": 1, "pod": "j-worker-1", "phase": "Running"}])
    out = decide(job(status=st), seen(w(0), failed(1, 1, message=message)))
    assert out.status.restarts == charged and out.status.generation == 1
    assert (out.status.ranks[0].uid, out.status.ranks[0].generation) == (w(0).uid, 1)
    assert not of(out, d.DeleteWorker) or of(out, d.DeleteWorker)[0].name == "j-worker-1"
    assert any(e.reason == d.REASON_REPLACE and "join it in place" in e.message for e in of(out, d.Event))


def test_oom_is_retryable_by_default():
    assert d.classify_exit(137, "OOMKilled", False, model.FailurePolicy()) == d.RETRYABLE


@pytest.mark.parametrize("steps, expected", [
    ([], 0),
    ([None], 10), ([None, None], 20), ([None] * 3, 40), ([None] * 4, 60), ([None] * 10, 60),  # no reports
    ([40], 0), ([40, 80, 120], 0),  # trained between failures: replaced at once, however many
    ([40, 40], 10), ([40, 40, 40], 20), ([40, 40, 40, 40, 40], 60),  # failing at the same step: a loop
    ([40, 40, 90], 0), ([40, 90, 90], 10),  # progress ends a loop; a loop after progress starts over
    ([None, 30], 0),  # the first report came after the previous failure: it trained
    (["uncharged", 40, 40], 10),  # a disruption between them does not count
])
def test_backoff_grows_only_over_failures_in_a_row_without_progress(steps, expected):
    incidents = [model.Incident(generation=g, time="2026-11-23T00:00:00Z", cause=d.RETRYABLE, charged=True, step=s)
                 if s != "uncharged" else model.Incident(generation=g, time="2026-11-23T00:00:00Z",
                                                         cause=d.DISRUPTION, charged=False)
                 for g, s in enumerate(steps)]
    assert d.backoff_seconds(incidents, model.Backoff(initial_seconds=10, max_seconds=60, factor=2)) == expected


@pytest.mark.parametrize("text, expected", [
    (None, None),
    ("", None),
    ("rank 1 (local rank 1) exited with code 3: ValueError: bad lr",
     "rank 1 (local rank 1) exited with code 3: ValueError: bad lr"),
    # A log tail (FallbackToLogsOnError) becomes one line.
    ("Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'lr'\n",
     "Traceback (most recent call last): File \"x.py\" KeyError: 'lr'"),
])
def test_short_message(text, expected):
    assert d.short_message(text) == expected


def test_long_message_keeps_its_start_and_its_end():
    short = d.short_message("rank 0 exited with code 3: " + "x" * 5000 + " the last words")
    assert len(short) <= d.MESSAGE_LIMIT and short.startswith("rank 0 exited") and short.endswith("the last words")


# ---------------------------------------------------------------- creation

def test_new_job_creates_store_then_every_worker():
    out = decide(job(), seen(store=None))
    assert out.actions[0] == d.CreateStore()
    assert of(out, d.CreateWorker) == [d.CreateWorker(0, 0, 0), d.CreateWorker(1, 0, 0)]
    s = out.status
    assert s.phase == "Pending" and s.start_time == d.rfc3339(T0) and s.observed_generation == 1
    assert s.selector == "elastic.ddp.dev/job-name=j,elastic.ddp.dev/role=worker"
    assert [r.phase for r in s.ranks] == ["Missing", "Missing"]
    assert {c.type for c in s.conditions} == {"Created"}
    assert of(out, d.Event)[-1].reason == "Starting"


def test_all_running_is_running_and_idempotent():
    first = decide(job(status=running_status()), seen(w(0), w(1)))
    assert first.status.phase == "Running" and first.status.world_size == 2 and first.status.ready_replicas == 2
    assert of(first, d.CreateWorker) == [] and of(first, d.DeleteWorker) == []
    again = decide(job(status=first.status), seen(w(0), w(1), now=T0 + timedelta(minutes=5)))
    assert not again.status_changed(first.status) and again.actions == ()


def test_condition_keeps_transition_time_when_status_unchanged():
    first = decide(job(status=running_status(phase="Pending")), seen(w(0), w(1)))
    later = decide(job(status=first.status), seen(w(0), w(1), now=T0 + timedelta(hours=1)))
    running = next(c for c in later.status.conditions if c.type == "Running")
    assert running.last_transition_time == d.rfc3339(T0)


def test_invalid_spec_fails_without_pods():
    with pytest.raises(InvalidJob) as caught:
        parse_spec({"replicas": 0, "image": "x", "entrypoint": "m"})
    view = d.JobView(name="j", namespace="ns", uid=UID, metadata_generation=1, created_at=T0, spec=None,
                     spec_errors=tuple(caught.value.errors))
    out = decide(view, seen(store=None))
    assert out.status.phase == "Failed" and "spec.replicas" in out.status.message
    assert of(out, d.CreateWorker) == [] and of(out, d.CreateStore) == []
    cond = next(c for c in out.status.conditions if c.type == "Failed")
    assert cond.reason == "InvalidSpec" and "spec.replicas" in cond.message
    assert of(out, d.Event)[-1].type == "Warning"


def test_invalid_update_of_running_job_is_not_applied():
    view = replace(job(status=running_status()), spec=None, spec_errors=(d.FieldError("spec.replicas", "too big"),))
    out = decide(view, seen(w(0), w(1)))
    assert out.status.phase == "Running" and not of(out, d.DeleteWorker) and not of(out, d.CreateWorker)
    assert any(c.type == "SpecRejected" for c in out.status.conditions)
    assert of(out, d.Event)[0].reason == "InvalidSpec"
    again = decide(replace(view, status=out.status), seen(w(0), w(1)))
    assert of(again, d.Event) == []  # warned once


def test_deleting_job_does_nothing():
    assert decide(job(deleting=True), seen(store=None)).actions == ()


# ---------------------------------------------------------------- failures

MESSAGE = "rank 1 (local rank 1) exited with code 3: ValueError: learning rate must be positive"


@pytest.mark.parametrize("policy, phase, reason", [
    ({}, "Failed", d.REASON_PERMANENT_ERROR),
    ({"retryableExitCodes": [3]}, "Restarting", d.REASON_WORKER_FAILED),
    ({"retryableExitCodes": [3], "maxRestarts": 0}, "Failed", d.REASON_BUDGET_EXHAUSTED),
])
def test_the_termination_message_reaches_condition_event_and_rank(policy, phase, reason):
    s = spec(failurePolicy=policy)
    out = decide(job(s, running_status()), seen(w(0), failed(1, 3, message=MESSAGE)))
    assert out.status.phase == phase
    rank = out.status.ranks[1]
    assert (rank.last_exit_code, rank.last_reason, rank.last_message) == (3, "Error", MESSAGE)
    told = {e.reason: e.message for e in of(out, d.Event)}
    told.update({c.reason: c.message for c in out.status.conditions})
    assert f"failed with exit code 3, reason Error ({MESSAGE})" in told[reason]

PROGRESS_WARNING = "WARNING ddp_trainer.progress: progress report failed: HTTP 503 from the standby"


@pytest.mark.parametrize("code, reason, message, disruption, says", [
    # Killed with no word of the launcher's: the kubelet's log tail is not what explains it (issue 23: 12).
    (137, "Error", PROGRESS_WARNING, False, "killed by signal 9 (SIGKILL)"),
    (143, "Error", None, False, "killed by signal 15 (SIGTERM)"),
    (137, "OOMKilled", PROGRESS_WARNING, False, "out of memory: killed by signal 9 (SIGKILL)"),
    (1, "OOMKilled", "step 40 loss 0.3", False, "out of memory"),
    # The launcher's own message (its generation mark) is the story, whatever the exit code.
    (137, "OOMKilled", "rank 0 (local rank 0) exited with code 137: killed by SIGKILL [generation 2]", False,
     "rank 0 (local rank 0) exited with code 137: killed by SIGKILL [generation 2]"),
    (143, "Error", "torchrun stopped by SIGTERM; exit code 143 [generation 0]", False,
     "torchrun stopped by SIGTERM; exit code 143 [generation 0]"),
    # An ordinary exit's log tail is its traceback: kept.
    (1, "Error", "ValueError: bad learning rate", False, "ValueError: bad learning rate"),
    # A disruption's message is the control plane's (an eviction's): kept.
    (137, "Evicted", "The node was low on resource: memory.", True, "The node was low on resource: memory."),
])
def test_a_failure_is_told_by_what_explains_the_exit(code, reason, message, disruption, says):
    told = describe_failure(failed(1, code, reason, message=message, disruption=disruption))
    assert told == f"worker 1 (pod j-worker-1) failed with exit code {code}, reason {reason} ({says})"


def test_retryable_failure_pod_scope_waits_for_backoff_then_replaces_only_that_rank():
    s = spec(minReplicas=1)
    first = decide(job(s, running_status()), seen(w(0), failed(1, 137, "OOMKilled")))
    st = first.status
    # Charged at once: the survivor keeps its pod and is carried into generation 1 (it joins in place).
    assert st.phase == "Restarting" and st.restarts == 1 and st.generation == 1
    assert (st.ranks[0].uid, st.ranks[0].generation) == (w(0).uid, 1)
    assert st.ranks[1].restarts == 1 and st.ranks[1].last_exit_code == 137 and st.ranks[1].last_reason == "OOMKilled"
    assert of(first, d.DeleteWorker) == [] and first.requeue_after == 10
    assert any(e.reason == "WorkerFailed" for e in of(first, d.Event))
    # Same observation again: not charged twice, and the survivor is still the generation's.
    again = decide(job(s, st), seen(w(0), failed(1, 137, "OOMKilled"), now=T0 + timedelta(seconds=5)))
    assert again.status.restarts == 1 and again.requeue_after == 5 and not of(again, d.DeleteWorker)
    # Backoff passed: the exited pod is removed at once and replaced in the same pass (the new
    # generation, next attempt); the survivor is untouched.
    later = decide(job(s, again.status), seen(w(0), failed(1, 137, "OOMKilled"), now=T0 + timedelta(seconds=10)))
    assert later.actions[:2] == (d.DeleteWorker("j-worker-1", d.REASON_REPLACE, force=True), d.CreateWorker(1, 1, 1))
    assert of(later, d.DeleteWorker) == [d.DeleteWorker("j-worker-1", d.REASON_REPLACE, force=True)]
    assert later.status.restarts == 1
    # Had the delete not finished yet (pod still listed), nothing is created twice: the name is taken.
    pending = decide(job(s, later.status), seen(w(0), failed(1, 137, "OOMKilled", terminating_since=T0),
                                                  now=T0 + timedelta(seconds=11)))
    assert of(pending, d.CreateWorker) == [] and pending.status.restarts == 1
    # Once it is gone, a pass that missed the create makes it.
    replaced = decide(job(s, later.status), seen(w(0), now=T0 + timedelta(seconds=11)))
    assert of(replaced, d.CreateWorker) == [d.CreateWorker(1, 1, 1)] and replaced.status.restarts == 1
    back = decide(job(s, replaced.status), seen(w(0), w(1, generation=1, attempt=1), now=T0 + timedelta(seconds=30)))
    assert back.status.phase == "Running" and back.status.ranks[1].restarts == 1 and not back.actions[:-1]
    assert [r.generation for r in back.status.ranks] == [1, 1]


def test_second_failure_of_replacement_is_charged_again():
    s = spec(minReplicas=1)
    status = running_status(restarts=1, ranks=[{"index": 0, "pod": "j-worker-0", "phase": "Running"},
                                               {"index": 1, "pod": "j-worker-1", "phase": "Running", "restarts": 1}])
    status.incidents = [model.Incident(generation=0, time="2026-11-22T00:00:00Z", cause=d.RETRYABLE, charged=True)]
    out = decide(job(s, status), seen(w(0), failed(1, 143, attempt=1)))
    assert out.status.restarts == 2 and out.status.ranks[1].restarts == 2
    # No step reported between the two failures (a crash loop): the second waits initial * factor.
    assert out.requeue_after == 20


def test_permanent_failure_fails_job_naming_rank_code_and_reason():
    out = decide(job(status=running_status()), seen(w(0), failed(1, 2, "Error")))
    st = out.status
    assert st.phase == "Failed" and st.completion_time == d.rfc3339(T0)
    cond = next(c for c in st.conditions if c.type == "Failed")
    assert cond.reason == "PermanentError"
    for part in ("worker 1", "j-worker-1", "exit code 2", "Error"):
        assert part in cond.message
    # cleanPodPolicy Running (default): the running worker and the store go, the failed one stays.
    assert of(out, d.DeleteWorker) == [d.DeleteWorker("j-worker-0", d.REASON_CLEANUP)]
    assert of(out, d.DeleteStore) == [d.DeleteStore(d.REASON_CLEANUP)]
    assert any(e.type == "Warning" and "Failed" in e.message for e in of(out, d.Event))


def test_listed_retryable_code_is_retried():
    s = spec(minReplicas=1, failurePolicy={"retryableExitCodes": [3]})
    assert decide(job(s, running_status()), seen(w(0), failed(1, 3))).status.phase == "Restarting"


def test_budget_exhaustion_fails_and_never_loops_in_restarting():
    s = spec(minReplicas=1, failurePolicy={"maxRestarts": 1})
    status = running_status(restarts=1, ranks=[{"index": 1, "pod": "j-worker-1", "phase": "Running", "restarts": 1}])
    out = decide(job(s, status), seen(w(0), failed(1, 137, attempt=1)))
    assert out.status.phase == "Failed" and out.status.restarts == 1
    cond = next(c for c in out.status.conditions if c.type == "Failed")
    assert cond.reason == "RestartBudgetExhausted" and "maxRestarts=1" in cond.message and "exit code 137" in cond.message


@pytest.mark.parametrize(("restarts", "phase"), [(0, "Restarting"), (1, "Restarting"), (2, "Failed")])
def test_the_budget_allows_exactly_max_restarts(restarts, phase):
    """maxRestarts=2: the failures after 0 and 1 restarts are restarted (the second takes the budget's last
    restart), the one after 2 fails the job with nothing more charged."""
    s = spec(minReplicas=1, failurePolicy={"maxRestarts": 2})
    status = running_status(restarts=restarts, ranks=[{"index": 1, "pod": "j-worker-1", "phase": "Running",
                                                       "restarts": restarts}])
    out = decide(job(s, status), seen(w(0), failed(1, 137, attempt=restarts)))
    assert out.status.phase == phase
    assert out.status.restarts == min(restarts + 1, 2)
    assert out.status.incidents[-1].charged is (phase == "Restarting")


def test_zero_budget_fails_on_first_retryable_failure():
    s = spec(failurePolicy={"maxRestarts": 0})
    assert decide(job(s, running_status()), seen(w(0), failed(1, 143))).status.phase == "Failed"


@pytest.mark.parametrize("worker", [
    failed(1, 137, "Evicted", disruption=True),
    w(1, "Running", terminating_since=T0),  # node lost: deleted behind our back
])
def test_disruption_is_recorded_but_not_charged(worker):
    s = spec(minReplicas=1, failurePolicy={"maxRestarts": 0})
    out = decide(job(s, running_status()), seen(w(0), worker))
    st = out.status
    assert st.phase == "Restarting" and st.restarts == 0 and st.disruptions == 1 and st.ranks[1].restarts == 1
    assert any(e.reason == "WorkerDisrupted" for e in of(out, d.Event))
    # The survivor's next collective fails: a fresh generation at once, which it joins in place.
    assert st.generation == 1 and st.incidents[-1].cause == d.DISRUPTION and not st.incidents[-1].charged
    assert all(a.name == "j-worker-1" for a in of(out, d.DeleteWorker)) and st.ranks[0].generation == 1
    if worker.phase == "Failed":  # no backoff for disruptions
        assert d.DeleteWorker("j-worker-1", d.REASON_REPLACE, force=True) in of(out, d.DeleteWorker)


def test_restart_scope_all_moves_gang_to_new_generation_after_backoff():
    s = spec(failurePolicy={"restartScope": "All"})
    first = decide(job(s, running_status()), seen(w(0), failed(1, 143)))
    st = first.status
    assert st.generation == 1 and st.restarts == 1 and st.phase == "Restarting"
    # Survivor of the old generation goes now; the failed pod stays for the backoff; nothing new yet.
    assert of(first, d.DeleteWorker) == [d.DeleteWorker("j-worker-0", d.REASON_OLD_GENERATION)]
    assert of(first, d.CreateWorker) == []
    assert any(e.reason == "GangRestart" for e in of(first, d.Event))
    early = decide(job(s, st), seen(failed(1, 143), now=T0 + timedelta(seconds=5)))
    assert of(early, d.CreateWorker) == [] and early.requeue_after == 5  # the backoff holds the gang
    mid = decide(job(s, st), seen(failed(1, 143), now=T0 + timedelta(seconds=10)))
    assert mid.status.restarts == 1  # old generation: never charged again
    assert of(mid, d.DeleteWorker) == [d.DeleteWorker("j-worker-1", d.REASON_REPLACE, force=True)]
    assert of(mid, d.CreateWorker) == [d.CreateWorker(0, 1, 0), d.CreateWorker(1, 1, 1)]


def test_pod_scope_static_job_keeps_its_survivor_in_place():
    # min == replicas (static job): the fresh generation's round completes when the replacement joins.
    out = decide(job(spec(), running_status()), seen(w(0), failed(1, 143)))
    assert out.status.generation == 1 and out.status.restarts == 1
    assert not of(out, d.DeleteWorker) and out.status.ranks[0].generation == 1


def test_pod_scope_elastic_survivors_join_the_next_generation_in_place():
    s = spec(replicas=3, minReplicas=2, maxReplicas=3)
    out = decide(job(s, running_status()), seen(w(0), w(1), failed(2, 143)))
    assert out.status.generation == 1 and not of(out, d.DeleteWorker)
    assert out.status.world_size == 2 and [r.generation for r in out.status.ranks[:2]] == [1, 1]


def test_restart_scope_all_replaces_every_pod():
    s = spec(replicas=3, minReplicas=2, maxReplicas=3, failurePolicy={"restartScope": "All"})
    out = decide(job(s, running_status()), seen(w(0), w(1), failed(2, 143)))
    assert out.status.generation == 1
    assert {a.name for a in of(out, d.DeleteWorker)} == {"j-worker-0", "j-worker-1"}
    assert all(r.generation is None for r in out.status.ranks)


def test_generation_is_taken_from_pods_when_status_lags():
    out = decide(job(status=running_status(generation=0)), seen(w(0, generation=2), w(1, generation=2)))
    assert out.status.generation == 2 and not of(out, d.DeleteWorker)


# ---------------------------------------------------------------- rendezvous store

def test_store_loss_moves_job_to_new_generation_without_charging():
    restart = spec(failurePolicy={"recovery": "Restart"})
    out = decide(job(restart, status=running_status()), seen(w(0), w(1), store=d.StoreObservation("Failed")))
    st = out.status
    assert st.generation == 1 and st.restarts == 0 and st.disruptions == 1 and st.phase == "Restarting"
    assert d.DeleteStore("store pod is Failed", force=True) in out.actions
    assert {a.name for a in of(out, d.DeleteWorker)} == {"j-worker-0", "j-worker-1"}
    assert any(e.reason == "RendezvousStoreLost" for e in of(out, d.Event))


def test_in_process_store_loss_recreates_the_store_and_keeps_every_worker():
    in_process = spec(failurePolicy={"recovery": "InProcess"})
    failed = decide(job(in_process, status=running_status()), seen(w(0), w(1), store=d.StoreObservation("Failed")))
    assert failed.actions == (d.DeleteStore("store pod is Failed", force=True),)
    gone = decide(job(in_process, status=failed.status), seen(w(0), w(1), store=None))
    assert [type(a) for a in gone.actions] == [d.CreateStore, d.Event]
    for out in (failed, gone):
        st = out.status
        assert (st.generation, st.restarts, st.disruptions, st.incidents, st.phase) == (0, 0, 0, [], "Running")


def test_store_gone_is_recreated_before_new_generation_workers():
    out = decide(job(status=running_status(generation=1)), seen(store=None))
    assert out.actions[0] == d.CreateStore()
    assert of(out, d.CreateWorker) == [d.CreateWorker(0, 1, 0), d.CreateWorker(1, 1, 0)]


def test_no_workers_while_store_terminating():
    out = decide(job(status=running_status()), seen(store=d.StoreObservation("Running", terminating_since=T0)))
    assert of(out, d.CreateWorker) == [] and of(out, d.CreateStore) == []


# ---------------------------------------------------------------- success

@pytest.mark.parametrize("policy, workers, phase", [
    ("AllWorkers", [w(0, "Succeeded"), w(1, "Succeeded")], "Succeeded"),
    ("AllWorkers", [w(0, "Succeeded"), w(1)], "Running"),
    ("RankZero", [w(0, "Succeeded"), w(1)], "Succeeded"),
    ("RankZero", [w(0), w(1, "Succeeded")], "Running"),
    ("AllWorkers", [w(0, "Succeeded"), failed(1, 143)], "Failed"),
])
def test_success_policy(policy, workers, phase):
    out = decide(job(spec(runPolicy={"successPolicy": policy}), running_status()), seen(*workers))
    assert out.status.phase == phase


def test_success_stops_the_rest_and_sets_completion_time():
    out = decide(job(spec(runPolicy={"successPolicy": "RankZero", "cleanPodPolicy": "None"}), running_status()),
                   seen(w(0, "Succeeded"), w(1)))
    assert out.status.completion_time == d.rfc3339(T0)
    assert of(out, d.DeleteWorker) == [d.DeleteWorker("j-worker-1", d.REASON_CLEANUP)]
    assert of(out, d.DeleteStore)


@pytest.mark.parametrize("policy, deleted", [("None", set()), ("Running", {"j-worker-0"}),
                                             ("All", {"j-worker-0", "j-worker-1"})])
def test_clean_pod_policy_on_failure(policy, deleted):
    out = decide(job(spec(runPolicy={"cleanPodPolicy": policy}), running_status()), seen(w(0), failed(1, 1)))
    assert {a.name for a in of(out, d.DeleteWorker)} == deleted


def test_ttl_deletes_finished_job():
    s = spec(runPolicy={"ttlSecondsAfterFinished": 60})
    done = running_status(phase="Succeeded", completionTime=d.rfc3339(T0))
    early = decide(job(s, done), seen(store=None, now=T0 + timedelta(seconds=20)))
    assert early.requeue_after == 40 and not of(early, d.DeleteJob)
    late = decide(job(s, done), seen(store=None, now=T0 + timedelta(seconds=60)))
    assert of(late, d.DeleteJob)


def test_finished_job_stays_finished():
    done = running_status(phase="Failed", completionTime=d.rfc3339(T0))
    out = decide(job(status=done), seen(store=None))
    assert out.status.phase == "Failed" and not of(out, d.CreateWorker)


# ---------------------------------------------------------------- scale, suspend, deadline, stuck pods

def test_scale_up_adds_highest_indices():
    s = spec(replicas=4, minReplicas=1, maxReplicas=4, failurePolicy={"recovery": "Restart"})
    out = decide(job(s, running_status(ranks=[{"index": 0, "pod": "a", "phase": "Running"},
                                                {"index": 1, "pod": "b", "phase": "Running"}]), generation=2),
                   seen(w(0), w(1)))
    assert of(out, d.CreateWorker) == [d.CreateWorker(2, 0, 0), d.CreateWorker(3, 0, 0)]
    assert any(e.reason == "Scaled" for e in of(out, d.Event))


def test_scale_down_restarts_the_gang_gracefully_at_the_new_size_without_charging():
    """Departing peers would break the survivors' next collective: a fresh generation, all stopped with
    SIGTERM (they checkpoint), restarted at the new size (recovery Restart; InProcess:
    test_scale_in_place_decisions.py)."""
    s = spec(replicas=1, minReplicas=1, maxReplicas=3, failurePolicy={"recovery": "Restart"})
    out = decide(job(s, running_status()), seen(w(0), w(1), w(2)))
    assert of(out, d.DeleteWorker) == [d.DeleteWorker(f"j-worker-{i}", d.REASON_OLD_GENERATION) for i in range(3)]
    st = out.status
    assert st.phase == "Restarting" and st.restarts == 0 and st.disruptions == 0 and st.generation == 1
    assert st.incidents[-1].cause == d.REASON_SCALE_DOWN and not st.incidents[-1].charged
    gone = decide(job(s, st), seen())
    assert of(gone, d.CreateWorker) == [d.CreateWorker(0, 1, 0)]


def test_suspend_deletes_pods_and_resume_recreates_them():
    s = spec(checkpoint={"claimTemplate": {"size": "1Gi"}}, runPolicy={"suspend": True})
    out = decide(job(s, running_status()), seen(w(0), w(1)))
    assert out.status.phase == "Suspended"
    assert {a.name for a in of(out, d.DeleteWorker)} == {"j-worker-0", "j-worker-1"}
    assert of(out, d.DeleteStore) == [d.DeleteStore(d.REASON_SUSPENDED)]
    assert next(c for c in out.status.conditions if c.type == "Suspended").status == "True"
    resumed = decide(job(spec(checkpoint={"claimTemplate": {"size": "1Gi"}}), out.status),
                       seen(store=None, now=T0 + timedelta(hours=1)))
    assert resumed.status.phase == "Pending" and len(of(resumed, d.CreateWorker)) == 2
    assert resumed.status.start_time == d.rfc3339(T0 + timedelta(hours=1))
    assert next(c for c in resumed.status.conditions if c.type == "Suspended").status == "False"
    assert any(e.reason == "Resumed" for e in of(resumed, d.Event))


def test_active_deadline_fails_with_deadline_exceeded():
    s = spec(runPolicy={"activeDeadlineSeconds": 100})
    before = decide(job(s, running_status()), seen(w(0), w(1), now=T0 + timedelta(seconds=40)))
    assert before.status.phase == "Running" and before.requeue_after == 60
    after = decide(job(s, running_status()), seen(w(0), w(1), now=T0 + timedelta(seconds=100)))
    assert after.status.phase == "Failed" and after.status.conditions[-1].reason == "DeadlineExceeded"
    assert {a.name for a in of(after, d.DeleteWorker)} == {"j-worker-0", "j-worker-1"}


def test_stuck_terminating_pod_is_force_deleted_after_timeout_then_replaced():
    s = spec(minReplicas=1)
    opts = d.Options(stuck_terminating_seconds=30)
    status = running_status(ranks=[{"index": 1, "pod": "j-worker-1", "phase": "Running", "restarts": 1}])
    stuck = w(1, "Running", terminating_since=T0)  # its loss was already recorded (restarts 1)
    early = decide(job(s, status), seen(w(0), stuck, now=T0 + timedelta(seconds=10)), opts)
    assert not of(early, d.DeleteWorker) and early.requeue_after == 20
    late = decide(job(s, status), seen(w(0), stuck, now=T0 + timedelta(seconds=30)), opts)
    assert of(late, d.DeleteWorker) == [d.DeleteWorker("j-worker-1", d.REASON_STUCK_TERMINATING, force=True)]
    gone = decide(job(s, late.status), seen(w(0), now=T0 + timedelta(seconds=31)), opts)
    assert of(gone, d.CreateWorker) == [d.CreateWorker(1, 0, 1)]


def test_transition_events_on_every_phase_change():
    out = decide(job(status=running_status(phase="Pending")), seen(w(0), w(1)))
    transitions = [e for e in of(out, d.Event) if "->" in e.message]
    assert [e.message.split(":")[0] for e in transitions] == ["Pending -> Running"]


def test_pod_deleted_behind_our_back_is_a_disruption_and_replaced():
    s = spec(minReplicas=1)
    status = decide(job(s, running_status()), seen(w(0), w(1))).status
    out = decide(job(s, status), seen(w(0)))  # worker 1 force-deleted by someone else
    st = out.status
    assert st.disruptions == 1 and st.restarts == 0 and st.generation == 1
    assert st.incidents[-1].reason == d.REASON_POD_VANISHED and st.incidents[-1].ranks == [1]
    # The survivor stays; the vanished rank is created again in the fresh generation, once.
    assert of(out, d.DeleteWorker) == [] and of(out, d.CreateWorker) == [d.CreateWorker(1, 1, 1)]
    again = decide(job(s, st), seen(w(0)))  # its create not seen yet: nothing charged twice
    assert again.status.disruptions == 1 and of(again, d.CreateWorker) == [d.CreateWorker(1, 1, 1)]
    done = decide(job(s, again.status), seen(w(0), w(1, generation=1, attempt=1)))
    assert done.status.disruptions == 1 and not of(done, d.CreateWorker) and done.status.phase == "Running"


def test_resume_while_suspended_pods_still_terminate_charges_nothing_and_waits():
    suspended = decide(job(spec(runPolicy={"suspend": True}), running_status()), seen(w(0), w(1)))
    assert suspended.status.generation == 1
    stopping = (w(0, terminating_since=T0), w(1, terminating_since=T0))
    resumed = decide(job(spec(), suspended.status), seen(*stopping, store=None))
    st = resumed.status
    assert st.restarts == 0 and st.disruptions == 0 and of(resumed, d.CreateWorker) == []
    done = decide(job(spec(), st), seen(store=d.StoreObservation("Pending")))
    assert of(done, d.CreateWorker) == [d.CreateWorker(0, 1, 0), d.CreateWorker(1, 1, 0)]


# ---------------------------------------------------------------- pods that cannot start

BAD_IMAGE = d.Waiting("ImagePullBackOff", 'Back-off pulling image "trainer:nope"', T0)


@pytest.mark.parametrize("worker_waiting, store_waiting, after, failed_field", [
    (BAD_IMAGE, None, 299, None),  # still within the timeout: wait (and wake up at its end)
    (BAD_IMAGE, None, 300, "spec.image"),
    (None, BAD_IMAGE, 300, "spec.rendezvous.storeImage"),
    (d.Waiting("CreateContainerConfigError", 'secret "token" not found', T0), None, 300, "spec.image"),
    (d.Waiting("ContainerCreating", None, T0), None, 3000, None),  # a slow start is not an error
])
def test_a_pod_that_cannot_start_fails_the_job_naming_the_field(worker_waiting, store_waiting, after,
                                                                failed_field):
    now = T0 + timedelta(seconds=after)
    store = d.StoreObservation("Pending", waiting=store_waiting)
    out = decide(job(status=running_status()),
                   seen(w(0, "Pending", waiting=worker_waiting), w(1, "Pending"), store=store, now=now))
    if failed_field is None:
        assert out.status.phase != "Failed"
        if worker_waiting is not None and worker_waiting.reason in d.CANNOT_START_REASONS:
            assert out.requeue_after == 1
        return
    failed = next(c for c in out.status.conditions if c.type == "Failed")
    assert out.status.phase == "Failed" and failed.reason == d.REASON_CANNOT_START
    wait = worker_waiting or store_waiting
    assert wait.reason in failed.message and wait.message in failed.message
    assert f"Fix: check {failed_field}" in failed.message
    assert {a.name for a in of(out, d.DeleteWorker)} == {"j-worker-0", "j-worker-1"}  # cleanPodPolicy Running


GLOO_RESET = ("rank 0 (local rank 0) exited with code 1: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/"
              "pair.cc:537] Read error [10.0.0.7]:4711: Connection reset by peer [rendezvous closed]")
GLOO_TIMEOUT = "rank 0 (local rank 0) exited with code 1: RuntimeError: Application timeout caused pair closure"


@pytest.mark.parametrize("exit_code, message, expected", [
    (1, GLOO_RESET, d.PEER_FAILURE),
    (1, GLOO_TIMEOUT, d.PEER_FAILURE),
    (1, "rank 0 (local rank 0) exited with code 1: ValueError: learning rate must be positive", d.PERMANENT),
    (3, GLOO_RESET, d.RETRYABLE),  # explicit rules win: retryableExitCodes [3]
])
def test_a_trainer_failing_because_a_peer_did_is_told_from_its_own_bug(exit_code, message, expected):
    policy = model.FailurePolicy(retryable_exit_codes=[3])
    assert d.classify_exit(exit_code, "Error", False, policy, message) == expected


def test_survivors_peer_failures_alone_are_charged_once_after_settling():
    """A peer that hung (or a node lost without a trace): only the survivor's collective error is seen.
    It waits the settle time for the cause, then counts as one retryable failure, never a user error."""
    s = spec(minReplicas=1)
    settling = d.Options(incident_settle_seconds=10)
    early = decide(job(s, running_status()), seen(w(1), failed(0, 1, "Error", message=GLOO_TIMEOUT)), settling)
    assert early.status.restarts == 0 and early.status.phase == "Running" and early.requeue_after is not None
    settled = decide(job(s, early.status), seen(w(1), failed(0, 1, "Error", message=GLOO_TIMEOUT),
                                                now=T0 + timedelta(seconds=11)), settling)
    assert settled.status.phase != "Failed" and settled.status.restarts == 1, settled.status
    assert settled.status.incidents[-1].cause == d.RETRYABLE


def test_a_user_error_with_a_peers_collective_error_still_fails_at_once():
    s = spec(minReplicas=1)
    out = decide(job(s, running_status()), seen(failed(0, 1, "Error", message=GLOO_RESET),
                                                failed(1, 1, "Error", message="rank 1 (local rank 0) exited with code 1: "
                                                                              "ValueError: bad batch")))
    assert out.status.phase == "Failed" and out.status.restarts == 0
