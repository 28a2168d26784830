"""The Python API: create, wait for, follow, list, suspend, resume, scale and delete DDPJobs.

    from ddpjob_operator import client
    jobs = client.Client()                      # kubeconfig's current context, or in-cluster credentials
    job = jobs.create("examples/cpu-digits.yaml")
    for line in jobs.logs(job.name, rank=0, follow=True): print(line)
    job = jobs.wait(job.name)                   # Succeeded, or JobEnded naming the reason

One concern a module, each importing only the ones above it: `job.py` a job as read back; `errors.py` the
DDPJobError family; `manifests.py` manifests checked with the CRD's model before anything is sent;
`transport.py` credentials, TLS and HTTP (synchronous urllib: the same in a script and in a notebook, which
runs an event loop of its own); `creation.py` create and the API server's dry run of what a job creates;
`waits.py` watch, progress and wait; `pod_logs.py` a worker's log, followed across replacements;
`functions.py` a Python function as a job; `verbs.py` the `Client` (a thin front of verbs) and `submit`.
Users import this package (or `ddpjob`), never the modules. Never imports torch.
"""

from .errors import (ApiError, DDPJobError, InvalidArgument, InvalidManifest, InvalidName, JobEnded, JobExists,
                     JobNotFound, LogsUnavailable, WaitTimeout)
from .job import Job
from .manifests import as_manifest, load_manifests
from .transport import default_namespace
from .verbs import Client, submit

__all__ = [
    "Client", "Job", "submit", "load_manifests", "as_manifest", "default_namespace",
    "DDPJobError", "InvalidManifest", "InvalidArgument", "InvalidName", "JobNotFound", "JobExists", "WaitTimeout",
    "JobEnded", "LogsUnavailable", "ApiError",
]
