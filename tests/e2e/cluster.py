"""kubectl against the real cluster KUBECONFIG names; the e2e tests' only way to touch it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ddpjob_operator import model
from ddpjob_operator.builders import LABEL_JOB_NAME, LABEL_ROLE, ROLE_WORKER

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# Where `make helm-install` puts the operator; `make e2e` passes it on.
OPERATOR_NAMESPACE = os.environ.get("DDPJOB_E2E_OPERATOR_NAMESPACE", "ddpjob-system")
# The trainer image `make kind-load` loaded (the examples name the default one).
TRAINER_IMAGE = os.environ.get("DDPJOB_E2E_TRAINER_IMAGE")

T = TypeVar("T")


class KubectlError(RuntimeError):
    def __init__(self, args: list[str], result: subprocess.CompletedProcess):
        self.stderr = result.stderr
        super().__init__(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")


def why_no_cluster() -> str | None:
    """The reason e2e tests cannot run here, or None when a cluster answers."""
    if shutil.which("kubectl") is None:
        return "no Kubernetes cluster reachable: kubectl is not installed"
    if not os.environ.get("KUBECONFIG"):
        return "no Kubernetes cluster reachable: KUBECONFIG unset (run `make kind-up`, then `make e2e`)"
    result = subprocess.run(["kubectl", "cluster-info", "--request-timeout=10s"],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return f"no Kubernetes cluster reachable: kubectl cluster-info failed: {result.stderr.strip()[:300]}"
    return None


def kubectl(*args: str, stdin: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
    argv = list(args)
    result = subprocess.run(["kubectl", *argv], input=stdin, capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise KubectlError(argv, result)
    return result


def get_json(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def apply(manifest: dict[str, Any], namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(manifest))


def wait_for(check: Callable[[], T], what: str, timeout: float, interval: float = 3.0) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: T = check()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
        last = check()
    return last


def example(name: str, *, spec_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """An example manifest, with the image `make kind-load` loaded and optional spec overrides."""
    manifest = yaml.safe_load((EXAMPLES / name).read_text())
    if TRAINER_IMAGE:
        manifest["spec"]["image"] = TRAINER_IMAGE
    for key, value in (spec_overrides or {}).items():
        manifest["spec"][key] = value
    return manifest


def job(namespace: str, name: str) -> dict[str, Any]:
    return get_json(f"{model.PLURAL}.{model.GROUP}", name, "-n", namespace)


def condition(job_object: dict[str, Any], type_: str) -> str | None:
    for item in job_object.get("status", {}).get("conditions", []):
        if item["type"] == type_:
            return item["status"]
    return None


def wait_condition(namespace: str, name: str, type_: str, timeout: int) -> None:
    kubectl("wait", "-n", namespace, f"{model.PLURAL}.{model.GROUP}/{name}",
            f"--for=condition={type_}", f"--timeout={timeout}s", timeout=timeout + 30)


def _worker_selector(job_name: str) -> str:
    return f"{LABEL_JOB_NAME}={job_name},{LABEL_ROLE}={ROLE_WORKER}"


def live_workers(namespace: str, job_name: str) -> list[dict[str, Any]]:
    """Worker pods that exist and are not being deleted."""
    pods = get_json("pods", "-n", namespace, "-l", _worker_selector(job_name))
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def running_workers(namespace: str, job_name: str) -> list[dict[str, Any]]:
    return [p for p in live_workers(namespace, job_name) if p["status"].get("phase") == "Running"]


def worker_logs(namespace: str, job_name: str) -> str:
    result = kubectl("logs", "-n", namespace, "-l", _worker_selector(job_name),
                     "--tail=-1", "--prefix", "--max-log-requests=16", check=False)
    return result.stdout


STEP_LINE = re.compile(r"\bstep=(\d+) epoch=")
RESUMED_LINE = re.compile(r"resumed from checkpoint step=(\d+)")


def latest_step(logs: str) -> int:
    return max((int(m) for m in STEP_LINE.findall(logs)), default=0)


def owned_objects(namespace: str, owner_uid: str) -> list[str]:
    """`kind/name` of every pod, service and PVC in `namespace` that the owner owns."""
    found = []
    for kind in ("pods", "services", "persistentvolumeclaims"):
        for item in get_json(kind, "-n", namespace)["items"]:
            owners = item["metadata"].get("ownerReferences", [])
            if any(o["uid"] == owner_uid for o in owners):
                found.append(f"{kind}/{item['metadata']['name']}")
    return found


def gpu_nodes() -> dict[str, int]:
    """Node name -> allocatable nvidia.com/gpu, for nodes that have any."""
    nodes = get_json("nodes")["items"]
    counts = {n["metadata"]["name"]: int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0"))
              for n in nodes}
    return {name: count for name, count in counts.items() if count > 0}
