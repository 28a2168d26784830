"""Issue 38 item 5: a marker under a name the writer never writes (`step-000000060.committed`, nine digits for a
step under 10^8) counted as a step: `keep: 2` then kept one real checkpoint. Only the writer's own spelling
(`step-%08d`, `generation-%08d`) counts, for markers, data files, claims and fences alike; any other is someone
else's file: never loaded, never counted, never removed, named in one warning.

Process-free, on real CheckpointManager saves, prunes and loads."""

from __future__ import annotations

import shutil

import pytest
import torch

from ddp_trainer.runtime import CheckpointManager, checkpoint


def _state(value: float) -> dict:
    return {"w": torch.full((4,), value)}


@pytest.fixture
def manager(tmp_path, monkeypatch):
    monkeypatch.delenv("DDPJOB_NAMESPACE", raising=False)
    return CheckpointManager(tmp_path, keep=2, job_name="train", run_id="uid-g1")


def test_a_marker_of_another_spelling_is_not_a_step_and_keep_2_keeps_two_real_checkpoints(manager, caplog):
    for step in (20, 40):
        manager.save(step, _state(step))
    planted = manager.dir / "step-000000060.committed"  # nine digits: a copy of step 40's marker
    shutil.copy(manager.marker(40), planted)
    manager.save(80, _state(80))  # the old code counted "60" as a kept step and pruned 40
    assert manager.committed_steps() == [80, 40]
    reader = CheckpointManager(manager.mount, job_name="train", is_writer=False)
    assert [float(reader.load(step)["w"][0]) for step in (80, 40)] == [80.0, 40.0]
    assert planted.is_file()  # not ours: never removed either
    manager.save(90, _state(90))
    warnings = [r.getMessage() for r in caplog.records if str(planted) in r.getMessage()]
    assert len(warnings) == 1 and "is not a name this trainer writes" in warnings[0]


def test_data_files_and_claims_of_another_spelling_are_not_pruned(manager):
    planted = [manager.dir / "step-000000010.pt", manager.dir / "step-000000010.rescue.pt",
               manager.dir / "step-000000010.rescue", manager.dir / "step-0000000010.pt"]
    manager.dir.mkdir(parents=True, exist_ok=True)
    for path in planted:
        path.write_bytes(b"someone else's")
    for step in (20, 30, 40):
        manager.save(step, _state(step))
    assert all(path.read_bytes() == b"someone else's" for path in planted)
    assert manager.committed_steps() == [40, 30]


def test_a_fence_of_another_spelling_fences_nothing_and_is_not_removed(tmp_path, monkeypatch):
    monkeypatch.delenv("DDPJOB_NAMESPACE", raising=False)
    root = tmp_path / "train"
    root.mkdir()
    planted = root / checkpoint.fence_path(root, "uid", 9).name.replace("-00000009-", "-000000009-")
    planted.write_text('{"generation": 9, "run": "uid"}')
    manager = CheckpointManager(tmp_path, keep=2, job_name="train", run_id="uid-g1")  # old: CheckpointFenceError
    manager.save(10, _state(10))
    assert manager.committed_steps() == [10] and manager.fenced_by is None
    assert planted.is_file() and manager.fence(1).is_file()


def test_a_step_of_more_than_eight_digits_is_the_writers_own_name(manager):
    for step in (99_999_999, 123_456_789):
        manager.save(step, _state(step))
    assert manager.marker(123_456_789).name == "step-123456789.committed"
    assert manager.committed_steps() == [123_456_789, 99_999_999]
    assert manager.load_latest()[0] == 123_456_789
