"""Issue 36: ddpjob_ranks_training and ddpjob_ranks_desired per job, from the status each pass decides: the
ranks training only while Running (a job restarting or waiting for ranks trains nothing), and both series gone
with the job."""

from __future__ import annotations

from ddpjob_operator import model
from ddpjob_operator.metrics import Metrics


def series(metrics: Metrics) -> dict[str, float]:
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.text().splitlines()
            if line.startswith("ddpjob_ranks_")}


def test_the_gauges_follow_the_status_and_leave_with_the_job():
    metrics = Metrics()
    training = 'ddpjob_ranks_training{name="digits",namespace="team-a"}'
    desired = 'ddpjob_ranks_desired{name="digits",namespace="team-a"}'
    for phase, world, expected in (("Running", 3, 3), ("Running", 2, 2), ("Restarting", 2, 0), ("Pending", 1, 0)):
        status = model.DDPJobStatus(phase=phase, world_size=world, desired_world_size=3)
        metrics.job_phase("uid-1", phase)
        metrics.job_world("uid-1", "team-a", "digits", status)
        assert series(metrics) == {training: expected, desired: 3}, phase
    metrics.job_phase("uid-1", None)  # the job is gone
    assert series(metrics) == {}
