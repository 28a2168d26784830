"""Operator memory per job: the operator process's RSS with 0, 100, 500, 1000 and 2000 DDPJobs.

The emulated API server (kmock + tests/operator/emulator.py) runs in this process; the operator runs
as users run it (`ddpjob_operator.run.main()`, a kubeconfig pointing at the emulator) in a process of
its own, so its RSS is measured alone. The only additions in that process are signal handlers: SIGUSR1
runs `gc.collect()` (and, with --tracemalloc, writes the top allocation sites to a file), SIGUSR2 the
--diagnose statistics; BENCH_SAMPLE=1 in the environment prints its RSS and asyncio tasks every 2 s.

Each job is the CPU example (examples/cpu-digits.yaml: 2 workers, a checkpoint claim), created as
`kubectl apply` would (with its last-applied-configuration annotation), 32 POSTs at a time. The bench
is the kubelet: once the operator has created a job's store pod and 2 workers, it writes each one
Running. A step ends when every job reports phase Running and the operator has made no API call for
6 s (longer than kopf's idle worker timeout) and is idle; then the operator runs a full GC and its VmRSS
(and VmHWM, the peak) is read from /proc.

    .venv/bin/python bench/operator_memory.py [--points 0,100,500,1000,2000]
        [--restart]         # one more reading: a new operator process started with all the jobs there
        [--baseline DIR]    # also measure the ddpjob_operator package in DIR (put first on the child's
                            # PYTHONPATH, e.g. an older commit's operator/ from `git archive`), first
        [--diagnose]        # per reading: pymalloc arenas in use, and the RSS malloc_trim(0) would leave
        [--tracemalloc N]   # per reading: the operator's N top allocation sites, growth since the last
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
import kmock
import yaml
from kmock._internal import enums

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpjob_operator import model, naming  # noqa: E402
from tests.kube_emulator import DDPJOBS, OPERATOR_AGENTS, PODS, Cluster  # noqa: E402

NAMESPACE = "bench"
EXAMPLE = ROOT / "examples" / "cpu-digits.yaml"
QUIET_SECONDS = 6.0  # no operator call for this long: the listing and its passes are done
CONCURRENCY = 32  # jobs POSTed at a time

# The operator process: the image's entrypoint plus a GC (and optional tracemalloc) signal handler.
CHILD = """\
import gc, os, signal, sys
trace = int(os.environ.get("BENCH_TRACEMALLOC") or 0)
if trace:
    import tracemalloc
    tracemalloc.start(int(os.environ.get('BENCH_TRACE_FRAMES') or 1))
frames = int(os.environ.get("BENCH_TRACE_FRAMES") or 1)
group = "traceback" if frames > 1 else "lineno"
previous = []
def collect(*_):
    gc.collect()
    if trace:
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        stats = snapshot.compare_to(previous[0], group) if previous else snapshot.statistics(group)
        previous[:] = [snapshot]
        total = sum(s.size for s in stats)
        path = os.environ["BENCH_TRACE_FILE"]
        with open(path + ".tmp", "w") as out:
            out.write(f"traced {total / 2**20:.1f} MiB; top sites by growth since the previous point:\\n")
            for s in sorted(stats, key=lambda s: -getattr(s, "size_diff", s.size))[:trace]:
                out.write(f"{getattr(s, 'size_diff', s.size) / 2**20:+8.2f} MiB {getattr(s, 'count_diff', s.count):+8d} blocks"
                          f"  {s.traceback[0]}\\n")
                if group == "traceback":
                    out.write("".join(f"      {line}\\n" for line in s.traceback.format()[:-1]))
        os.rename(path + ".tmp", path)
