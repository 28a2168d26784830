"""What got in a newcomer's way adopting the runtime library from docs/your-own-script.md alone (issue 21):
each item, fixed in the library, the runner or the guide, checked here. Runs use the real local runner
(torchrun agents, Gloo) with a tiny script of the test's own."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from ddpjob_operator import job_manifests, launch, model, naming, validation
from ddpjob_operator.local import faults as fault_schedule
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import KILL, FaultInjection, RunOptions
from ddpjob_operator.local.view import Summary
from ddp_trainer.runtime import ResumableDistributedSampler

from .harness import TimelineView

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "your-own-script.md").read_text()

# One script, several behaviours: `threads` prints its thread count; `steps` prints rank 0's step lines and
# never calls job.report(); `quiet` trains N seconds and says nothing; `checkpoint` reports every 5 steps and
# saves once at the end, after its last report; `idle` waits for SIGTERM.
SCRIPT = textwrap.dedent('''
    import os, signal, sys, time
    mode, steps = sys.argv[1], int(sys.argv[2])
    if mode == "threads":
        import torch
        print(f"threads env={os.environ.get('OMP_NUM_THREADS')} torch={torch.get_num_threads()}", flush=True)
    elif mode == "steps":
        for step in range(1, steps + 1):
            print(f"step={step} epoch=0 loss=1.0", flush=True)
            time.sleep(0.1)
    elif mode == "quiet":
        time.sleep(steps)
    elif mode == "idle":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
    else:
        from ddp_trainer.runtime import Job, exit_process
        with Job.start() as job:
            start = (job.resume() or {}).get("step", 0)
            for step in range(start + 1, steps + 1):
                if step % 5 == 0:
                    job.report(step=step, total_steps=steps, loss=0.5)
            job.save(steps, {"step": steps}, final=True)
            job.result(step=steps, loss=0.5)
        exit_process(0)
''')


def job(tmp_path: Path, name: str, mode: str, steps: int = 12, **spec) -> validation.model.DDPJob:
    script = tmp_path / "newcomer.py"
    script.write_text(SCRIPT)
    body = {"replicas": 1, "image": "ghcr.io/ddpjob/ddp-trainer:0.1.0", "entrypoint": str(script),
            "args": [mode, str(steps)], "rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 1},
            "checkpoint": {"claimTemplate": {"size": "1Gi"}, "intervalSteps": 1000},
            "failurePolicy": {"maxRestarts": 1, "backoff": {"initialSeconds": 0, "maxSeconds": 1}},
            "template": {"terminationGracePeriodSeconds": 10}, **spec}
    return validation.parse_job({"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                 "metadata": {"name": name}, "spec": body})


def run(tmp_path: Path, the_job, view=None, **options) -> tuple[LocalRunner, TimelineView, str]:
    view = view or TimelineView(timeout=180)
    runner = LocalRunner(the_job, RunOptions(state_dir=tmp_path / ".ddpjob", **options), view)
    runner.run()
    logs = "".join(p.read_text(errors="replace") for p in sorted(runner.log_dir.glob("*-worker-*.log")))
    return runner, view, logs


# ---- the guide ------------------------------------------------------------------------------------

def test_the_guide_shows_a_manifest_that_validates_and_says_where_the_entrypoint_is_and_what_runs_it():
    manifests = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", GUIDE, re.DOTALL)]
    jobs = [validation.parse_job(doc) for doc in manifests if isinstance(doc, dict) and doc.get("kind") == "DDPJob"]
    assert jobs and jobs[0].spec.entrypoint.endswith(".py")
    assert "relative to the working directory" in GUIDE
    assert "interpreter" in GUIDE and "sys.executable" in GUIDE


def test_the_guides_checkpoint_holds_the_scheduler_and_says_to_step_everything_before_the_next_collective():
    code = re.search(r"```python\n(.*?)```", GUIDE, re.DOTALL).group(1)
    assert '"scheduler": scheduler.state_dict()' in code and "scheduler.step()" in code
    assert "sampler.advance(batch)" in code and "len(batch" not in GUIDE
    assert "every stateful object" in GUIDE and "before the next collective" in GUIDE


def test_the_api_table_has_steady_timeout_the_samples_per_second_field_and_result_with_a_loss():
    table = GUIDE[GUIDE.index("### The API"):]
    assert "steady_timeout_s=0" in table.split("\n| `job.env`")[0]
    assert "`samples_per_second`" in table and "samples/s" in table
    assert "job.result(step=step, loss=" in GUIDE


# ---- the library ----------------------------------------------------------------------------------

def test_sampler_advance_takes_the_batch_itself_dict_batches_included():
    for batch in ({"input_ids": torch.zeros(16, 7), "labels": torch.zeros(16)}, (torch.zeros(16, 3), torch.zeros(16)),
                  torch.zeros(16, 2), 16):
        sampler = ResumableDistributedSampler(1000, 0, 2, seed=1)
        sampler.advance(batch)
        assert sampler.state_dict()["consumed"] == 32, batch  # 16 on each of 2 ranks


def test_the_resume_line_shows_without_any_logging_setup(tmp_path: Path):
    code = textwrap.dedent(f'''
        import torch
        from ddp_trainer.runtime import Job, JobEnv, StopRequest
        env = JobEnv(rank=0, local_rank=0, world_size=1, checkpoint_dir={str(tmp_path)!r})
        job = Job(env, torch.device("cpu"), StopRequest())
        job.save(7, {{"step": 7}}, final=True)
        job.resume()
        job.close()
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "resumed from checkpoint step=7 (saved at world_size=1, now 1)" in done.stderr, done.stderr


# ---- the builders: threads ------------------------------------------------------------------------

@pytest.mark.parametrize("cpu, nproc, env, expected", [
    ("4", 1, [], "4"), ("4", 2, [], "2"), ("500m", 1, [], "1"), ("2500m", 1, [], "2"),
    (None, 1, [], None), ("4", 1, [{"name": "OMP_NUM_THREADS", "value": "3"}], None)])
def test_omp_num_threads_defaults_to_the_cpu_request_per_process(cpu, nproc, env, expected):
    spec = validation.parse_spec({"replicas": 1, "image": "x:1", "entrypoint": "train.py", "nprocPerNode": nproc,
                                  "env": env, "resources": {"cpu": cpu} if cpu else {}})
    got = launch.worker_env(spec, job_name="j", namespace="n", index=0, generation=0, endpoint="e:1",
                            rdzv_id="u-g0", local_addr="a", master_addr="m")
    assert got.get("OMP_NUM_THREADS") == expected
    pod = job_manifests.worker_pod(naming.JobRef("j", "n", "u"), spec, index=0, generation=0)
    values = [e.get("value") for e in pod["spec"]["containers"][0]["env"] if e["name"] == "OMP_NUM_THREADS"]
    assert values == [expected or "3"] if env else values == ([expected] if expected else [])


@pytest.mark.slow
def test_a_local_trainer_gets_the_thread_count_of_its_cpu_request(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    runner, view, logs = run(tmp_path, job(tmp_path, "threads", "threads", resources={"cpu": "1"}))
    assert runner.status.phase == "Succeeded", view.transcript() + logs
    assert "threads env=1 torch=1" in logs, logs


# ---- the runner -----------------------------------------------------------------------------------

def test_the_summary_shows_the_scripts_own_result_not_the_bundled_trainers_fields():
    summary = Summary(job="j", phase="Succeeded", message="", elapsed_s=1.0, restarts=0, disruptions=0,
                      worker_restarts={}, result={"status": "completed", "world_size": 2, "step": 300, "loss": 0.25},
                      checkpoint_dir="/c", log_dir="/l")
    metrics = next(line for line in summary.lines() if line.startswith("final metrics:"))
    assert metrics == "final metrics: step 300, loss 0.2500, world_size 2"


def test_the_summary_gives_one_figure_per_fact_the_final_loss_and_the_newest_checkpoint_on_disk():
    """The last progress report lags the end: its loss and its checkpoint step are not shown beside the
    result's loss and the checkpoint on disk (issue 32 item 5: "last checkpoint step 180" beside "newest
    checkpoint: step 200", two final losses)."""
    lagging = model.Progress(step=190, total_steps=200, percent=95, loss=0.31, samples_per_second=50.0,
                             last_checkpoint_step=180)
    summary = Summary(job="j", phase="Succeeded", message="", elapsed_s=1.0, restarts=0, disruptions=0,
                      worker_restarts={}, result={"status": "completed", "step": 200, "loss": 0.25},
                      checkpoint_dir="/c", log_dir="/l", progress=lagging, newest_checkpoint=(200, "/c/step-200"))
    text = "\n".join(summary.lines())
    assert "0.3100" not in text and "180" not in text, text
    assert "loss 0.2500" in text and "newest checkpoint: step 200" in text, text
    # Without a checkpoint directory the report's checkpoint step is all there is; without a result, its loss.
    alone = Summary(job="j", phase="Failed", message="", elapsed_s=1.0, restarts=0, disruptions=0,
                    worker_restarts={}, result=None, checkpoint_dir=None, log_dir="/l", progress=lagging)
    assert "loss 0.3100" in "\n".join(alone.lines()) and "last checkpoint step 180" in "\n".join(alone.lines())


