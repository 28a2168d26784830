"""The worker agent: the program every worker and spare container runs, and the local runner's zygote.

Plain modules (bootstrap.py, contract.py, worker.py with generations.py, operator_endpoint.py and spare.py,
store.py, zygote.py), run as files: `python DIRECTORY/bootstrap.py ROLE ARGS...` (`command`). The trainer image
has torch and no operator package, so a pod gets the files by reference: the job's agent ConfigMap
(job_manifests.agent_config_map: POD_SOURCES, named by POD_DIGEST) mounted read-only; the local runner runs them
from this package's directory. The operator imports contract.py only; the others run in the pod (or in the local
runner's processes), beside torch."""

import hashlib
import json
from pathlib import Path

from . import contract

__all__ = ["DIRECTORY", "ENTRY", "POD_DIGEST", "POD_SOURCES", "command", "contract", "digest"]

DIRECTORY = str(Path(__file__).resolve().parent)
ENTRY = "bootstrap.py"
# What a pod runs: the entry, the worker and the modules it imports, and the store's program (zygote.py is the
# local runner's only). tests/operator/test_the_agent_config_map_carries_every_module_a_pod_runs.py checks it.
POD_FILES = (ENTRY, "contract.py", "worker.py", "generations.py", "operator_endpoint.py", "spare.py", "store.py")
# Byte for byte the package's files (decoded, never newline-translated): what the ConfigMap carries.
POD_SOURCES = {name: (Path(DIRECTORY) / name).read_bytes().decode("utf-8") for name in POD_FILES}


def digest(sources: dict[str, str]) -> str:
    """12 hex digits of the sha256 of the files' names and contents: another agent, another ConfigMap name."""
    return hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()[:12]


POD_DIGEST = digest(POD_SOURCES)


def command(role: str, *, python: str, directory: str = DIRECTORY) -> list[str]:
    """The argv that runs the agent module `role` (bootstrap.ROLES) from the files in `directory`; its own
    arguments follow."""
    return [python, f"{directory}/{ENTRY}", role]
