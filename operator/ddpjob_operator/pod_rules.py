"""The API server's and kubelet's rules for the pass-through parts of a worker pod that no CRD schema expresses
(issue 31, item 5): each is a job that would fail late, or never start, after a clean `ddpjob validate`.

Pure: `problems(spec)` lists (fieldPath under spec, message with the fix) for a DDPJobSpec's wire form. Written
from k8s.io/kubernetes pkg/apis/core/validation and the kubelet; on a cluster the operator's dry run
(`dryRun=All`) has the last word.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Iterator

from . import k8s_fields as k8s

# ValidateAnnotations: keys and values of one object's annotations together (TotalAnnotationSizeLimitB).
MAX_ANNOTATIONS_BYTES = 256 * 1024
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# The kernel's MAX_ARG_STRLEN: one argv or environ string ("NAME=value"), its NUL included; execve fails above.
MAX_ARG_STRLEN = 128 * 1024
# Device plugins' GPU resources: a job uses one vendor, through spec.resources.gpuResourceName.
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe", "habana.ai/gaudi",
                 "aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "google.com/tpu", "nvidia.com/mig-")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
_IANA_SVC_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([a-z0-9]|-(?=[a-z0-9]))*")


def _subdomain(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None


def _ip(value: Any) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return isinstance(value, str)


def _port(value: Any, *, zero: bool = False) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (0 if zero else 1) <= value <= 65535


def _go_int32(text: Any) -> bool:
    """strconv.ParseInt(text, 10, 32) succeeds."""
    return (isinstance(text, str) and re.fullmatch(r"[+-]?[0-9]+", text) is not None
            and -(2**31) <= int(text) < 2**31)


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(fieldPath, container) for the trainer's pass-through fields and every init container."""
    template = spec.get("template") or {}
    yield ".template.trainer", template.get("trainer") or {}
    for i, container in enumerate((template.get("podSpec") or {}).get("initContainers") or []):
        if isinstance(container, dict):
            yield f".template.podSpec.initContainers[{i}]", container


