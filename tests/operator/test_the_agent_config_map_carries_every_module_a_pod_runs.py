"""A pod runs the agent from its job's agent ConfigMap alone (its image has no operator package): the entry a
rendered pod's command names, the role's module and every agent module those import (at the top or inside a
function) must be keys of the ConfigMap, or the pod fails at the import that is missing. Read with ast: a module
split in two (issue 37) is caught here, before a real process trips on it."""

from __future__ import annotations

import ast
from pathlib import Path

from ddpjob_operator import agent, job_manifests, model, naming

JOB = naming.JobRef("digits", "team-a", "0b9f6d0e-uid")
SPEC = model.DDPJobSpec.model_validate({"replicas": 1, "image": "trainer:1", "entrypoint": "train.py"})


def agent_modules_imported_by(file_name: str) -> set[str]:
    """The agent's files that `file_name` (an agent file) imports relatively, directly."""
    tree = ast.parse((Path(agent.DIRECTORY) / file_name).read_text(), file_name)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [alias.name for alias in node.names]
            found.update(f"{name.split('.')[0]}.py" for name in names)
    return found


def needed_by(entry_files: set[str]) -> set[str]:
    needed, pending = set(), set(entry_files)
    while pending:
        name = pending.pop()
        needed.add(name)
        pending |= agent_modules_imported_by(name) - needed
    return needed


def test_every_agent_module_a_rendered_pod_runs_is_in_the_agent_config_map():
    pods = [job_manifests.worker_pod(JOB, SPEC, index=0, generation=0),
            job_manifests.spare_pod(JOB, SPEC, serial=0, generation=0), job_manifests.store_pod(JOB, SPEC)]
    entries = set()
    for pod in pods:
        _, entry, role = pod["spec"]["containers"][0]["command"][:3]
        entries |= {Path(entry).name, f"{role}.py"}
    assert entries >= {"bootstrap.py", "worker.py", "store.py"}, entries
    carried = set(job_manifests.agent_config_map(JOB)["data"])
    missing = needed_by(entries) - carried
    assert not missing, f"the pods import {sorted(missing)}, which the agent ConfigMap lacks: add them to " \
                        f"agent.POD_FILES (it carries {sorted(carried)})"
