"""What the operator benchmarks share: a kubeconfig for the API emulator, the environment of one operator
replica started as `python -m ddpjob_operator.run` beside it, and the machine's name for the results."""

from __future__ import annotations

import os
import platform
from pathlib import Path

OPERATOR_NAMESPACE, LEASE_NAME = "ddpjob-system", "ddpjob-operator"
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: kmock, cluster: {server: "%s"}}]
users: [{name: bench, user: {}}]
contexts: [{name: kmock, context: {cluster: kmock, user: bench}}]
current-context: kmock
"""


def write_kubeconfig(tmp: Path, url: str) -> Path:
    path = tmp / "kubeconfig"
    path.write_text(KUBECONFIG % url)
    return path


def replica_env(kubeconfig: Path, name: str, watch_namespace: str, **settings: str) -> dict[str, str]:
    """The replica's environment: this process's without its DDPJOB_OPERATOR_* settings, then the pod's
    identity, no health or metrics port, the Lease, and `settings` (DDPJOB_OPERATOR_<KEY> = value)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPJOB_OPERATOR_")}
    env.update({"KUBECONFIG": str(kubeconfig), "POD_NAME": name, "POD_NAMESPACE": OPERATOR_NAMESPACE,
                "DDPJOB_OPERATOR_WATCH_NAMESPACES": watch_namespace, "DDPJOB_OPERATOR_HEALTH_PORT": "0",
                "DDPJOB_OPERATOR_METRICS_PORT": "0", "DDPJOB_OPERATOR_LEASE_NAME": LEASE_NAME})
    env.update({f"DDPJOB_OPERATOR_{key.upper()}": value for key, value in settings.items()})
    return env


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()
