"""A pod runs the worker agent from its job's agent ConfigMap, mounted at /var/run/secrets/ddpjob/agent/.
`make coverage` (.coveragerc) measures such a process, the agent leaving with os._exit included, and maps its
lines onto operator/ddpjob_operator/agent/, line for line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .pod_agent import mount_agent

ROOT = Path(__file__).resolve().parents[2]
WORKER_FILE = "operator/ddpjob_operator/agent/worker.py"
BOOTSTRAP_FILE = "operator/ddpjob_operator/agent/bootstrap.py"


def test_the_agents_lines_in_a_pod_like_process_are_reported_against_its_source_file(tmp_path):
    data = tmp_path / ".coverage"
    env = {"PATH": "/usr/bin:/bin", "COVERAGE_PROCESS_START": str(ROOT / ".coveragerc"), "COVERAGE_FILE": str(data)}
    agent = subprocess.run([*mount_agent(tmp_path / "node"), "--help"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert agent.returncode == 0, agent.stderr[-2000:]
    coverage = [sys.executable, "-m", "coverage"]
    subprocess.run([*coverage, "combine", "--rcfile", str(ROOT / ".coveragerc"), "-q", str(tmp_path)], env={**env},
                   cwd=ROOT, check=True, timeout=60)
    report = tmp_path / "coverage.json"
    subprocess.run([*coverage, "json", "--rcfile", str(ROOT / ".coveragerc"), "-o", str(report)], env={**env},
                   cwd=ROOT, check=True, timeout=60, capture_output=True)
    files = json.loads(report.read_text())["files"]
    assert WORKER_FILE in files and BOOTSTRAP_FILE in files, sorted(files)
    executed = set(files[WORKER_FILE]["executed_lines"])
    source = (ROOT / WORKER_FILE).read_text().splitlines()
    # The lines it ran are the file's: `def main` ran (the module was executed), as the pod ran it.
    main_line = next(number for number, line in enumerate(source, 1) if line.startswith("def main("))
    assert main_line in executed
    assert all(source[number - 1].strip() and not source[number - 1].lstrip().startswith("#") for number in executed)
