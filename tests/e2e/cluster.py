"""kubectl against the real cluster KUBECONFIG names; the e2e tests' only way to touch it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ddpjob_operator import model
from ddpjob_operator.naming import LABEL_JOB_NAME, LABEL_ROLE, ROLE_STORE, ROLE_WORKER, store_pod_name

from .. import support

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# Where `make helm-install` puts the operator; `make e2e` passes it on.
OPERATOR_NAMESPACE = os.environ.get("DDPJOB_E2E_OPERATOR_NAMESPACE", "ddpjob-system")
# The trainer image `make kind-load` loaded (the examples name the default one).
TRAINER_IMAGE = os.environ.get("DDPJOB_E2E_TRAINER_IMAGE")
# The fault-injection command (`make e2e` passes hack/kind/faults.sh): `kill NAMESPACE/POD [--signal N]`,
# `node-down NODE` (the node goes silent), `node-up NODE` (it comes back rebooted), ... (tests/e2e/README.md).
# Tests that inject faults skip with the reason when it is unset.
FAULTS = os.environ.get("DDPJOB_E2E_FAULTS", "").strip()
OPERATOR_SELECTOR = "app.kubernetes.io/name=ddpjob-operator"
RESOURCE = f"{model.PLURAL}.{model.GROUP}"

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


def wait_for(check: Callable[[], T], what: str, timeout: float, interval: float = 3.0,
             explain: Callable[[], str] | None = None) -> T:
    """tests/support.py's wait_for, polling the cluster every 3 s by default."""
    return support.wait_for(check, what, timeout, interval, explain)


# Access modes of the checkpoint claims the tests create. The examples ask for ReadWriteMany (workers on any
# node); kind's local-path storage only provides ReadWriteOnce, whose volumes pin every pod to one node.
CHECKPOINT_ACCESS_MODES = os.environ.get("DDPJOB_E2E_CHECKPOINT_ACCESS_MODES", "ReadWriteOnce").split(",")
# Workers on different nodes share one checkpoint claim only with ReadWriteMany storage.
SHARED_CHECKPOINTS = "ReadWriteMany" in CHECKPOINT_ACCESS_MODES


