"""Issue 32, the decision layer's side: reports of a world size no rendezvous of the job has are a
condition and an event, not progress; a job with a checkpoint interval that reports nothing (or saves
nothing) is warned of; a user's own error fails the job at once while a kill's consequences still settle;
a local run never warns of a ReadWriteOnce claim. Table tests of the pure rules (decisions/warnings.py,
decisions/accounting.py, decisions/volumes.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from ddpjob_operator import decisions as d, validation
from ddpjob_operator.agent import contract
from ddpjob_operator.decisions.warnings import world_sizes

from .test_decisions import T0, failed, job, of, running_status, seen, spec, w

CKPT = {"claimTemplate": {"size": "1Gi", "accessModes": ["ReadWriteMany"]}, "intervalSteps": 10}
OPTIONS = d.Options(incident_settle_seconds=10, unreported_warning_seconds=60)


def decide(view, observed, options=OPTIONS):
    return d.decide(view, observed, options)


def report(step, world_size=2, last_checkpoint_step=None, generation=0):
    return d.ProgressObservation(generation=generation, step=step, last_advance=T0, world_size=world_size,
                                 last_checkpoint_step=last_checkpoint_step, updated_at=T0)


def observed(*workers, progress=None, now=T0):
    return d.Observed(workers=tuple(workers), store=seen().store, now=now, progress=progress)


def started(index, at=T0):
    return w(index, started_at=at)


def events(out, reason):
    return [e for e in of(out, d.Event) if e.reason == reason]


def cond(status, type_):
    return next((c for c in status.conditions if c.type == type_), None)


# ---------------------------------------------------------------- 1. a world size of its own

@pytest.mark.parametrize("replicas, min_replicas, nproc, sizes", [
    (2, None, 1, [2]),
    (4, 2, 1, [2, 3, 4]),
    (2, None, 4, [8]),
    (3, 1, 2, [2, 4, 6]),
])
def test_the_world_sizes_a_rendezvous_of_the_job_can_have(replicas, min_replicas, nproc, sizes):
    extra = {"minReplicas": min_replicas, "maxReplicas": replicas} if min_replicas else {}
    assert list(world_sizes(spec(replicas=replicas, nprocPerNode=nproc, **extra))) == sizes


@pytest.mark.parametrize("replicas, nproc, reported, mismatch", [
    (2, 1, 1, True),   # HF on CPU without use_cpu=True: each rank alone
    (2, 1, 2, False),
    (2, 2, 2, True),   # a framework that counts nodes, not processes
    (2, 2, 4, False),
    (1, 1, 1, False),
    (2, 1, 3, True),
])
def test_a_report_of_a_foreign_world_size_is_a_condition_and_an_event_not_progress(replicas, nproc, reported,
                                                                                       mismatch):
    s = spec(replicas=replicas, nprocPerNode=nproc, checkpoint=CKPT)
    workers = [started(i) for i in range(replicas)]
    out = decide(job(s, running_status()), observed(*workers, progress=report(7, world_size=reported)))
    flagged = cond(out.status, d.CONDITION_WORLD_SIZE_MISMATCH)
    if mismatch:
        assert flagged.status == "True" and flagged.reason == d.REASON_WORLD_SIZE_MISMATCH
        assert "use_cpu=True" in flagged.message and f"reports world size {reported}" in flagged.message
        assert [e.type for e in events(out, d.REASON_WORLD_SIZE_MISMATCH)] == ["Warning"]
        assert out.status.progress is None  # not taken as progress
    else:
        assert flagged is None and not events(out, d.REASON_WORLD_SIZE_MISMATCH)
        assert out.status.progress.step == 7


def test_the_mismatch_is_told_once_and_cleared_by_a_report_that_agrees():
    s = spec(replicas=2, checkpoint=CKPT)
    workers = (started(0), started(1))
    first = decide(job(s, running_status()), observed(*workers, progress=report(5, world_size=1)))
    later = T0 + timedelta(seconds=30)
    again = decide(job(s, first.status), observed(*workers, progress=report(9, world_size=1), now=later))
    assert not events(again, d.REASON_WORLD_SIZE_MISMATCH) and again.status.conditions == first.status.conditions
    # Nor is the silence of a mismatched job told as a missing callback: one story.
    assert cond(again.status, d.CONDITION_NOT_REPORTING) is None
    fixed = decide(job(s, again.status), observed(*workers, progress=report(12, world_size=2), now=later))
    assert cond(fixed.status, d.CONDITION_WORLD_SIZE_MISMATCH).status == "False"
    assert fixed.status.progress.step == 12


def test_after_the_end_a_foreign_world_size_is_still_not_progress_and_not_told_again():
    s = spec(replicas=2, checkpoint=CKPT)
    done = running_status(progress={"step": 30})
    done.phase = "Succeeded"
    out = decide(job(s, done), observed(progress=report(31, world_size=1)))
    assert out.status.progress.step == 30 and not events(out, d.REASON_WORLD_SIZE_MISMATCH)


# ---------------------------------------------------------------- 3. a forgotten callback

@pytest.mark.parametrize("checkpoint, after, progress, expected", [
    (CKPT, 59, None, None),                              # not a while yet: a wakeup at 60 s
    (CKPT, 60, None, d.REASON_NO_PROGRESS_REPORTS),      # no report at all
    (None, 600, None, None),                             # no checkpoint volume: nothing to lose
    (CKPT, 600, report(5), None),                        # reports, not two intervals yet
    (CKPT, 600, report(20), d.REASON_NO_CHECKPOINTS),    # reports, two intervals, no checkpoint
    (CKPT, 600, report(20, last_checkpoint_step=10), None),
])
def test_a_job_that_reports_nothing_or_saves_nothing_is_warned_of(checkpoint, after, progress, expected):
    s = spec(replicas=2, checkpoint=checkpoint) if checkpoint else spec(replicas=2)
    now = T0 + timedelta(seconds=after)
    out = decide(job(s, running_status()), observed(started(0), started(1), progress=progress, now=now))
    flagged = cond(out.status, d.CONDITION_NOT_REPORTING)
    if expected is None:
        assert flagged is None and not [e for e in of(out, d.Event) if e.type == "Warning"]
    else:
        assert flagged.status == "True" and flagged.reason == expected
        assert "callback" in flagged.message and "job." in flagged.message
        assert [e.type for e in events(out, expected)] == ["Warning"]
    if checkpoint and progress is None and after < 60:
        assert out.requeue_after == pytest.approx(60 - after)


def test_the_missing_report_clock_starts_when_every_worker_runs_and_the_warning_clears_on_a_report():
    s = spec(replicas=2, checkpoint=CKPT)
    late = T0 + timedelta(seconds=50)
    one_pending = decide(job(s, running_status()), observed(started(0), w(1, "Pending", ready=False),
                                                            now=T0 + timedelta(seconds=100)))
    assert cond(one_pending.status, d.CONDITION_NOT_REPORTING) is None
    before = decide(job(s, running_status()), observed(started(0), started(1, late), now=T0 + timedelta(seconds=100)))
    assert cond(before.status, d.CONDITION_NOT_REPORTING) is None and before.requeue_after == pytest.approx(10)
    warned = decide(job(s, running_status()), observed(started(0), started(1, late),
                                                       now=T0 + timedelta(seconds=110)))
    assert cond(warned.status, d.CONDITION_NOT_REPORTING).status == "True"
    twice = decide(job(s, warned.status), observed(started(0), started(1, late), now=T0 + timedelta(seconds=200)))
    assert not events(twice, d.REASON_NO_PROGRESS_REPORTS)
    reported = decide(job(s, twice.status), observed(started(0), started(1, late), progress=report(3),
                                                     now=T0 + timedelta(seconds=201)))
    assert cond(reported.status, d.CONDITION_NOT_REPORTING).status == "False"
    assert cond(reported.status, d.CONDITION_NOT_REPORTING).reason == d.REASON_REPORTING


# ---------------------------------------------------------------- 4. a user's own error fails at once

OWN_ERROR = f"rank 1 (local rank 0) exited with code 1: RuntimeError: bad batch {contract.GENERATION_MARK.format(generation=0)}"


@pytest.mark.parametrize("message, code, fails_at_once, settle", [
    (OWN_ERROR, 1, True, None),                        # the launcher's word: the trainer's own traceback
    (None, 1, False, 10),                              # no launcher's word: a kill may be on its way
    ("Traceback ... last line of a log tail", 1, False, 10),
])
def test_a_permanent_error_in_the_launchers_words_fails_the_job_without_the_settle_wait(message, code,
                                                                                           fails_at_once, settle):
    s = spec(replicas=2)
    status = running_status(ranks=[{"index": i, "pod": f"j-worker-{i}", "phase": "Running"} for i in range(2)])
    out = decide(job(s, status), observed(w(0), failed(1, code, message=message)))
    if fails_at_once:
        assert out.status.phase == "Failed" and out.status.restarts == 0
        assert cond(out.status, "Failed").reason == d.REASON_PERMANENT_ERROR
        assert "RuntimeError: bad batch" in cond(out.status, "Failed").message
    else:
        assert out.status.phase == "Running" and out.requeue_after == settle


def test_a_retryable_failure_with_a_survivor_still_groups_the_peers_exits_into_one_incident():
    """The settle is kept where the verdict can still change: a peer's collective error before the kill."""
    s = spec(replicas=3)
    status = running_status(ranks=[{"index": i, "pod": f"j-worker-{i}", "phase": "Running"} for i in range(3)])
    peer = "rank 0 (local rank 0) exited with code 1: DistBackendError: Connection closed by peer [generation 0]"
    waiting = decide(job(s, status), observed(failed(0, 1, message=peer), w(1), w(2)))
    assert waiting.status.phase == "Running" and waiting.requeue_after == 10
    charged = decide(job(s, waiting.status), observed(failed(0, 1, message=peer), w(1), failed(2, 137),
                                                      now=T0 + timedelta(seconds=1)))
    assert charged.status.phase == "Restarting" and charged.status.restarts == 1
    assert charged.status.incidents[-1].ranks == [0, 2]


