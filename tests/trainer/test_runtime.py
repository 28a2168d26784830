"""ddp_trainer.runtime on its own: dependencies, the progress client, the sampler's resume state; and the
bundled trainer's plug-in API with dict batches (real torchrun)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from ddp_trainer.runtime import (CheckpointDirError, ProgressReporter, ResumableDistributedSampler, ResumeMismatch,
                                 check_writable)
from trainer_harness import job_dir, base_env, read_json, run, tail, torchrun_cmd, wait_for


def test_the_runtime_library_imports_nothing_beyond_torch_and_the_standard_library() -> None:
    code = ("import sys; import torch; before = set(sys.modules); import ddp_trainer.runtime; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    new = set(eval(out))  # noqa: S307 - our own output
    assert new - set(sys.stdlib_module_names) == {"ddp_trainer"}, new
    imported = subprocess.run([sys.executable, "-c", "import sys, ddp_trainer.runtime; "
                               "print([m for m in sys.modules if m.startswith('ddp_trainer.')])"],
                              capture_output=True, text=True, check=True).stdout
    assert "ddp_trainer.config" not in imported and "ddp_trainer.trainer" not in imported  # no sklearn either


def test_progress_is_a_no_op_when_unconfigured_and_on_other_ranks(tmp_path: Path) -> None:
    for reporter in (ProgressReporter(), ProgressReporter(tmp_path, enabled=False),
                     ProgressReporter.from_env({"RANK": "1", "DDPJOB_CHECKPOINT_DIR": str(tmp_path)})):
        reporter.report(step=1, loss=0.5)
        reporter.close()
        assert reporter._thread is None
    assert not (tmp_path / "progress.json").exists()


def test_progress_never_blocks_training_and_the_newest_report_wins(tmp_path: Path) -> None:
    reporter = ProgressReporter(tmp_path)
    real_send, writing, release = reporter._send, threading.Event(), threading.Event()
    sent: list[int] = []

    def hanging(values):  # a disk (or endpoint) whose write returns only when the test lets it go
        sent.append(values["step"])
        real_send(values)
        if threading.current_thread() is not threading.main_thread():  # a report() that waited would hang
            writing.set()
            release.wait(60)

    reporter._send = hanging
    reporter.report(step=1, total_steps=1000, loss=1.0, epoch=0)
    assert writing.wait(60), "the first report was never written"
    for step in range(2, 1001):  # all of them while that write hangs: report() returns at once
        reporter.report(step=step, total_steps=1000, loss=1.0 / step, epoch=0)
    assert sent == [1]
    release.set()
    reporter.close()
    assert sent == [1, 1000]  # the newest only, once
    progress = read_json(tmp_path / "progress.json")
    assert progress["step"] == 1000 and progress["total_steps"] == 1000 and progress["epoch"] == 0


def test_progress_posts_to_the_url_and_survives_a_dead_endpoint(tmp_path: Path, caplog) -> None:
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reporter = ProgressReporter(None, f"http://127.0.0.1:{server.server_port}/progress")
        reporter.report(step=7, total_steps=10, loss=0.25)
        reporter.close()
    finally:
        server.shutdown()
    assert received and received[-1]["step"] == 7 and received[-1]["total_steps"] == 10
    with caplog.at_level(logging.DEBUG, logger="ddp_trainer"):
        dead = ProgressReporter(None, f"http://127.0.0.1:{server.server_port}/gone", http_timeout_s=0.5)
        dead.report(step=1)
        dead.report(step=2)
        dead.close()
    # A transient failure (issue 23): at debug level only, never a warning; training unaffected.
    assert "progress POST" in caplog.text and not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_progress_http_sends_the_token_retries_a_503_and_heartbeats(tmp_path: Path) -> None:
    """Issue 12's endpoint: a bearer token read at each send, a standby's 503 retried at once, and
    the newest report again every heartbeat while nothing new comes."""
    seen: list[tuple[int, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            code = 503 if not seen else 204
            seen.append((code, self.headers.get("Authorization", ""), body))
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("secret-1\n")
    try:
        env = {"RANK": "3", "LOCAL_RANK": "0", "DDPJOB_PROGRESS_URL": f"http://127.0.0.1:{server.server_port}/p",
               "DDPJOB_PROGRESS_TOKEN_FILE": str(token), "DDPJOB_CHECKPOINT_DIR": str(tmp_path)}
        reporter = ProgressReporter.from_env(env)
        reporter.heartbeat_s = 0.2
        reporter.min_interval_s = 0.05  # the default paces POSTs to one a second (issue 12)
        reporter.report(step=5, total_steps=10, loss=0.5)
        wait_for(lambda: len(seen) >= 2, "the report, retried after the 503", 30)
        token.write_text("secret-2\n")  # rotated by the kubelet
        # Nothing new is reported: only a heartbeat sends again, and it reads the token afresh.
        wait_for(lambda: any(a == "Bearer secret-2" for _, a, _ in seen), "a heartbeat with the new token", 30)
        reporter.close()
    finally:
        server.shutdown()
    assert [c for c, _, _ in seen[:2]] == [503, 204] and len(seen) >= 3, seen
    assert {b["step"] for _, _, b in seen} == {5} and seen[0][2]["rank"] == 3
    assert seen[0][1] == "Bearer secret-1" and seen[-1][1] == "Bearer secret-2"
    assert not (tmp_path / "progress.json").exists()  # the file is global rank 0's


def test_sampler_state_resumes_at_another_world_size_and_refuses_another_seed() -> None:
    n, batch = 100, 5
    before = [ResumableDistributedSampler(n, r, 2, seed=3) for r in range(2)]
    consumed = []
    for s in before:
        s.set_epoch(1)
        consumed += list(s)[: 4 * batch]
        for _ in range(4):
            s.advance(batch)
    state = before[0].state_dict()
    assert state["consumed"] == 40 and state["epoch"] == 1
    after = ResumableDistributedSampler(n, 0, 1, seed=3)
    after.load_state_dict(state)
    assert sorted(consumed + list(after)) == list(range(n))
    with pytest.raises(ResumeMismatch, match=r"seed=3 \(this run: 4\)"):
        ResumableDistributedSampler(n, 0, 1, seed=4).load_state_dict(state)


def test_check_writable_names_the_path_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointDirError, match=r"checkpoint directory .*/file/ckpt is not writable by uid \d+"):
        check_writable(tmp_path / "file" / "ckpt")


DICT_WORKLOAD = '''
import torch
from torch import nn

class Text(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.randint(1, 20, (int(l),), generator=g) for l in torch.randint(2, 9, (n,), generator=g)]
    def __len__(self):
        return len(self.items)
    def __getitem__(self, i):
        ids = self.items[i]
        return {"input_ids": ids, "labels": int((ids == 3).any())}

def collate_fn(samples):
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    for r, s in enumerate(samples):
        ids[r, :len(s["input_ids"])] = s["input_ids"]
    return {"input_ids": ids, "labels": torch.tensor([s["labels"] for s in samples])}

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(20, 16, padding_idx=0)
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 2)
    def forward(self, input_ids, labels=None):
        logits = self.head(self.norm(self.embed(input_ids)))
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}

def build_datasets(cfg):
    return Text(512, 0), Text(128, 1)

def build_model(cfg):
    return Model()

def train_step(model, batch, cfg):
    return model(**batch)["loss"] * cfg.workload.get("loss_scale", 1.0)
'''


@pytest.mark.slow
def test_plugin_with_dict_batches_collate_fn_train_step_and_ddp_options(tmp_path: Path) -> None:
    (tmp_path / "dict_task.py").write_text(DICT_WORKLOAD)
    ckpt = tmp_path / "ckpt"
    env = base_env(ckpt, PYTHONPATH=str(tmp_path))
    args = ["--workload", "dict_task", "--workload-option", "loss_scale=1.0", "--epochs", "3", "--batch-size", "16",
            "--lr", "0.01", "--log-every", "5", "--ddp-static-graph",
            "--ddp-gradient-as-bucket-view", "--ddp-bucket-cap-mb", "1", "--num-workers", "1"]
    assert run(torchrun_cmd(args, nproc=2), env, tmp_path / "log", 120) == 0, tail(tmp_path / "log")
    result = read_json(job_dir(ckpt) / "result.json")
    assert result["status"] == "completed" and result["eval_accuracy"] is None and result["eval_loss"] < 0.69
    log = (tmp_path / "log").read_text()
    assert "step=5 epoch=0 loss=" in log and log.count("eval epoch=") == 3
