"""The Python API for DDPJobs: `import ddpjob`.

    import ddpjob
    jobs = ddpjob.Client()                      # kubeconfig's current context, or in-cluster credentials
    job = jobs.create("examples/cpu-digits.yaml")
    for line in jobs.logs(job.name, rank=0, follow=True): print(line)
    job = jobs.wait(job.name)                   # Succeeded, or JobEnded naming the reason
    ddpjob.submit(train, replicas=2)            # a Python function as a job

A thin front: the same objects as `ddpjob_operator.client` (which keeps working), with the CRD's model
(`ddpjob.DDPJob`, `ddpjob.model`) and function jobs (`ddpjob.function_job`: `build`, `run_local`) beside
them. The `ddpjob` command is another thing (`ddpjob_operator.cli`). Never imports torch. docs/python-api.md.
"""

from ddpjob_operator import function_job, model
from ddpjob_operator.client import (ApiError, Client, DDPJobError, InvalidArgument, InvalidManifest, InvalidName, Job,
                                    JobEnded, JobExists, JobNotFound, LogsUnavailable, WaitTimeout, as_manifest,
                                    default_namespace, load_manifests, submit)
from ddpjob_operator.model import DDPJob, DDPJobSpec, DDPJobStatus
from ddpjob_operator.validation import FieldError

__all__ = [
    "Client", "Job", "submit", "load_manifests", "as_manifest", "default_namespace",
    "DDPJobError", "InvalidManifest", "InvalidArgument", "InvalidName", "JobNotFound", "JobExists", "WaitTimeout", "JobEnded",
    "LogsUnavailable", "ApiError", "FieldError",
    "DDPJob", "DDPJobSpec", "DDPJobStatus", "model", "function_job",
]
