"""The Hugging Face Trainer on the cluster tier (issue 21): examples/hf as shipped, in its derived image
(`make images` builds it, `make kind-load` loads it, `make e2e` names it in DDPJOB_E2E_HF_IMAGE). A tiny
GPT-2 built from a config (HF_HUB_OFFLINE=1: nothing is downloaded) trains to the end through a
SIGKILLed worker with exactly one restart charged, resuming from the survivor's rescue checkpoint at most
one step behind the newest step seen before the kill (and never more than one checkpoint interval)."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from . import cluster
from .scenario import Training

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

HF_IMAGE = os.environ.get("DDPJOB_E2E_HF_IMAGE", "")
RESUMED = re.compile(r"resumed from checkpoint step=(\d+)")
RESCUED = re.compile(r"rescue checkpoint: rank \d+ saved step (\d+)")


def hf_manifest(max_steps: int) -> dict:
    manifest = yaml.safe_load((cluster.EXAMPLES / "hf" / "hf-tiny-lm.yaml").read_text())
    spec = manifest["spec"]
    spec["image"] = HF_IMAGE
    spec["checkpoint"]["claimTemplate"]["accessModes"] = list(cluster.CHECKPOINT_ACCESS_MODES)
    spec["args"] = ["--max-steps", str(max_steps), "--batch-size", "8", "--step-sleep", "0.05"]
    return manifest


def test_hf_trainer_survives_a_worker_kill(faults, namespace, operator):
    if not HF_IMAGE:
        pytest.skip("DDPJOB_E2E_HF_IMAGE is unset: build and load the derived image (make images kind-load), "
                    "then run make e2e")
    manifest = hf_manifest(max_steps=1500)
    interval = manifest["spec"]["checkpoint"]["intervalSteps"]
    t = Training(namespace, manifest).start()
    # Between two periodic checkpoints: a resume from the rescue, not from the last interval.
    t.wait(lambda: t.status.get("phase") == "Running" and t.status.get("worldSize") == 2
           and t.latest_step(0) >= 3 * interval + interval // 2, f"training at world size 2 past step {3 * interval}",
           900)
    before = t.latest_step(0)
    cluster.fault("kill", f"{namespace}/{t.pod(1)['metadata']['name']}", "--signal", "9")

    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    # Rank 0's survivor keeps its pod (created for generation 0) and resumes there: every pod that served
    # generation 1, created for it or carried into it in place (status.ranks).
    resumed = [int(m) for r in t.records.values() for m in RESUMED.findall(r.log_served(1))]
    assert resumed, f"generation 1 never resumed from a checkpoint: {t.describe()}"
    assert min(resumed) >= before - interval, f"resumed from step {min(resumed)}, more than {interval} behind {before}"
    rescued = [int(m) for r in t.records.values() for m in RESCUED.findall(r.log)]
    assert rescued and min(resumed) == max(rescued) >= before - 1, (
        f"resumed from {min(resumed)}, rescue checkpoints {rescued}, last step seen {before}: {t.describe()}")
