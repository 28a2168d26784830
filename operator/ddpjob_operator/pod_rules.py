"""The API server's and kubelet's rules for the pass-through parts of a worker pod that no CRD schema expresses
(issue 31, item 5): each is a job that would fail late, or never start, after a clean `ddpjob validate`.

Pure: `problems(spec)` lists (fieldPath under spec, message with the fix) for a DDPJobSpec's wire form. Written
from k8s.io/kubernetes pkg/apis/core/validation and the kubelet; on a cluster the operator's dry run
(`dryRun=All`) has the last word.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any, Callable, Iterator

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


# ---------------------------------------------------------------- env sources, volumes, scheduling (issue 38, 14)

# EnvVarSource: exactly one of these (fileKeyRef: Kubernetes 1.34+, feature gate EnvFiles).
ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef", "fileKeyRef")
# validEnvDownwardAPIFieldPathExpressions, and the two maps a subscript selects one key of.
ENV_FIELD_PATHS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
                   "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs")
_SUBSCRIPTED_FIELD = re.compile(r"(metadata\.labels|metadata\.annotations)\['(.*)'\]", re.DOTALL)
# validContainerResourceFieldPathExpressions, and the hugepages prefixes.
ENV_RESOURCES = ("limits.cpu", "limits.memory", "limits.ephemeral-storage", "requests.cpu", "requests.memory",
                 "requests.ephemeral-storage")
_CPU_DIVISORS = (k8s.quantity("1m"), k8s.quantity("1"))
_BYTE_DIVISORS = tuple(k8s.quantity(f"1{suffix}") for suffix in ("", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi",
                                                                 "Ti", "Pi", "Ei"))
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
# Every volume source of a Pod's volume (validateVolumeSource counts them: exactly one).
VOLUME_SOURCES = ("hostPath", "emptyDir", "gitRepo", "secret", "nfs", "iscsi", "glusterfs", "persistentVolumeClaim",
                  "rbd", "flexVolume", "cinder", "cephfs", "flocker", "downwardAPI", "fc", "azureFile",
                  "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "portworxVolume", "scaleIO",
                  "storageos", "csi", "ephemeral", "image", "awsElasticBlockStore", "gcePersistentDisk", "configMap",
                  "projected")
SPREAD_ACTIONS = ("DoNotSchedule", "ScheduleAnyway")
NODE_INCLUSION_POLICIES = ("Honor", "Ignore")
_NAME_RULE = ("an optional DNS subdomain prefix and '/', then at most 63 letters, digits, '-', '_' and '.' that start "
              "and end with a letter or digit")


def _count(value: Any) -> int:
    return len(value) if isinstance(value, (list, dict)) else 0


def _items(value: Any) -> list[Any]:
    """A list field's entries; nothing for a value of another type (the API server refuses its type)."""
    return value if isinstance(value, list) else []


def _config_key(key: Any) -> bool:
    """IsConfigMapKey: a ConfigMap's or Secret's key."""
    return (isinstance(key, str) and len(key) <= 253 and _CONFIG_KEY.fullmatch(key) is not None
            and key not in (".", "..") and not key.startswith(".."))


def _field_ref_problem(ref: dict[str, Any]) -> str | None:
    version, path = ref.get("apiVersion"), ref.get("fieldPath")
    if version not in (None, "", "v1"):
        return f"fieldRef.apiVersion {version!r} is not supported: write v1 or leave it out"
    if not path:
        return "fieldRef.fieldPath is required: name the pod field, such as metadata.name"
    subscripted = _SUBSCRIPTED_FIELD.fullmatch(path) if isinstance(path, str) else None
    if subscripted is not None:
        key = subscripted.group(2)
        if not k8s.is_qualified_name(key.lower() if subscripted.group(1).endswith("annotations") else key):
            return f"fieldRef.fieldPath {path!r}: the key must be {_NAME_RULE}"
        return None
    if path not in ENV_FIELD_PATHS:
        return (f"fieldRef.fieldPath {path!r} is not a pod field an env var can read: use one of "
                f"{', '.join(ENV_FIELD_PATHS)}, metadata.labels['<key>'] or metadata.annotations['<key>']")
    return None