def diagnose(*_):
    # Where the RSS is: pymalloc's arenas, and what glibc could give back.
    import ctypes, re
    def rss():
        return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) // 1024
    gc.collect()
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    sys._debugmallocstats()
    os.dup2(saved, 2)
    os.close(w)
    text = os.read(r, 1 << 20).decode(errors="replace")
    os.close(r)
    get = lambda label: int(re.search(re.escape(label) + r"\\s*=\\s*([\\d,]+)", text).group(1).replace(",", ""))
    before = rss()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open(os.environ["BENCH_TRACE_FILE"] + ".diag.tmp", "w") as out:
        out.write(f"RSS {before} MiB; pymalloc arenas now {get('# arenas allocated current')} "
                  f"(peak {get('# arenas highwater mark')}) of 1 MiB, {get('# bytes in allocated blocks') / 2**20:.1f} MiB "
                  f"in use in them; "
                  f"RSS after malloc_trim(0) {rss()} MiB\\n")
    os.rename(os.environ["BENCH_TRACE_FILE"] + ".diag.tmp", os.environ["BENCH_TRACE_FILE"] + ".diag")
signal.signal(signal.SIGUSR1, collect)
signal.signal(signal.SIGUSR2, diagnose)
if os.environ.get("BENCH_SAMPLE"):
    # Every 2 s to stderr: RSS and the operator's asyncio tasks by coroutine (what is in flight).
    import asyncio, collections, re, threading, time
    def sample():
        while True:
            time.sleep(2)
            loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]
            try:
                tasks = [t for loop in loops for t in asyncio.all_tasks(loop)]
            except RuntimeError:
                continue
            names = collections.Counter(getattr(t.get_coro(), "__qualname__", "?") for t in tasks)
            rss = re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)
            print(f"[sample] RSS {int(rss) // 1024} MiB, {len(tasks)} tasks: {names.most_common(6)}",
                  file=sys.stderr, flush=True)
    threading.Thread(target=sample, daemon=True).start()
from ddpjob_operator import run
sys.exit(run.main())
"""

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: kmock, cluster: {server: "%s"}}]
users: [{name: bench, user: {}}]
contexts: [{name: kmock, context: {cluster: kmock, user: bench}}]
current-context: kmock
"""


class CountingCluster(Cluster):
    """The emulator, counting the operator's API calls (to tell when it has gone quiet)."""

    operator_requests = 0
    operator_watches = 0

    def record(self, request: Any) -> None:
        if request.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS):
            type(self).operator_requests += 1
            type(self).operator_watches += request.action == enums.action.WATCH
        super().record(request)


def rss_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon"):
            fields[key] = int(value.split()[0])
    return fields


def running_status(pod: str) -> dict[str, Any]:
    """What a kubelet writes for a started pod (the fields a real one sets, roughly in size)."""
    started = "2026-11-23T00:00:00Z"
    container = naming.STORE_CONTAINER if pod.endswith("-rdzv") else naming.TRAINER_CONTAINER
    return {"spec": {"nodeName": "node-1"}, "status": {
        "phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}],
        "startTime": started, "qosClass": "Guaranteed",
        "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                       for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                 "PodScheduled")],
        "containerStatuses": [{
            "name": container, "ready": True, "restartCount": 0, "started": True,
            "image": "ghcr.io/ddpjob/ddp-trainer:0.1.0",
            "imageID": "ghcr.io/ddpjob/ddp-trainer@sha256:" + "0" * 64,
            "containerID": "containerd://" + "1" * 64, "state": {"running": {"startedAt": started}},
            "lastState": {}}]}}


