"""Issue 25: what one lost worker costs does not grow with the job. With restartScope Pod an incident creates
one pod and deletes one pod, and the operator's API requests for it (by resource and verb, watches excluded)
are the same for a job of 4 workers and one of 32: the real operator against the API double, measured by
bench/incident_cost.py's own incident (the benchmark reports the numbers for 256 workers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from .conftest import operator  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def _bench():
    """bench/incident_cost.py, imported by path (bench/ is not a package); the sys.path entries it adds for
    its own imports are taken back once it is loaded."""
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("incident_cost", ROOT / "bench" / "incident_cost.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = saved


incident_cost = _bench()


# Timing moves a request or two from run to run, whatever the job's size: a pass that runs before the new pod's
# watch event arrives repeats its create (409, then a get of the pod holding the name), the status may go on
# record in one patch or two, and the last Event may land after the measurement ends. A cost per worker would
# differ by 28 between the two jobs.
SLACK = 2
CEILING = 20  # requests per incident, all verbs (about 10 today)


async def test_one_lost_worker_costs_the_same_whatever_the_jobs_size(harness, operator):
    await harness.cluster.add_node("node-0")
    cost = {n: await incident_cost.one_incident(harness.cluster, harness.session, harness.url, n, "Pod",
                                                job=f"cost-{n}")
            for n in (4, 32)}
    for n, got in cost.items():
        assert (got["created"], got["deleted"]) == (1, 1), f"{n} workers: {got}"
        assert got["requests"][("", "pods", "delete")] == 1 and sum(got["requests"].values()) <= CEILING, got
    small, large = cost[4]["requests"], cost[32]["requests"]
    assert all(abs(small.get(k, 0) - large.get(k, 0)) <= SLACK for k in small.keys() | large.keys()), (small, large)