def _resource_ref_problem(ref: dict[str, Any]) -> str | None:
    resource, divisor = ref.get("resource"), ref.get("divisor")
    if not resource:
        return "resourceFieldRef.resource is required: such as limits.memory"
    hugepages = isinstance(resource, str) and resource.startswith(("requests.hugepages-", "limits.hugepages-"))
    if resource not in ENV_RESOURCES and not hugepages:
        return (f"resourceFieldRef.resource {resource!r} is not one the API server exposes: use one of "
                f"{', '.join(ENV_RESOURCES)}, requests.hugepages-<size> or limits.hugepages-<size>")
    if divisor in (None, "", 0, "0"):
        return None
    amount = k8s.quantity(divisor)
    if str(resource).endswith(".cpu"):
        return None if amount in _CPU_DIVISORS else f"resourceFieldRef.divisor {divisor!r}: for cpu only 1m or 1"
    return None if amount in _BYTE_DIVISORS else (f"resourceFieldRef.divisor {divisor!r}: for {resource} only 1, 1k, "
                                                  "1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi or 1Ei")


def _key_ref_problem(kind: str, ref: dict[str, Any]) -> str | None:
    if not _subdomain(ref.get("name")):
        return f"{kind}.name {ref.get('name')!r} must name the {kind[:-6]} (a DNS-1123 subdomain)"
    if not _config_key(ref.get("key")):
        return (f"{kind}.key {ref.get('key')!r} must be a key of letters, digits, '-', '_' and '.' (at most 253, not "
                "'.', '..' or starting with '..')")
    return None


def _env_problems(where: str, env: Any) -> Iterator[tuple[str, str]]:
    """validateEnvVarValueFrom for each variable of `env` (a list at fieldPath `where`)."""
    for i, var in enumerate(_items(env)):
        source = var.get("valueFrom") if isinstance(var, dict) else None
        if not isinstance(source, dict):
            continue
        here = f"{where}[{i}].valueFrom"
        given = [name for name, value in source.items() if name in ENV_SOURCES and value is not None]
        if len(given) != 1:
            yield here, (f"{here[1:]} needs exactly one source of {', '.join(ENV_SOURCES[:4])} (it has "
                         f"{', '.join(given) or 'none'}): keep one, or use value")
            continue
        if var.get("value"):
            yield here, f"{here[1:]}: set either value or valueFrom, not both"
            continue
        ref, kind = source[given[0]], given[0]
        if not isinstance(ref, dict):
            continue
        problem = (_field_ref_problem(ref) if kind == "fieldRef" else _resource_ref_problem(ref)
                   if kind == "resourceFieldRef" else _key_ref_problem(kind, ref) if kind != "fileKeyRef" else None)
        if problem:
            yield here, f"{here[1:]}.{problem}"


def _volume_problems(volumes: Any) -> Iterator[tuple[str, str]]:
    for i, volume in enumerate(_items(volumes)):
        if not isinstance(volume, dict):
            continue
        given = [name for name, value in volume.items() if name in VOLUME_SOURCES and value is not None]
        if len(given) != 1:
            yield ".template.volumes", (f"template.volumes[{i}] ({volume.get('name')}) needs exactly one volume source "
                                        f"(emptyDir, configMap, secret, persistentVolumeClaim, csi, ...); it has "
                                        f"{', '.join(given) or 'none'}: keep one")


def _requirement_problem(at: str, requirement: dict[str, Any], operators: tuple[str, ...]) -> str | None:
    """A label selector's or node selector's requirement (key, operator, values) at `at`."""
    operator, values, key = requirement.get("operator"), requirement.get("values"), requirement.get("key")
    if operator not in operators:
        return f"{at}.operator {operator!r} is not {', '.join(operators[:-1])} or {operators[-1]}"
    if operator in ("In", "NotIn") and not _count(values):
        return f"{at}: operator {operator} needs values: add at least one"
    if operator in ("Exists", "DoesNotExist") and _count(values):
        return f"{at}: operator {operator} takes no values: remove values"
    if operator in ("Gt", "Lt") and _count(values) != 1:
        return f"{at}: operator {operator} takes exactly one value"
    if not k8s.is_qualified_name(key):
        return f"{at}.key {key!r} must be {_NAME_RULE}"
    if isinstance(values, list) and not all(k8s.is_label_value(v) for v in values):
        return f"{at}.values: every value is a label value (at most 63 letters, digits, '-', '_', '.'): fix it"
    return None


LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
NODE_OPERATORS = (*LABEL_OPERATORS, "Gt", "Lt")


def _requirements_problems(here: str, requirements: Any, operators: tuple[str, ...]) -> Iterator[str]:
    for j, requirement in enumerate(_items(requirements)):
        problem = _requirement_problem(f"{here}[{j}]", requirement, operators) if isinstance(requirement,
                                                                                            dict) else None
        if problem:
            yield problem


