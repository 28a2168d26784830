"""The worker agent as a pod runs it: the job's agent ConfigMap written where the kubelet mounts it (read-only
files in a read-only directory, under `root` in place of /), and the launcher of the pod's own command pointed
there, on this interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

from ddpjob_operator import job_manifests, model, naming

JOB = naming.JobRef("digits", "team-a", "0b9f6d0e-uid")
SPEC = model.DDPJobSpec.model_validate({"replicas": 1, "image": "trainer:1", "entrypoint": "train.py"})


def mount_agent(root: Path) -> list[str]:
    """The pod's launcher (its command up to torchrun's flags), running the ConfigMap's files under `root`."""
    pod = job_manifests.worker_pod(JOB, SPEC, index=0, generation=0)
    config_map = job_manifests.agent_config_map(JOB)
    volume = next(v for v in pod["spec"]["volumes"]
                  if v.get("configMap", {}).get("name") == config_map["metadata"]["name"])
    container = pod["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] is True
    directory = root / mount["mountPath"].lstrip("/")
    directory.mkdir(parents=True)
    for key, text in config_map["data"].items():
        (directory / key).write_bytes(text.encode())
        (directory / key).chmod(volume["configMap"]["defaultMode"])
    directory.chmod(0o555)
    python, entry, role = container["command"][:3]
    assert python == "python" and entry.startswith(mount["mountPath"] + "/"), container["command"]
    return [sys.executable, str(root) + entry, role]
