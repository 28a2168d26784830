"""faults.py and display.py read a run through the `RunView` protocol (run_view.py), never runner.py (no import
loop): a LocalRunner must answer every name the protocol has, with what it holds, or they break mid-run."""

from __future__ import annotations

from ddpjob_operator import validation
from ddpjob_operator.local.options import RunOptions
from ddpjob_operator.local.run_view import RunView
from ddpjob_operator.local.runner import LocalRunner

from .harness import TimelineView, manifest


def run_view_names() -> set[str]:
    """Every attribute, property and method the protocol declares."""
    names = set(RunView.__annotations__)
    names |= {name for name in vars(RunView) if not name.startswith("_")}
    return names


def test_a_fresh_runner_answers_every_name_of_the_run_view(tmp_path):
    job = validation.parse_job(manifest("view", replicas=2, minReplicas=1, args=[]))
    runner = LocalRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob"), TimelineView(timeout=60))
    names = run_view_names()
    assert {"spec", "status", "workers", "store", "files", "pod_of", "scale"} <= names, names
    missing = sorted(name for name in names if not hasattr(runner, name))
    assert missing == [], f"LocalRunner lacks {missing}, which faults.py or display.py read"
    # The parts' state, not copies: a spec change and a pod show through the names the protocol reads.
    runner.scale(1)
    assert runner.spec.replicas == 1 and runner.metadata_generation == 2
    assert runner.workers is runner.pods.workers and runner.tails is runner.pods.tails
    assert runner.pod_of(0) == "view-worker-0" and runner.reported_step({"step": 7}) == 7
    assert runner.waiting_on_steps() == [] and runner.stopped_by is None
