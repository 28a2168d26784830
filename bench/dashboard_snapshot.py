"""Render docs/dashboard.svg: the Grafana dashboard's panels drawn from real operator metrics.

No Grafana or Prometheus runs here, so this plays their part: the real operator (kopf, handlers, its
progress endpoint) runs against the API emulator of tests/operator while a scripted scenario happens
(jobs start, trainers post progress through the endpoint with TokenReview'd tokens, a worker is killed, one
is evicted, one job hangs and is stalled, one fails, one succeeds), the operator's /metrics endpoint is
scraped over HTTP every second (as Prometheus would, at a shorter interval), and each panel's query is
evaluated on those samples by a small Python equivalent of its PromQL (rate/increase over a window,
histogram_quantile with Prometheus' linear interpolation). The SVG is drawn by hand (no plotting library).

    .venv/bin/python bench/dashboard_snapshot.py [--seconds 90] [--out docs/dashboard.svg]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import re
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import kmock  # noqa: E402

from ddpjob_operator import naming  # noqa: E402
from tests.operator.conftest import FAST, NAMESPACE, Harness, OperatorProcess  # noqa: E402
from tests.kube_emulator import Cluster  # noqa: E402

AUDIENCE = "progress.elastic.ddp.dev"
SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ([-+.\deEinfNa]+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# ---------------------------------------------------------------- the scenario


@dataclasses.dataclass
class Trainer:
    job: str
    replicas: int
    total: int
    speed: float  # steps per second
    sps_per_worker: float
    step: float = 0.0
    hung: bool = False
    done: bool = False


async def scenario(seconds: float, scrapes: list[tuple[float, dict]]) -> None:
    async with Cluster() as emulator, kmock.Server(emulator) as server:
        emulator.register_resources()
        url = str(server.url).rstrip("/")
        settings = dataclasses.replace(FAST, metrics_port=-1, bind_address="127.0.0.1", resync_seconds=1.0,
                                       progress_url="http://ddpjob-progress.ddpjob-system.svc:8090",
                                       progress_write_seconds=1.0, incident_settle_seconds=1.0)
        operator = OperatorProcess(url, settings)
        await operator.start()
        await operator.in_operator(operator.controller.progress_server.start(0, "127.0.0.1"))
        metrics_url = f"http://127.0.0.1:{operator.controller.metrics.port}/metrics"
        progress_base = f"http://127.0.0.1:{operator.controller.progress_server.port}"
        async with aiohttp.ClientSession(headers={"User-Agent": "kubectl"}) as session:
            harness = Harness(emulator, url, session)
            trainers = [Trainer("bert-base", 4, 4000, 40.0, 310.0), Trainer("resnet50", 2, 2600, 30.0, 480.0),
                        Trainer("gpt-small", 2, 6000, 25.0, 150.0)]
            for t in trainers:
                await harness.apply(t.job, replicas=t.replicas, maxReplicas=t.replicas,
                                    failurePolicy={"maxRestarts": 5, "backoff": {"initialSeconds": 0}},
                                    runPolicy={"progressDeadlineSeconds": 10})
            await harness.apply("bad-lr", replicas=2)
            start = time.monotonic()
            events = {"kill": 20.0, "evict": 38.0, "fail": 12.0, "hang": 50.0, "finish": seconds - 12}
            done_events: set[str] = set()
            tokens: dict[str, str] = {}

            async def scrape_loop() -> None:
                while time.monotonic() - start < seconds:
                    text = await asyncio.to_thread(lambda: urllib.request.urlopen(metrics_url).read().decode())
                    scrapes.append((time.monotonic() - start, parse(text)))
                    await asyncio.sleep(1.0)

            scraper = asyncio.create_task(scrape_loop())
            while time.monotonic() - start < seconds:
                now = time.monotonic() - start
                # The kubelet: every pod created runs; graceful deletions complete.
                for job in [t.job for t in trainers] + ["bad-lr"]:
                    await harness.finish_terminating(job)
                    for role in (naming.ROLE_WORKER, naming.ROLE_STORE):
                        for name, pod in harness.pods(job, role).items():
                            if not (pod.get("status") or {}).get("containerStatuses") and \
                                    not pod["metadata"].get("deletionTimestamp"):
                                await harness.run(name)
                if now > events["fail"] and "fail" not in done_events:
                    done_events.add("fail")
                    await harness.exit(naming.worker_name("bad-lr", 0), 1, message="ValueError: lr must be > 0")
                if now > events["kill"] and "kill" not in done_events:
                    done_events.add("kill")
                    await harness.exit(naming.worker_name("resnet50", 1), 137)
                if now > events["evict"] and "evict" not in done_events:
                    done_events.add("evict")
                    await harness.evict(naming.worker_name("bert-base", 3))
                if now > events["hang"] and "hang" not in done_events:
                    done_events.add("hang")
                    trainers[2].hung = True
                if now > events["hang"] + 25 and trainers[2].hung:
                    trainers[2].hung = False  # restarted by the stall's gang restart, training again
                if now > events["finish"] and "finish" not in done_events:
                    done_events.add("finish")
                    trainers[1].done = True
                    for pod in harness.pods("resnet50"):
                        await harness.exit(pod, 0)
                for t in trainers:
                    phase = harness.status(t.job).get("phase")
                    if t.done or t.hung or phase not in ("Running",):
                        continue
                    t.step = min(t.total, t.step + t.speed * 0.5 * random.uniform(0.8, 1.2))
                    world = len(harness.pods(t.job))
                    for rank in range(world):
                        pod = naming.worker_name(t.job, rank)
                        if pod not in harness.pods(t.job):
                            continue
                        uid = harness.pods(t.job)[pod]["metadata"]["uid"]
                        if uid not in tokens:  # the kubelet's projected token, one per pod
                            tokens[uid] = emulator.issue_token(NAMESPACE, pod, (AUDIENCE,))
                        token = tokens[uid]
                        body = {"step": int(t.step), "total_steps": t.total, "rank": rank, "world_size": world,
                                "loss": round(3.0 * (0.999 ** t.step) + 0.2, 4),
                                "samples_per_second": round(t.sps_per_worker * world * random.uniform(0.9, 1.1), 1),
                                "step_seconds": round(own_step_seconds(t, rank, now), 4)}
                        async with session.post(f"{progress_base}/v1/namespaces/{NAMESPACE}/ddpjobs/{t.job}/progress",
                                                json=body, headers={"Authorization": f"Bearer {token}"}) as answer:
                            await answer.read()
                await asyncio.sleep(0.5)
            await scraper
        await operator.stop()


def own_step_seconds(t: Trainer, rank: int, now: float) -> float:
    """A worker's own time per step (apart from waiting for its peers): bert-base's rank 2 slows down
    2.5x after 30 s, as on a throttled node."""
    base = 0.6 / t.speed * random.uniform(0.9, 1.1)
    return base * (2.5 if t.job == "bert-base" and rank == 2 and now > 30 else 1.0)


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


# ---------------------------------------------------------------- the panels' queries, in Python


def series(scrapes, name: str, by: tuple[str, ...] = (), agg=max) -> dict[str, list[tuple[float, float]]]:
    """agg by (labels) (name) at every scrape."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t, samples in scrapes:
        groups: dict[str, list[float]] = defaultdict(list)
        for (metric, labels), value in samples.items():
            if metric == name:
                d = dict(labels)
                groups["/".join(d.get(k, "") for k in by) or name].append(value)
        for key, values in groups.items():
            out[key].append((t, agg(values)))
    return out


