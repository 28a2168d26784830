"""The trainer's progress client (trainer-image) against the real endpoint (progress/server.py): its token
file, rank, heartbeat, and a standby's 503 retried once."""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime, timezone
from pathlib import Path

from ddpjob_operator import progress

from .conftest import eventually
from .test_progress_auth import review_answer

ROOT = Path(__file__).resolve().parents[2]


async def test_trainer_client_reports_to_the_real_endpoint_with_its_token(tmp_path):
    """The runtime library's client (trainer-image) against this endpoint: the token file, the rank,
    the heartbeat, and a 503 from a standby retried once."""
    sys.path.insert(0, str(ROOT / "trainer-image"))
    from ddp_trainer.runtime.progress import ProgressReporter

    leading = [False]
    tracker = progress.ProgressTracker(write_seconds=0.01)
    counts: dict[str, int] = {}

    async def review(token, audiences):
        return review_answer(pod="job-worker-0") if token == "pod-token" else {"status": {"authenticated": False}}
    server = progress.ProgressServer(
        tracker, progress.TokenReviewer(review, progress.DEFAULT_AUDIENCE),
        find_worker=lambda ns, name, who: progress.Worker("uid", 0, 0) if who.pod_name == "job-worker-0" else None,
        leading=lambda: leading[0], accepted=lambda *a: None,
        count=lambda r: counts.__setitem__(r, counts.get(r, 0) + 1), clock=lambda: datetime.now(timezone.utc))
    await server.start(0, "127.0.0.1")
    try:
        token = tmp_path / "token"
        token.write_text("pod-token\n")
        url = f"http://127.0.0.1:{server.port}/v1/namespaces/ns/ddpjobs/job/progress"
        client = ProgressReporter(None, url, enabled=False, http_enabled=True, token_file=str(token), rank=0,
                                  heartbeat_s=0.2, min_interval_s=0.05)
        await asyncio.to_thread(client.report, step=7, total_steps=70, loss=0.25)
        await eventually(lambda: counts.get("standby", 0) >= 2, 30, "the 503 and its one retry")
        assert "accepted" not in counts  # a standby stores nothing
        leading[0] = True
        await eventually(lambda: counts.get("accepted", 0) >= 1, 30, "a heartbeat reaching the leader")
        seen = tracker.observation("uid", datetime.now(timezone.utc))
        assert seen.step == 7 and seen.total_steps == 70 and seen.loss == 0.25
        token.write_text("rotated-but-wrong")  # read at every send
        await eventually(lambda: counts.get("unauthenticated", 0) >= 1, 30, "a heartbeat with the wrong token")
        await asyncio.to_thread(client.close)
    finally:
        await server.stop()
