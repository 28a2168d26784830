"""Operator failover against the in-process Kubernetes emulator: two replicas, the leader stopped.

Two operator replicas run as users run them (`python -m ddpjob_operator.run`, each its own OS
process, kubeconfig pointing at the emulator), with the chart's leader election settings (Lease
duration 15 s, renew deadline 10 s, retry period 2 s; `--lease-duration` etc. to change them). A
job runs with 2 workers. Then, in one instant, the leader is stopped and worker 1 of the job fails
(exit 137), so the job needs an operator. Two times per run, from the signal:

- handover: the Lease names the standby (what `kubectl get lease` shows);
- first action: the standby, now leading, has created worker 1's replacement (the emulator's
  own creation time).

Modes: `graceful` (SIGTERM: the leader releases the Lease on its way out) and `sigkill` (the
leader vanishes: the standby waits for the Lease to expire). The stopped replica is replaced by a
fresh process, the standby of the next run. Medians of `--repeats` (5) runs per mode. The node-loss
case (the leader's node stops answering) needs a cluster: tests/e2e/test_operator_failover.py.

    .venv/bin/python bench/operator_failover.py [--repeats 5] [--modes graceful,sigkill]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
import kmock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpjob_operator import model, naming  # noqa: E402
from tests.kube_emulator import LEASES, PODS, Cluster  # noqa: E402

from operator_replicas import LEASE_NAME, OPERATOR_NAMESPACE, cpu_model, replica_env, write_kubeconfig  # noqa: E402

NAMESPACE = "team-a"
SPEC = {"replicas": 2, "minReplicas": 1, "image": "trainer:1", "entrypoint": "ddp_trainer",
        "failurePolicy": {"maxRestarts": 1000, "restartScope": "Pod", "backoff": {"initialSeconds": 0, "maxSeconds": 0}}}




async def wait_until(check: Callable[[], Any], what: str, timeout: float = 60, every: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(every)
    return result


class Bench:
    def __init__(self, cluster: Cluster, url: str, session: aiohttp.ClientSession, tmp: Path, args: argparse.Namespace):
        self.cluster, self.url, self.session, self.tmp, self.args = cluster, url, session, tmp, args
        self.replicas: dict[str, subprocess.Popen[bytes]] = {}
        self.serial = 0
        self.kubeconfig = write_kubeconfig(tmp, url)

    def start_replica(self) -> str:
        self.serial += 1
        name = f"ddpjob-operator-{self.serial}"
        env = replica_env(self.kubeconfig, name, NAMESPACE, log_level="WARNING",
                          # The failed worker's peer keeps running: replace it without waiting for more exits.
                          incident_settle_seconds="0.01",
                          lease_duration_seconds=str(self.args.lease_duration),
                          lease_renew_deadline_seconds=str(self.args.renew_deadline),
                          lease_retry_period_seconds=str(self.args.retry_period))
        self.replicas[name] = subprocess.Popen([sys.executable, "-m", "ddpjob_operator.run"], env=env)
        return name

    def holder(self) -> str:
        lease = self.cluster.get(LEASES, OPERATOR_NAMESPACE, LEASE_NAME)
        return ((lease or {}).get("spec") or {}).get("holderIdentity") or ""

    def watches(self, plural: str) -> int:
        return sum(1 for r in self.cluster.in_flight() if r.resource is not None and r.resource.plural == plural
                   and r.params.get("watch"))

    async def two_replicas(self) -> tuple[str, str]:
        """A leader and a warm standby (it watches, so its index is full)."""
        while len(self.replicas) < 2:
            self.start_replica()
        leader = await wait_until(lambda: self.holder() in self.replicas and self.holder(), "a leader")
        await wait_until(lambda: self.watches(model.PLURAL) >= 2 and self.watches("pods") >= 2, "two watching replicas")
        standby = next(n for n in self.replicas if n != leader)
        return leader, standby

    async def running_job(self, name: str) -> None:
        body = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name}, "spec": SPEC}
        async with self.session.post(f"{self.url}/apis/{model.API_VERSION}/namespaces/{NAMESPACE}/{model.PLURAL}",
                                     json=body) as response:
            assert response.status < 300, await response.text()
        pods = [naming.store_pod_name(name)] + [naming.worker_name(name, i) for i in range(2)]
        await wait_until(lambda: all(self.cluster.get(PODS, NAMESPACE, p) for p in pods), "the job's pods")
        for pod in pods:
            await self.cluster.write((PODS, NAMESPACE, pod), {"spec": {"nodeName": "node-1"}, "status": {
                "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})

        def running() -> bool:
            job = self.cluster.get(*self._job_key(name))
            return ((job or {}).get("status") or {}).get("phase") == "Running"
        await wait_until(running, "the job to run")

    @staticmethod
    def _job_key(name: str) -> tuple[Any, str, str]:
        return (kmock.resource(model.GROUP, model.VERSION, model.PLURAL), NAMESPACE, name)

    async def one(self, mode: str, run: int) -> tuple[float, float]:
        leader, standby = await self.two_replicas()
        job = f"{mode}-{run}"
        await self.running_job(job)
        replacement = self.cluster.when_created(NAMESPACE, naming.worker_name(job, 1))
        process = self.replicas.pop(leader)
        signalled = time.perf_counter()
        process.send_signal(signal.SIGTERM if mode == "graceful" else signal.SIGKILL)
        await self.cluster.write((PODS, NAMESPACE, naming.worker_name(job, 1)), {"status": {
            "phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": naming.TRAINER_CONTAINER, "state": {"terminated": {
                "exitCode": 137, "reason": "Error", "finishedAt": "2026-11-23T00:00:00Z"}}}]}})
        await wait_until(lambda: self.holder() == standby, "the standby to hold the Lease",
                         timeout=self.args.lease_duration * 3)
        handover = time.perf_counter() - signalled
        acted = await asyncio.wait_for(replacement, self.args.lease_duration * 3) - signalled
        await asyncio.to_thread(process.wait, 30)
        return handover, acted

    async def close(self) -> None:
        """SIGTERM the replicas while the emulator still answers (the leader releases the Lease)."""
        for process in self.replicas.values():
            process.terminate()
        for process in self.replicas.values():
            await asyncio.to_thread(process.wait, 30)


async def main(args: argparse.Namespace) -> None:
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ddpjob-failover-") as tmp:
        async with Cluster() as cluster, kmock.Server(cluster) as server, aiohttp.ClientSession() as session:
            cluster.register_resources()
            bench = Bench(cluster, str(server.url).rstrip("/"), session, Path(tmp), args)
            try:
                for mode in args.modes.split(","):
                    for run in range(args.repeats):
                        results.setdefault(mode, []).append(await bench.one(mode, run))
                        print(f"{mode} run {run}: handover {results[mode][-1][0]:.2f}s, "
                              f"first action {results[mode][-1][1]:.2f}s", flush=True)
            finally:
                await bench.close()
    print(f"\nmachine: {cpu_model()}, {os.cpu_count()} cores, python {platform.python_version()}; "
          f"Lease {args.lease_duration}s / renew deadline {args.renew_deadline}s / retry {args.retry_period}s; "
          f"{args.repeats} runs per mode")
    print("| leader stopped by | handover median s (min-max) | first action median s (min-max) |")
    print("| --- | --- | --- |")
    for mode, runs in results.items():
        handovers, actions = [h for h, _ in runs], [a for _, a in runs]
        print(f"| {mode} | {statistics.median(handovers):.2f} ({min(handovers):.2f}-{max(handovers):.2f}) | "
              f"{statistics.median(actions):.2f} ({min(actions):.2f}-{max(actions):.2f}) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="graceful,sigkill")
    parser.add_argument("--lease-duration", type=int, default=15)
    parser.add_argument("--renew-deadline", type=float, default=10.0)
    parser.add_argument("--retry-period", type=float, default=2.0)
    asyncio.run(main(parser.parse_args()))