class Bench:
    def __init__(self, cluster: CountingCluster, url: str, session: aiohttp.ClientSession,
                 operator: subprocess.Popen[bytes]):
        self.cluster, self.url, self.session, self.operator = cluster, url, session, operator
        self.manifest = yaml.safe_load(EXAMPLE.read_text())
        self.jobs: list[str] = []

    async def add_jobs(self, count: int) -> None:
        """Create `count` more jobs; be their kubelet; return when all of them are Running."""
        start = len(self.jobs)
        names = [f"job-{i:05d}" for i in range(start, start + count)]
        self.jobs.extend(names)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(name: str) -> None:
            pods = [naming.store_pod_name(name)] + [naming.worker_name(name, i) for i in range(2)]
            created = [self.cluster.when_created(NAMESPACE, p) for p in pods]
            async with gate:
                await self.create(name)
            await asyncio.wait_for(asyncio.gather(*created), 600)
            await asyncio.sleep(0.05)  # as after scheduling and image pulls: a status write of its own
            for pod in pods:
                await self.cluster.write((PODS, NAMESPACE, pod), running_status(pod))

        await asyncio.gather(*(one(n) for n in names))
        await self.until(lambda: all(self.phase(n) == "Running" for n in self.jobs), "every job Running")

    async def create(self, name: str) -> None:
        body = {**self.manifest, "metadata": {"name": name}}
        applied = json.dumps({**body, "metadata": {"name": name, "namespace": NAMESPACE}}, separators=(",", ":"))
        body["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": applied + "\n"}
        async with self.session.post(f"{self.url}/apis/{model.API_VERSION}/namespaces/{NAMESPACE}/{model.PLURAL}",
                                     json=body) as response:
            answer = await response.json()
            assert response.status < 300, answer

    def phase(self, name: str) -> str | None:
        key = (DDPJOBS, NAMESPACE, name)
        return (self.cluster.objects[key].raw.get("status") or {}).get("phase") if key in self.cluster.objects else None

    async def until(self, check: Callable[[], bool], what: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.operator.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.operator.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            await asyncio.sleep(0.25)

    async def quiet(self) -> None:
        """Until the operator has made no API call for QUIET_SECONDS and is idle (under 10% of a core
        over the last second): done with what it was sent, including a first list with no calls to make."""
        seen, since = CountingCluster.operator_requests, time.monotonic()
        busy = cpu_seconds(self.operator.pid)
        while True:
            await asyncio.sleep(1.0)
            now = cpu_seconds(self.operator.pid)
            used, busy = now - busy, now
            if CountingCluster.operator_requests != seen:
                seen, since = CountingCluster.operator_requests, time.monotonic()
            elif time.monotonic() - since >= QUIET_SECONDS and used < 0.1:
                return


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def measure(points: list[int], operator_path: str | None, trace: int, diagnose: bool, restart: bool,
                  tmp: Path) -> list[dict[str, Any]]:
    results = []
    async with CountingCluster() as cluster, kmock.Server(cluster) as server, \
            aiohttp.ClientSession(headers={"User-Agent": "kubectl/bench"}) as session:
        cluster.register_resources()
        url = str(server.url).rstrip("/")
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG % url)
        trace_file = tmp / "tracemalloc.txt"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "DDPJOB_OPERATOR_HEALTH_PORT": "0",
               "DDPJOB_OPERATOR_METRICS_PORT": "0", "DDPJOB_OPERATOR_LOG_LEVEL": "ERROR",
               "DDPJOB_OPERATOR_WATCH_NAMESPACES": NAMESPACE,
               "BENCH_TRACEMALLOC": str(trace), "BENCH_TRACE_FILE": str(trace_file)}
        if operator_path:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (operator_path, env.get("PYTHONPATH")) if p)
        bench = Bench(cluster, url, session, subprocess.Popen([sys.executable, "-c", CHILD], env=env))

        async def reading(label: str, started: float) -> None:
            await bench.quiet()
            settled = time.monotonic() - started
            operator = bench.operator
            trace_file.unlink(missing_ok=True)
            operator.send_signal(signal.SIGUSR1)
            await asyncio.sleep(1.0)  # the GC runs
            if trace:
                await bench.until(trace_file.exists, "the allocation snapshot")
                print(trace_file.read_text(), file=sys.stderr)
            memory = rss_kib(operator.pid)
            results.append({"jobs": len(bench.jobs), "label": label, **memory})
            if diagnose:  # after the reading: malloc_trim changes the RSS
                diag_file = Path(str(trace_file) + ".diag")
                diag_file.unlink(missing_ok=True)
                operator.send_signal(signal.SIGUSR2)
                await bench.until(diag_file.exists, "the allocator statistics")
                print(f"        {diag_file.read_text().strip()}", file=sys.stderr)
            print(f"  {label:>22}: VmRSS {memory['VmRSS'] / 1024:6.1f} MiB, peak {memory['VmHWM'] / 1024:6.1f} MiB "
                  f"(settled {settled:.0f} s into the step)", file=sys.stderr, flush=True)

        try:
            await bench.until(lambda: (model.GROUP, model.PLURAL, "watch") in cluster.calls
                              and ("", "pods", "watch") in cluster.calls, "the operator to watch", 300)
            for n in points:
                started = time.monotonic()
                await bench.add_jobs(n - len(bench.jobs))
                await reading(str(n), started)
            if restart:
                # A new operator process finds every job and pod at once (its first list): the burst of a
                # rollout, a crash or a failover, with all the jobs there already.
                bench.operator.terminate()
                bench.operator.wait(60)
                started, watches = time.monotonic(), CountingCluster.operator_watches
                bench.operator = subprocess.Popen([sys.executable, "-c", CHILD], env=env)
                await bench.until(lambda: CountingCluster.operator_watches >= watches + 2, "the new operator to watch")
                await reading(f"{len(bench.jobs)} after a restart", started)
        finally:
            bench.operator.terminate()
            bench.operator.wait(60)
    return results


