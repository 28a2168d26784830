"""Issue 23, items 4-6: checkpoints are never lost.

4. An I/O error while resuming is retried, then fails retryably (exit 75, `checkpoint volume
   unreadable:`); it is never taken for corruption, and nothing is pruned unless a newer checkpoint
   was committed and read back first.
5. Each job has a directory of its own on the volume (`<dir>/<job name>/`), and every commit,
   periodic ones too, is fenced by the rendezvous generation of torchrun's run id (`<uid>-g<N>`).
6. A full volume (ENOSPC, EDQUOT) exits 75 with `checkpoint volume full: <dir>`, leaves no temp file
   and prunes nothing.

Process-free on the CheckpointManager and `Job` (no process group), plus one real torchrun run
through the worker launcher for the exit code and the termination message. The same promises for the
HF and Lightning integrations' checkpoints (`runtime.frameworks`, with the CheckpointManager's retry,
fence and full-volume code) are at the end; their runs with each framework's own saves are in
test_hf_callback.py and test_lightning_callback.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
import torch

from ddp_trainer import runtime
from ddp_trainer.runtime import CheckpointManager, Job, JobEnv, ProgressReporter, StopRequest
from ddp_trainer.runtime import checkpoint as checkpoint_module
from ddp_trainer.runtime.checkpoint import files as checkpoint_files
from ddp_trainer.runtime.checkpoint import store as checkpoint_store
from ddp_trainer.runtime import frameworks
from trainer_harness import PY, base_env, recorded, run, steps_dir, tail, trap_exit, wait_for

_real_read_bytes = Path.read_bytes
_real_read_regular_file = checkpoint_files.read_regular_file
_real_fsync = os.fsync


def _state(value: float) -> dict:
    return {"w": torch.full((4,), value)}


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _job(directory: Path, name: str, *, stale_generation: int = 0) -> Job:
    """A rank-0 `Job` as a DDPJob worker gets it, without a process group; its pod env's generation
    (DDPJOB_GENERATION, JobEnv.generation) is `stale_generation`, whatever torchrun's run id says."""
    env = JobEnv(rank=0, local_rank=0, world_size=1, generation=stale_generation, job_name=name)
    return Job(env, torch.device("cpu"), StopRequest(), checkpoint_dir=directory, keep=2,
               reporter=ProgressReporter(None, None, enabled=False))


def _fail_reads(monkeypatch, suffix: str, times: int | None = None) -> list[Path]:
    """Path.read_bytes raises EIO for files ending in `suffix` (the first `times` calls; None: always)."""
    calls: list[Path] = []

    def read_bytes(self: Path) -> bytes:
        if self.name.endswith(suffix):
            calls.append(self)
            if times is None or len(calls) <= times:
                raise OSError(errno.EIO, "Input/output error", str(self))
        return _real_read_bytes(self)

    def read_regular_file(path, **kwargs) -> bytes:
        path = Path(path)
        if path.name.endswith(suffix):
            calls.append(path)
            if times is None or len(calls) <= times:
                raise OSError(errno.EIO, "Input/output error", str(path))
        return _real_read_regular_file(path, **kwargs)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None, errors=None:
                        read_bytes(self).decode(encoding or "utf-8", errors or "strict"))
    for module in (checkpoint_files, checkpoint_store):  # markers, and a step's data
        monkeypatch.setattr(module, "read_regular_file", read_regular_file)
    monkeypatch.setattr(frameworks, "read_regular_file", read_regular_file, raising=False)
    return calls


def _fail_fsync(monkeypatch, code: int, which: str) -> None:
    """os.fsync raises OSError(code) for temp files whose name contains `which` (after the data went in)."""
    def fsync(fd: int) -> None:
        if which in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        _real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


# ---- 4. an I/O error while resuming ------------------------------------------------------------

def test_4_an_io_error_while_resuming_is_retried_then_fails_retryably_and_removes_nothing(tmp_path, monkeypatch):
    """It used to be taken for corruption: all three good checkpoints skipped, a start from step 0, and
    the first save pruned them."""
    m = CheckpointManager(tmp_path, keep=3)
    for step in (100, 200, 300):
        m.save(step, _state(step))
    before = _files(m.dir)
    restarted = CheckpointManager(tmp_path, keep=3)
    restarted.retry_backoff_s = 0.001
    reads = _fail_reads(monkeypatch, ".pt")
    with pytest.raises(OSError) as failed:
        restarted.load_latest()  # the old code returned None here: "no checkpoint, start from scratch"
    error = failed.value
    assert str(error).startswith(f"checkpoint volume unreadable: {m.dir}: "), str(error)
    assert isinstance(error, runtime.CheckpointVolumeUnreadable)
    assert error.exit_code == runtime.CHECKPOINT_VOLUME_UNREADABLE_EXIT_CODE == 75
    assert runtime.CHECKPOINT_VOLUME_UNREADABLE_PREFIX == "checkpoint volume unreadable:"
    assert len(reads) == 1 + restarted.read_retries, "retried, and never fell back to an older step"
    assert restarted.corrupt == set()
    monkeypatch.undo()
    assert _files(m.dir) == before
    assert CheckpointManager(tmp_path, keep=3).load_latest()[0] == 300  # the volume is back: nothing lost


