"""Issue 38 item 4 (the trainer's side): a symbolic link at the job's directory (`<mount>/<namespace>.<name>`) or
at its `checkpoints/` made the trainer resume from the link's target, then prune it. It is refused with a
CheckpointDirError naming the path and the fix, before anything is written, pruned or loaded there, and the
target is left exactly as it was; a framework's prune never deletes through a link either.

Process-free, on real CheckpointManager saves and loads and the frameworks' fence, commit and prune code."""

from __future__ import annotations

import hashlib
import re

import pytest
import torch

from ddp_trainer.runtime import CheckpointDirError, CheckpointManager, frameworks


def _state(value: float) -> dict:
    return {"w": torch.full((4,), value)}


def _tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True)
def _no_namespace(monkeypatch):
    """The job's directory is `<mount>/train` (a job without a namespace): the same path before and after the fix."""
    monkeypatch.delenv("DDPJOB_NAMESPACE", raising=False)


@pytest.fixture
def someone_elses(tmp_path):
    """A directory of another job's checkpoints (steps 10 and 20, keep 2) that a link will point at."""
    other = CheckpointManager(tmp_path / "other", keep=2, job_name="theirs", run_id="their-uid-g0")
    for step in (10, 20):
        other.save(step, _state(step))
    return other.root


def _link(link, target) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)


@pytest.mark.parametrize("where", ["job", "checkpoints"])
@pytest.mark.parametrize("writer", [True, False], ids=["writer", "reader"])
def test_a_link_at_the_jobs_directories_is_refused_and_its_target_untouched(tmp_path, someone_elses, where, writer):
    volume = tmp_path / "volume"
    job = volume / "train"
    if where == "job":
        _link(job, someone_elses)
    else:
        _link(job / "checkpoints", someone_elses / "checkpoints")
    before = _tree(someone_elses)
    refused = re.escape(str(job if where == "job" else job / "checkpoints")) + r" is a symbolic link .*real directory"
    with pytest.raises(CheckpointDirError, match=refused):
        manager = CheckpointManager(volume, keep=2, job_name="train", run_id="uid-g1", is_writer=writer)
        manager.load_latest()  # the old code resumed from step 20 of the other job, then pruned it
        manager.save(30, _state(30))
    assert _tree(someone_elses) == before


def test_a_link_put_in_place_after_the_start_is_refused_at_the_next_save_and_load(tmp_path, someone_elses):
    manager = CheckpointManager(tmp_path / "volume", keep=2, job_name="train", run_id="uid-g1")
    manager.save(1, _state(1))
    mine = manager.dir.rename(tmp_path / "moved")
    _link(manager.dir, someone_elses / "checkpoints")
    before = _tree(someone_elses)
    with pytest.raises(CheckpointDirError, match="is a symbolic link"):
        manager.save(30, _state(30))
    with pytest.raises(CheckpointDirError, match="is a symbolic link"):
        manager.load_latest()
    assert not manager.save_rescue(40, _state(40))
    assert _tree(someone_elses) == before and (mine / "step-00000001.committed").is_file()


def test_a_file_where_the_jobs_directory_goes_is_refused(tmp_path):
    (tmp_path / "train").write_text("not a directory")
    with pytest.raises(CheckpointDirError, match=r"train is not a directory: remove it"):
        CheckpointManager(tmp_path, job_name="train", run_id="uid-g1")
    assert (tmp_path / "train").read_text() == "not a directory"


def test_a_frameworks_job_directory_that_is_a_link_is_refused(tmp_path, someone_elses, monkeypatch):
    monkeypatch.setenv("DDPJOB_CHECKPOINT_DIR", str(tmp_path / "volume"))
    monkeypatch.setenv("DDPJOB_NAME", "train")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")
    _link(tmp_path / "volume" / "train", someone_elses)
    before = _tree(someone_elses)
    with pytest.raises(CheckpointDirError, match="is a symbolic link"):
        frameworks.start_generation(frameworks.job_dir("lightning"))
    with pytest.raises(CheckpointDirError, match="is a symbolic link"):
        frameworks.newest_complete(frameworks.job_dir("lightning"), re.compile(r"^step-(\d+)\.ckpt$"))
    assert _tree(someone_elses) == before


def test_a_frameworks_prune_never_deletes_through_a_link_at_a_checkpoints_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")
    pattern = re.compile(r"^checkpoint-(\d+)$")
    directory = tmp_path / "hf"
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "ddpjob.committed.json").write_text("{}")  # what marker_path(link) named through the link
    (precious / "weights.bin").write_bytes(b"w" * 10)
    _link(directory / "checkpoint-1", precious)
    for step in (2, 3, 4):
        path = directory / f"checkpoint-{step}"
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x" * 10)
        assert frameworks.commit(path, step=step, world_size=1) is not None
    frameworks.prune(directory / "checkpoint-4", pattern, keep=2)
    assert sorted(p.name for p in precious.iterdir()) == ["ddpjob.committed.json", "weights.bin"]
    assert (directory / "checkpoint-1").is_symlink()  # not the framework's: left in place
    assert not (directory / "checkpoint-2").exists() and (directory / "checkpoint-3").is_dir()
