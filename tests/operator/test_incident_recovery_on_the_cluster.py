"""Issue 29, "Recovery is visible", on the API tier: the real operator against the HTTP API emulator, the trainers'
reports POSTed to its progress endpoint with pod-bound tokens as the runtime sends them. A killed worker's
incident gets its recovery timeline in the status (`kubectl describe` shows it as written), one `Recovered`
event, and one observation in ddpjob_recovery_seconds, which a restarted operator does not repeat."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from .conftest import eventually
from .test_progress_follows_every_rank_holder import FOLLOW, LOADED, Trainers, promote
from .test_scenarios import nodes, operator, reconciled_past, started  # noqa: F401
from .test_spares import serving, warm_job

OBSERVED = 'ddpjob_recovery_seconds_count{path="InProcess"}'


def timeline(harness, job: str) -> dict[str, Any]:
    return harness.status(job)["incidents"][-1].get("recovery") or {}


def observed(operator) -> float:
    """The InProcess observations this operator process made (0 before its first)."""
    line = next((x for x in operator.controller.metrics.text().splitlines() if x.startswith(OBSERVED)), None)
    return float(line.split()[-1]) if line else 0.0


@pytest.mark.settings(**FOLLOW)
async def test_a_killed_workers_recovery_is_on_the_status_in_one_event_and_observed_once(harness, operator,  # noqa: F811
                                                                                         nodes):  # noqa: F811
    await serving(operator)
    await warm_job(harness, nodes, "heal")
    async with aiohttp.ClientSession() as session:
        trainers = Trainers(harness, operator, session, "heal")
        await trainers.generation({0: "heal-worker-0", 1: "heal-worker-1"}, 0, range(10, 31, 10))
        killed = time.time()
        await promote(harness, nodes, "heal", "heal-worker-1", "heal-spare-0", 1)
        # The operator's own points: the failure seen, and the spare given worker 1's place in the same pass.
        seen = timeline(harness, "heal")
        assert seen["failureSeenTime"] and seen["replacementTime"] == seen["failureSeenTime"] and seen["spare"]
        assert "seconds" not in seen and seen.get("path", "") == ""  # nothing reported yet

        # Generation 1 forms in process: the survivor is rank 0 and says how, first the rendezvous...
        recovery = {"path": "InProcess", "reason": "", "resumed_step": 30, "rendezvous_time": time.time(),
                    "first_step_time": None}
        await trainers.report("heal-worker-0", 30, 0, 1, recovery=recovery)
        await trainers.report("heal-spare-0", 30, 1, 1)
        await eventually(lambda: timeline(harness, "heal").get("rendezvousTime"), LOADED, "the rendezvous on record")
        assert observed(operator) == 0
        # ...then its first step, on every report from then on (sticky).
        recovery["first_step_time"] = time.time()
        for step in (31, 32):
            await trainers.report("heal-worker-0", step, 0, 1, recovery=recovery)
            await trainers.report("heal-spare-0", step, 1, 1)
        await eventually(lambda: timeline(harness, "heal").get("seconds") is not None, LOADED, "the recovery done")
        await eventually(lambda: observed(operator) == 1, LOADED, "the histogram's observation")

    done = timeline(harness, "heal")
    assert (done["path"], done["stepsLost"], done["spare"]) == ("InProcess", 0, True)
    assert done["firstStepTime"] and done.get("fallbackReason", "") == ""
    assert 0 <= done["seconds"] <= time.time() - killed
    [event] = [e for e in harness.events("heal") if e["reason"] == "Recovered"]
    assert event["type"] == "Normal" and "path InProcess" in event["message"] and "0 steps lost" in event["message"]
    assert f"in {done['seconds']:g}s" in event["message"]
    text = operator.controller.metrics.text()
    assert 'ddpjob_recovery_seconds_bucket{le="1800.0",path="InProcess"} 1.0' in text

    # A new operator process reads the timeline from the status: the trainers' sticky reports go on, and
    # it neither observes nor tells the recovery again.
    await operator.stop()
    await operator.start()
    await serving(operator)
    since = time.monotonic()
    async with aiohttp.ClientSession() as session:
        trainers = Trainers(harness, operator, session, "heal")
        for step in (33, 34):
            await trainers.report("heal-worker-0", step, 0, 1, recovery=recovery)
            await trainers.report("heal-spare-0", step, 1, 1)
        await eventually(lambda: (harness.status("heal").get("progress") or {}).get("step") == 34, LOADED,
                         "the new operator's progress")
    await reconciled_past(operator, since, FOLLOW["progress_write_seconds"], "the new operator's passes")
    assert timeline(harness, "heal") == done
    assert observed(operator) == 0
    assert len([e for e in harness.events("heal") if e["reason"] == "Recovered"]) == 1