@pytest.mark.slow
def test_kill_at_step_fires_on_step_lines_of_a_script_that_reports_no_progress(tmp_path: Path):
    # 30 lines, 0.1 s apart: the kill came 2 steps after step 15, the replacement prints all 30 again (3 s).
    runner, view, logs = run(tmp_path, job(tmp_path, "lines", "steps", steps=30),
                             faults=(FaultInjection(index=0, at_step=15, kind=KILL),))
    described = view.transcript()
    assert runner.status.phase == "Succeeded" and runner.status.restarts == 1, described
    fired = view.first_event("fault injection: killed lines-worker-0")
    assert fired and 15 <= int(re.search(r"trainer step (\d+)", fired[1]).group(1)) < 30, described
    # The step it names is the one it killed at, or it says it was asked for another (issue 32 item 5).
    killed_at = int(re.search(r"trainer step (\d+)", fired[1]).group(1))
    assert killed_at == 15 or "asked for step 15: " in fired[1], fired


@pytest.mark.slow
def test_kill_at_step_that_cannot_fire_is_said_during_the_run_and_in_the_summary(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(fault_schedule, "NO_PROGRESS_WARNING_SECONDS", 0.5)
    runner, view, _ = run(tmp_path, job(tmp_path, "silent", "quiet", steps=3),
                          faults=(FaultInjection(index=0, at_step=5, kind=KILL),))
    assert runner.status.phase == "Succeeded" and runner.status.restarts == 0, view.transcript()
    assert view.first_event("--kill-at-step 5 waits for the trainer to report a step"), view.transcript()
    assert any(line.startswith("--kill-at-step 5 never fired") for line in view.summary.lines())


def test_kill_at_step_without_a_checkpoint_volume_is_refused_before_the_run(tmp_path: Path):
    doc = {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "nock"},
           "spec": {"replicas": 1, "image": "x:1", "entrypoint": "train.py"}}
    path = tmp_path / "nock.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "run", str(path), "--local", "--kill-worker",
                           "0", "--kill-at-step", "5"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == validation.EXIT_INVALID, done.stderr
    assert "--kill-at-step" in done.stderr and "spec.checkpoint" in done.stderr, done.stderr


