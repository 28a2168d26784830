"""Rooms a newcomer can hold (issue 37): in the operator's and the trainer's packages no module is over 800 lines
and no class over 300 (tests aside). A concern that outgrows its room gets a module or a class of its own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "operator" / "ddpjob_operator", ROOT / "operator" / "ddpjob", ROOT / "trainer-image" / "ddp_trainer")
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 300


def oversized(source: str, where: str) -> list[str]:
    """Each module and class (nested ones included) of `source` past its limit, named with its size and the rule."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{where}: module of {lines} lines (at most {MAX_MODULE_LINES}: split it by concern)")
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.ClassDef):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_CLASS_LINES:
                found.append(f"{where}:{node.lineno}: class {node.name} of {length} lines (at most {MAX_CLASS_LINES}: "
                             "move a concern out into a function or a class of its own)")
    return found


def test_the_measure_names_a_class_and_a_module_one_line_past_their_limits():
    body = "\n".join(f"    field_{n} = {n}" for n in range(MAX_CLASS_LINES))  # the class line and 300 more
    source = "class Big:\n" + body + "\n" + "\n".join(f"x_{n} = {n}" for n in range(MAX_MODULE_LINES - 300)) + "\n"
    assert oversized(source, "big.py") == [
        f"big.py: module of {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES}: split it by concern)",
        f"big.py:1: class Big of {MAX_CLASS_LINES + 1} lines (at most {MAX_CLASS_LINES}: move a concern out into "
        "a function or a class of its own)"]
    assert oversized("class Small:\n" + body.rsplit("\n", 1)[0] + "\n", "small.py") == []


def test_no_class_over_300_lines_and_no_module_over_800_in_the_operator_and_trainer_packages():
    paths = [path for package in PACKAGES for path in sorted(package.rglob("*.py"))]
    assert len(paths) > 50, f"the packages' modules were not found under {[str(p) for p in PACKAGES]}"
    found = [finding for path in paths for finding in oversized(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)
