"""A script on `Job` that only reports: N steps (argv[1], default 3), then its result and a clean exit (Job.close
sends the last report)."""

import sys

from ddp_trainer.runtime import Job

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
with Job.start(device="cpu") as job:
    for step in range(1, steps + 1):
        job.report(step=step, total_steps=steps, loss=1.0 / step)
    job.result(step=steps)
