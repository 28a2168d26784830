"""tests/conftest.py's SERIAL (the tests make test runs alone) marks what it lists and nothing else, and
each entry names a test file and test functions that exist: a renamed or moved test would otherwise
silently go back to running beside others, and time itself wrongly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SERIAL

ROOT = Path(__file__).resolve().parents[1]
PARTLY_SERIAL = "tests/local/test_missing_callback_and_prompt_user_error.py"


def functions_named_test(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


@pytest.mark.parametrize("file", sorted(SERIAL))
def test_each_entry_names_an_existing_test(file: str) -> None:
    path = ROOT / file
    assert path.is_file(), f"tests/conftest.py SERIAL names {file}, which does not exist: update or drop it"
    missing = set(SERIAL[file]) - functions_named_test(path)
    assert not missing, f"tests/conftest.py SERIAL names {sorted(missing)} in {file}, which has no such test"


def collected(selection: str) -> set[str]:
    """The test functions pytest collects from PARTLY_SERIAL under `-m selection` (a real collection, the
    hook included)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", selection, PARTLY_SERIAL], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 5), done.stdout + done.stderr
    return {line.split("::")[1].split("[")[0] for line in done.stdout.splitlines() if line.startswith(PARTLY_SERIAL)}


def test_only_the_listed_functions_of_a_file_run_alone() -> None:
    listed = set(SERIAL[PARTLY_SERIAL])
    assert listed and listed < functions_named_test(ROOT / PARTLY_SERIAL)  # the file has others to leave out
    assert collected("serial") == listed
