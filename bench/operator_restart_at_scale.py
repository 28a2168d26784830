"""A restart of both operator replicas on a cluster full of Pending pods, and a job submitted meanwhile.

The real operator (`python -m ddpjob_operator.run`, two replicas with the chart's leader election: Lease
15 s, renew deadline 10 s, retry 2 s; INFO logs) against the in-process API emulator
(tests/operator/emulator.py). Setup: `--jobs N` DDPJobs of 2 workers each, so 3 pods per job with the
rendezvous store, which the operator creates; the bench, as the scheduler, marks every pod Unschedulable
(PodScheduled False: a node selector nothing matches), and waits until the operator made no API call for
6 s. Then both replicas get SIGTERM at once (a rollout of both), two fresh replicas start, and a new job
is submitted at the same instant. Measured, on the emulator's clock (its own writes):

- Lease: from the restart to a new replica holding the Lease;
- first pod: from the new leader taking the Lease to the new job's first pod (the goal: within 10 s);
- INFO lines: what the new leader logged from its start until it went quiet (every job resynced),
  and how many of those were kopf's per-event "Handler ... succeeded." lines;
- memory: each new replica's VmRSS (and VmHWM, its peak) once quiet;
- the Lease under that load (issue 38): the new leader's renewals in the `--lease-seconds` (60) from its
  takeover (its first passes, then every job's resync, each 30 s), as the emulator saw them: the gaps between them (median, max: a renewal is due every retry period, 2 s, and
  the leader stops acting 10 s after the start of its last successful one), how often it logged "could not
  renew Lease", and how often the Lease changed hands after the takeover (lost Leases).

    .venv/bin/python bench/operator_restart_at_scale.py [--jobs 1000] [--baseline DIR]
        --baseline DIR: run the replicas from the ddpjob_operator package in DIR (first on their
        PYTHONPATH; e.g. an older commit's operator/ from `git archive`), to compare.
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

from operator_replicas import cpu_model, replica_env, write_kubeconfig  # noqa: E402

NAMESPACE = "team-a"
SPEC = {"replicas": 2, "minReplicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer"}
UNSCHEDULABLE = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
QUIET_SECONDS = 6.0
CONCURRENCY = 32  # POSTs at a time




def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


async def wait_until(check: Callable[[], Any], what: str, timeout: float, every: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(every)
    return result


class LeaseNotingCluster(Cluster):
    """The emulator, noting when the Lease changes hands (at its own write), and every write of it."""

    holders: list[tuple[float, str]] = []  # (perf_counter, holder) at each change
    writes: list[tuple[float, str]] = []  # (perf_counter, holder) at each write

    async def commit(self, key: Any, obj: Any, type_: str) -> Any:
        stored = await super().commit(key, obj, type_)
        if key[0] == LEASES:
            holder = ((stored or {}).get("spec") or {}).get("holderIdentity") or ""
            self.writes.append((time.perf_counter(), holder))
            if not self.holders or self.holders[-1][1] != holder:
                self.holders.append((time.perf_counter(), holder))
        return stored


class Bench:
    def __init__(self, cluster: LeaseNotingCluster, url: str, session: aiohttp.ClientSession, tmp: Path,
                 args: argparse.Namespace) -> None:
        self.cluster, self.url, self.session, self.tmp, self.args = cluster, url, session, tmp, args
        self.replicas: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.serial = 0
        self.replicas_seen: list[tuple[str, Path]] = []
        self.lease_holders = LeaseNotingCluster.holders
        self.kubeconfig = write_kubeconfig(tmp, url)

    def start_replica(self) -> str:
        self.serial += 1
        name = f"ddpjob-operator-{self.serial}"
        env = replica_env(self.kubeconfig, name, NAMESPACE, log_level="INFO")
        if self.args.baseline:
            env["PYTHONPATH"] = os.pathsep.join([str(Path(self.args.baseline).resolve()), env.get("PYTHONPATH", "")])
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "ddpjob_operator.run"], env=env, stdout=out,
                                       stderr=subprocess.STDOUT)
        self.replicas[name] = (process, log)
        self.replicas_seen.append((name, log))
        return name

    def holder(self) -> str:
        return self.lease_holders[-1][1] if self.lease_holders else ""

    def calls(self) -> int:
        """The operators' API calls but the Lease's (renewed every retry period)."""
        return sum(n for (_, resource, _), n in self.cluster.call_counts.items() if resource != "leases")

    async def quiet(self, timeout: float) -> float:
        """Waits until the operators made no API call for QUIET_SECONDS; returns when the last one was."""
        deadline, last, seen = time.monotonic() + timeout, time.perf_counter(), self.calls()
        while time.perf_counter() - last < QUIET_SECONDS:
            if time.monotonic() > deadline:
                raise TimeoutError("the operators never went quiet")
            await asyncio.sleep(0.2)
            if self.calls() != seen:
                last, seen = time.perf_counter(), self.calls()
        return last

    async def post_job(self, name: str) -> None:
        body = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name}, "spec": SPEC}
        async with self.session.post(f"{self.url}/apis/{model.API_VERSION}/namespaces/{NAMESPACE}/{model.PLURAL}",
                                     json=body) as response:
            assert response.status < 300, await response.text()

    async def setup(self, jobs: int) -> None:
        started = time.perf_counter()
        names = [f"pending-{i:05d}" for i in range(jobs)]
        for i in range(0, jobs, CONCURRENCY):
            await asyncio.gather(*(self.post_job(n) for n in names[i:i + CONCURRENCY]))
        await wait_until(lambda: len(self.cluster.live(PODS, NAMESPACE)) >= 3 * jobs, "every job's 3 pods",
                         timeout=60 + jobs, every=1.0)  # a scan of every object: not too often
        for pod in self.cluster.live(PODS, NAMESPACE):
            await self.cluster.unschedulable(NAMESPACE, pod["metadata"]["name"], UNSCHEDULABLE)
        await self.quiet(timeout=120 + jobs)
        print(f"setup: {jobs} jobs, {len(self.cluster.live(PODS, NAMESPACE))} Pending pods, "
              f"{time.perf_counter() - started:.0f} s", flush=True)

    async def restart_and_submit(self) -> dict[str, Any]:
        old = dict(self.replicas)
        new_job = "submitted-meanwhile"
        first_pod = [self.cluster.when_created(NAMESPACE, n) for n in
                     (naming.store_pod_name(new_job), *(naming.worker_name(new_job, i) for i in range(2)))]
        load = os.getloadavg()
        restarted = time.perf_counter()
        for process, _ in old.values():
            process.send_signal(signal.SIGTERM)
        for name in old:
            del self.replicas[name]
        fresh = [self.start_replica(), self.start_replica()]
        await self.post_job(new_job)
        await wait_until(lambda: self.holder() in fresh, "a new replica to hold the Lease", timeout=180, every=0.005)
        leader = self.holder()
        taken = next(t for t, h in self.lease_holders if h == leader)
        done, _ = await asyncio.wait(first_pod, timeout=600, return_when=asyncio.FIRST_COMPLETED)
        created = min(f.result() for f in done)
        for process, _ in old.values():
            await asyncio.to_thread(process.wait, 60)
        quiet_at = await self.quiet(timeout=600)
        await asyncio.sleep(max(0.0, taken + self.args.lease_seconds - time.perf_counter()))
        watched_until = time.perf_counter()
        rss = {name: memory_mib(self.replicas[name][0].pid) for name in fresh}
        lines = self.replicas[leader][1].read_text(errors="replace").splitlines()
        info = [line for line in lines if " INFO " in line or " WARNING " in line or " ERROR " in line]
        per_event = [line for line in info if "Handler '" in line and "succeeded" in line]
        listing = next((line.split(": ", 1)[1] for line in info if " listed " in line), "")
        standby = next(n for n in fresh if n != leader)
        renewals = [t for t, h in LeaseNotingCluster.writes if taken <= t <= watched_until and h == leader]
        gaps = [b - a for a, b in zip(renewals, renewals[1:])] or [0.0]
        return {"renewals": len(renewals), "gap_median_s": statistics.median(gaps), "gap_max_s": max(gaps),
                "could_not_renew": sum("could not renew Lease" in line for line in lines),
                "lost_leases": sum(1 for t, h in self.lease_holders if taken < t <= watched_until and h != leader),
                "watched_s": watched_until - taken,"lease_s": taken - restarted, "first_pod_s": created - taken, "from_restart_s": created - restarted,
                "resynced_s": quiet_at - taken, "info_lines": len(info), "per_event_lines": len(per_event),
                "leader_rss": rss[leader][0], "leader_hwm": rss[leader][1],
                "standby_rss": rss[standby][0], "standby_hwm": rss[standby][1], "load": load[0], "listing": listing}

    async def close(self) -> None:
        for process, _ in self.replicas.values():
            process.terminate()
        for process, _ in self.replicas.values():
            await asyncio.to_thread(process.wait, 60)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="ddpjob-restart-") as tmp:
        async with LeaseNotingCluster() as cluster, kmock.Server(cluster) as server, aiohttp.ClientSession() as session:
            cluster.register_resources()
            bench = Bench(cluster, str(server.url).rstrip("/"), session, Path(tmp), args)
            try:
                bench.start_replica()
                bench.start_replica()
                await wait_until(lambda: bench.holder(), "a leader", timeout=120)
                await bench.setup(args.jobs)
                result = await bench.restart_and_submit()
            finally:
                await bench.close()
                if args.logs:
                    Path(args.logs).mkdir(parents=True, exist_ok=True)
                    for _, log in bench.replicas_seen:
                        (Path(args.logs) / log.name).write_bytes(log.read_bytes())
    code = "baseline " + args.baseline if args.baseline else "this tree"
    print(f"\nmachine: {cpu_model()}, {os.cpu_count()} cores, python {platform.python_version()}; {code}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {result['load']:.1f} at the restart")
    print("| jobs (Pending pods) | restart -> Lease s | Lease -> new job's first pod s | restart -> first pod s "
          "| Lease -> every job resynced s | new leader's INFO lines (per-event) | RSS MiB leader / standby "
          "(peak) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    r = result
    print(f"| {args.jobs} ({3 * args.jobs}) | {r['lease_s']:.1f} | {r['first_pod_s']:.1f} | {r['from_restart_s']:.1f} | "
          f"{r['resynced_s']:.0f} | {r['info_lines']:.0f} ({r['per_event_lines']:.0f}) | "
          f"{r['leader_rss']:.0f} ({r['leader_hwm']:.0f}) / {r['standby_rss']:.0f} ({r['standby_hwm']:.0f}) |")
    print(f"new leader: {r['listing']}")
    print("\n| jobs (Pending pods) | renewals in the s after the Lease | gap between renewals median / max s "
          "| 'could not renew Lease' lines | lost Leases |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {args.jobs} ({3 * args.jobs}) | {r['renewals']} in {r['watched_s']:.0f} | {r['gap_median_s']:.2f} / "
          f"{r['gap_max_s']:.2f} | {r['could_not_renew']} | {r['lost_leases']} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--baseline", default="", help="a directory holding an older ddpjob_operator package")
    parser.add_argument("--logs", default="", help="a directory to copy every replica's log to")
    parser.add_argument("--lease-seconds", type=float, default=60.0,
                        help="how long after the takeover the new leader's renewals are watched")
    asyncio.run(main(parser.parse_args()))
