"""The progress router alone (progress_router.py): an accepted report requeues its job when its progress may
be published (only on the leader); a refused one holds the job's stall clock; the routing label is on this
replica's pod exactly while it leads and removed when it stops; its endpoint serves on the port it bound."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import aiohttp

from ddpjob_operator import kube, leader, progress
from ddpjob_operator.job_cache import JobCache, JobKey
from ddpjob_operator.metrics import Metrics
from ddpjob_operator.progress_router import PROGRESS_LEADER_LABEL, ProgressRouter
from ddpjob_operator.settings import AUTO_PORT
from ddpjob_operator.side_tasks import SideTasks

from .conftest import FAST, eventually
from tests.kube_emulator import PODS

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
SYSTEM = "ddpjob-system"
KEY = ("team-a", "reported")


class Rig:
    def __init__(self, url: str, **settings: object) -> None:
        self.settings = dataclasses.replace(FAST, **settings)  # type: ignore[arg-type]
        self.leads = True
        self.requeued: list[tuple[JobKey, float]] = []
        self.tracker, self.cache = progress.ProgressTracker(write_seconds=5.0), JobCache()
        self.api = kube.Kube(kube.Connection(server=url))
        self.elector = leader.Elector(leader.NamedKube(kube.Connection(server=url), "operator-a"), SYSTEM,
                                      "ddpjob-operator", "operator-a", leader.Timing())
        self.router = ProgressRouter(self.settings, self.tracker, self.cache, Metrics(),
                                     progress.TokenReviewer(self.api.token_review, self.settings.progress_audience),
                                     clock=lambda: NOW, leading=lambda: self.leads,
                                     requeue=lambda key, delay: self.requeued.append((key, delay)),
                                     elector=self.elector, labeler=self.api)

    async def close(self) -> None:
        await self.api.close()
        await self.elector.api.close()


async def test_an_accepted_report_requeues_its_job_when_it_may_be_published(cluster):
    _, url = cluster
    rig = Rig(url)
    try:
        rig.router.accepted(*KEY, "u-1")  # nothing recorded yet: nothing due
        assert rig.requeued == []
        rig.tracker.record("u-1", KEY, 0, 0, progress.Report(step=5), NOW)
        rig.router.accepted(*KEY, "u-1")
        assert rig.requeued == [(KEY, 0.0)]  # never published: at once
        rig.tracker.observation("u-1", NOW)  # the pass publishes it
        rig.tracker.record("u-1", KEY, 0, 0, progress.Report(step=6), NOW)
        rig.router.accepted(*KEY, "u-1")
        assert rig.requeued[-1] == (KEY, 5.0)  # one write per progress_write_seconds
        rig.leads = False
        rig.router.accepted(*KEY, "u-1")
        assert len(rig.requeued) == 2  # a standby schedules nothing
    finally:
        await rig.close()


async def test_a_refused_report_holds_its_jobs_stall_clock(cluster):
    _, url = cluster
    rig = Rig(url)
    try:
        rig.router.refused(*KEY)  # a job the operator does not know: nothing held
        assert rig.tracker.jobs == {}
        rig.cache.saw(KEY, {"metadata": {"name": KEY[1], "namespace": KEY[0], "uid": "u-1", "generation": 1},
                            "spec": {}, "status": {}})
        rig.router.refused(*KEY)
        assert rig.tracker.jobs["u-1"].last_refused == NOW
    finally:
        await rig.close()


async def test_the_label_is_on_this_replicas_pod_exactly_while_it_leads(cluster):
    emulator, url = cluster
    await emulator.create(PODS, SYSTEM, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator-a"},
                                         "spec": {"containers": [{"name": "operator", "image": "operator:1"}]}})

    def label() -> str | None:
        pod = emulator.get(PODS, SYSTEM, "operator-a") or {}
        return (pod.get("metadata", {}).get("labels") or {}).get(PROGRESS_LEADER_LABEL)

    rig = Rig(url, progress_port=AUTO_PORT, bind_address="127.0.0.1", progress_leader_label=True,
              lease_namespace=SYSTEM, identity="operator-a", lease_retry_period_seconds=0.2)
    side_tasks = SideTasks()
    try:
        rig.leads = False
        rig.router.start(side_tasks)
        await eventually(lambda: rig.router.labeled is False, what="the standby's label settled (absent)")
        assert label() is None
        port = await eventually(lambda: rig.router.server.port, what="the endpoint listening")
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/v1/namespaces/team-a/ddpjobs/x/progress",
                                    json={"step": 1}) as response:
                assert response.status == 503  # a standby takes no report
        rig.leads = True
        rig.router.leadership_changed()
        await eventually(lambda: label() == "true", what="the leader's label")
        rig.leads = False
        rig.router.leadership_changed()
        await eventually(lambda: label() is None and rig.router.labeled is False, what="the label removed")
        rig.leads = True
        rig.router.leadership_changed()
        await eventually(lambda: label() == "true", what="the label again")
        await side_tasks.stop()
        await rig.router.stop()  # reports go to the next leader only
        assert label() is None and rig.router.labeled is False
    finally:
        await side_tasks.stop()
        await rig.close()