class InterruptWhenRunning(TimelineView):
    """Ctrl-C, as a user presses it, once the trainer is up."""

    def __init__(self, runner_ref: list) -> None:
        super().__init__(timeout=120)
        self.runner_ref = runner_ref

    def log_line(self, pod: str, line: str) -> None:
        pass

    def update(self, snap) -> None:
        super().update(snap)
        runner = self.runner_ref[0] if self.runner_ref else None
        if runner is not None and not runner._signals and any(
                "ready" in p.read_text(errors="replace") for p in runner.log_dir.glob("*-worker-*.log")):
            runner._on_signal(signal.SIGINT, None)


@pytest.mark.slow
def test_an_interrupted_run_without_a_checkpoint_says_so(tmp_path: Path):
    ref: list = []
    view = InterruptWhenRunning(ref)
    runner = LocalRunner(job(tmp_path, "idle", "idle"), RunOptions(state_dir=tmp_path / ".ddpjob"), view)
    ref.append(runner)
    runner.run()
    assert runner.interrupted
    assert "no checkpoint was written" in view.summary.message and "checkpointed" not in view.summary.message
    assert "newest checkpoint: none" in view.summary.lines()


@pytest.mark.slow
def test_the_summary_names_the_newest_checkpoint_on_disk_and_logs_follow_the_checkpoints(tmp_path: Path):
    the_job = job(tmp_path, "ckpt", "checkpoint", steps=12)
    runner, view, logs = run(tmp_path, the_job)
    assert runner.status.phase == "Succeeded", view.transcript() + logs
    # The last progress report said step 10; the final save after it is step 12.
    assert view.summary.newest_checkpoint[0] == 12, view.summary
    assert any(line.startswith("newest checkpoint: step 12 ") for line in view.summary.lines())
    assert view.summary.result["loss"] == 0.5
    # A new run starts with empty checkpoints and empty logs; --resume keeps both.
    again, _, logs = run(tmp_path, the_job)
    assert logs.count("---- ckpt-worker-0:") == 1, logs
    resumed, _, logs = run(tmp_path, the_job, resume=True)
    assert logs.count("---- ckpt-worker-0:") == 2, logs
    assert resumed.resumes and resumed.resumes[0].step == 12