# ---------------------------------------------------------------- 5. a ReadWriteOnce claim on one machine

@pytest.mark.parametrize("one_node, shared, warned", [(False, "False", True), (True, "True", False)])
def test_a_read_write_once_claim_is_warned_of_only_where_workers_can_land_on_different_nodes(one_node, shared,
                                                                                              warned):
    s = spec(replicas=2, checkpoint={"claimTemplate": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}})
    out = d.decide(job(s, running_status()), observed(started(0), started(1)), d.Options(one_node=one_node))
    assert cond(out.status, d.CONDITION_CHECKPOINT_SHARED).status == shared
    assert bool(events(out, "ReadWriteOnce")) == warned


EXAMPLES = sorted(Path(__file__).resolve().parents[2].glob("examples/**/*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_validates_without_a_warning(path):
    (found,) = [validation.parse_job(doc.body) for doc in validation.load_documents(str(path))]
    assert validation.warnings(found) == []


@pytest.mark.parametrize("storage_class, replicas, warned", [
    (None, 2, False),     # the cluster's default class decides (kind's local-path pins): the operator tells
    ("gp2", 2, True),     # block storage named: one node at a time
    ("gp2", 1, False),    # one worker
])
def test_validate_warns_of_a_read_write_once_claim_only_where_it_can_bite(storage_class, replicas, warned):
    claim = {"size": "1Gi", "accessModes": ["ReadWriteOnce"],
             **({"storageClassName": storage_class} if storage_class else {})}
    found = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                  "metadata": {"name": "rwo"}, "spec": {
                                      "replicas": replicas, "image": "trainer:1", "entrypoint": "ddp_trainer",
                                      "checkpoint": {"claimTemplate": claim}}})
    warnings = validation.warnings(found)
    assert bool(warnings) == warned and all("Multi-Attach" in str(w) for w in warnings)