def increase(points: list[tuple[float, float]], window: float) -> list[tuple[float, float]]:
    out = []
    for i, (t, v) in enumerate(points):
        old = next((pv for pt, pv in points[:i + 1] if pt >= t - window), v)
        out.append((t, max(0.0, v - old)))
    return out


def quantile(scrapes, q: float, window: float) -> list[tuple[float, float]]:
    """histogram_quantile(q, sum by (le) (rate(ddpjob_reconcile_duration_seconds_bucket[window])))."""
    buckets = series(scrapes, "ddpjob_reconcile_duration_seconds_bucket", ("le",), sum)
    bounds = sorted(buckets, key=lambda b: float(b))
    out = []
    times = [t for t, _ in buckets[bounds[0]]]
    for i, t in enumerate(times):
        counts = []
        for b in bounds:
            pts = buckets[b][:i + 1]
            counts.append(increase(pts, window)[-1][1])
        total = counts[-1]
        if total <= 0:
            continue
        rank, lower, below = q * total, 0.0, 0.0
        for b, c in zip(bounds, counts):
            upper = float(b)
            if c >= rank:
                value = upper if upper == float("inf") else lower + (upper - lower) * (rank - below) / max(c - below, 1e-9)
                out.append((t, value if value != float("inf") else lower))
                break
            lower, below = upper, c
    return out


