"""Issue 29, the trainer's side of the recovery timeline (docs/launch-contract.md, "Progress"): rank 0 of a
generation that resumed adds the sticky `recovery` object to every report (path, the fallback reason, the
resumed step, when the group was complete, when the first step finished), and the report that first carries a
changed one is sent at once, past the pacing. Real reporters against a loopback endpoint, a real `Job` on a
real checkpoint directory and a real TCPStore; the in-process path itself is proven with real processes in
test_inprocess_recovery.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddp_trainer.runtime import Job, JobEnv, ProgressReporter, StopRequest
from ddp_trainer.runtime.inprocess import FALLBACK, GROUP_PREFIX, Rendezvous, Seat
from ddp_trainer.runtime.progress import MAX_BODY, RECOVERY_REASON_LIMIT, recovery_field

from loopback_endpoint import Endpoint

ROOT = Path(__file__).resolve().parents[2]


def wait_posts(endpoint: Endpoint, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(endpoint.posts) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_recovery_object_has_the_contracts_fields_and_a_bounded_reason() -> None:
    got = recovery_field("Restart", reason="x" * 2000, resumed_step=12, rendezvous_time=1700000000.5)
    assert got == {"path": "Restart", "reason": "x" * RECOVERY_REASON_LIMIT, "resumed_step": 12,
                   "rendezvous_time": 1700000000.5, "first_step_time": None}
    assert recovery_field("InProcess", resumed_step=3, rendezvous_time=1.0, first_step_time=2)["first_step_time"] == 2.0
    with pytest.raises(ValueError, match="recovery path 'inprocess' is not one of InProcess, Restart"):
        recovery_field("inprocess", resumed_step=3, rendezvous_time=1.0)


def test_every_report_carries_the_recovery_and_a_changed_one_is_sent_past_the_pacing() -> None:
    with Endpoint() as endpoint:
        # One POST per 30 s: only a prompt report arrives before the pacing ends.
        reporter = ProgressReporter(None, endpoint.url, rank=0, min_interval_s=30.0)
        reporter.report(step=11, loss=0.5)  # the old generation's: no recovery
        wait_posts(endpoint, 1)
        reporter.recovery = recovery_field("InProcess", resumed_step=12, rendezvous_time=time.time())
        sent = time.monotonic()
        reporter.report(step=12, loss=0.4)
        wait_posts(endpoint, 2)
        reporter.report(step=12, loss=0.3)  # the same recovery: paced (30 s), still pending...
        time.sleep(0.3)
        assert len(endpoint.posts) == 2
        reporter.recovery = {**reporter.recovery, "first_step_time": time.time()}
        reporter.report(step=13, loss=0.2)  # ...until one with a changed recovery replaces it, at once
        wait_posts(endpoint, 3)
        arrived = time.monotonic()
        reporter.close()
    bodies = [body for _, body in endpoint.posts]
    assert "recovery" not in bodies[0]
    assert bodies[1]["step"] == 12 and bodies[1]["recovery"]["first_step_time"] is None
    assert bodies[2]["step"] == 13 and bodies[2]["recovery"]["first_step_time"] is not None
    assert arrived - sent < 5.0  # both prompt, not after min_interval_s
    assert len(bodies) == 3  # close() had nothing newer to send


def test_a_report_too_large_for_the_endpoint_keeps_its_recovery() -> None:
    with Endpoint() as endpoint:
        reporter = ProgressReporter(None, endpoint.url, rank=0)
        reporter.recovery = recovery_field("Restart", reason="r" * 600, resumed_step=5, rendezvous_time=1.0)
        reporter.report(step=6, step_seconds_by_worker={str(i): 0.1 for i in range(1024)})  # over 4 KiB
        reporter.close()
    (_, body), = endpoint.posts
    assert "step_seconds_by_worker" not in body and body["recovery"]["reason"] == "r" * RECOVERY_REASON_LIMIT
    assert len(json.dumps(body)) < MAX_BODY


def _job(directory: Path, rendezvous: Rendezvous | None = None, generation: int = 2) -> Job:
    env = JobEnv(rank=0, local_rank=0, world_size=1, generation=generation, job_name="timeline")
    return Job(env, torch.device("cpu"), StopRequest(), checkpoint_dir=directory, keep=2, rendezvous=rendezvous)


def test_a_resume_from_the_volume_reports_restart_until_and_after_its_first_step(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DDPJOB_INPROCESS", raising=False)
    before = time.time()
    job = _job(tmp_path)
    assert job.resume() is None and job.recovery is None  # a fresh start: not a recovery
    job.save(4, {"w": torch.ones(2)}, final=True)
    job.close()

    job = _job(tmp_path)
    assert job.resume() is not None
    assert job.recovering
    assert job.recovery == {"path": "Restart", "reason": "", "resumed_step": 4, "first_step_time": None,
                            "rendezvous_time": pytest.approx(time.time(), abs=30)}
    job.report(step=4)  # the resumed step itself: no step done yet
    assert job.recovering
    assert job.should_stop() is False  # after a step
    assert not job.recovering and job.recovery["first_step_time"] >= job.recovery["rendezvous_time"] >= before
    job.report(step=5, loss=0.1)
    job.close()
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 5 and progress["recovery"] == job.recovery


def test_a_restart_where_in_process_was_asked_for_says_why(tmp_path: Path, monkeypatch) -> None:
    """The survivors note why they took the exit path in the job's store; the next generation's rank 0 reads the
    newest note back to the generation its checkpoint was saved in; none: nobody held the state."""
    monkeypatch.setenv("DDPJOB_INPROCESS", "1")
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    rdzv = Rendezvous(store, "uid-timeline", Seat(0, 0, 1), backend="gloo")
    job = _job(tmp_path, rdzv, generation=1)
    job.save(7, {"w": torch.ones(2)}, final=True)  # saved in generation 1
    job.close()

    rdzv.note_fallback(1, "generation 2 has 2 ranks, not 3: the state is resumed from the volume")
    rdzv.note_fallback(1, "a second note does not replace the first")
    job = _job(tmp_path, rdzv, generation=2)
    job.resume()
    assert job.recovery["path"] == "Restart" and job.recovery["resumed_step"] == 7
    assert job.recovery["reason"] == "generation 2 has 2 ranks, not 3: the state is resumed from the volume"
    assert store.get(GROUP_PREFIX.format(uid="uid-timeline", generation=1) + FALLBACK)
    job.close()

    job = _job(tmp_path, Rendezvous(store, "uid-other", Seat(0, 0, 1), backend="gloo"), generation=2)
    job.resume()
    assert job.recovery["reason"] == ("no rank of generation 2 held the training state in memory (every one "
                                      "started anew): resumed from the volume")
    job.close()


def test_a_lightning_resume_reports_the_restart_path_and_its_first_step(tmp_path: Path, monkeypatch) -> None:
    """The framework callbacks keep the restart path and report its timeline (here Lightning's, in process)."""
    import importlib.util

    import lightning as L
    from torch.utils.data import DataLoader

    from ddp_trainer.runtime import ResumableDistributedSampler, lightning

    spec = importlib.util.spec_from_file_location("lightning_example", ROOT / "examples" / "lightning" / "train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)  # (Lightning would take the process for torchrun's)
    monkeypatch.setenv("DDPJOB_CHECKPOINT_DIR", str(tmp_path))
    ck = tmp_path / "lightning"

    def fit(max_steps: int, ckpt_path: str | None = None) -> None:
        data = example.Points(64, seed=1)
        loader = DataLoader(data, batch_size=4, sampler=ResumableDistributedSampler(len(data), 0, 1, seed=0))
        trainer = L.Trainer(max_steps=max_steps, callbacks=[lightning.DDPJobCallback(every_steps=2, keep=2,
                                                                                     directory=ck)],
                            use_distributed_sampler=False, enable_checkpointing=False, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
        trainer.fit(example.Tiny(1e-2, 1, max_steps, 0.0), loader, ckpt_path=ckpt_path)

    fit(4)
    assert "recovery" not in json.loads((tmp_path / "progress.json").read_text())  # a fresh start
    started = time.time()
    fit(8, ckpt_path=lightning.resume_from_checkpoint(ck))
    progress = json.loads((tmp_path / "progress.json").read_text())
    recovery = progress["recovery"]
    assert (progress["step"], recovery["path"], recovery["reason"], recovery["resumed_step"]) == (8, "Restart", "", 4)
    assert started <= recovery["rendezvous_time"] <= recovery["first_step_time"] <= progress["time"]


def test_the_operator_reads_the_trainers_recovery_as_sent() -> None:
    """The report as the trainer's reporter POSTs it goes through the operator's own parser (the contract's two
    sides, docs/launch-contract.md)."""
    from ddpjob_operator.progress.reports import parse_report

    with Endpoint() as endpoint:
        reporter = ProgressReporter(None, endpoint.url, rank=0)
        reporter.recovery = recovery_field("Restart", reason="generation 2 has 2 ranks, not 3", resumed_step=12,
                                           rendezvous_time=1700000000.25, first_step_time=1700000001.5)
        reporter.report(step=13, loss=0.5)
        reporter.close()
    (_, body), = endpoint.posts
    got = parse_report(json.dumps(body).encode()).recovery
    assert (got.path, got.reason, got.resumed_step, got.rendezvous_time, got.first_step_time) == (
        "Restart", "generation 2 has 2 ranks, not 3", 12, 1700000000.25, 1700000001.5)


def test_a_diverged_loss_and_a_reason_of_wide_characters_still_make_a_report_the_operator_reads() -> None:
    """A NaN loss goes as null (JSON has no NaN; a refused report would look like a stalled run), and a reason of
    512 characters outside the BMP is escaped to ASCII before the cut, so the body stays under the limit."""
    from ddpjob_operator.progress.reports import parse_report

    with Endpoint() as endpoint:
        reporter = ProgressReporter(None, endpoint.url, rank=0)
        reporter.recovery = recovery_field("Restart", reason="\U0001F525" * 600, resumed_step=5, rendezvous_time=1.0)
        reporter.report(step=6, loss=float("nan"), samples_per_second=float("inf"), epoch=1)
        reporter.close()
    (_, body), = endpoint.posts
    report = parse_report(json.dumps(body).encode())
    assert (report.step, report.loss, report.samples_per_second) == (6, None, None)
    assert report.recovery.reason.startswith("\\U0001f525") and len(report.recovery.reason) == RECOVERY_REASON_LIMIT
    assert len(json.dumps(body)) < MAX_BODY
