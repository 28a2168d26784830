"""The local summary's newest checkpoint is the data file its commit marker names: a survivor's rescue commits
`step-N.rescue.pt` (runtime/checkpoint/rescue.py), not `step-N.pt`. A marker someone made a FIFO never blocks it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ddpjob_operator.local.logs import newest_checkpoint


def _commit(directory: Path, step: int, data: str | None) -> None:
    marker = {"step": step, "bytes": 1, "sha256": "0" * 64, **({"data": data} if data else {})}
    (directory / f"step-{step:08d}.committed").write_text(json.dumps(marker))


def test_the_newest_checkpoint_is_the_file_its_marker_commits(tmp_path: Path) -> None:
    steps = tmp_path / "job" / "checkpoints"
    steps.mkdir(parents=True)
    _commit(steps, 10, None)  # a marker of an older version: step-N.pt
    assert newest_checkpoint(tmp_path) == (10, steps / "step-00000010.pt")
    _commit(steps, 20, "step-00000020.rescue.pt")
    assert newest_checkpoint(tmp_path) == (20, steps / "step-00000020.rescue.pt")
    _commit(steps, 30, "../../elsewhere.pt")  # not a name of its step: the default, never another path
    assert newest_checkpoint(tmp_path) == (30, steps / "step-00000030.pt")


def test_a_marker_that_is_a_fifo_does_not_block_the_summary(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "step-00000040.committed")
    found: list = []
    reader = threading.Thread(target=lambda: found.append(newest_checkpoint(tmp_path)), daemon=True)
    reader.start()
    reader.join(10)
    assert found == [(40, tmp_path / "step-00000040.pt")]
