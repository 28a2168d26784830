"""Issue 36 item 6: `ddpjob run --local` shows a job training short the way the status does on a cluster. The
survivors' progress.json (their old generation, the live view's fields) is read by the same parser and tracker
as the operator's endpoint, the same decision layer raises Degraded from it, and the display shows the world
below the whole one with the condition's words."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from types import SimpleNamespace

from rich.console import Console

from ddpjob_operator import decisions as d
from ddpjob_operator import progress
from ddpjob_operator.local import display
from ddpjob_operator.local.logs import PROGRESS_FILE, JobFiles
from ddpjob_operator.local.progress_file import ProgressFile
from ddpjob_operator.local.view import PlainView

from ..operator.test_a_job_training_short_says_so import SHORT, at, job, lost_worker_2, survivors, unschedulable

SHORT_REPORT = {"step": 31, "total_steps": 100, "rank": 0, "generation": 0, "world_size": 2, "desired_world_size": 3,
                "missing_ranks": [2], "short_since": at(1).timestamp(),
                "recovery": {"path": "InProcess", "kind": "Shrink", "resumed_step": 30,
                             "rendezvous_time": at(1).timestamp(), "first_step_time": at(1.5).timestamp()}}


def test_a_short_world_reads_the_same_from_progress_json_and_from_the_endpoint(tmp_path):
    local = ProgressFile(JobFiles(tmp_path, print), "uid", ("local", "j"), at(-1))
    (tmp_path / PROGRESS_FILE).write_text(json.dumps({**SHORT_REPORT, "time": at(3).timestamp()}))
    here = local.observe(1, at(3))  # the runner's pods serve generation 1; the survivors report generation 0
    tracker = progress.ProgressTracker(write_seconds=0.0)
    report = progress.report_from(SHORT_REPORT)
    tracker.record("uid", ("ns", "j"), None, report.attributed_to(1), report, at(3))
    assert here == tracker.observation("uid", at(3))
    assert (here.generation, here.world_size, here.desired_world_size, here.missing_ranks, here.in_place) == \
        (0, 2, 3, (2,), True)

    status = d.decide(job(SHORT, lost_worker_2()), d.Observed(workers=(*survivors(), unschedulable()),
                                                              store=d.StoreObservation("Running", ready=True),
                                                              now=at(5), progress=here),
                      d.Options(incident_settle_seconds=0)).status
    runner = SimpleNamespace(name="j", status=status, spec=SHORT, workers={}, tails={}, created_at=at(0),
                             files=SimpleNamespace(progress=lambda: SHORT_REPORT), pod_of=lambda i: f"j-worker-{i}")
    snap = display.snapshot(runner, at(5) + timedelta(seconds=1))
    buffer = io.StringIO()
    view = PlainView(Console(file=buffer, force_terminal=False, width=400, color_system=None))
    view.update(snap)
    text = buffer.getvalue()
    assert "world_size 2 of 3" in text
    assert "DEGRADED: 2 of 3 ranks training; missing rank 2 (worker 2) since 2026-11-22T12:00:01Z: its replacement " \
           "pod j-worker-2 is Pending: 0/4 nodes are available" in text