def _probe_problems(where: str, container: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(name)
        if not isinstance(probe, dict):
            continue
        handlers = [h for h in _PROBE_HANDLERS if probe.get(h) is not None]
        if len(handlers) != 1:
            yield f"{where}.{name}", (f"{where[1:]}.{name} needs exactly one handler ({', '.join(_PROBE_HANDLERS)}); "
                                      f"it has {len(handlers) or 'none'}: set one, such as tcpSocket: {{port: 8080}}")
            continue
        port = (probe.get(handlers[0]) or {}).get("port") if handlers[0] != "exec" else None
        if handlers[0] != "exec" and not (_port(port) or (handlers[0] != "grpc" and isinstance(port, str)
                                                          and len(port) <= 15 and _IANA_SVC_NAME.fullmatch(port))):
            yield f"{where}.{name}", (f"{where[1:]}.{name}.{handlers[0]}.port must be a port 1-65535 (or a named "
                                      f"container port); got {port!r}")


def _port_problems(where: str, container: dict[str, Any], host_network: bool) -> Iterator[tuple[str, str]]:
    for i, port in enumerate(container.get("ports") or []):
        if not isinstance(port, dict):
            continue
        here = f"{where[1:]}.ports[{i}]"
        container_port, host_port = port.get("containerPort"), port.get("hostPort")
        if not _port(container_port):
            yield f"{where}.ports", f"{here}.containerPort must be 1-65535 (got {container_port!r}): fix the port"
        if host_port is not None and not _port(host_port, zero=True):
            yield f"{where}.ports", f"{here}.hostPort must be 1-65535 (got {host_port!r}): fix or remove it"
        elif host_network and host_port not in (None, 0) and host_port != container_port:
            yield f"{where}.ports", (f"{here}: with hostNetwork the hostPort must equal containerPort ({host_port} != "
                                     f"{container_port}): remove hostPort or make them equal")


def _mount_problems(where: str, mounts: Any) -> Iterator[tuple[str, str]]:
    for i, mount in enumerate(mounts or []):
        if not isinstance(mount, dict):
            continue
        for key in ("subPath", "subPathExpr"):
            sub = mount.get(key)
            if isinstance(sub, str) and sub and (sub.startswith("/") or ".." in sub.split("/")):
                yield where, (f"{where[1:]}[{i}].{key} {sub!r} must be a relative path without '..' (the API server "
                              f"refuses an escape from the volume): write a path inside the volume, such as data/run1")


def _hugepage_problems(where: str, resources: Any) -> Iterator[tuple[str, str]]:
    for part in ("requests", "limits"):
        for name, value in ((resources or {}).get(part) or {}).items() if isinstance(resources, dict) else ():
            if not str(name).startswith("hugepages-"):
                continue
            page, amount = k8s.quantity(name[len("hugepages-"):]), k8s.quantity(value)
            if page is None or page <= 0:
                yield f"{where}.resources.{part}", f"{name}: the page size is not a quantity such as 2Mi or 1Gi"
            elif amount is not None and amount % page != 0:
                yield f"{where}.resources.{part}", (f"{name}: {value!r} is not a multiple of the page size "
                                                    f"{name[len('hugepages-'):]}: round it to whole pages")


def _string_problems(where: str, text: Any, *, prefix: int = 0) -> Iterator[tuple[str, str]]:
    if not isinstance(text, str):
        return
    if "\x00" in text:
        yield where, f"{where[1:]} holds a NUL byte, which no process argument or variable can carry: remove it"
    elif prefix + len(text.encode("utf-8")) + 1 > MAX_ARG_STRLEN:
        yield where, (f"{where[1:]} is longer than the kernel's limit for one argument or variable (128 KiB, "
                      f"MAX_ARG_STRLEN): the container would fail to start. Put the data in a file (a ConfigMap "
                      f"volume) and pass its path")


def problems(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(fieldPath under spec, message) for what the API server or the kubelet would refuse in `spec` (wire form)."""
    found: list[tuple[str, str]] = []
    template = spec.get("template") or {}
    pod_spec = template.get("podSpec") or {}
    host_network = pod_spec.get("hostNetwork") is True

    os_name = (pod_spec.get("os") or {}).get("name") if isinstance(pod_spec.get("os"), dict) else None
    if os_name is not None and os_name != "linux":
        found.append((".template.podSpec.os", f"podSpec.os.name {os_name!r}: workers are Linux pods (the operator sets "
                      "securityContext.fsGroup, which a windows pod may not have, and torchrun needs Linux): set "
                      "name: linux or remove os"))
    for i, container in enumerate(pod_spec.get("initContainers") or []):
        if isinstance(container, dict) and not (isinstance(container.get("image"), str)
                                                and container["image"].strip()):
            found.append((".template.podSpec.initContainers", f"initContainers[{i}] ({container.get('name')}) has no "
                          "image: add the image it runs"))
    if pod_spec.get("shareProcessNamespace") is True and pod_spec.get("hostPID") is True:
        found.append((".template.podSpec.shareProcessNamespace", "shareProcessNamespace and hostPID cannot both be "
                      "true: remove one"))
    if pod_spec.get("overhead") is not None and not pod_spec.get("runtimeClassName"):
        found.append((".template.podSpec.overhead", "overhead is set by the RuntimeClass admission from "
                      "runtimeClassName; without one the API server refuses it: remove overhead or set "
                      "runtimeClassName"))
    if host_network and pod_spec.get("dnsPolicy") == "ClusterFirst":
        found.append((".template.podSpec.dnsPolicy", "with hostNetwork, dnsPolicy ClusterFirst falls back to the node's "
                      "resolver, so workers cannot resolve the rendezvous Service and the rendezvous never forms: "
                      "use ClusterFirstWithHostNet (or remove dnsPolicy: the operator sets it)"))
    dns = pod_spec.get("dnsConfig") if isinstance(pod_spec.get("dnsConfig"), dict) else {}
    for server in dns.get("nameservers") or []:
        if not _ip(server):
            found.append((".template.podSpec.dnsConfig", f"dnsConfig.nameservers: {server!r} is not an IP address: "
                          "write the DNS server's IP, such as 10.96.0.10"))
    for i, alias in enumerate(pod_spec.get("hostAliases") or []):
        if isinstance(alias, dict) and not _ip(alias.get("ip")):
            found.append((".template.podSpec.hostAliases", f"hostAliases[{i}].ip {alias.get('ip')!r} is not an IP "
                          "address: write an IP, such as 10.0.0.5"))

    for key in ("priorityClassName",):
        value = template.get(key)
        if value is not None and not _subdomain(value):
            found.append((f".template.{key}", f"template.{key} {value!r} is not a DNS-1123 subdomain (lowercase "
                          "letters, digits, '-' and '.'): use the PriorityClass's name"))
    store = ((spec.get("rendezvous") or {}).get("storeTemplate") or {}).get("priorityClassName")
    if store is not None and not _subdomain(store):
        found.append((".rendezvous.storeTemplate.priorityClassName", f"rendezvous.storeTemplate.priorityClassName "
                      f"{store!r} is not a DNS-1123 subdomain: use the PriorityClass's name"))
    claim = (spec.get("checkpoint") or {}).get("claimTemplate") or {}
    storage_class = claim.get("storageClassName")
    if storage_class not in (None, "") and not _subdomain(storage_class):
        found.append((".checkpoint.claimTemplate.storageClassName", f"checkpoint.claimTemplate.storageClassName "
                      f"{storage_class!r} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.'): use "
                      "the StorageClass's name (kubectl get storageclass)"))

    annotations = template.get("annotations") or {}
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        found.append((".template.annotations", f"template.annotations total {size} bytes, more than the API server's "
                      f"{MAX_ANNOTATIONS_BYTES} (256 KiB) for one object: move the data to a ConfigMap"))
    if POD_DELETION_COST in annotations and not _go_int32(annotations[POD_DELETION_COST]):
        found.append((".template.annotations", f"template.annotations {POD_DELETION_COST} "
                      f"{annotations[POD_DELETION_COST]!r} must be a whole number in int32 range: write one, such as "
                      "\"100\""))

    for where, container in _containers(spec):
        found += _probe_problems(where, container)
        found += _port_problems(where, container, host_network)
        found += _mount_problems(f"{where}.volumeMounts", container.get("volumeMounts"))
        found += _hugepage_problems(where, container.get("resources"))
    found += _mount_problems(".template.volumeMounts", template.get("volumeMounts"))

    for i, arg in enumerate(spec.get("args") or []):
        found += _string_problems(f".args[{i}]", arg)
    for i, env in enumerate(spec.get("env") or []):
        if isinstance(env, dict):
            found += _string_problems(f".env[{i}].value", env.get("value"), prefix=len(str(env.get("name"))) + 1)

    resources = spec.get("resources") or {}
    gpu_name = resources.get("gpuResourceName", "nvidia.com/gpu")
    extra = (template.get("trainer") or {}).get("resources") or {}
    for part in ("requests", "limits"):
        for name in (extra.get(part) or {}) if isinstance(extra, dict) else ():
            if name != gpu_name and any(name == g or (g.endswith("-") and name.startswith(g)) for g in GPU_RESOURCES):
                found.append((f".template.trainer.resources.{part}", f"{name} is a GPU of another device plugin than "
                              f"spec.resources.gpuResourceName ({gpu_name}): a job's GPUs come from one vendor, "
                              "through spec.resources.gpu and gpuResourceName; remove it or set gpuResourceName to it"))
    return found
