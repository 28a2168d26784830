"""The trainer's side of the launch contract: the `DDPJOB_*` environment the operator and the local runner
set for every worker (operator/ddpjob_operator/builders.py writes it; agent/contract.py is the operator's
side), and where a job's own files live on its checkpoint volume. Standard library only: every runtime
module may import it, and it imports none of them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CHECKPOINT_DIR_ENV = "DDPJOB_CHECKPOINT_DIR"
JOB_NAME_ENV = "DDPJOB_NAME"
JOB_NAMESPACE_ENV = "DDPJOB_NAMESPACE"


def job_directory_name(name: str | None, namespace: str | None) -> str:
    """The job's own directory under the volume's mount: `<namespace>.<name>`, so two jobs of one name in two
    namespaces that share storage never read or prune each other's files. A namespace (a DNS-1123 label) and a
    DDPJob name (a DNS-1035 label) hold no '.', so the key is unambiguous and never equals the name alone,
    the layout before namespaces (see checkpoint.adopt_legacy_job_directory). Without a namespace (a plain
    script naming a job): the name alone; without a name: "" (the mount itself)."""
    if not name:
        return ""
    return f"{namespace}.{name}" if namespace else name


def job_root(mount: str | os.PathLike, env: Mapping[str, str] | None = None) -> Path:
    """`<mount>/<namespace>.<name>` for the job this process runs in (its environment), the mount without one."""
    e = os.environ if env is None else env
    key = job_directory_name(e.get(JOB_NAME_ENV) or None, e.get(JOB_NAMESPACE_ENV) or None)
    return Path(mount) / key if key else Path(mount)
