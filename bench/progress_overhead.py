"""Issue 12 benchmarks.

    .venv/bin/python bench/progress_overhead.py trainer [--device cuda] [--hidden 4096] [--steps 300]
    .venv/bin/python bench/progress_overhead.py operator [--jobs 100] [--seconds 30]

trainer: a training step (MLP, AdamW) timed with the progress client off (no endpoint) and on (a report
every step, far more often than the bundled trainer's one per --log-every steps, HTTP POSTs with a bearer
token to a local endpoint that answers 204, plus the 5 s heartbeat), in interleaved rounds; median step time.

operator: the real operator against the emulated API server (tests/operator/emulator.py) with N running
jobs whose 2 workers each report every second through the real endpoint (TokenReview included); counts the
status patches per second that carry progress and all status patches per second.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "trainer-image")]


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def trainer(a: argparse.Namespace) -> None:
    import torch
    from torch import nn

    from ddp_trainer.runtime.progress import ProgressReporter

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = Path(tempfile.mkdtemp()) / "token"
    token.write_text("x" * 900)  # about a projected token's size
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/namespaces/ns/ddpjobs/j/progress"
    device = torch.device(a.device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(a.hidden, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(),
                          nn.Linear(a.hidden, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(a.batch, a.hidden, device=device)
    y = torch.randint(0, 10, (a.batch,), device=device)

    def run(reporter: ProgressReporter | None, steps: int) -> list[float]:
        times = []
        for step in range(steps):
            start = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if reporter is not None:
                reporter.report(step=step, total_steps=steps, loss=loss.detach(), epoch=0, samples_per_second=1.0)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return times

    run(None, 30)  # warm-up
    on, off = [], []
    reporter = ProgressReporter(None, url, enabled=False, http_enabled=True, token_file=str(token), rank=0)
    for _ in range(a.rounds):
        off += run(None, a.steps)
        on += run(reporter, a.steps)
    reporter.close()
    med_off, med_on = statistics.median(off), statistics.median(on)
    print(json.dumps({"device": str(device), "hidden": a.hidden, "batch": a.batch,
                      "steps_each": len(on), "median_step_ms_off": round(med_off * 1e3, 4),
                      "median_step_ms_on": round(med_on * 1e3, 4),
                      "overhead_percent": round(100 * (med_on - med_off) / med_off, 2)}))


async def operator_bench(a: argparse.Namespace) -> None:
    import aiohttp
    import kmock

    from ddpjob_operator import naming
    from tests.operator.conftest import FAST, NAMESPACE, Harness, OperatorProcess, eventually
    from tests.kube_emulator import Cluster

    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from dataclasses import replace
    settings = replace(FAST, resync_seconds=30, progress_port=port, bind_address="127.0.0.1",
                       progress_url="http://ddpjob-progress.ddpjob-system.svc:8090", progress_write_seconds=5.0)
    async with Cluster() as emulator, kmock.Server(emulator) as server:
        emulator.register_resources()
        url = str(server.url).rstrip("/")
        async with aiohttp.ClientSession(headers={"User-Agent": "kubectl-test"}) as session:
            harness = Harness(emulator, url, session)
            op = OperatorProcess(url, settings)
            await op.start()
            try:
                names = [f"job-{i}" for i in range(a.jobs)]
                for name in names:
                    await harness.apply(name)
                await eventually(lambda: all(len(harness.pods(n)) == 2 for n in names), 120, "workers")
                for name in names:
                    await harness.run_all(name)
                await eventually(lambda: all(harness.status(n).get("phase") == "Running" for n in names), 120,
                                 "Running")
                tokens = {(n, i): emulator.issue_token(NAMESPACE, naming.worker_name(n, i),
                                                        ("progress.elastic.ddp.dev",)) for n in names for i in (0, 1)}
                api, patches = op.controller.api, {"all": 0, "progress": 0}
                original = api.patch_status

                async def counting(namespace, name, body):
                    patches["all"] += 1
                    patches["progress"] += "progress" in body
                    return await original(namespace, name, body)
                api.patch_status = counting
                base = f"http://127.0.0.1:{port}"
                codes: dict[int, int] = {}

                async def worker(name: str, index: int) -> None:
                    step = 0
                    deadline = time.monotonic() + a.seconds
                    while time.monotonic() < deadline:
                        step += 10
                        async with session.post(f"{base}/v1/namespaces/{NAMESPACE}/ddpjobs/{name}/progress",
                                                json={"step": step, "total_steps": 100000, "loss": 1.0,
                                                      "rank": index},
                                                headers={"Authorization": f"Bearer {tokens[name, index]}"}) as r:
                            codes[r.status] = codes.get(r.status, 0) + 1
                        await asyncio.sleep(1.0)
                started = time.monotonic()
                await asyncio.gather(*(worker(n, i) for n in names for i in (0, 1)))
                elapsed = time.monotonic() - started
                print(json.dumps({"jobs": a.jobs, "reports_per_second": round(sum(codes.values()) / elapsed, 1),
                                  "answers": codes, "seconds": round(elapsed, 1),
                                  "status_patches_per_second": round(patches["all"] / elapsed, 2),
                                  "progress_patches_per_second": round(patches["progress"] / elapsed, 2),
                                  "bound_per_second": a.jobs / settings.progress_write_seconds,
                                  "token_reviews": "cached 60 s per token"}))
            finally:
                await op.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["trainer", "operator"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--seconds", type=float, default=30)
    a = p.parse_args()
    if a.what == "trainer":
        trainer(a)
    else:
        asyncio.run(operator_bench(a))


if __name__ == "__main__":
    main()
