"""Issue 38 item 2: two jobs of one name in two namespaces on one shared volume. The job's directory was
`<mount>/<name>`: team B's `train` resumed from team A's weights, then pruned A's checkpoints and fence. It is
`<mount>/<namespace>.<name>` now, and a job's directory of the layout before (`<mount>/<name>`) is adopted only
where its fences and markers show it is this very job's (its uid), never through a link.

Process-free, on real CheckpointManager saves and loads (and the frameworks' fence and commit code)."""

from __future__ import annotations

import hashlib
import logging

import pytest
import torch

from ddp_trainer.runtime import CheckpointDirError, CheckpointManager, checkpoint, frameworks


def _state(value: float) -> dict:
    return {"w": torch.full((4,), value)}


def _tree(root) -> dict[str, str]:
    """Every file under `root` with the digest of its bytes: what must stay exactly as it was."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _as(monkeypatch, namespace: str, run_id: str) -> None:
    """This process is a worker of job `train` in `namespace`, in the rendezvous `run_id` (`<uid>-g<N>`)."""
    monkeypatch.setenv("DDPJOB_NAME", "train")
    monkeypatch.setenv("DDPJOB_NAMESPACE", namespace)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)


def test_jobs_of_one_name_in_two_namespaces_neither_read_nor_prune_each_other(tmp_path, monkeypatch):
    _as(monkeypatch, "team-a", "uid-a-g0")
    a = CheckpointManager(tmp_path, keep=2)
    for step in (100, 200, 300):
        a.save(step, _state(step))
    a_files = _tree(a.root)

    _as(monkeypatch, "team-b", "uid-b-g0")
    b = CheckpointManager(tmp_path, keep=2)
    assert b.load_latest() is None  # it resumed from team A's step 300
    for step in (1, 2, 3):
        b.save(step, _state(step))  # and its prune removed A's checkpoints and fence

    assert _tree(a.root) == a_files
    assert a.root == tmp_path / "team-a.train" and b.root == tmp_path / "team-b.train"
    _as(monkeypatch, "team-a", "uid-a-g1")
    step, state = CheckpointManager(tmp_path, keep=2).load_latest()
    assert step == 300 and torch.equal(state["w"], _state(300)["w"])
    team_b = CheckpointManager(tmp_path, is_writer=False, job_name="train", namespace="team-b")
    assert team_b.committed_steps() == [3, 2]


def test_a_namespace_that_is_not_one_path_component_is_refused(tmp_path):
    for namespace in ("..", "a/b", "a.b", "Team", "-a"):
        with pytest.raises(CheckpointDirError, match=r"namespace .* \(DDPJOB_NAMESPACE\) cannot name"):
            CheckpointManager(tmp_path, job_name="train", namespace=namespace)
    assert list(tmp_path.iterdir()) == []


def _legacy(tmp_path, run_id: str, steps=(10, 20)) -> dict[str, str]:
    """A job's directory as the layout before namespaces left it: `<mount>/train`, written by run `run_id`."""
    old = CheckpointManager(tmp_path, keep=2, job_name="train", namespace="", run_id=run_id)
    for step in steps:
        old.save(step, _state(step))
    return _tree(tmp_path / "train")


def test_this_jobs_directory_of_the_layout_before_is_adopted_and_resumed_from(tmp_path, monkeypatch, caplog):
    before = _legacy(tmp_path, "uid-a-g3")
    _as(monkeypatch, "team-a", "uid-a-g4")  # the same job (uid), its next generation on the new trainer
    caplog.set_level(logging.INFO)
    manager = CheckpointManager(tmp_path, keep=2)
    assert not (tmp_path / "train").exists()
    assert {k: v for k, v in _tree(manager.root).items() if k.startswith("checkpoints/")} == \
        {k: v for k, v in before.items() if k.startswith("checkpoints/")}
    assert manager.load_latest()[0] == 20
    assert f"adopted {tmp_path / 'train'}" in caplog.text


