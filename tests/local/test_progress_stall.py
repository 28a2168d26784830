"""Issue 12 end to end with the local runner: a rank hangs mid-training (`--fault-hang-at-step`, a real
SIGSTOP of its trainer process), the step stops advancing, and after runPolicy.progressDeadlineSeconds the
decision layer stalls the job: one charged incident (reason Stalled), a gang restart in a new generation
that resumes from the checkpoint and trains to Succeeded. Real torchrun agents and the real trainer."""

from __future__ import annotations

import pytest

from .harness import TINY_DIGITS, Run, job_dir, manifest, write_manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_hung_rank_is_stalled_restarted_and_the_job_succeeds(tmp_path):
    args = ["--workload", "digits", "--epochs", "2", "--batch-size", "32", "--lr", "0.05", "--log-every", "5",
            "--fault-hang-at-step", "25", "--fault-rank", "1"]
    doc = manifest("hang", args=args, minReplicas=2, maxReplicas=2,
                   runPolicy={"progressDeadlineSeconds": 10},
                   failurePolicy={**TINY_DIGITS["failurePolicy"], "recovery": "Restart"},  # the restart path
                   # The frozen process only dies by SIGKILL: torchrun sends it after --shutdown-timeout.
                   template={"terminationGracePeriodSeconds": 6})
    run = Run(tmp_path, str(write_manifest(tmp_path, doc)))
    code, out = run.wait(400)
    assert code == 0, out
    # The hang really happened (rank 1's trainer froze itself), before the operator's verdict.
    rank1 = (job_dir(tmp_path, "hang") / "logs" / "hang-worker-1.log").read_text(errors="replace")
    assert "fault injection: rank 1 at step 25: hanging (SIGSTOP)" in rank1, rank1[-4000:]
    assert "Warning Stalled: no training progress for 10s" in out, out
    assert "restarting every worker in rendezvous generation 1" in out, out
    assert "job hang: Succeeded" in out, out
    # One charged restart, reported in the summary with the progress block.
    assert "restarts charged to the budget: 1" in out and "stalls detected: 1" in out, out
    # The survivor's collective timed out at the 5 s steady timeout, before the 10 s deadline's verdict: it saved
    # the step it held (a rescue checkpoint of step 25), not only the periodic one of step 20.
    assert "training resumed from the checkpoint of step 25" in out, out
    assert run.leftovers() == []