def test_4_a_transient_read_error_is_retried_and_resumes_from_the_newest(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, keep=3)
    for step in (100, 200, 300):
        m.save(step, _state(step))
    restarted = CheckpointManager(tmp_path, keep=3)
    restarted.retry_backoff_s = 0.001
    _fail_reads(monkeypatch, "step-00000300.pt", times=2)
    step, state = restarted.load_latest()
    assert step == 300 and torch.equal(state["w"], torch.full((4,), 300.0))
    monkeypatch.undo()
    restarted.save(301, _state(301))
    assert restarted.committed_steps() == [301, 300, 200]


def test_4_nothing_is_pruned_until_the_new_checkpoint_reads_back(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, keep=2)
    m.retry_backoff_s = 0.001
    for step in (10, 20):
        m.save(step, _state(step))
    _fail_reads(monkeypatch, "step-00000030.committed")  # step 30 is written, but cannot be read back
    with pytest.raises(OSError) as failed:
        m.save(30, _state(30))  # the old code never read it back, and pruned step 10
    assert isinstance(failed.value, runtime.CheckpointVolumeUnreadable), failed.value
    monkeypatch.undo()
    assert {10, 20} <= set(m.committed_steps())


def test_4_a_checkpoint_that_reads_back_differently_is_uncommitted_and_nothing_pruned(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, keep=2)
    for step in (10, 20):
        m.save(step, _state(step))
    real_replace = os.replace

    def replace(src, dst):  # the volume keeps a torn copy of step 30's data
        real_replace(src, dst)
        if str(dst).endswith("step-00000030.pt"):
            Path(dst).write_bytes(_real_read_bytes(Path(dst))[:50])

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(runtime.CheckpointVolumeUnreadable, match="read back as 50 bytes"):
        m.save(30, _state(30))
    assert m.committed_steps() == [20, 10]
    assert CheckpointManager(tmp_path, keep=2).load_latest()[0] == 20


def test_4_corrupt_checkpoints_still_fall_back_to_the_previous_good_one(tmp_path):
    m = CheckpointManager(tmp_path, keep=4)
    for step in (1, 2, 3, 4):
        m.save(step, _state(step))
    m.path(4).write_bytes(_real_read_bytes(m.path(4))[:-1])  # truncated
    m.marker(3).write_text("{not json")  # bad marker
    payload = b"not a torch.save file"  # bad payload, and a marker that matches it
    m.path(2).write_bytes(payload)
    m.marker(2).write_text(json.dumps({"step": 2, "bytes": len(payload),
                                       "sha256": hashlib.sha256(payload).hexdigest()}))
    step, _ = CheckpointManager(tmp_path, keep=4).load_latest()
    assert step == 1


def test_4_a_checkpoint_whose_data_file_vanished_is_skipped_not_retried(tmp_path):
    m = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2):
        m.save(step, _state(step))
    m.path(2).unlink()
    restarted = CheckpointManager(tmp_path, keep=2)
    assert restarted.load_latest()[0] == 1 and restarted.corrupt == {2}


# ---- 5. one directory per job, every commit fenced by generation -------------------------------

def test_5_two_jobs_on_one_claim_never_see_each_others_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-a-g0")
    with _job(tmp_path, "first") as first:
        for step in (100, 200, 300):
            first.save(step, _state(step))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-b-g0")
    with _job(tmp_path, "second") as second:
        assert second.resume() is None  # the old code resumed the first job's step 300
        for step in (1, 2, 3):
            second.save(step, _state(step))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-a-g1")
    with _job(tmp_path, "first") as first:
        state = first.resume()
        assert state["ddpjob"]["step"] == 300  # and its second save used to prune the first job's
        assert first.checkpoints.committed_steps() == [300, 200]
    assert (tmp_path / "first" / "checkpoints").is_dir() and (tmp_path / "second" / "checkpoints").is_dir()


def test_5_a_periodic_save_of_an_older_generation_commits_nothing(tmp_path, monkeypatch):
    """Generation 2 resumed and committed; a left-behind trainer of generation 1 (the same pod env,
    DDPJOB_GENERATION=1, as a survivor's pod that joins later generations in place keeps) saves."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-uid-g1")
    with _job(tmp_path, "job", stale_generation=1) as old:
        old.save(100, _state(100))
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-uid-g2")
        with _job(tmp_path, "job", stale_generation=1) as new:
            assert new.resume()["ddpjob"]["step"] == 100
            new.save(110, _state(110))
            old.save(150, _state(150))  # further along, but of a replaced generation
            old.save(160, _state(160), final=True)
            assert old.last_checkpoint_step == 100  # the old code committed 150 and 160 (160 the newest)
            assert old.checkpoints.fenced_by == 2
    reader = CheckpointManager(tmp_path, job_name="job", is_writer=False)
    assert reader.committed_steps() == [110, 100]
    assert reader.load_latest()[0] == 110


def test_5_an_older_generation_commits_nothing_once_a_newer_one_started(tmp_path):
    """The newer generation fences the directory when it starts, before it looks for a checkpoint: a
    save of the older one after that would otherwise become a later generation's resume point."""
    old = CheckpointManager(tmp_path, job_name="job", run_id="uid-g1")
    old.save(10, _state(10))
    CheckpointManager(tmp_path, job_name="job", run_id="uid-g2")  # generation 2's rank 0 starts
    old.save(20, _state(20))
    assert not CheckpointManager(tmp_path, job_name="job", run_id="uid-g1", is_writer=False).save_rescue(
        21, _state(21))
    assert CheckpointManager(tmp_path, job_name="job", run_id="uid-g2").committed_steps() == [10]


