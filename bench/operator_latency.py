"""Operator latency against the in-process Kubernetes emulator, side by side with a bare client.

Two measurements, for 1 job (repeated) and for batches of 100 jobs of 4 workers at once:

- create: DDPJob POST answered -> the last of its pods (store + 4 workers) created;
- replace: a worker's Failed status written (what the operator's watch sees) -> its
  replacement pod created (restartScope Pod, backoff 0).

The floor is a bare client (the operator's own HTTP client, no kopf, no watch, no decisions)
that creates the same manifests the moment the job exists, and deletes and recreates the failed
pod the moment it fails. The emulated API server runs in this process's event loop; the operator runs
as users run it (`python -m ddpjob_operator.run`, kubeconfig pointing at the emulator) in its own
process; the bare client runs in a process of its own too, told what to do over a pipe. Creation times are
taken inside the emulator when it stores each pod (futures, no polling).

    .venv/bin/python bench/operator_latency.py [--repeats 15] [--jobs 100] [--batches 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
import kmock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpjob_operator import job_manifests, model, naming  # noqa: E402
from ddpjob_operator.kube import PODS, Connection, Kube  # noqa: E402
from tests.kube_emulator import PODS as POD_RESOURCE  # noqa: E402
from tests.kube_emulator import Cluster  # noqa: E402

FLOOR_NAMESPACE, OPERATOR_NAMESPACE = "floor", "operator"  # the operator watches only its own
WORKERS = 4
SPEC = {"replicas": WORKERS, "minReplicas": 1, "image": "trainer:1", "entrypoint": "ddp_trainer",
        "failurePolicy": {"maxRestarts": 1000, "backoff": {"initialSeconds": 0, "maxSeconds": 0}}}


class Bench:
    def __init__(self, cluster: Cluster, url: str, session: aiohttp.ClientSession):
        self.cluster, self.url, self.session = cluster, url, session
        self.serial = 0
        self.namespace = FLOOR_NAMESPACE

    async def create_job(self, name: str) -> tuple[dict[str, Any], float]:
        body = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name}, "spec": SPEC}
        async with self.session.post(f"{self.url}/apis/{model.API_VERSION}/namespaces/{self.namespace}/{model.PLURAL}",
                                     json=body) as response:
            created = await response.json()
            assert response.status < 300, created
        return created, time.perf_counter()

    async def created_after(self, names: list[str], since: float, waiters: list[asyncio.Future[float]]) -> float:
        """Seconds from `since` until the last of these pods was created (the emulator's clock)."""
        times = await asyncio.wait_for(asyncio.gather(*waiters), 120)
        return max(times) - since

    def watch_creation(self, names: list[str]) -> list[asyncio.Future[float]]:
        return [self.cluster.when_created(self.namespace, n) for n in names]

    def job_pods(self, name: str) -> list[str]:
        return [naming.store_pod_name(name)] + [naming.worker_name(name, i) for i in range(WORKERS)]

    async def run_all(self, names: list[str]) -> None:
        for name in names:
            for pod in self.job_pods(name):
                await self.cluster.write((POD_RESOURCE, self.namespace, pod), {"status": {
                    "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})

    async def fail(self, pod: str) -> float:
        started = time.perf_counter()
        await self.cluster.write((POD_RESOURCE, self.namespace, pod), {"status": {
            "phase": "Failed", "containerStatuses": [{"name": naming.TRAINER_CONTAINER, "state": {"terminated": {
                "exitCode": 137, "reason": "Error", "finishedAt": "2026-11-22T00:00:00Z"}}}]}})
        return started

    # ------------------------------------------------------------ one scenario, either side

    async def scenario(self, jobs: int, prefix: str, on_created: Callable[[dict[str, Any]], None],
                       on_failed: Callable[[dict[str, Any], str], None]) -> tuple[list[float], list[float]]:
        """Create `jobs` jobs at once, wait for their pods, fail worker 1 of each; per-job latencies."""
        names = [f"{prefix}-{self.serial}-{i}" for i in range(jobs)]
        self.serial += 1
        creations = [self.watch_creation(self.job_pods(n)) for n in names]
        async def create(name: str) -> tuple[dict[str, Any], float]:
            created, at = await self.create_job(name)
            on_created(created)  # the floor starts the moment its job exists
            return created, at

        results = await asyncio.gather(*(create(n) for n in names))
        create = await asyncio.gather(*(self.created_after(self.job_pods(n), t, waiters)
                                        for n, (_, t), waiters in zip(names, results, creations)))
        await self.run_all(names)
        await asyncio.sleep(0.2)  # let the operator see them Running
        replacements = [self.watch_creation([naming.worker_name(n, 1)]) for n in names]
        failed_at = []
        for (created, _), name in zip(results, names):
            pod = naming.worker_name(name, 1)
            failed_at.append(await self.fail(pod))
            on_failed(created, pod)
        replace = await asyncio.gather(*(self.created_after([naming.worker_name(n, 1)], t, waiters)
                                         for n, t, waiters in zip(names, failed_at, replacements)))
        for name in names:  # clean up: the job and, through ownership, its pods
            async with self.session.delete(f"{self.url}/apis/{model.API_VERSION}/namespaces/{self.namespace}/"
                                           f"{model.PLURAL}/{name}", json={}) as response:
                await response.read()
        return list(create), list(replace)


async def bare_client(url: str) -> None:
    """The floor, in its own process: the same manifests and calls, issued the instant the bench
    says so on stdin (one JSON line per command), with no watch, no kopf and no decisions."""
    api = Kube(Connection(server=url, insecure=True))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pending: set[asyncio.Task[None]] = set()

    async def create(job: naming.JobRef, spec: model.DDPJobSpec) -> None:
        await asyncio.gather(*(api.create(m) for m in job_manifests.shared_manifests(job, spec)))
        await api.create(job_manifests.store_pod(job, spec))
        await asyncio.gather(*(api.create(job_manifests.worker_pod(job, spec, index=i, generation=0))
                               for i in range(spec.replicas)))

    async def replace(job: naming.JobRef, spec: model.DDPJobSpec, pod: str) -> None:
        await api.delete(PODS, job.namespace, pod)
        await api.create(job_manifests.worker_pod(job, spec, index=1, generation=0, attempt=1))

    while line := await reader.readline():
        command = json.loads(line)
        meta = command["job"]["metadata"]
        job = naming.JobRef(meta["name"], meta["namespace"], meta["uid"])
        spec = model.DDPJobSpec.model_validate(command["job"]["spec"])
        work = create(job, spec) if command["op"] == "create" else replace(job, spec, command["pod"])
        task = loop.create_task(work)
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    await api.close()


def bare_client_hooks(process: subprocess.Popen[bytes]) -> tuple[Callable[..., None], Callable[..., None]]:
    def send(command: dict[str, Any]) -> None:
        assert process.stdin is not None
        process.stdin.write(json.dumps(command).encode() + b"\n")
        process.stdin.flush()

    return (lambda created: send({"op": "create", "job": created}),
            lambda created, pod: send({"op": "replace", "job": created, "pod": pod}))


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: kmock, cluster: {server: "%s"}}]
users: [{name: bench, user: {}}]
contexts: [{name: kmock, context: {cluster: kmock, user: bench}}]
current-context: kmock
"""


def start_operator_process(url: str, tmp: Path) -> subprocess.Popen[bytes]:
    """The operator as users run it (`python -m ddpjob_operator.run`), in its own process."""
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG % url)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "DDPJOB_OPERATOR_HEALTH_PORT": "0",
           "DDPJOB_OPERATOR_METRICS_PORT": "0", "DDPJOB_OPERATOR_LOG_LEVEL": "ERROR",
           "DDPJOB_OPERATOR_WATCH_NAMESPACES": OPERATOR_NAMESPACE}
    return subprocess.Popen([sys.executable, "-m", "ddpjob_operator.run"], env=env)


async def wait_until(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.perf_counter() + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def summary(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}"


async def main(repeats: int, many: int, batches: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ddpjob-bench-") as tmp:
        await measure(Path(tmp), repeats, many, batches)


async def measure(tmp: Path, repeats: int, many: int, batches: int) -> None:
    async with Cluster() as cluster, kmock.Server(cluster) as server, aiohttp.ClientSession() as session:
        cluster.register_resources()
        url = str(server.url).rstrip("/")
        bench = Bench(cluster, url, session)

        bare = subprocess.Popen([sys.executable, __file__, "--bare-client", url], stdin=subprocess.PIPE)
        on_created, on_failed = bare_client_hooks(bare)
        await asyncio.sleep(1.0)  # let it import and connect its stdin
        operator = start_operator_process(url, tmp)
        await wait_until(lambda: (model.GROUP, model.PLURAL, "watch") in cluster.calls
                         and ("", "pods", "watch") in cluster.calls, "the operator to watch")
        noop = lambda *_: None  # noqa: E731 - the operator reacts on its own
        sides = {"floor": (FLOOR_NAMESPACE, on_created, on_failed), "operator": (OPERATOR_NAMESPACE, noop, noop)}
        results: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        # Interleaved, so both sides share whatever else the machine is doing at the time.
        for jobs, rounds in ((1, repeats), (many, batches)):
            for _ in range(rounds):
                for side, (namespace, created_hook, failed_hook) in sides.items():
                    bench.namespace = namespace
                    c, r = await bench.scenario(jobs, side, created_hook, failed_hook)
                    create, replace = results.setdefault((side, str(jobs)), ([], []))
                    create.extend(c), replace.extend(r)
        operator.terminate()
        operator.wait(15)
        assert bare.stdin is not None
        bare.stdin.close()
        bare.wait(15)

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, python {platform.python_version()}, date 2026-11-22; "
          f"{repeats} single-job runs, {batches} batches of {many} jobs x {WORKERS} workers, sides interleaved")
    print("| jobs | measurement | bare client median ms | operator median ms | ratio | operator max ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for jobs in ("1", str(many)):
        for i, label in enumerate(("creation -> all pods created", "failure visible -> replacement created")):
            f, m = results["floor", jobs][i], results["operator", jobs][i]
            print(f"| {jobs} | {label} | {summary(f)} | {summary(m)} | "
                  f"{statistics.median(m) / statistics.median(f):.2f}x | {max(m) * 1000:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15, help="single-job runs per side")
    parser.add_argument("--jobs", type=int, default=100, help="jobs in a concurrent batch")
    parser.add_argument("--batches", type=int, default=3, help="concurrent batches per side")
    parser.add_argument("--bare-client", metavar="URL", help=argparse.SUPPRESS)  # the floor's own process
    args = parser.parse_args()
    asyncio.run(bare_client(args.bare_client) if args.bare_client else main(args.repeats, args.jobs, args.batches))