@pytest.mark.parametrize("writers", [["uid-b-g0"], ["uid-a-g0", "uid-b-g0"]], ids=["another-job", "two-jobs"])
def test_another_jobs_directory_of_the_layout_before_is_left_alone(tmp_path, monkeypatch, caplog, writers):
    for i, run_id in enumerate(writers):  # two jobs of one name, as the old layout mixed them
        before = _legacy(tmp_path, run_id, steps=(10 + i, 20 + i))
    _as(monkeypatch, "team-a", "uid-a-g1")
    manager = CheckpointManager(tmp_path, keep=2)
    assert manager.load_latest() is None
    manager.save(1, _state(1))
    assert _tree(tmp_path / "train") == before  # not read, not renamed, nothing pruned
    line = next(r.getMessage() for r in caplog.records if "was not adopted" in r.getMessage())
    assert ("uid-b" in line or "the fence of another run" in line) and \
        f"mv {tmp_path / 'train'} {tmp_path / 'team-a.train'}" in line


def test_a_markers_namespace_that_is_not_this_jobs_keeps_it_from_being_adopted(tmp_path, monkeypatch, caplog):
    elsewhere = CheckpointManager(tmp_path / "other", job_name="train", namespace="team-b", run_id="uid-a-g0")
    elsewhere.save(10, _state(10))  # the same uid (a copied volume), committed in namespace team-b
    (tmp_path / "other" / "team-b.train").rename(tmp_path / "train")
    before = _tree(tmp_path / "train")
    _as(monkeypatch, "team-a", "uid-a-g1")
    assert CheckpointManager(tmp_path, keep=2).load_latest() is None
    assert _tree(tmp_path / "train") == before
    assert "committed in namespace 'team-b'" in caplog.text


def test_a_link_at_the_layout_before_is_never_adopted_or_followed(tmp_path, monkeypatch, caplog):
    volume = tmp_path / "volume"
    volume.mkdir()
    before = _legacy(tmp_path / "elsewhere", "uid-a-g0")  # this very job's files, but behind a link
    (volume / "train").symlink_to(tmp_path / "elsewhere" / "train")
    _as(monkeypatch, "team-a", "uid-a-g1")
    manager = CheckpointManager(volume, keep=2)
    assert manager.load_latest() is None
    manager.save(1, _state(1))
    assert (volume / "train").is_symlink() and _tree(tmp_path / "elsewhere" / "train") == before
    assert "it is a symbolic link, never followed" in caplog.text


def test_without_a_job_uid_nothing_is_adopted(tmp_path, monkeypatch, caplog):
    before = _legacy(tmp_path, "uid-a-g0")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert not checkpoint.adopt_legacy_job_directory(tmp_path, "train", "team-a")
    assert _tree(tmp_path / "train") == before and not (tmp_path / "team-a.train").exists()
    assert "no job uid" in caplog.text


def test_a_frameworks_directory_of_the_layout_before_is_adopted_by_its_own_job(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPJOB_CHECKPOINT_DIR", str(tmp_path))
    _as(monkeypatch, "team-a", "uid-a-g0")
    monkeypatch.setenv("DDPJOB_NAMESPACE", "")  # the trainer of before: <mount>/train/lightning
    old = frameworks.job_dir("lightning")
    assert old == tmp_path / "train" / "lightning"
    frameworks.start_generation(old)
    (old / "step-00000010.ckpt").write_bytes(b"x" * 10)
    assert frameworks.commit(old / "step-00000010.ckpt", step=10, world_size=1) is not None

    _as(monkeypatch, "team-a", "uid-a-g1")
    new = frameworks.job_dir("lightning")
    assert new == tmp_path / "team-a.train" / "lightning"
    frameworks.start_generation(new)
    assert frameworks.read_marker(new / "step-00000010.ckpt")["step"] == 10
    assert not (tmp_path / "train").exists()