# ---------------------------------------------------------------- SVG

COLORS = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0"]
PHASE_COLORS = {"Running": "#73bf69", "Pending": "#8ab8ff", "Restarting": "#fade2a", "Suspended": "#b877d9",
                "Succeeded": "#5794f2", "Failed": "#f2495c"}


def esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel_svg(x: float, y: float, w: float, h: float, title: str, lines: dict[str, list[tuple[float, float]]],
              t_max: float, unit: str = "", stacked: bool = False, colors: dict[str, str] | None = None) -> str:
    out = [f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="3" fill="#181b1f" stroke="#2c3235"/>',
           f'<text x="{x + 10}" y="{y + 20}" fill="#ccccdc" font-size="13" font-weight="600">{esc(title)}</text>']
    left, right, top, bottom = x + 46, x + w - 10, y + 32, y + h - 42
    lines = {k: v for k, v in lines.items() if v}
    if stacked:
        acc: dict[float, float] = defaultdict(float)
        stacked_lines = {}
        for key, pts in lines.items():
            stacked_lines[key] = [(t, acc[t] + v) for t, v in pts]
            for t, v in pts:
                acc[t] += v
        lines = stacked_lines
    y_max = max([v for pts in lines.values() for _, v in pts] + [1e-9])
    y_max = y_max * 1.1 if y_max > 0 else 1
    for i in range(5):
        gy = bottom - (bottom - top) * i / 4
        label = y_max * i / 4
        text = f"{label:.0f}" if y_max >= 10 else f"{label:.2g}" if label else "0"
        out.append(f'<line x1="{left}" x2="{right}" y1="{gy:.1f}" y2="{gy:.1f}" stroke="#2c3235"/>')
        out.append(f'<text x="{left - 4}" y="{gy + 4:.1f}" fill="#8e8e8e" font-size="10" text-anchor="end">'
                   f'{text}{unit}</text>')
    for s in range(0, int(t_max) + 1, 15):
        gx = left + (right - left) * s / t_max
        out.append(f'<text x="{gx:.1f}" y="{bottom + 13}" fill="#8e8e8e" font-size="10" text-anchor="middle">{s}s</text>')
    legend_x = left
    for i, (key, pts) in enumerate(sorted(lines.items())):
        color = (colors or {}).get(key, COLORS[i % len(COLORS)])
        path = " ".join(f"{left + (right - left) * t / t_max:.1f},{bottom - (bottom - top) * v / y_max:.1f}"
                        for t, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        out.append(f'<rect x="{legend_x}" y="{bottom + 22}" width="10" height="3" fill="{color}"/>')
        out.append(f'<text x="{legend_x + 14}" y="{bottom + 27}" fill="#ccccdc" font-size="10">{esc(key)}</text>')
        legend_x += 20 + 6.2 * len(key)
    return "\n".join(out)


def render(scrapes, out: Path) -> None:
    t_max = max(t for t, _ in scrapes)
    leader = {t: s for t, s in scrapes}
    phases = series(scrapes, "ddpjob_jobs", ("phase",), sum)
    restarts = series(scrapes, "ddpjob_restarts_total", (), sum)
    disruptions = series(scrapes, "ddpjob_disruptions_total", (), sum)
    stalls = series(scrapes, "ddpjob_stalls_total", (), sum)
    count = series(scrapes, "ddpjob_reconcile_duration_seconds_count", (), sum)
    errors = series(scrapes, "ddpjob_reconcile_errors_total", (), sum)
    W, H = 1200, 1160
    panels = [
        (10, 40, 585, 210, "Jobs by phase", {k: v for k, v in phases.items()}, "", True, PHASE_COLORS),
        (605, 40, 585, 210, "Restarts and disruptions (increase over 10s)",
         {"restarts (charged)": increase(restarts.get("ddpjob_restarts_total", []), 10),
          "disruptions (not charged)": increase(disruptions.get("ddpjob_disruptions_total", []), 10),
          "stalls detected": increase(stalls.get("ddpjob_stalls_total", []), 10)}, "", False, None),
        (10, 290, 390, 220, "Step", series(scrapes, "ddpjob_job_progress_step", ("namespace", "ddpjob")), "",
         False, None),
        (405, 290, 390, 220, "Samples/s", series(scrapes, "ddpjob_job_samples_per_second", ("namespace", "ddpjob")),
         "", False, None),
        (800, 290, 390, 220, "Seconds since the step advanced",
         series(scrapes, "ddpjob_job_seconds_since_progress", ("namespace", "ddpjob")), "s", False, None),
        (10, 520, 1180, 190, "Own step time per rank (stragglers)",
         series(scrapes, "ddpjob_rank_step_seconds", ("ddpjob", "rank")), "s", False, None),
        (10, 730, 290, 210, "Leader", series(scrapes, "ddpjob_leader", ()), "", False, None),
        (305, 730, 290, 210, "Reconcile latency",
         {"p50": quantile(scrapes, 0.5, 10), "p99": quantile(scrapes, 0.99, 10)}, "s", False, None),
        (600, 730, 290, 210, "Reconciles and errors (per s, 10s)",
         {"passes/s": [(t, v / 10) for t, v in increase(count.get("ddpjob_reconcile_duration_seconds_count", []), 10)],
          "errors/s": [(t, v / 10) for t, v in increase(errors.get("ddpjob_reconcile_errors_total", []), 10)]},
         "", False, None),
        (895, 730, 295, 210, "Queue depth", series(scrapes, "ddpjob_reconcile_queue_depth", ()), "", False, None),
        (10, 950, 1180, 200, "Progress reports by result (per s, 10s)",
         {k: [(t, v / 10) for t, v in increase(p, 10)]
          for k, p in series(scrapes, "ddpjob_progress_reports_total", ("result",), sum).items()}, "", False, None),
    ]
    del leader
    body = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="Inter, Helvetica, Arial, '
            f'sans-serif"><rect width="{W}" height="{H}" fill="#111217"/>',
            '<text x="12" y="26" fill="#ccccdc" font-size="16" font-weight="600">DDPJob operator</text>',
            f'<text x="150" y="26" fill="#8e8e8e" font-size="11">panels of charts/ddpjob-operator/files/dashboards/'
            f'ddpjob.json from the operator\'s /metrics, scraped every 1s for {t_max:.0f}s (bench/dashboard_snapshot.py)'
            f'</text>',
            '<text x="12" y="282" fill="#ccccdc" font-size="14" font-weight="600">Training progress (per job)</text>',
            '<text x="12" y="722" fill="#ccccdc" font-size="14" font-weight="600">Operator health</text>']
    for x, y, w, h, title, lines, unit, stacked, colors in panels:
        body.append(panel_svg(x, y, w, h, title, lines, t_max, unit, stacked, colors))
    body.append("</svg>")
    out.write_text("\n".join(body) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.svg")
    parser.add_argument("--samples", type=Path, help="also write the scraped samples (JSON lines)")
    parser.add_argument("--from-samples", type=Path, help="draw from samples written by --samples (no scenario)")
    args = parser.parse_args()
    random.seed(7)
    scrapes: list[tuple[float, dict]] = []
    if args.from_samples:
        for line in args.from_samples.read_text().splitlines():
            row = json.loads(line)
            scrapes.append((row["t"], {(n, tuple(sorted(l.items()))): v for n, l, v in row["samples"]}))
    else:
        asyncio.run(scenario(args.seconds, scrapes))
    if args.samples and not args.from_samples:
        with args.samples.open("w") as f:
            for t, samples in scrapes:
                f.write(json.dumps({"t": round(t, 2), "samples": [[n, dict(l), v] for (n, l), v in samples.items()
                                                                    if n.startswith("ddpjob_")]}) + "\n")
    render(scrapes, args.out)
    print(f"{len(scrapes)} scrapes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