def slope(results: list[dict[str, Any]]) -> float:
    """Least-squares MiB per job over the readings as the jobs were added."""
    xs = [r["jobs"] for r in results]
    ys = [r["VmRSS"] / 1024 for r in results]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread if spread else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", default="0,100,500,1000,2000", help="job counts to measure at, ascending")
    parser.add_argument("--baseline", metavar="DIR", help="also measure the ddpjob_operator package in DIR")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="N",
                        help="trace allocations in the operator; print the N top sites (slows it down)")
    parser.add_argument("--restart", action="store_true",
                        help="one more reading: a new operator process started with all the jobs there (its first "
                             "list parks every object until all are indexed; slow: minutes at 2,000 jobs)")
    parser.add_argument("--diagnose", action="store_true",
                        help="after each reading, print pymalloc's arena counts and the RSS after malloc_trim(0)")
    args = parser.parse_args()
    points = [int(p) for p in args.points.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {}
    began = time.monotonic()
    for label, path in ([("baseline", args.baseline)] if args.baseline else []) + [("current", None)]:
        print(f"{label}:", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="ddpjob-memory-") as tmp:
            runs[label] = asyncio.run(measure(points, path, args.tracemalloc, args.diagnose, args.restart, Path(tmp)))

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}; "
          f"{time.monotonic() - began:.0f} s; each job 2 workers + store pod, all Running"
          + ("; tracemalloc on (RSS includes its overhead)" if args.tracemalloc else ""))
    labels = list(runs)
    print("| jobs | " + " | ".join(f"{l} RSS MiB" for l in labels) + " |")
    print("| --- |" + " --- |" * len(labels))
    for i, row in enumerate(runs[labels[0]]):
        print(f"| {row['label']} | " + " | ".join(f"{runs[l][i]['VmRSS'] / 1024:.1f}" for l in labels) + " |")
    growth = {l: runs[l][:len(points)] for l in labels}
    print("| MiB per job, least squares over the growth | "
          + " | ".join(f"{slope(growth[l]):.3f}" for l in labels) + " |")
    if points[0] == 0 and points[-1]:
        print(f"| MiB per job, ({points[-1]} - 0) / {points[-1]} | " + " | ".join(
            f"{(growth[l][-1]['VmRSS'] - growth[l][0]['VmRSS']) / 1024 / points[-1]:.3f}" for l in labels) + " |")
    print("| peak RSS (VmHWM) while growing, MiB | "
          + " | ".join(f"{growth[l][-1]['VmHWM'] / 1024:.1f}" for l in labels) + " |")
    if len(runs[labels[0]]) > len(points):
        print("| peak RSS (VmHWM) after a restart, MiB | "
              + " | ".join(f"{runs[l][-1]['VmHWM'] / 1024:.1f}" for l in labels) + " |")

if __name__ == "__main__":
    main()
