"""The API server's (and kubelet's) rules for Pods, Services and claims that OpenAPI schemas miss.

Written from k8s.io/apimachinery/pkg/util/validation, pkg/apis/core/validation and the kubelet, independently
of the operator's model (its own regexes are not imported: a shared mistake would hide here).
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from decimal import Decimal, InvalidOperation
from typing import Any

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
QUANTITY = re.compile(r"([+-]?)([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "n": Decimal("1e-9"),
          "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "P": 10**15, "E": 10**18}
STANDARD_CONTAINER_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
FQDN_MAX = 64  # the kubelet's limit for setHostnameAsFQDN (a Linux hostname)


def dns_label(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and DNS_LABEL.fullmatch(value) is not None


def dns_subdomain(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 253 and DNS_SUBDOMAIN.fullmatch(value) is not None


def qualified_name(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    prefix, _, name = value.rpartition("/")
    if "/" in value and (not prefix or not dns_subdomain(prefix)):
        return False
    return 0 < len(name) <= 63 and QUALIFIED_NAME_PART.fullmatch(name) is not None


def label_value(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.fullmatch(value) is not None


def quantity(value: Any) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    match = QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    sign, number, _, suffix = match.groups()
    suffix = suffix or ""
    try:
        amount = Decimal(number)
        amount = amount * Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else amount * SUFFIX[suffix]
    except (InvalidOperation, KeyError):
        return None
    return -amount if sign == "-" else amount


def _extended(name: str) -> bool:
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _labels(where: str, labels: Any) -> list[str]:
    return [f"{where}: invalid key {k!r} or value {v!r}" for k, v in (labels or {}).items()
            if not qualified_name(k) or not label_value(v)]


def _resources(where: str, resources: dict[str, Any], pod_has_cpu_or_memory: bool) -> list[str]:
    errors = []
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for part, amounts in (("requests", requests), ("limits", limits)):
        for name, value in amounts.items():
            if name not in STANDARD_CONTAINER_RESOURCES and not name.startswith("hugepages-") and (
                    "/" not in name or not qualified_name(name)):
                errors.append(f"{where}.{part}.{name}: not a container resource name")
            amount = quantity(value)
            if amount is None or amount < 0:
                errors.append(f"{where}.{part}.{name}: {value!r} is not a non-negative quantity")
                continue
            if _extended(name) and amount != amount.to_integral_value():
                errors.append(f"{where}.{part}.{name}: must be an integer")
            if name.startswith("hugepages-") and not pod_has_cpu_or_memory:
                errors.append(f"{where}.{part}.{name}: hugepages require cpu or memory")
    for name, value in requests.items():
        request, limit = quantity(value), quantity(limits.get(name, "x"))
        if request is not None and limit is not None and request > limit:
            errors.append(f"{where}.requests.{name}: must be <= the limit")
        if (_extended(name) or name.startswith("hugepages-")) and request is not None and request != limit:
            errors.append(f"{where}.requests.{name}: must equal the limit (not overcommitable)")
    return errors


def _mount_path(path: str) -> str:
    # What the container runtime mounts: a clean absolute path.
    return posixpath.normpath("/" + path.lstrip("/")) if path.startswith("/") else path


def pod_errors(pod: dict[str, Any]) -> list[str]:
    meta, spec = pod["metadata"], pod["spec"]
    errors = []
    if not dns_subdomain(meta.get("name")):
        errors.append(f"metadata.name: {meta.get('name')!r} is not a DNS subdomain")
    errors += _labels("metadata.labels", meta.get("labels"))
    errors += [f"metadata.annotations: invalid key {k!r}" for k in (meta.get("annotations") or {})
               if not qualified_name(k)]
    volumes = spec.get("volumes") or []
    names = [v.get("name") for v in volumes]
    errors += [f"spec.volumes: invalid name {n!r}" for n in names if not dns_label(n)]
    errors += [f"spec.volumes: duplicate name {n!r}" for n in set(names) if names.count(n) > 1]
    for field in ("hostname", "subdomain"):
        if field in spec and not dns_label(spec[field]):
            errors.append(f"spec.{field}: {spec[field]!r} is not a DNS label")
    if spec.get("dnsPolicy") not in (None, "ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"):
        errors.append(f"spec.dnsPolicy: unsupported {spec['dnsPolicy']!r}")
    if spec.get("dnsPolicy") == "None" and not (spec.get("dnsConfig") or {}).get("nameservers"):
        errors.append("spec.dnsConfig.nameservers: required with dnsPolicy None")
    errors += _labels("spec.nodeSelector", spec.get("nodeSelector"))
    if spec.get("setHostnameAsFQDN") and "hostname" in spec:
        fqdn = f"{spec['hostname']}.{spec.get('subdomain')}.{meta['namespace']}.svc.cluster.local"
        if len(fqdn) > FQDN_MAX:
            errors.append(f"spec.hostname: FQDN {fqdn} is longer than {FQDN_MAX}")
    containers = [("containers", c) for c in spec.get("containers", [])] + \
        [("initContainers", c) for c in spec.get("initContainers") or []]
    container_names = [c.get("name") for _, c in containers]
    errors += [f"spec.containers: duplicate name {n!r}" for n in set(container_names) if container_names.count(n) > 1]
    for kind, container in containers:
        where = f"spec.{kind}[{container.get('name')}]"
        if not dns_label(container.get("name")):
            errors.append(f"{where}.name: not a DNS label")
        image = container.get("image")
        if kind == "containers" and (not image or image.strip() != image or any(c.isspace() for c in image)):
            errors.append(f"{where}.image: {image!r} is empty or has whitespace")
        errors += [f"{where}.env: invalid name {e.get('name')!r}" for e in container.get("env") or []
                   if not ENV_NAME.fullmatch(str(e.get("name")))]
        for source in container.get("envFrom") or []:
            if source.get("prefix") and not ENV_NAME.fullmatch(source["prefix"]):
                errors.append(f"{where}.envFrom: invalid prefix {source['prefix']!r}")
        mounts = container.get("volumeMounts") or []
        paths = [_mount_path(m.get("mountPath", "")) for m in mounts]
        errors += [f"{where}.volumeMounts: {p!r} mounted twice" for p in set(paths) if paths.count(p) > 1]
        errors += [f"{where}.volumeMounts: {m.get('mountPath')!r} is not absolute" for m in mounts
                   if not str(m.get("mountPath", "")).startswith("/")]
        errors += [f"{where}.volumeMounts: volume {m.get('name')!r} not found" for m in mounts
                   if m.get("name") not in names]
        resources = container.get("resources") or {}
        cpu_or_memory = any(k in (resources.get(p) or {}) for p in ("requests", "limits") for k in ("cpu", "memory"))
        errors += _resources(f"{where}.resources", resources, cpu_or_memory)
    for i, toleration in enumerate(spec.get("tolerations") or []):
        if toleration.get("key") and not qualified_name(toleration["key"]):
            errors.append(f"spec.tolerations[{i}].key: not a qualified name")
        if toleration.get("operator") == "Exists" and toleration.get("value"):
            errors.append(f"spec.tolerations[{i}].value: must be empty with Exists")
    errors += _pod_spec_rules(meta, spec)
    for volume in volumes:
        if "emptyDir" in volume and "sizeLimit" in (volume["emptyDir"] or {}):
            amount = quantity(volume["emptyDir"]["sizeLimit"])
            if amount is None or amount < 0:
                errors.append(f"spec.volumes[{volume['name']}].emptyDir.sizeLimit: not a non-negative quantity")
    return errors


def _ip(value: Any) -> bool:
    try:
        ipaddress.ip_address(value)
        return isinstance(value, str)
    except ValueError:
        return False


def _pod_spec_rules(meta: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """ValidatePodSpec's cross-field rules and the kubelet's exec limits (issue 31, item 5)."""
    errors = []
    annotations = meta.get("annotations") or {}
    if sum(len(k.encode()) + len(str(v).encode()) for k, v in annotations.items()) > 256 * 1024:
        errors.append("metadata.annotations: Too long: must have at most 262144 bytes")
    cost = annotations.get("controller.kubernetes.io/pod-deletion-cost")
    if cost is not None and not (re.fullmatch(r"[+-]?[0-9]+", cost) and -(2**31) <= int(cost) < 2**31):
        errors.append("metadata.annotations: pod-deletion-cost must be an int32")
    if (spec.get("os") or {}).get("name") == "windows" and "fsGroup" in (spec.get("securityContext") or {}):
        errors.append("spec.securityContext.fsGroup: Forbidden: windows pods")
    if spec.get("shareProcessNamespace") and spec.get("hostPID"):
        errors.append("spec.shareProcessNamespace: Invalid value: with hostPID")
    if spec.get("overhead") and not spec.get("runtimeClassName"):
        errors.append("spec.overhead: Forbidden: set by the RuntimeClass")
    if "priorityClassName" in spec and not dns_subdomain(spec["priorityClassName"]):
        errors.append("spec.priorityClassName: not a DNS subdomain")
    if spec.get("hostNetwork") and spec.get("dnsPolicy") == "ClusterFirst":
        errors.append("spec.dnsPolicy: ClusterFirst with hostNetwork resolves through the node: peers unreachable")
    errors += [f"spec.dnsConfig.nameservers: {n!r} is not an IP" for n in (spec.get("dnsConfig") or {})
               .get("nameservers") or [] if not _ip(n)]
    errors += [f"spec.hostAliases: {a.get('ip')!r} is not an IP" for a in spec.get("hostAliases") or []
               if not _ip(a.get("ip"))]
    errors += _scheduling_rules(spec)
    for volume in spec.get("volumes") or []:
        sources = [k for k, v in volume.items() if k != "name" and v is not None]  # a volume is a name and a source
        if len(sources) != 1:
            errors.append(f"spec.volumes[{volume.get('name')}]: must specify exactly one volume type, not {sources}")
    containers = [*spec.get("containers", []), *(spec.get("initContainers") or [])]
    for c in containers:
        where = f"spec.containers[{c.get('name')}]"
        errors += [f"{where}.env[{e['name']}].valueFrom: {problem}" for e in c.get("env") or []
                   for problem in _value_from(e)]
        if not c.get("image"):
            errors.append(f"{where}.image: Required value")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in c and sum(h in c[probe] for h in ("exec", "httpGet", "tcpSocket", "grpc")) != 1:
                errors.append(f"{where}.{probe}: must have exactly one handler")
            port = next((c[probe][h].get("port") for h in ("httpGet", "tcpSocket", "grpc")
                         if h in (c.get(probe) or {})), None)
            if isinstance(port, int) and not 1 <= port <= 65535:
                errors.append(f"{where}.{probe}: port out of range")
        for port in c.get("ports") or []:
            if not 1 <= port.get("containerPort", 0) <= 65535 or not 0 <= port.get("hostPort", 0) <= 65535:
                errors.append(f"{where}.ports: out of range")
            elif spec.get("hostNetwork") and port.get("hostPort") not in (None, port.get("containerPort")):
                errors.append(f"{where}.ports: hostPort must equal containerPort with hostNetwork")
        for mount in c.get("volumeMounts") or []:
            sub = mount.get("subPath") or ""
            if sub.startswith("/") or ".." in posixpath.normpath(sub or ".").split("/") or ".." in sub.split("/"):
                errors.append(f"{where}.volumeMounts.subPath: must not escape the volume")
        for part in ("requests", "limits"):
            for name, value in ((c.get("resources") or {}).get(part) or {}).items():
                if name.startswith("hugepages-") and quantity(value) % quantity(name[10:]) != 0:
                    errors.append(f"{where}.resources.{part}.{name}: not a multiple of the page size")
        strings = [*(c.get("command") or []), *(c.get("args") or []),
                   *(f"{e['name']}={e.get('value', '')}" for e in c.get("env") or [])]
        errors += [f"{where}: an argument or variable over MAX_ARG_STRLEN or with NUL" for text in strings
                   if "\x00" in text or len(text.encode()) + 1 > 128 * 1024]
    return errors


ENV_POD_FIELDS = {"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
                  "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}
ENV_CONTAINER_RESOURCES = {f"{part}.{name}" for part in ("limits", "requests")
                           for name in ("cpu", "memory", "ephemeral-storage")}


def _value_from(var: dict[str, Any]) -> list[str]:
    """validateEnvVarValueFrom."""
    source = var.get("valueFrom")
    if source is None:
        return []
    refs = {k: v for k, v in source.items() if v is not None}
    if len(refs) != 1:
        return [f"must have exactly one source, has {sorted(refs)}"]
    if var.get("value"):
        return ["may not be specified when value is not empty"]
    (kind, ref), = refs.items()
    if kind == "fieldRef":
        path = ref.get("fieldPath", "")
        subscripted = re.fullmatch(r"metadata\.(labels|annotations)\['(.*)'\]", path)
        if subscripted and not qualified_name(subscripted.group(2).lower()):
            return [f"fieldRef.fieldPath {path}: invalid key"]
        if not subscripted and path not in ENV_POD_FIELDS:
            return [f"fieldRef.fieldPath: Unsupported value: {path!r}"]
    if kind == "resourceFieldRef":
        resource = ref.get("resource", "")
        if resource not in ENV_CONTAINER_RESOURCES and not re.match(r"(limits|requests)\.hugepages-", resource):
            return [f"resourceFieldRef.resource: Unsupported value: {resource!r}"]
    return []


def _selector_requirements(where: str, requirements: list[dict[str, Any]], operators: set[str]) -> list[str]:
    errors = []
    for r in requirements:
        op, values = r.get("operator"), r.get("values") or []
        if op not in operators:
            errors.append(f"{where}.operator: Unsupported value: {op!r}")
        elif (op in ("In", "NotIn") and not values) or (op in ("Exists", "DoesNotExist") and values) or (
                op in ("Gt", "Lt") and len(values) != 1):
            errors.append(f"{where}.values: wrong number of values for {op}")
        if not qualified_name(r.get("key")):
            errors.append(f"{where}.key: invalid")
        errors += [f"{where}.values: {v!r} invalid" for v in values if not label_value(v)]
    return errors


def _scheduling_rules(spec: dict[str, Any]) -> list[str]:
    """hostUsers, topology spread, node affinity and the pod's gates (ValidatePodSpec)."""
    errors = []
    if spec.get("hostUsers") is False and any(spec.get(f) for f in ("hostNetwork", "hostPID", "hostIPC")):
        errors.append("spec.hostUsers: Forbidden: with host namespaces")
    constraints = spec.get("topologySpreadConstraints") or []
    pairs = [(c.get("topologyKey"), c.get("whenUnsatisfiable")) for c in constraints]
    for i, c in enumerate(constraints):
        where = f"spec.topologySpreadConstraints[{i}]"
        if not (c.get("maxSkew") or 0) > 0:
            errors.append(f"{where}.maxSkew: must be greater than zero")
        if not c.get("topologyKey"):
            errors.append(f"{where}.topologyKey: Required value")
        if c.get("whenUnsatisfiable") not in ("DoNotSchedule", "ScheduleAnyway"):
            errors.append(f"{where}.whenUnsatisfiable: Unsupported value")
        if pairs.count(pairs[i]) > 1:
            errors.append(f"{where}: Duplicate value {pairs[i]}")
        if "minDomains" in c and (c["minDomains"] <= 0 or c.get("whenUnsatisfiable") != "DoNotSchedule"):
            errors.append(f"{where}.minDomains: Invalid value")
        selector = c.get("labelSelector")
        if c.get("matchLabelKeys") and selector is None:
            errors.append(f"{where}.matchLabelKeys: Forbidden without labelSelector")
        if selector is not None:
            errors += _labels(f"{where}.labelSelector.matchLabels", selector.get("matchLabels"))
            errors += _selector_requirements(f"{where}.labelSelector", selector.get("matchExpressions") or [],
                                             {"In", "NotIn", "Exists", "DoesNotExist"})
    node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        terms = required.get("nodeSelectorTerms") or []
        if not terms:
            errors.append("spec.affinity.nodeAffinity.required.nodeSelectorTerms: Required value")
        for term in terms:
            errors += _selector_requirements("spec.affinity.nodeAffinity.required", term.get("matchExpressions") or [],
                                             {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
    affinity = spec.get("affinity") or {}
    weighted = [*node.get("preferredDuringSchedulingIgnoredDuringExecution", []),
                *(affinity.get("podAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution", []),
                *(affinity.get("podAntiAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution", [])]
    errors += [f"spec.affinity: weight {w.get('weight')!r} not in 1-100" for w in weighted
               if not 1 <= w.get("weight", 0) <= 100]
    pod_terms = [*(affinity.get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution", []),
                 *(affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution", []),
                 *(w["podAffinityTerm"] for w in weighted if "podAffinityTerm" in w)]
    errors += [f"spec.affinity: topologyKey {t.get('topologyKey')!r} invalid" for t in pod_terms
               if not qualified_name(t.get("topologyKey"))]
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    errors += [f"spec.schedulingGates: {g!r} invalid or duplicate" for g in gates
               if not qualified_name(g) or gates.count(g) > 1]
    errors += [f"spec.readinessGates: {g.get('conditionType')!r} invalid" for g in spec.get("readinessGates") or []
               if not qualified_name(g.get("conditionType"))]
    return errors


def object_errors(obj: dict[str, Any]) -> list[str]:
    """API-server errors for one object the operator creates (Pod, Service, PersistentVolumeClaim, PodGroup)."""
    kind = obj["kind"]
    if kind == "Pod":
        return pod_errors(obj)
    meta = obj["metadata"]
    errors = _labels("metadata.labels", meta.get("labels"))
    name = meta.get("name")
    if kind == "Service" and not (isinstance(name, str) and len(name) <= 63 and DNS_1035.fullmatch(name)):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    if kind != "Service" and not dns_subdomain(name):
        errors.append(f"metadata.name: {name!r} is not a DNS subdomain")
    if kind == "PersistentVolumeClaim":
        size = quantity(obj["spec"]["resources"]["requests"]["storage"])
        if size is None or size <= 0:
            errors.append("spec.resources.requests.storage: must be a positive quantity")
        storage_class = obj["spec"].get("storageClassName")
        if storage_class not in (None, "") and not dns_subdomain(storage_class):
            errors.append("spec.storageClassName: not a DNS subdomain")
    return errors
