"""Bring your own script on the cluster tier (issue 11): examples/byo as shipped, in its derived image
(`make images` builds it, `make kind-load` loads it, `make e2e` names it in DDPJOB_E2E_BYO_IMAGE). It
trains to the end through a SIGKILLed worker with exactly one restart charged, resuming from a
checkpoint at most one interval behind."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from . import cluster
from .scenario import Training

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

BYO_IMAGE = os.environ.get("DDPJOB_E2E_BYO_IMAGE", "")
RESUMED = re.compile(r"resumed from checkpoint step=(\d+)")


def byo_manifest(max_steps: int) -> dict:
    manifest = yaml.safe_load((cluster.EXAMPLES / "byo" / "byo-text.yaml").read_text())
    spec = manifest["spec"]
    spec["image"] = BYO_IMAGE
    spec["checkpoint"]["claimTemplate"]["accessModes"] = list(cluster.CHECKPOINT_ACCESS_MODES)
    spec["args"] = [a if prev != "--max-steps" else str(max_steps)
                    for prev, a in zip([None, *spec["args"]], spec["args"])]
    return manifest


def test_byo_script_survives_a_worker_kill(faults, namespace, operator):
    if not BYO_IMAGE:
        pytest.skip("DDPJOB_E2E_BYO_IMAGE is unset: build and load the derived image (make images kind-load), "
                    "then run make e2e")
    manifest = byo_manifest(max_steps=3000)
    interval = manifest["spec"]["checkpoint"]["intervalSteps"]
    t = Training(namespace, manifest).start()
    t.wait(lambda: t.status.get("phase") == "Running" and t.status.get("worldSize") == 2
           and t.latest_step(0) >= 5 * interval, f"training at world size 2 past step {5 * interval}", 900)
    before = t.latest_step(0)
    cluster.fault("kill", f"{namespace}/{t.pod(1)['metadata']['name']}", "--signal", "9")

    t.wait_terminal()
    t.assert_outcome(phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1)
    resumed = [int(m) for r in t.records.values() if r.generation == 1 for m in RESUMED.findall(r.log)]
    assert resumed, f"generation 1 never resumed from a checkpoint: {t.describe()}"
    assert min(resumed) >= before - interval, f"resumed from step {min(resumed)}, more than {interval} behind {before}"
