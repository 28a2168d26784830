"""What one lost worker costs the cluster: pods created and deleted, and the operator's API requests, per
incident, for a job of N workers (issue 25), restartScope Pod against All.

The operator runs as users run it (`python -m ddpjob_operator.run`, its own process) against the API
double (tests/operator/emulator.py, in this process). For each scope: a job of N workers starts and runs;
worker 1 fails with exit 137 (a SIGKILL) and, with All, the survivors' containers exit when the operator
stops them, as the kubelet would; once every worker of the next generation runs again, the pods the
server created and deleted and the requests the operator sent (by resource and verb, watches excluded)
since the failure are the incident's cost.

    .venv/bin/python bench/incident_cost.py [--workers 256]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import aiohttp
import kmock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ddpjob_operator import model, naming  # noqa: E402
from operator_latency import OPERATOR_NAMESPACE, cpu_model, start_operator_process, wait_until  # noqa: E402
from tests.kube_emulator import DDPJOBS, PODS, Cluster  # noqa: E402


def spec(workers: int, scope: str) -> dict[str, Any]:
    return {"replicas": workers, "minReplicas": 1, "maxReplicas": workers, "image": "trainer:1",
            "entrypoint": "ddp_trainer",
            "failurePolicy": {"maxRestarts": 10, "restartScope": scope, "backoff": {"initialSeconds": 0, "maxSeconds": 0}}}


def pods_of(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    return [p for p in cluster.live(PODS, OPERATOR_NAMESPACE)
            if p["metadata"]["labels"].get(naming.LABEL_JOB_NAME) == job]


def history(cluster: Cluster, job: str, kind: str) -> int:
    return sum(1 for c in cluster.history(PODS) if c.type == kind
               and c.obj["metadata"].get("labels", {}).get(naming.LABEL_JOB_NAME) == job)


async def run_pending(cluster: Cluster, job: str) -> None:
    """The scheduler and kubelets: every pod not yet running runs; graceful deletions complete (exit 143)."""
    for pod in pods_of(cluster, job):
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp"):
            try:
                await cluster.kubelet_finish(OPERATOR_NAMESPACE, name, 143, "torchrun stopped by SIGTERM")
            except Exception:  # noqa: BLE001 - force-deleted meanwhile
                pass
        elif not pod["spec"].get("nodeName"):
            await cluster.bind(OPERATOR_NAMESPACE, name, "node-0")
            await cluster.kubelet_start(OPERATOR_NAMESPACE, name)


async def one_incident(cluster: Cluster, session: aiohttp.ClientSession, url: str, workers: int,
                       scope: str, job: str | None = None) -> dict[str, Any]:
    """One job of `workers` (named `job`, by default after its scope) started, one worker killed, until every
    worker runs again: what that cost (tests/operator/test_incident_cost.py runs it too)."""
    job = job or f"cost-{scope.lower()}"
    body = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": job}, "spec": spec(workers, scope)}
    async with session.post(f"{url}/apis/{model.API_VERSION}/namespaces/{OPERATOR_NAMESPACE}/{model.PLURAL}",
                            json=body) as response:
        assert response.status < 300, await response.text()

    def status() -> dict[str, Any]:
        obj = cluster.get(DDPJOBS, OPERATOR_NAMESPACE, job) or {}
        return obj.get("status") or {}

    async def until_running(generation: int) -> None:
        deadline = time.monotonic() + 300
        while not (status().get("phase") == "Running" and status().get("generation") == generation
                   and status().get("readyReplicas") == workers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job} did not run generation {generation} again: {status().get('message')}")
            await run_pending(cluster, job)
            await asyncio.sleep(0.05)

    await until_running(0)
    before = collections.Counter(cluster.call_counts)
    created, deleted = history(cluster, job, "ADDED"), history(cluster, job, "DELETED")
    started = time.perf_counter()
    await cluster.kubelet_exit(OPERATOR_NAMESPACE, naming.worker_name(job, 1), 137, "Error")
    await until_running(1)
    seconds = time.perf_counter() - started
    requests = {k: v for k, v in (collections.Counter(cluster.call_counts) - before).items() if k[2] != "watch"}
    return {"scope": scope, "created": history(cluster, job, "ADDED") - created,
            "deleted": history(cluster, job, "DELETED") - deleted, "requests": requests, "seconds": seconds}


async def measure(workers: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="ddpjob-bench-") as tmp:
        async with Cluster() as cluster, kmock.Server(cluster) as server, aiohttp.ClientSession() as session:
            cluster.register_resources()
            await cluster.add_node("node-0")
            url = str(server.url).rstrip("/")
            operator = start_operator_process(url, Path(tmp))
            try:
                await wait_until(lambda: ("", "pods", "watch") in cluster.calls, "the operator to watch", 60)
                return [await one_incident(cluster, session, url, workers, scope) for scope in ("Pod", "All")]
            finally:
                operator.terminate()
                operator.wait(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=256)
    args = parser.parse_args()
    results = asyncio.run(measure(args.workers))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, python {platform.python_version()}, {date.today()}; "
          f"one job of {args.workers} workers, worker 1 exits 137, until every worker runs again")
    print("| restartScope | pods created | pods deleted | operator requests (watches excluded) | by resource and verb |"
          " failure -> all running (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        by = ", ".join(f"{res} {verb} {n}" for (_, res, verb), n in sorted(r["requests"].items()))
        print(f"| {r['scope']} | {r['created']} | {r['deleted']} | {sum(r['requests'].values())} | {by} | "
              f"{r['seconds']:.1f} |")


if __name__ == "__main__":
    main()