def test_5_a_commit_is_withdrawn_when_a_newer_generation_starts_while_it_writes(tmp_path, monkeypatch):
    old = CheckpointManager(tmp_path, job_name="job", run_id="uid-g1")
    real_dumps = json.dumps

    def dumps(obj, *a, **k):  # the marker of step 20 is being written: generation 2 starts meanwhile
        if isinstance(obj, dict) and obj.get("step") == 20:
            CheckpointManager(tmp_path, job_name="job", run_id="uid-g2")
        return real_dumps(obj, *a, **k)

    monkeypatch.setattr(json, "dumps", dumps)
    old.save(20, _state(20))
    assert old.committed_steps() == [] and not old.path(20).exists() and old.fenced_by == 2


def test_5_a_survivors_rescue_commits_in_the_generation_it_joined_and_a_left_behind_one_commits_nothing(tmp_path):
    """In-process recovery writes a survivor's rescue while it joins the next generation (RescueCheckpoint): the
    replacement's rank 0 raised generation 2's fence meanwhile. The survivor, a member of generation 2 which
    resumes from the rescued step, commits it in generation 2; a trainer left behind in generation 1, a rescue of
    a step generation 2 did not resume from, and one written after generation 3 started commit nothing."""
    def manager(generation: int, writer: bool = False) -> CheckpointManager:
        return CheckpointManager(tmp_path, job_name="job", run_id=f"uid-g{generation}", is_writer=writer)

    manager(1, writer=True).save(10, _state(10))
    manager(2, writer=True)  # generation 2's rank 0 starts: its fence
    survivor = checkpoint_module.RescueCheckpoint(manager(1), 12, _state(12)).start()
    assert survivor.read.wait(30)  # the tensors are read: the survivor may train on
    left_behind = checkpoint_module.RescueCheckpoint(manager(1), 13, _state(13)).start()
    left_behind.stayed()  # never a member of generation 2: the exit path
    assert not left_behind.join()
    behind = checkpoint_module.RescueCheckpoint(manager(1), 11, _state(11)).start()
    behind.joined(2, 12)  # generation 2 resumed from a later step (a peer's)
    assert not behind.join()
    survivor.joined(2, 12)
    assert survivor.join() and survivor.generation == 2
    reader = manager(2)
    assert reader.committed_steps() == [12, 10] and not reader.path(13).exists() and not reader.path(11).exists()
    assert json.loads(reader.marker(12).read_text())["generation"] == 2
    assert torch.equal(reader.load(12)["w"], torch.full((4,), 12.0))
    manager(3, writer=True)  # generation 3 starts: a rescue that joined generation 2 is left behind in turn
    late = checkpoint_module.RescueCheckpoint(manager(1), 14, _state(14)).start()
    late.joined(2, 14)
    assert not late.join()
    assert manager(3).committed_steps() == [12, 10]


@pytest.mark.parametrize("writer_kept", [True, False])
def test_a_rescue_of_a_step_the_writer_saves_itself_waits_to_know_the_writer_was_lost(tmp_path, writer_kept):
    """Rank 1 rescues step 20, a periodic step, while rank 0 (the writer) may still be writing its own save of
    it (each writes its own file, but one copy of the step is enough). The rescue claims nothing until it joined
    the next generation; where rank 0 lives on, its save stands and the rescue writes nothing; where rank 0 was
    lost, the rescue commits the step in the generation it joined."""
    def manager(generation: int, writer: bool = False) -> CheckpointManager:
        return CheckpointManager(tmp_path, job_name="job", run_id=f"uid-g{generation}", is_writer=writer)

    writer = manager(1, writer=True)
    writer.save(10, _state(10))
    rescue = checkpoint_module.RescueCheckpoint(manager(1), 20, _state(20), after_writer=True).start()
    assert rescue.read.wait(30)  # the survivor trains on at once
    assert not writer.claim(20).exists() and not writer.path(20).exists() and not writer.rescue_path(20).exists()
    if writer_kept:
        writer.save(20, _state(20))  # the save that was in flight: alone on the step's file
    manager(2, writer=True)  # generation 2's rank 0 starts: its fence
    rescue.joined(2, 20, writer_kept=writer_kept)
    assert rescue.join() is not writer_kept
    reader = manager(2)
    assert reader.committed_steps() == [20, 10] and torch.equal(reader.load(20)["w"], torch.full((4,), 20.0))
    assert json.loads(reader.marker(20).read_text())["generation"] == (1 if writer_kept else 2)
    if writer_kept:
        assert not reader.claim(20).exists()  # never claimed: rank 0's own rescue could have taken the step