def _selector_problems(here: str, selector: Any) -> Iterator[str]:
    """ValidateLabelSelector (invalid label values refused): messages for `selector` at `here`."""
    if not isinstance(selector, dict):
        return
    labels = selector.get("matchLabels")
    for key, value in labels.items() if isinstance(labels, dict) else ():
        if not k8s.is_qualified_name(key) or not k8s.is_label_value(value):
            yield (f"{here}.matchLabels {key!r}: {value!r}: a key is {_NAME_RULE}; a value at most 63 such "
                   "characters, or empty")
    yield from _requirements_problems(f"{here}.matchExpressions", selector.get("matchExpressions"), LABEL_OPERATORS)


def _node_term_problems(here: str, term: Any) -> Iterator[str]:
    """ValidateNodeSelectorTerm: its expressions on node labels and its fields (metadata.name only)."""
    if not isinstance(term, dict):
        return
    yield from _requirements_problems(f"{here}.matchExpressions", term.get("matchExpressions"), NODE_OPERATORS)
    for j, requirement in enumerate(_items(term.get("matchFields"))):
        if not isinstance(requirement, dict):
            continue
        at, values = f"{here}.matchFields[{j}]", requirement.get("values")
        if requirement.get("operator") not in ("In", "NotIn") or len(_items(values)) != 1:
            yield f"{at}: a node field selector is operator In or NotIn with exactly one value"
        elif requirement.get("key") != "metadata.name":
            yield f"{at}.key {requirement.get('key')!r}: the only node field is metadata.name"
        elif not _subdomain(values[0]):
            yield f"{at}.values: {values[0]!r} is not a node name (a DNS-1123 subdomain)"


def _preferred_problems(here: str, entries: Any, term: str,
                        term_problems: Callable[[str, Any], Iterator[str]]) -> Iterator[str]:
    """Weighted terms (preferredDuringSchedulingIgnoredDuringExecution): each a weight 1-100 and a valid `term`."""
    for i, entry in enumerate(_items(entries)):
        if not isinstance(entry, dict):
            continue
        weight = entry.get("weight")
        if not (isinstance(weight, int) and not isinstance(weight, bool) and 1 <= weight <= 100):
            yield f"{here}[{i}].weight {weight!r} must be 1-100"
        yield from term_problems(f"{here}[{i}].{term}", entry.get(term))


def _pod_term_problems(here: str, term: Any) -> Iterator[str]:
    if not isinstance(term, dict):
        return
    if not k8s.is_qualified_name(term.get("topologyKey")):
        yield f"{here}.topologyKey {term.get('topologyKey')!r} is required and must be {_NAME_RULE}"
    yield from _selector_problems(f"{here}.labelSelector", term.get("labelSelector"))
    yield from _selector_problems(f"{here}.namespaceSelector", term.get("namespaceSelector"))
    for namespace in _items(term.get("namespaces")):
        if not (isinstance(namespace, str) and re.fullmatch(k8s.DNS_1123_LABEL, namespace)):
            yield f"{here}.namespaces: {namespace!r} is not a namespace name (a DNS-1123 label)"


def _affinity_problems(affinity: Any) -> Iterator[str]:
    """ValidateAffinity: messages (each naming its place under template.affinity)."""
    if not isinstance(affinity, dict):
        return
    node = affinity.get("nodeAffinity") if isinstance(affinity.get("nodeAffinity"), dict) else {}
    base = "template.affinity.nodeAffinity"
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, dict):
        terms = required.get("nodeSelectorTerms")
        here = f"{base}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        if not _count(terms):
            yield f"{here} must have at least one term (an empty list matches no node): add one, or remove required"
        for i, term in enumerate(_items(terms)):
            yield from _node_term_problems(f"{here}[{i}]", term)
    yield from _preferred_problems(f"{base}.preferredDuringSchedulingIgnoredDuringExecution",
                                   node.get("preferredDuringSchedulingIgnoredDuringExecution"), "preference",
                                   _node_term_problems)
    for kind in ("podAffinity", "podAntiAffinity"):
        pods = affinity.get(kind) if isinstance(affinity.get(kind), dict) else {}
        here = f"template.affinity.{kind}"
        for i, term in enumerate(_items(pods.get("requiredDuringSchedulingIgnoredDuringExecution"))):
            yield from _pod_term_problems(f"{here}.requiredDuringSchedulingIgnoredDuringExecution[{i}]", term)
        yield from _preferred_problems(f"{here}.preferredDuringSchedulingIgnoredDuringExecution",
                                       pods.get("preferredDuringSchedulingIgnoredDuringExecution"), "podAffinityTerm",
                                       _pod_term_problems)