def example(name: str, *, spec_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """An example manifest, with the image `make kind-load` loaded, the claim access modes this cluster's
    storage provides (CHECKPOINT_ACCESS_MODES) and optional spec overrides."""
    manifest = yaml.safe_load((EXAMPLES / name).read_text())
    if TRAINER_IMAGE:
        manifest["spec"]["image"] = TRAINER_IMAGE
    claim = (manifest["spec"].get("checkpoint") or {}).get("claimTemplate")
    if claim is not None:
        claim["accessModes"] = list(CHECKPOINT_ACCESS_MODES)
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
    """`kind/name` of every pod, service, PVC and ConfigMap in `namespace` that the owner owns."""
    found = []
    for kind in ("pods", "services", "persistentvolumeclaims", "configmaps"):
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


# ---------------------------------------------------------------- raw API calls


def raw_get(path: str, check: bool = True) -> subprocess.CompletedProcess:
    """GET an API path (`/api/v1/...`), as the API server answers it."""
    return kubectl("get", "--raw", path, check=check)


def raw_post(path: str, body: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess:
    """POST a JSON body to an API path (a subresource such as pods/NAME/eviction)."""
    return kubectl("create", "--raw", path, "-f", "-", stdin=json.dumps(body), check=check)


def pod_log(namespace: str, pod: str, container: str | None = None, timeout: int = 15) -> str | None:
    """GET /api/v1/namespaces/NS/pods/POD/log: the container's whole log; None while it has none, or
    when its kubelet does not answer within `timeout` s (a lost node)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
    if container:
        path += f"?container={container}"
    try:
        result = kubectl("get", "--raw", path, f"--request-timeout={timeout}s", check=False, timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        return None
    return result.stdout if result.returncode == 0 else None


def evict(namespace: str, pod: str) -> None:
    """The Eviction API (policy/v1): what `kubectl drain` and the descheduler use."""
    raw_post(f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
             {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}})


def scale(namespace: str, name: str, replicas: int, check: bool = True) -> subprocess.CompletedProcess:
    """PATCH the job's scale subresource, as `kubectl scale` and autoscalers do."""
    return kubectl("patch", RESOURCE, name, "-n", namespace, "--subresource=scale", "--type=merge",
                   "-p", json.dumps({"spec": {"replicas": replicas}}), check=check)


def set_suspend(namespace: str, name: str, suspend: bool) -> None:
    kubectl("patch", RESOURCE, name, "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"runPolicy": {"suspend": suspend}}}))


def delete_pod(namespace: str, pod: str, *, grace: int | None = None) -> None:
    """DELETE a pod without waiting for it to go; grace None is the pod's own grace period."""
    args = ["delete", "pod", pod, "-n", namespace, "--wait=false"]
    if grace is not None:
        args.append(f"--grace-period={grace}")
        if grace == 0:
            args.append("--force")
    kubectl(*args)


# ---------------------------------------------------------------- reading a job and its pods


def job_pods(namespace: str, job_name: str, role: str = ROLE_WORKER) -> list[dict[str, Any]]:
    """Every pod of the job with that role, terminating ones included."""
    return get_json("pods", "-n", namespace, "-l", f"{LABEL_JOB_NAME}={job_name},{LABEL_ROLE}={role}")["items"]


def store_pod(namespace: str, job_name: str) -> dict[str, Any] | None:
    pods = [p for p in job_pods(namespace, job_name, ROLE_STORE)
            if p["metadata"]["name"] == store_pod_name(job_name)]
    return pods[0] if pods else None


def condition_of(job_object: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for item in job_object.get("status", {}).get("conditions", []):
        if item["type"] == type_:
            return item
    return None


def terminal(job_object: dict[str, Any]) -> tuple[str, str, str] | None:
    """(phase, reason, message) of a finished job: the reason of its Succeeded/Failed condition."""
    status = job_object.get("status", {})
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    cond = condition_of(job_object, phase) or {}
    return phase, cond.get("reason", ""), cond.get("message") or status.get("message") or ""


def parse_time(text: str) -> float:
    """RFC 3339 (`2026-01-02T03:04:05Z`) -> seconds since the epoch."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------- nodes and the operator


def cpu_millis(quantity: str | int | float | None) -> int:
    """A CPU quantity (`2`, `500m`, `1.5`) in millicores."""
    if quantity is None:
        return 0
    text = str(quantity)
    if text.endswith("m"):
        return int(float(text[:-1]))
    return int(round(float(text) * 1000))


def nodes() -> list[dict[str, Any]]:
    return get_json("nodes")["items"]


def node_ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))


def node_unready_since(name: str) -> float | None:
    """When the node controller declared the node not Ready (its Ready condition's last transition, as
    epoch seconds), or None while it is Ready."""
    ready = next((c for c in get_json("node", name).get("status", {}).get("conditions", []) if c["type"] == "Ready"),
                 None)
    return None if ready is None or ready["status"] == "True" else parse_time(ready["lastTransitionTime"])


def schedulable_nodes() -> list[dict[str, Any]]:
    """Ready nodes an ordinary pod (no tolerations) can land on: not cordoned, no NoSchedule/NoExecute taint."""
    return [n for n in nodes()
            if node_ready(n) and not n["spec"].get("unschedulable")
            and not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in n["spec"].get("taints", []))]


def requested_cpu_millis(node_name: str) -> int:
    """CPU the scheduler counts as taken on a node: requests of its pods that have not finished."""
    pods = get_json("pods", "--all-namespaces", "--field-selector", f"spec.nodeName={node_name}")["items"]
    total = 0
    for pod in pods:
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        containers = sum(cpu_millis(c.get("resources", {}).get("requests", {}).get("cpu"))
                         for c in pod["spec"].get("containers", []))
        inits = max((cpu_millis(c.get("resources", {}).get("requests", {}).get("cpu"))
                     for c in pod["spec"].get("initContainers", [])), default=0)
        overhead = cpu_millis(pod["spec"].get("overhead", {}).get("cpu"))
        total += max(containers, inits) + overhead
    return total


def operator_pods() -> list[dict[str, Any]]:
    """The operator's live pods, from `make helm-install`'s Deployment."""
    pods = get_json("pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_SELECTOR)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def acting_operator_pod() -> str:
    """The operator pod that acts: the Lease holder when the chart runs several replicas (leader
    election), else the only one."""
    pods = operator_pods()
    lease = operator_setting("DDPJOB_OPERATOR_LEASE_NAME", "")
    if lease:
        holder = get_json("lease", lease, "-n", OPERATOR_NAMESPACE).get("spec", {}).get("holderIdentity")
        if holder in {p["metadata"]["name"] for p in pods}:
            return holder
    assert len(pods) == 1, f"cannot tell which operator pod acts: {[p['metadata']['name'] for p in pods]}"
    return pods[0]["metadata"]["name"]


FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")


@contextlib.contextmanager
def port_forward(namespace: str, pod: str, *ports: int, timeout: float = 60) -> Iterator[dict[int, int]]:
    """`kubectl port-forward` to local ports the kernel picks (`:PORT`): {pod port: local port}, the
    pod reached directly (not through a Service that may pick another pod)."""
    process = subprocess.Popen(["kubectl", "port-forward", "-n", namespace, f"pod/{pod}", *(f":{p}" for p in ports)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        local: dict[int, int] = {}
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while len(local) < len(ports):
            ready, _, _ = select.select([process.stdout], [], [], max(deadline - time.monotonic(), 0))
            line = process.stdout.readline() if ready else ""
            if not line:
                raise AssertionError(f"kubectl port-forward to {namespace}/{pod} {ports} did not start: {seen}")
            seen.append(line.strip())
            match = FORWARDING.search(line)
            if match:
                local[int(match.group(2))] = int(match.group(1))
        yield local
    finally:
        process.terminate()
        process.wait(30)


def operator_setting(name: str, default: str) -> str:
    """A DDPJOB_OPERATOR_* value as the operator Deployment sets it (literal env values only)."""
    deployments = get_json("deployments", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_SELECTOR)["items"]
    for deployment in deployments:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                if env["name"] == name and "value" in env:
                    return env["value"]
    return default


# ---------------------------------------------------------------- fault injection


def why_no_faults() -> str | None:
    if not FAULTS:
        return ("DDPJOB_E2E_FAULTS unset: this test injects a fault through the fault command "
                "(`$DDPJOB_E2E_FAULTS kill NAMESPACE/POD [--signal N] | node-down NODE | node-up NODE`; "
                "`make e2e` passes hack/kind/faults.sh for kind)")
    return None


def why_fault_unsupported(*verbs: str) -> str | None:
    """Why the fault command cannot inject these faults (None: it can): the contract's `supports VERB`
    answers 0 for a verb it has; an implementation that predates `supports` answers otherwise."""
    reason = why_no_faults()
    if reason:
        return reason
    for verb in verbs:
        argv = _fault_argv(("supports", verb))
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            return (f"the fault command does not support `{verb}` (`{' '.join(argv)}` exited {result.returncode}); "
                    f"tests/e2e/README.md describes the verb")
    return None


def api_answers() -> bool:
    """The API server is ready (GET /readyz answered 200 within 5 s)."""
    return kubectl("get", "--raw", "/readyz", "--request-timeout=5s", check=False, timeout=30).returncode == 0


def _fault_argv(args: tuple[str, ...]) -> list[str]:
    return [*shlex.split(FAULTS), *args]


def fault(*args: str, timeout: float = 180, check: bool = True) -> str:
    """Run the fault command to completion; its failure fails the test with its words (check=False:
    best effort, for undoing a fault while a test is already failing)."""
    argv = _fault_argv(args)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"fault command {' '.join(argv)} exited {result.returncode}: "
                             f"{(result.stderr or result.stdout).strip()}")
    return result.stdout


def faults_at_once(*commands: tuple[str, ...], timeout: float = 180) -> None:
    """Start several fault commands together (the same instant, as far as processes go), then wait for all."""
    started = [(c, subprocess.Popen(_fault_argv(c), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
               for c in commands]
    problems = []
    for command, process in started:
        out, err = process.communicate(timeout=timeout)
        if process.returncode != 0:
            problems.append(f"{' '.join(command)} exited {process.returncode}: {(err or out).strip()}")
    assert not problems, "fault commands failed: " + "; ".join(problems)


def is_control_plane(node: dict[str, Any]) -> bool:
    return "node-role.kubernetes.io/control-plane" in node["metadata"].get("labels", {})


def _kubelet_renewed(name: str) -> str | None:
    """The renewTime of the node's Lease (kube-node-lease), which its kubelet renews every 10 s while it runs."""
    result = kubectl("get", "lease", name, "-n", "kube-node-lease", "-o", "jsonpath={.spec.renewTime}", check=False)
    return (result.stdout.strip() or None) if result.returncode == 0 else None


NODE_BACK_WITHIN = 300  # s from node-up to Ready: a reboot (systemd, containerd, the kubelet) on a loaded host


@contextlib.contextmanager
def node_down(name: str) -> Iterator[Callable[[], None]]:
    """`node-down NAME` for the block, which gets `up()`: `node-up NAME`, then wait for the node Ready with
    a kubelet of its new boot. Whatever happens in the block, the node is up when it ends: a failing test
    must not leave the cluster a node short (nor a node-down that failed half-way)."""
    down = True

    def up() -> None:
        nonlocal down
        # A silent node's Ready condition stays True until the node controller's grace period runs out:
        # a renewed Lease is what tells the rebooted kubelet from the frozen one.
        frozen = _kubelet_renewed(name)
        fault("node-up", name)
        down = False
        wait_for(lambda: node_ready(get_json("node", name)) and (frozen is None or _kubelet_renewed(name) != frozen),
                 f"node {name} Ready again after node-up", NODE_BACK_WITHIN)

    try:
        fault("node-down", name)
        yield up
    finally:
        if down:
            try:
                up()
            except Exception as exc:  # the block's own failure is the one to report
                print(f"node {name} not back after node-up: {exc}")
