"""The launcher (and the local runner's zygote) preload the entrypoint's own top-level imports once, so a
trainer forked from them skips those imports at every generation (transformers alone is seconds): read with
`ast`, never run; what does not import is left to the trainer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the launcher's program imports torch")

PROBE = ("import sys\nfrom ddpjob_operator.agent.worker import preload\npreload({args!r})\n"
         "print(sorted(m for m in ('colorsys', 'wave', 'netrc') if m in sys.modules))\n")


def run(args: list[str], cwd: Path) -> str:
    program = PROBE.format(args=args)
    done = subprocess.run([sys.executable, "-c", program], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_scripts_imports_are_preloaded_and_its_body_never_runs(tmp_path: Path):
    (tmp_path / "train.py").write_text("import colorsys\nfrom wave import open as wopen\nimport not_a_module_xyz\n"
                                       "from . import sibling\nprint('THE SCRIPT RAN')\n")
    out = run(["train.py", "--epochs", "3"], tmp_path)
    assert "['colorsys', 'wave']" in out and "THE SCRIPT RAN" not in out


def test_a_packages_main_module_is_read_for_a_dash_m_entrypoint(tmp_path: Path):
    package = tmp_path / "mytrainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("import netrc\nprint('THE MODULE RAN')\n")
    out = run(["-m", "mytrainer", "--lr", "0.1"], tmp_path)
    assert "['netrc']" in out and "THE MODULE RAN" not in out