def test_a_rescue_and_the_writers_save_of_one_step_never_share_a_file(tmp_path):
    """A survivor's rescue of step 20 and rank 0's own save of it overlap (rank 0's save was in flight when the
    peer failed): the rescue writes its own file, and whichever marker comes last commits its own file whole.
    Before, both wrote step-00000020.pt: rank 0's read-back then found the rescue's bytes and raised
    CheckpointVolumeUnreadable after uncommitting the step."""
    def manager(generation: int, writer: bool = False) -> CheckpointManager:
        return CheckpointManager(tmp_path, job_name="job", run_id=f"uid-g{generation}", is_writer=writer)

    manager(1, writer=True).save(10, _state(10))
    writer = manager(2, writer=True)  # the rescue, of generation 1, now waits to know where it commits
    rescue = checkpoint_module.RescueCheckpoint(manager(1), 20, {"w": torch.full((4,), 20.5)}).start()
    assert rescue.read.wait(30)
    wait_for(lambda: writer.rescue_path(20).exists(), "the rescue's own data file", 30)
    withdraw_if_fenced = writer._withdraw_if_fenced

    def rescue_commits_meanwhile(step: int) -> bool:  # between rank 0's marker and its read-back
        rescue.joined(2, 20)
        assert rescue.join()
        return withdraw_if_fenced(step)

    writer._withdraw_if_fenced = rescue_commits_meanwhile
    writer.save(20, _state(20))  # no CheckpointVolumeUnreadable
    reader = manager(2)
    assert reader.committed_steps() == [20, 10]
    assert json.loads(reader.marker(20).read_text())["data"] == "step-00000020.rescue.pt"
    assert torch.equal(reader.load(20)["w"], torch.full((4,), 20.5))  # the rescue's, whole
    assert not reader.path(20).exists()  # rank 0's copy, no longer committed, removed


@pytest.mark.parametrize("named", ["../step-00000020.pt", "step-00000010.pt", "/etc/passwd", 7])
def test_a_marker_naming_a_file_not_of_its_step_is_skipped_as_corrupt(tmp_path, caplog, named):
    m = CheckpointManager(tmp_path, job_name="job")
    m.save(10, _state(10))
    m.save(20, _state(20))
    marker = json.loads(m.marker(20).read_text())
    m.marker(20).write_text(json.dumps({**marker, "data": named}))
    step, state = m.load_latest()
    assert step == 10 and torch.equal(state["w"], torch.full((4,), 10.0))
    assert "skipping unreadable checkpoint step 20" in caplog.text and "not a data file of step 20" in caplog.text


