"""Process supervision: exit codes, and killing a pod's whole tree across sessions (no torch, fast)."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ddpjob_operator.local.processes import LocalProcess, exit_code_of, marked_pids, marker_for

from .harness import SPAWNS_DETACHED_CHILD, alive, exit_code, wait_for_file

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def pod(tmp_path: Path, mode: str, run: str = "run-a") -> tuple[LocalProcess, Path]:
    pid_file = tmp_path / f"child-{mode}.pid"
    process = LocalProcess(name="job-worker-0", marker=marker_for(run, "job-worker-0", 0),
                           argv=[sys.executable, "-c", SPAWNS_DETACHED_CHILD, str(pid_file), mode],
                           env={"PATH": "/usr/bin:/bin"}, log_path=tmp_path / "logs" / "job-worker-0.log")
    process.start(NOW)
    return process, pid_file


@pytest.mark.parametrize("returncode, expected", [(0, 0), (1, 1), (2, 2), (-9, 137), (-15, 143)])
def test_exit_code_is_reported_as_a_container_runtime_would(returncode, expected):
    assert exit_code_of(returncode) == expected


def test_markers_of_one_pod_never_match_another():
    assert not marker_for("run", "job-worker-10", 0).startswith(marker_for("run", "job-worker-1"))
    assert marker_for("run", "job-worker-1", 0).startswith(marker_for("run"))


def test_kill_takes_the_whole_tree_even_in_other_sessions(tmp_path):
    process, pid_file = pod(tmp_path, "stay")
    child = int(wait_for_file(pid_file))
    assert alive(child) and set(marked_pids(process.marker)) == {process.pid, child}
    process.kill()
    assert not alive(process.pid) and not alive(child)
    assert marked_pids(marker_for("run-a")) == []
    assert exit_code_of(process.popen.returncode) == 137


def test_a_pod_whose_root_exits_takes_its_leftover_children_with_it(tmp_path):
    process, pid_file = pod(tmp_path, "leave", run="run-b")
    child = int(wait_for_file(pid_file))
    assert exit_code(process, NOW) == 0 and process.finished_at == NOW
    assert not alive(child), "a trainer orphaned by its agent must not keep running"
    assert "---- job-worker-0:" in process.log_path.read_text()


def test_terminate_sends_sigterm_and_records_when(tmp_path):
    process, pid_file = pod(tmp_path, "stay", run="run-c")
    wait_for_file(pid_file)
    process.terminate(NOW)
    exit_code(process, NOW)
    assert process.terminating_since == NOW
    assert exit_code_of(process.popen.returncode) == 143
    assert marked_pids(marker_for("run-c")) == []
