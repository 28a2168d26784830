"""Issue 36, "Scale in place", with real processes: `ddpjob run --local` with in-process recovery, scaled 3 -> 2 and
back to 3 while it trains. Nobody is stopped: the survivors' agents and trainer processes are the ones they started
with (same PIDs), they learn each generation from the runner as a pod's agent learns it from the operator, no
checkpoint is read, the departing worker leaves the smaller generation, the new worker joins with the state from a
survivor by broadcast, and nothing is charged."""

from __future__ import annotations

import pytest

from ddpjob_operator import validation
from ddpjob_operator.decisions.scaling import REASON_SCALED_IN_PLACE
from ddpjob_operator.local.options import RunOptions, SpecChange

from .harness import TimelineView
from .test_cold_start_in_process_survivors_keep_their_trainers import TrainerRecordingRunner, run_to_the_end
from .test_semantics import STEP_LINE, WORKLOAD, spec

pytestmark = pytest.mark.slow


def test_scale_down_and_up_in_place_keep_every_survivors_trainer(tmp_path):
    steps = 700  # after the scale up, time for the new worker's trainer to start and join before the end
    job = validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                "metadata": {"name": "rescale"},
                                "spec": spec(replicas=3, minReplicas=1, maxReplicas=3,
                                             args=[*WORKLOAD, "--epochs", "1000", "--max-steps", str(steps)],
                                             failurePolicy={"restartScope": "Pod", "recovery": "InProcess"})})
    # The scale up once the survivors train at world size 2 (they moved into the smaller generation).
    changes = (SpecChange(replicas=2, at_step=20, world_size=3), SpecChange(replicas=3, at_step=120, world_size=2))
    runner = TrainerRecordingRunner(job, RunOptions(state_dir=tmp_path / ".ddpjob", changes=changes),
                                    TimelineView(timeout=240))
    logs, described = run_to_the_end(runner, "rescale-worker-")
    status = runner.status
    assert (status.phase, status.restarts, status.disruptions, status.generation) == ("Succeeded", 0, 0, 2), described
    assert [(i.cause, i.charged, i.message) for i in status.incidents] == [
        (REASON_SCALED_IN_PLACE, False, "scaled in place 3 -> 2 workers"),
        (REASON_SCALED_IN_PLACE, False, "scaled in place 2 -> 3 workers")], described
    # Workers 0 and 1: one agent each, which started one trainer for its whole life. Worker 2: the departed pod and
    # the new one.
    pods = sorted(name for name, _ in runner.trainers)
    assert pods == ["rescale-worker-0", "rescale-worker-1", "rescale-worker-2", "rescale-worker-2"], described
    assert all(len(pids) == 1 for (name, _), pids in runner.trainers.items() if name != "rescale-worker-2"), described
    text = "\n".join(logs.values())
    assert "resumed from checkpoint" not in text, described
    assert "rank 2 (seat 2) has no place in view" in logs["rescale-worker-2.log"], described
    assert "resumed from peer rank 0 by broadcast" in logs["rescale-worker-2.log"], described
    assert "(joined: 2)" in logs["rescale-worker-0.log"], described
    assert logs["rescale-worker-0.log"].count("the operator carried this pod into rendezvous generation") == 2
    steps_seen = [int(s) for s in STEP_LINE.findall(logs["rescale-worker-0.log"])]
    assert steps_seen == sorted(set(steps_seen)) and steps_seen[-1] == steps, described