def _spread_problems(constraints: Any) -> Iterator[str]:
    """validateTopologySpreadConstraints: messages (each naming its constraint)."""
    constraints = [c for c in _items(constraints) if isinstance(c, dict)]
    for i, constraint in enumerate(constraints):
        here = f"template.podSpec.topologySpreadConstraints[{i}]"
        skew, key, action = constraint.get("maxSkew"), constraint.get("topologyKey"), constraint.get("whenUnsatisfiable")
        min_domains, selector = constraint.get("minDomains"), constraint.get("labelSelector")
        if not (isinstance(skew, int) and not isinstance(skew, bool) and skew > 0):
            yield f"{here}.maxSkew {skew!r} must be greater than zero"
        if not key:
            yield f"{here}.topologyKey is required: such as topology.kubernetes.io/zone"
        if action not in SPREAD_ACTIONS:
            yield f"{here}.whenUnsatisfiable {action!r} must be DoNotSchedule or ScheduleAnyway"
        if any(c.get("topologyKey") == key and c.get("whenUnsatisfiable") == action for c in constraints[i + 1:]):
            yield (f"{here}: another constraint has the same topologyKey {key!r} and whenUnsatisfiable {action!r}: "
                   "merge them")
        if min_domains is not None and not (isinstance(min_domains, int) and min_domains > 0):
            yield f"{here}.minDomains {min_domains!r} must be greater than zero"
        elif min_domains is not None and action != "DoNotSchedule":
            yield f"{here}.minDomains needs whenUnsatisfiable DoNotSchedule (not {action!r})"
        for policy in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            if constraint.get(policy) is not None and constraint[policy] not in NODE_INCLUSION_POLICIES:
                yield f"{here}.{policy} {constraint[policy]!r} must be Honor or Ignore"
        match_keys = _items(constraint.get("matchLabelKeys"))
        if match_keys and not isinstance(selector, dict):
            yield f"{here}.matchLabelKeys needs labelSelector: add one, or remove matchLabelKeys"
        elif match_keys:
            labels = selector.get("matchLabels") if isinstance(selector.get("matchLabels"), dict) else {}
            selected = [*labels, *(e.get("key") for e in _items(selector.get("matchExpressions"))
                                   if isinstance(e, dict))]
            for key in match_keys:
                if not k8s.is_qualified_name(key) or key in selected:
                    yield (f"{here}.matchLabelKeys {key!r} must be {_NAME_RULE}, and not a key of labelSelector "
                           "too")
        yield from _selector_problems(f"{here}.labelSelector", selector)


def object_meta_problems(labels: dict[str, str] | None, annotations: dict[str, str] | None) -> list[tuple[str, str]]:
    """(field under metadata, message) for an object's own labels and annotations, as ValidateObjectMeta refuses them
    (the API server checks any object's metadata itself; a CRD schema cannot constrain it)."""
    found = []
    for key, value in (labels or {}).items():
        where = f"labels[{json.dumps(key, ensure_ascii=False)}]"
        if not k8s.is_qualified_name(key):
            found.append((where, f"the label key must be {_NAME_RULE} (such as app.kubernetes.io/name): rename it"))
        elif not k8s.is_label_value(value):
            found.append((where, f"the label value {value!r} must be at most 63 letters, digits, '-', '_' and '.', "
                                 "starting and ending with a letter or digit, or empty: change the value"))
    for key in annotations or {}:
        if not k8s.is_qualified_name(key.lower()):  # ValidateAnnotations checks the key lowercased
            found.append((f"annotations[{json.dumps(key, ensure_ascii=False)}]",
                          f"the annotation key must be {_NAME_RULE} (such as example.com/owner): rename it"))
    size = sum(len(k.encode()) + len(v.encode()) for k, v in (annotations or {}).items())
    if size > MAX_ANNOTATIONS_BYTES:
        found.append(("annotations", f"the annotations total {size} bytes, more than the API server's "
                                     f"{MAX_ANNOTATIONS_BYTES} (256 KiB) for one object: move the data to a ConfigMap"))
    return found

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

    found += _env_problems(".env", spec.get("env"))
    for where, container in _containers(spec):
        if where != ".template.trainer":  # the trainer's env is spec.env
            found += _env_problems(f"{where}.env", container.get("env"))
    found += _volume_problems(template.get("volumes"))
    found += [(".template.affinity", message) for message in _affinity_problems(template.get("affinity"))]
    found += [(".template.podSpec.topologySpreadConstraints", message)
              for message in _spread_problems(pod_spec.get("topologySpreadConstraints"))]

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