def test_a_rescue_write_gives_way_to_the_hand_over_it_overlaps(tmp_path):
    """Once it has read the tensors, the rescue thread's niceness is RESCUE_NICENESS above the process's (Linux:
    per thread): a spare's broadcast and a replacement's start on the node, which training waits for, go first.
    The caller's own stays as it was."""
    import threading

    seen: list[int] = []
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    manager = CheckpointManager(tmp_path, job_name="job", run_id="uid-g1")
    rescue = checkpoint_module.RescueCheckpoint(
        manager, 12, _state(12), done=lambda _: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    assert rescue.start().join() and manager.committed_steps() == [12]
    assert seen == [min(19, mine + checkpoint_module.RESCUE_NICENESS)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_5_generation_comes_from_torchruns_run_id_with_a_fallback(monkeypatch):
    assert runtime.rendezvous_generation({"TORCHELASTIC_RUN_ID": "0f1e-2d3c-g7", "DDPJOB_GENERATION": "3"}) == \
        ("0f1e-2d3c", 7)
    assert runtime.rendezvous_generation({"DDPJOB_GENERATION": "3"}) == ("", 3)  # a plain script
    assert runtime.rendezvous_generation({"TORCHELASTIC_RUN_ID": "none"}) == ("", 0)  # torchrun's default id
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc-g4")
    monkeypatch.setenv("DDPJOB_GENERATION", "1")
    m = CheckpointManager("/nonexistent", is_writer=False, job_name="")
    assert (m.run, m.generation) == ("abc", 4)


def test_5_a_recreated_job_of_the_same_name_resumes_and_is_not_fenced_by_the_old_run(tmp_path):
    CheckpointManager(tmp_path, job_name="job", run_id="old-uid-g5").save(50, _state(50))
    again = CheckpointManager(tmp_path, job_name="job", run_id="new-uid-g0")
    assert again.load_latest()[0] == 50
    again.save(51, _state(51))
    assert again.committed_steps() == [51, 50]


def test_5_earlier_versions_shared_layout_is_named_not_resumed(tmp_path, caplog):
    CheckpointManager(tmp_path, job_name="").save(7, _state(7))  # <dir>/checkpoints/, as before
    assert CheckpointManager(tmp_path, job_name="job").load_latest() is None
    assert f"move them into {tmp_path / 'job' / 'checkpoints'}" in caplog.text


def test_5_a_job_name_that_is_not_one_path_component_is_refused(tmp_path):
    for name in ("..", "a/b", ".hidden"):
        with pytest.raises(runtime.CheckpointDirError, match="cannot name a checkpoint directory"):
            CheckpointManager(tmp_path, job_name=name)


# ---- 6. a full checkpoint volume ---------------------------------------------------------------

@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
@pytest.mark.parametrize("which", [".step-00000030.pt.tmp-", ".step-00000030.committed.tmp-"],
                         ids=["data", "marker"])
def test_6_a_full_volume_is_reported_as_such_leaves_no_temp_file_and_prunes_nothing(tmp_path, monkeypatch,
                                                                                       code, which):
    m = CheckpointManager(tmp_path, keep=2)
    for step in (10, 20):
        m.save(step, _state(step))
    before = _files(m.dir)
    _fail_fsync(monkeypatch, code, which)
    with pytest.raises(OSError) as failed:
        m.save(30, _state(30))
    error = failed.value
    assert str(error).startswith(f"checkpoint volume full: {m.dir}: "), str(error)  # was "[Errno 28] ...", exit 1
    assert isinstance(error, runtime.CheckpointVolumeFull) and error.errno == code
    assert error.exit_code == runtime.CHECKPOINT_VOLUME_FULL_EXIT_CODE == 75
    assert runtime.CHECKPOINT_VOLUME_FULL_PREFIX == "checkpoint volume full:"
    assert _files(m.dir) == before  # no temp file, no uncommitted data file taking the space
    assert m.committed_steps() == [20, 10]


def test_6_an_async_save_on_a_full_volume_surfaces_as_volume_full(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, keep=2, async_save=True)
    _fail_fsync(monkeypatch, errno.ENOSPC, ".step-00000001.pt.tmp-")
    m.save(1, _state(1))
    with pytest.raises(runtime.CheckpointVolumeFull, match=r"^checkpoint volume full: "):
        m.wait()


def test_6_a_full_volume_at_start_is_volume_full_not_a_directory_error(tmp_path, monkeypatch):
    _fail_fsync(monkeypatch, errno.ENOSPC, ".write-probe-")
    with pytest.raises(runtime.CheckpointVolumeFull, match=re.escape(f"checkpoint volume full: {tmp_path / 'job'}:")):
        CheckpointManager(tmp_path, job_name="job")


def test_6_record_hands_the_message_to_torchrun_and_returns_75(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    error = runtime.CheckpointVolumeFull(tmp_path, "No space left on device while writing x")
    assert error.record() == 75
    recorded = json.loads((tmp_path / "error.json").read_text())["message"]
    assert recorded["message"] == f"checkpoint volume full: {tmp_path}: No space left on device while writing x"
    assert int(recorded["extraInfo"]["timestamp"]) > 0


FULL_VOLUME_WORKLOAD = """
import errno, os
from ddp_trainer.workloads.synthetic import build_datasets, build_model

_fsync = os.fsync

def fsync(fd):
    if ".step-00000010.pt.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    _fsync(fd)

os.fsync = fsync
"""


@pytest.mark.slow
def test_6_the_trainer_exits_75_and_the_termination_message_says_volume_full(tmp_path: Path) -> None:
    agent = pytest.importorskip("ddpjob_operator.agent", reason="the operator package is not on the path")
    (tmp_path / "full_volume_task.py").write_text(FULL_VOLUME_WORKLOAD)
    ckpt, message = tmp_path / "ckpt", tmp_path / "termination-log"
    env = base_env(ckpt, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   **{agent.contract.TERMINATION_LOG_ENV: str(message)})
    args = ["--workload", "full_volume_task", "--workload-option", "samples=512", "--workload-option", "features=8",
            "--workload-option", "hidden=16", "--workload-option", "classes=3", "--epochs", "100",
            "--batch-size", "8", "--checkpoint-every", "5", "--log-every", "5"]
    cmd = [*agent.command("worker", python=PY), "--standalone", "--nproc-per-node=1", "--max-restarts=0",
           "-m", "ddp_trainer", *args]
    code = run(cmd, env, tmp_path / "log", 120)
    assert code == 75, tail(tmp_path / "log")
    steps = steps_dir(ckpt)
    assert message.read_text().startswith(
        f"rank 0 (local rank 0) exited with code 75: checkpoint volume full: {steps}: "), message.read_text()
    assert _files(steps) == ["step-00000005.committed", "step-00000005.pt"]  # no temp file, step 5 kept


# ---- the same promises for the HF and Lightning integrations (runtime.frameworks) ----------------------

FRAMEWORKS = ["hf", "lightning"]


def _framework(name: str, monkeypatch):
    """The integration's module (skipped without its framework); read retries without pauses."""
    module = pytest.importorskip(f"ddp_trainer.runtime.{name}")
    monkeypatch.setattr(checkpoint_files, "READ_RETRY_BACKOFF_SECONDS", 0.0)
    return module


def _framework_checkpoint(directory: Path, name: str, step: int, size: int = 100) -> Path:
    """What the framework leaves before the commit: HF a directory `checkpoint-<N>/`, Lightning one file."""
    if name == "hf":
        path = directory / f"checkpoint-{step}"
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"x" * size)
        (path / "trainer_state.json").write_text("{}")  # HF resumes only with both (hf.unloadable)
    else:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"step-{step:08d}.ckpt"
        torch.save({"x": b"x" * size}, path)  # Lightning resumes only from a torch.save archive (lightning.unloadable)
    return path


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_4_frameworks_a_read_error_on_a_marker_is_retried_then_exits_75_never_an_older_checkpoint(
        tmp_path, monkeypatch, name):
    """`read_marker` took an I/O error for "no marker": the newest checkpoint was skipped for an older one."""
    module = _framework(name, monkeypatch)
    ck = tmp_path / "ck"
    paths = {step: _framework_checkpoint(ck, name, step) for step in (10, 20, 30)}
    for step, path in paths.items():
        frameworks.commit(path, step=step, world_size=2)
    marker = frameworks.marker_path(paths[30]).name  # (HF: every checkpoint's marker has this name)
    reads = _fail_reads(monkeypatch, marker)
    with pytest.raises(runtime.CheckpointVolumeUnreadable) as failed:
        frameworks.newest_complete(ck, module.CHECKPOINT)  # the old code: step 20
    assert str(failed.value).startswith(f"checkpoint volume unreadable: {ck}: "), str(failed.value)
    assert len(reads) == 1 + checkpoint_module.READ_RETRIES
    error_file = trap_exit(monkeypatch, tmp_path)
    with pytest.raises(SystemExit) as exited:
        module.resume_from_checkpoint(str(ck))  # what the script calls: exit 75, as the bundled trainer
    assert exited.value.code == 75
    assert recorded(error_file).startswith(f"checkpoint volume unreadable: {ck}: "), recorded(error_file)
    monkeypatch.undo()
    _framework(name, monkeypatch)
    _fail_reads(monkeypatch, marker, times=2)  # a transient error: retried, the newest is found
    assert frameworks.newest_complete(ck, module.CHECKPOINT)[0] == 30


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_4_frameworks_prune_only_after_a_complete_commit_and_never_on_a_read_error(tmp_path, monkeypatch, name):
    module = _framework(name, monkeypatch)
    paths = {step: _framework_checkpoint(tmp_path, name, step) for step in (10, 20, 30, 40, 50)}
    for step in (10, 30, 40, 50):  # 20: partial (its writer died); 50: newer than 40, another writer's
        frameworks.commit(paths[step], step=step, world_size=1)
    before = _files(tmp_path)
    _fail_reads(monkeypatch, frameworks.marker_path(paths[10]).name)
    assert frameworks.prune(paths[40], module.CHECKPOINT, 2) == []  # one marker cannot be read: nothing goes
    monkeypatch.undo()
    _framework(name, monkeypatch)
    data = paths[40] / "model.safetensors" if name == "hf" else paths[40]
    committed = data.read_bytes()
    data.write_bytes(b"x" * 50)  # 40 does not read back as committed
    assert frameworks.prune(paths[40], module.CHECKPOINT, 2) == []
    assert _files(tmp_path) == before
    data.write_bytes(committed)
    assert sorted(frameworks.prune(paths[40], module.CHECKPOINT, 2)) == [paths[10], paths[20]]
    assert [step for step, path in paths.items() if path.exists()] == [30, 40, 50]


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_5_frameworks_commits_are_fenced_by_generation(tmp_path, monkeypatch, name):
    module = _framework(name, monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")
    frameworks.start_generation(tmp_path)
    first = _framework_checkpoint(tmp_path, name, 10)
    assert frameworks.commit(first, step=10, world_size=2) is not None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g2")
    assert module.resume_from_checkpoint(str(tmp_path)) == str(first)  # generation 2's rank 0: fence, then look
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")  # a trainer of generation 1, left behind, further along
    late = _framework_checkpoint(tmp_path, name, 20)
    assert frameworks.commit(late, step=20, world_size=2) is None  # the old code committed it
    assert late.exists()  # its files stay: the step may be the newer generation's too
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g2")
    assert frameworks.newest_complete(tmp_path, module.CHECKPOINT)[0] == 10
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "new-uid-g0")  # the job recreated under the same name
    frameworks.start_generation(tmp_path)
    assert frameworks.commit(_framework_checkpoint(tmp_path, name, 30), step=30, world_size=2) is not None


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_5_frameworks_a_commit_is_withdrawn_when_a_newer_generation_starts_while_it_writes(tmp_path, monkeypatch,
                                                                                           name):
    _framework(name, monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")
    frameworks.start_generation(tmp_path)
    real_dumps = json.dumps

    def dumps(obj, *args, **kwargs):  # step 20's marker is being written: generation 2 starts meanwhile
        if isinstance(obj, dict) and obj.get("step") == 20 and "files" in obj:
            with monkeypatch.context() as m:
                m.setenv("TORCHELASTIC_RUN_ID", "uid-g2")
                frameworks.start_generation(tmp_path)
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", dumps)
    path = _framework_checkpoint(tmp_path, name, 20)
    assert frameworks.commit(path, step=20, world_size=2) is None
    assert not frameworks.marker_path(path).exists() and path.exists()


def test_6_frameworks_a_full_volume_is_recognised_behind_a_frameworks_own_error(tmp_path, monkeypatch):
    """HF and Lightning write their checkpoints with their own code, which may wrap the OSError, or (torch.save's
    C++ stream) lose its errno: the exception's chain, then the volume itself, tell a full volume."""
    error_file = trap_exit(monkeypatch, tmp_path)
    wrapped = RuntimeError("saving the checkpoint failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    bare = RuntimeError("basic_ios::clear: iostream error")  # torch.save's C++ writer, whatever went wrong

    def save(error: Exception):
        def write() -> None:
            raise error
        return write

    with pytest.raises(SystemExit) as exited:
        frameworks.guard_volume(save(wrapped), tmp_path, "checkpoint-4")
    assert exited.value.code == 75
    assert recorded(error_file).startswith(
        f"checkpoint volume full: {tmp_path}: {os.strerror(errno.EDQUOT)} while writing checkpoint-4: ")
    with pytest.raises(RuntimeError, match="iostream error"):
        frameworks.guard_volume(save(bare), tmp_path, "optimizer.pt")  # space left: not the volume's failure
    real = os.statvfs(tmp_path)
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((*real[:4], 0, *real[5:])))  # f_bavail 0
    with pytest.raises(SystemExit) as exited:
        frameworks.guard_volume(save(bare), tmp_path, "optimizer.pt")
    assert exited.value.code == 75
    assert recorded(error_file).startswith(f"checkpoint volume full: {tmp_path}: "), recorded(error_file)


# ---- issue 31 item 4: a checkpoint directory prepared by someone else ------------------------------------
# A checkpoint is read only if it is a regular file (lstat, never through a link; opened O_NOFOLLOW|O_NONBLOCK)
# of the size its marker says; a marker only if it is a small regular file; steps and generations are ASCII
# digits; a fence no generation of the job can have written stops the job with a message.

def _plant_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _plant_dev_zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def _plant_sparse(path: Path) -> None:  # 1 TiB that takes no space: the old code asked for 1 TiB of memory
    with open(path, "r+b") as f:
        f.truncate(1 << 40)


def _plant_link_to_a_good_copy(path: Path) -> None:  # the same bytes, through a link: still not read
    copy = path.with_name("elsewhere.bin")
    copy.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(copy)


def _plant_marker_directory(marker: Path) -> None:
    marker.unlink()
    (marker / "inside").mkdir(parents=True)


def _plant_marker_fifo(marker: Path) -> None:
    _plant_fifo(marker)


def _in_a_thread(call, seconds: float, fifos: list[Path]):
    """`call()` with a deadline: the old code blocked for ever opening a FIFO (a writer opening it frees it)."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    hung = thread.is_alive()
    for fifo in fifos:  # release a reader blocked in open()
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    thread.join(5)
    assert not hung, f"still reading after {seconds} s (blocked on a FIFO or reading without end)"
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.mark.parametrize("plant, which", [
    (_plant_fifo, "data"), (_plant_dev_zero, "data"), (_plant_sparse, "data"), (_plant_link_to_a_good_copy, "data"),
    (_plant_marker_directory, "marker"), (_plant_marker_fifo, "marker"),
], ids=["fifo", "link-to-dev-zero", "sparse-1TiB", "link-to-a-good-copy", "marker-is-a-directory", "marker-is-a-fifo"])
def test_31_4_a_planted_file_is_skipped_as_corrupt_never_hangs_or_runs_out_of_memory(tmp_path, caplog, plant, which):
    m = CheckpointManager(tmp_path, keep=3, job_name="job", run_id="uid-g0")
    m.save(10, _state(10))
    m.save(20, _state(20))
    target = m.path(20) if which == "data" else m.marker(20)
    plant(target)
    reader = CheckpointManager(tmp_path, keep=3, job_name="job", run_id="uid-g0", is_writer=False,
                               retry_backoff_s=0.001)
    fifos = [target] if target.is_fifo() else []
    step, state = _in_a_thread(reader.load_latest, 20, fifos)  # the old code hung, raised MemoryError or
    assert step == 10 and torch.equal(state["w"], torch.full((4,), 10.0))  # took the directory for an I/O error
    assert reader.corrupt == {20}
    assert "skipping unreadable checkpoint step 20" in caplog.text
    # The writer goes on: the next save commits and prunes around what it cannot remove, and never follows a link.
    writer = _in_a_thread(lambda: CheckpointManager(tmp_path, keep=2, job_name="job", run_id="uid-g1"), 20, fifos)
    writer.load_latest()
    writer.save(30, _state(30))
    assert writer.load_latest()[0] == 30 and writer.load(10)["w"][0] == 10
    if plant is _plant_link_to_a_good_copy:
        assert (m.dir / "elsewhere.bin").exists()  # the link went, not what it points to


def test_31_4_a_marker_with_other_digits_is_not_a_step(tmp_path):
    """`\\d` matched Arabic-Indic digits, which int() reads: a planted `step-٠٠٠٠٠٠٢٥.committed` was step 25,
    newer than 20, so with keep: 2 the save of 30 pruned 20 (and 10) and one real checkpoint was left."""
    m = CheckpointManager(tmp_path, keep=2, job_name="job", run_id="uid-g0")
    m.save(10, _state(10))
    m.save(20, _state(20))
    arabic = "".join(chr(0x0660 + int(c)) for c in "00000025")
    (m.dir / f"step-{arabic}.committed").write_bytes(m.marker(20).read_bytes())
    (m.dir / f"step-{arabic}.pt").write_bytes(m.path(20).read_bytes())
    fence = f"generation-{''.join(chr(0x0660 + int(c)) for c in '00000099')}-" \
                         f"{hashlib.sha256(b'uid').hexdigest()[:12]}.fence"
    (m.root / fence).write_text("{}")  # nor is a fence with them a generation (it would skip every save)
    m.save(30, _state(30))
    assert m.committed_steps() == [30, 20]
    assert [m.load(s)["w"][0].item() for s in (30, 20)] == [30.0, 20.0]
    assert m.fenced_by is None and (m.root / fence).exists()


@pytest.mark.parametrize("claim", ["fence", "marker"])
def test_31_4_a_fence_that_cannot_be_true_stops_the_job_with_a_message(tmp_path, claim):
    """A fence (or a committed marker) of generation 99 of this job, there when generation 1's writer starts:
    generations start in order, so no generation 99 ran. The old code warned and trained on, skipping every save."""
    m = CheckpointManager(tmp_path, keep=2, job_name="job", run_id="uid-g0")
    m.save(10, _state(10))
    if claim == "fence":
        planted = checkpoint_module.fence_path(m.root, "uid", 99)
        planted.write_text(json.dumps({"generation": 99, "run": "uid", "time": 0}))
    else:
        planted = m.marker(10)
        planted.write_text(json.dumps({**json.loads(planted.read_text()), "generation": 99}))
    with pytest.raises(runtime.CheckpointDirError) as refused:
        CheckpointManager(tmp_path, keep=2, job_name="job", run_id="uid-g1")
    message = str(refused.value)
    assert isinstance(refused.value, checkpoint_module.CheckpointFenceError)
    assert str(planted) in message and "generation 99" in message and "generation 1 " in message
    assert "cannot be true" in message and "Remove those files" in message
    planted.unlink()  # the fix the message names
    if claim == "marker":
        return
    again = CheckpointManager(tmp_path, keep=2, job_name="job", run_id="uid-g1")
    again.save(20, _state(20))
    assert again.committed_steps() == [20, 10] and again.fenced_by is None


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_31_4_frameworks_skip_planted_markers_and_other_digits_and_stop_on_an_impossible_fence(tmp_path, monkeypatch,
                                                                                                name):
    module = _framework(name, monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")
    frameworks.start_generation(tmp_path)
    for step in (10, 20):
        frameworks.commit(_framework_checkpoint(tmp_path, name, step), step=step, world_size=1)
    _plant_fifo(frameworks.marker_path(_framework_checkpoint(tmp_path, name, 30)))  # the old code hung on it
    arabic = "".join(chr(0x0660 + int(c)) for c in "40")  # the old code took `checkpoint-٤٠` for step 40
    other = tmp_path / (f"checkpoint-{arabic}" if name == "hf" else f"step-{arabic}.ckpt")
    source = tmp_path / ("checkpoint-20" if name == "hf" else "step-00000020.ckpt")
    if name == "hf":
        shutil.copytree(source, other)
    else:
        other.write_bytes(source.read_bytes())
        frameworks.marker_path(other).write_bytes(frameworks.marker_path(source).read_bytes())
    found = _in_a_thread(lambda: frameworks.newest_complete(tmp_path, module.CHECKPOINT), 20,
                         [frameworks.marker_path(tmp_path / ("checkpoint-30" if name == "hf" else "step-00000030.ckpt"))])
    assert found is not None and found[0] == 20
    checkpoint_module.fence_path(tmp_path, "uid", 99).write_text("{}")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g2")
    with pytest.raises(checkpoint_module.CheckpointFenceError, match="generation 99 of this job"):
        frameworks.start_generation(tmp_path)  # the old code warned and trained on, committing nothing
