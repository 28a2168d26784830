"""The trainer's side of the launch contract (docs/launch-contract.md): every `DDPJOB_*` variable the trainer
reads, by one name each, and where a job's own files live on its checkpoint volume. The operator and the local
runner set them for every worker (operator/ddpjob_operator/launch.py, worker_env; agent/contract.py is the
operator's side, and tests/trainer/test_trainer_contract_names_are_the_operators.py keeps the two equal).
Standard library only: every runtime module may import it, and it imports none of them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CHECKPOINT_DIR_ENV = "DDPJOB_CHECKPOINT_DIR"  # the volume's mount; empty or unset: no checkpoints
JOB_NAME_ENV = "DDPJOB_NAME"
JOB_NAMESPACE_ENV = "DDPJOB_NAMESPACE"  # "local" in `ddpjob run --local`
CHECKPOINT_INTERVAL_ENV = "DDPJOB_CHECKPOINT_INTERVAL_STEPS"
CHECKPOINT_KEEP_ENV = "DDPJOB_CHECKPOINT_KEEP"
REPLICA_INDEX_ENV = "DDPJOB_REPLICA_INDEX"  # i of the pod <job>-worker-<i>
# The rendezvous generation the pod was started for; a survivor's may be stale: torchrun's run id says which one a
# trainer runs in (checkpoint.rendezvous_generation).
GENERATION_ENV = "DDPJOB_GENERATION"
INPROCESS_ENV = "DDPJOB_INPROCESS"  # "1": in-process recovery (runtime/inprocess.py); "" off
REJOIN_TIMEOUT_ENV = "DDPJOB_REJOIN_TIMEOUT_SECONDS"
SPARE_PLACE_ENV = "DDPJOB_SPARE_PLACE_KEY"  # set by a warm spare's agent in its trainers' environment only
PROGRESS_URL_ENV = "DDPJOB_PROGRESS_URL"
PROGRESS_TOKEN_ENV = "DDPJOB_PROGRESS_TOKEN_FILE"  # the bearer token's file, read at each send (it rotates)
PROGRESS_CA_ENV = "DDPJOB_PROGRESS_CA"  # PEM text (not a path): the CA an https progress endpoint chains to
PROGRESS_FILE = "progress.json"  # global rank 0's newest report, in the job's own directory (job_root)
RESULT_FILE = "result.json"  # rank 0's summary at a successful end, beside it


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


def env_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    """An integer variable of the contract (or torchrun's); `default` where it is unset or "" (the operator sets a
    variable that is off to ""). Anything else that is not an integer: ValueError naming the variable."""
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment {name} must be an integer, got {raw!r}") from None
