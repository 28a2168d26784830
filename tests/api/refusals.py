"""How a test shows that `ddpjob validate` and the operator refuse a manifest the same way, naming the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import cli, validation


def assert_validate_and_the_operator_refuse(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict,
                                            field: str, text: str) -> None:
    """`ddpjob validate` exits EXIT_INVALID with a line naming `field` that says `text`, and the operator, which
    reads the spec alone, refuses it naming the same field (its Failed condition)."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", str(path)]) == validation.EXIT_INVALID
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if f": {field}: " in line]
    assert lines and any(text in line for line in lines), err
    with pytest.raises(validation.InvalidJob, match=re.escape(field)):
        validation.parse_spec(doc["spec"])
