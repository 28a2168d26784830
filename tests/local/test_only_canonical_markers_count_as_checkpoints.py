"""issue 38 item 8 (the marker rule, mirrored from the trainer): a commit marker counts only under the name the
trainer writes, `step-%08d.committed` in ASCII digits. `step-000000040.committed` (nine digits) is not step 40,
and other scripts' digits are not a step: the trainer neither loads nor prunes such files, so the summary must
not name them as the newest checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpjob_operator.local.logs import newest_checkpoint


def _marker(directory: Path, name: str) -> None:
    (directory / name).write_text(json.dumps({"step": 1, "bytes": 1, "sha256": "0" * 64}))


@pytest.mark.parametrize("name", ["step-000000040.committed", "step-40.committed", "step-0000004٠.committed",
                                  "step-00000040.committed.bak"])
def test_a_marker_name_the_trainer_never_writes_is_not_a_checkpoint(tmp_path, name):
    steps = tmp_path / "checkpoints"
    steps.mkdir()
    _marker(steps, "step-00000030.committed")
    _marker(steps, name)
    assert newest_checkpoint(tmp_path) == (30, steps / "step-00000030.pt")


def test_steps_past_eight_digits_keep_counting(tmp_path):
    _marker(tmp_path, "step-00000030.committed")
    _marker(tmp_path, "step-123456789.committed")  # %08d of a step that needs nine digits
    assert newest_checkpoint(tmp_path) == (123456789, tmp_path / "step-123456789.pt")
