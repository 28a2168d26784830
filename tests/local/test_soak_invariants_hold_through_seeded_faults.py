"""hack/soak.py with a tiny budget: a seeded SIGKILL and a SIGSTOP/SIGCONT of a worker on the local runner,
then the soak's invariants (Succeeded at the last step, restarts charged == SIGKILLs and nothing else
charged, no resume behind the last checkpoint interval, nothing left behind). The long soak and its
results: docs/testing.md."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "hack" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("soak", module)  # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules["soak"])
    return sys.modules["soak"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_soak_holds_its_invariants_through_a_kill_and_a_pause(tmp_path):
    soak = _soak_module()
    plan, _ = soak.schedule(1, 2, 40)
    assert [f.kind for f in plan] == [soak.KILL, soak.PAUSE]  # the seed's draw: a charged fault and a free one
    # The restart path: its resumes from the volume are what "no resume behind the last checkpoint interval" judges.
    report = soak.soak(seed=1, faults=2, steps_between=40, state_dir=tmp_path / ".ddpjob", deadline_s=150, echo=False,
                       recovery="Restart")
    assert report["ok"], json.dumps(report, indent=2)
    assert (report["restarts"], report["sigkills_fired"], report["pauses"]) == (1, 1, 1), json.dumps(report, indent=2)
    assert report["final_step"] == report["max_steps"] and report["resumes"], json.dumps(report, indent=2)


def test_the_soak_schedule_is_a_function_of_its_seed():
    soak = _soak_module()
    assert soak.schedule(31, 10, 60) == soak.schedule(31, 10, 60) != soak.schedule(32, 10, 60)
    plan, last = soak.schedule(31, 10, 60)
    steps = [f.at_step for f in plan]
    assert steps == sorted(steps) and min(b - a for a, b in zip(steps, steps[1:])) >= 45 and last > steps[-1]
