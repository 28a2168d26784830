"""The client's errors: every one a DDPJobError whose message says what happened and the fix."""

from __future__ import annotations

from typing import Any

from .. import object_names, validation
from .job import Job


class DDPJobError(Exception):
    """Every error of this API: its message says what happened and the fix."""


class InvalidManifest(validation.InvalidJob, DDPJobError):
    """The manifest breaks a rule of the CRD: `errors` are `ddpjob validate`'s, each with its field and fix."""


class InvalidArgument(DDPJobError, ValueError):
    """An argument no call can take (a rank that is no whole number, an option `submit` does not have): refused
    before anything is sent, naming the argument and the fix."""


class InvalidName(InvalidArgument, object_names.InvalidName):
    """A name or namespace no object can have (empty, holding '/', not a DNS label ...): refused before anything
    is sent, since an empty name addresses the whole collection (a delete there deletes every DDPJob)."""


def checked_name(value: Any, rule: object_names.NameRule, argument: str) -> str:
    """`value` when an object of `rule`'s kind can have it, else the client's InvalidName naming `argument`."""
    try:
        return object_names.check(value, rule, argument)
    except object_names.InvalidName as exc:
        raise InvalidName(str(exc)) from None


class JobNotFound(DDPJobError):
    def __init__(self, namespace: str, name: str):
        self.namespace, self.name = namespace, name
        super().__init__(f"ddpjob {name} not found in namespace {namespace} (404). Fix: check the name and the "
                         f"namespace (`ddpjob list -n {namespace}` lists the jobs there)")


class JobExists(DDPJobError):
    def __init__(self, namespace: str, name: str):
        self.namespace, self.name = namespace, name
        super().__init__(f"ddpjob {name} already exists in namespace {namespace} (409). Fix: pick another "
                         f"metadata.name, or delete the old job first (`ddpjob delete {name} -n {namespace}`)")


class WaitTimeout(DDPJobError, TimeoutError):
    """`wait` gave up: what it waited for, and the job's last status."""

    def __init__(self, what: str, timeout: float, job: Job):
        self.job = job
        super().__init__(f"timed out after {timeout:g}s waiting for ddpjob {job.namespace}/{job.name} {what}; "
                         f"last status: {job.describe()}")


class JobEnded(DDPJobError):
    """The job reached a terminal phase other than the one awaited (a Failed job while waiting for Succeeded)."""

    def __init__(self, what: str, job: Job):
        self.job = job
        super().__init__(f"ddpjob {job.namespace}/{job.name} ended {job.phase} while waiting for it {what}: "
                         f"{job.describe()}")


class LogsUnavailable(DDPJobError):
    """The worker pod has no log to show (not created yet, or its container not started)."""


class ApiError(DDPJobError):
    """Any other answer of the API server, quoted."""

    def __init__(self, status: int, reason: str, message: str, what: str = ""):
        self.status, self.reason, self.message = status, reason, message
        hint = {401: " Fix: your credentials were refused; log in again (kubeconfig) or check the token",
                403: " Fix: your account lacks this permission (RBAC); ask for it, or use another namespace"}
        super().__init__(f"{what}{': ' if what else ''}HTTP {status} {reason}: {message}.{hint.get(status, '')}")
