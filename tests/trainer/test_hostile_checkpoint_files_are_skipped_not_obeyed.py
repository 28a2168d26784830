"""Issue 38 item 6 (the trainer's part): files planted in a job's checkpoint directory are skipped as corrupt with
a warning naming them, or refused with the path and the fix; none of them ends or misleads the trainer.

- a checkpoint whose zip records are DEFLATE-compressed: torch.load inflated whatever they said (0.5 MB on disk,
  510 MiB in memory) before the step was skipped; now only stored records (torch.save's) are ever loaded;
- a marker with `"generation": Infinity` (or 1e999: OverflowError at every start) or 60,000 nested brackets
  (RecursionError at every start);
- an empty marker of a huge step: taken for a later committed step, it silently disabled every rescue;
- a directory named like the write probe: a permanent "not writable" failure at every start.

Process-free, on real CheckpointManager saves, loads and rescues (and the frameworks' fence)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile

import pytest
import torch

from ddp_trainer.runtime import CheckpointManager, frameworks


def _state(value: float, size: int = 4) -> dict:
    return {"w": torch.full((size,), value)}


@pytest.fixture(autouse=True)
def _no_namespace(monkeypatch):
    monkeypatch.delenv("DDPJOB_NAMESPACE", raising=False)


def _manager(tmp_path, **kwargs) -> CheckpointManager:
    return CheckpointManager(tmp_path, keep=3, job_name="train", run_id="uid-g1", **kwargs)


def _deflated(data: bytes) -> bytes:
    """The same torch.save archive with every record DEFLATE-compressed: it loads (torch reads such records)."""
    source, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as packed:
        for record in source.infolist():
            packed.writestr(record.filename, source.read(record.filename))
    return out.getvalue()


def test_a_checkpoint_of_compressed_records_is_skipped_before_torch_load_inflates_it(tmp_path, caplog):
    manager = _manager(tmp_path)
    manager.save(10, _state(10))
    manager.save(20, _state(20, size=1 << 20))  # 4 MiB of one value: a few KiB deflated
    planted = _deflated(manager.path(20).read_bytes())
    assert len(planted) < (1 << 20) and torch.load(io.BytesIO(planted), weights_only=True)["w"].numel() == 1 << 20
    manager.path(20).write_bytes(planted)  # and a marker that matches it: whoever can write files can write both
    marker = json.loads(manager.marker(20).read_text())
    manager.marker(20).write_text(json.dumps({**marker, "bytes": len(planted),
                                              "sha256": hashlib.sha256(planted).hexdigest()}))
    step, state = manager.load_latest()
    assert step == 10 and torch.equal(state["w"], _state(10)["w"])  # the good older step
    assert f"checkpoint {manager.path(20)} holds" in caplog.text and "compressed record" in caplog.text


BAD_MARKERS = {
    "Infinity": '{"step": 30, "bytes": 1, "sha256": "00", "generation": Infinity, "run": "uid"}',
    "1e999": '{"step": 30, "bytes": 1, "sha256": "00", "generation": 1e999, "run": "uid"}',
    "nested": "[" * 60_000,  # within the 64 KiB a marker may have
    "nested-object": '{"step": 30, "generation": ' + '{"a":' * 10_000 + "1" + "}" * 10_000 + "}",
    "negative": '{"step": 30, "bytes": -1, "sha256": "00", "generation": 2, "run": "uid"}',
}


@pytest.mark.parametrize("text", BAD_MARKERS.values(), ids=BAD_MARKERS.keys())
def test_an_invalid_marker_is_skipped_with_a_warning_at_every_start(tmp_path, caplog, text):
    _manager(tmp_path).save(20, _state(20))
    marker = tmp_path / "train" / "checkpoints" / "step-00000030.committed"
    marker.write_text(text)
    manager = _manager(tmp_path)  # the writer's start: the old code raised OverflowError or RecursionError here
    step, _ = manager.load_latest()
    assert step == 20
    assert f"skipping unreadable checkpoint step 30: commit marker {marker} is not valid" in caplog.text
    manager.save(40, _state(40))
    assert manager.fenced_by is None and manager.committed_steps()[0] == 40


@pytest.mark.parametrize("text", [BAD_MARKERS["Infinity"], BAD_MARKERS["nested"]], ids=["Infinity", "nested"])
def test_a_frameworks_invalid_marker_neither_ends_the_start_nor_counts(tmp_path, monkeypatch, caplog, text):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")
    directory = tmp_path / "lightning"
    frameworks.start_generation(directory)
    for step in (10, 20):
        (directory / f"step-{step:08d}.ckpt").write_bytes(b"x" * 10)
        frameworks.commit(directory / f"step-{step:08d}.ckpt", step=step, world_size=1)
    (directory / "step-00000020.ckpt.ddpjob.json").write_text(text)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g2")
    assert frameworks.start_generation(directory) is None  # the old code: OverflowError or RecursionError
    step, path, _ = frameworks.newest_complete(directory, re.compile(r"^step-(\d+)\.ckpt$"))
    assert step == 10 and "skipping incomplete checkpoint" in caplog.text


@pytest.mark.parametrize("marker", ["", "{}", '{"step": 99999999999}'], ids=["empty", "no-fields", "no-data"])
def test_an_invalid_marker_of_a_huge_step_does_not_disable_rescues(tmp_path, marker):
    writer = _manager(tmp_path)
    writer.save(10, _state(10))
    (writer.dir / "step-99999999999.committed").write_text(marker)  # the writer's own spelling of that step
    survivor = _manager(tmp_path, is_writer=False)
    assert survivor.save_rescue(20, _state(20))  # the old code: "a later step is committed", nothing written
    step, state = _manager(tmp_path).load_latest()
    assert step == 20 and torch.equal(state["w"], _state(20)["w"])


@pytest.mark.parametrize("where", ["train", "train/checkpoints"])
def test_a_directory_named_like_the_write_probe_does_not_make_the_volume_unwritable(tmp_path, where):
    planted = tmp_path / where / ".write-probe-0123456789abcdef0123456789abcdef"
    planted.mkdir(parents=True)
    (planted / "inside").write_text("someone else's")
    manager = _manager(tmp_path)  # the old code: "checkpoint directory ... is not writable" at every start
    manager.save(10, _state(10))
    assert manager.load_latest()[0] == 10
    assert (planted / "inside").read_text() == "someone else's"


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_a_frameworks_checkpoint_of_compressed_records_is_skipped(tmp_path, monkeypatch, caplog, framework):
    """Lightning's `.ckpt` and HF's `optimizer.pt` are torch.save archives that the framework hands to torch.load."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")
    directory = tmp_path / framework
    frameworks.start_generation(directory)
    for step in (10, 20):
        buffer = io.BytesIO()
        torch.save(_state(step, size=1 << 20), buffer)
        data = buffer.getvalue() if step == 10 else _deflated(buffer.getvalue())
        if framework == "lightning":
            checkpoint = directory / f"step-{step:08d}.ckpt"
            checkpoint.write_bytes(data)
        else:
            checkpoint = directory / f"checkpoint-{step}"
            checkpoint.mkdir()
            (checkpoint / "optimizer.pt").write_bytes(data)
        assert frameworks.commit(checkpoint, step=step, world_size=1) is not None
    pattern = re.compile(r"^step-(\d+)\.ckpt$" if framework == "lightning" else r"^checkpoint-(\d+)$")
    step, _, _ = frameworks.newest_complete(directory, pattern)
    assert step == 10 and "compressed record" in caplog.text
