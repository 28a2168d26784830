"""The API server's own rules for the Kubernetes values a DDPJob passes through to its pods.

Regular expressions (RE2-compatible: the API server evaluates them in CEL and OpenAPI patterns, the
model with the same text) and the few checks no CRD schema can express (quantity comparisons). Each
rule mirrors k8s.io/apimachinery's validation, so `ddpjob validate` refuses what pod creation would.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

# Largest values the operator computes with: seconds become timedelta added to "now" (a datetime
# until year 9999), counters and steps are int64 on the wire.
MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
MAX_DURATION_SECONDS = 10 * 365 * 86400  # ten years: far beyond any training run, far below datetime's end

# A resource.Quantity, as controller-gen writes its pattern (sign, number, then a binary/decimal SI
# suffix or an exponent); NONNEGATIVE_QUANTITY for requests, limits and sizes (the API server refuses < 0).
QUANTITY = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
            r"|(\.[0-9]+))))?$")
NONNEGATIVE_QUANTITY = (r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
                        r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
# A claim's size: the API server refuses a zero one, so the number has a non-zero digit.
POSITIVE_QUANTITY = (r"^\+?((0*[1-9][0-9]*(\.[0-9]*)?)|([0-9]*\.[0-9]*[1-9][0-9]*))"
                     r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
# A label or annotation key: an optional DNS-subdomain prefix (<= 253) and a name (<= 63).
QUALIFIED_NAME = rf"^({_DNS_SUBDOMAIN}/)?{_NAME_PART}$"
QUALIFIED_NAME_PREFIX_LENGTH = r"^([^/]{1,253}/)?[^/]+$"  # RE2 cannot count inside the structure above
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DNS_1123_LABEL = rf"^{_DNS_LABEL}$"
# An extended resource (a device plugin's): domain-qualified and outside the kubernetes.io namespaces,
# so it can never be cpu, memory, ephemeral-storage or hugepages.
EXTENDED_RESOURCE_NAME = rf"^{_DNS_SUBDOMAIN}/{_NAME_PART}$"
# What a container may request besides cpu and memory (spec.resources sets those).
CONTAINER_RESOURCE_NAME = (rf"^(ephemeral-storage|hugepages-{NONNEGATIVE_QUANTITY[1:-1]}|"
                           rf"{_DNS_SUBDOMAIN}/{_NAME_PART})$")
# An absolute path with no empty, `.` or `..` segment and no trailing slash: one spelling per directory,
# so comparing strings compares mounts (`/dev/shm/` and `//dev/shm` are `/dev/shm` to the runtime).
_SEGMENT = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
NORMALIZED_PATH = rf"^(/|(/{_SEGMENT})+)$"
NO_WHITESPACE = r"^\S+$"
# An env var name as the API server checks it (also an envFrom prefix).
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

PATTERN_FIXES = {
    QUANTITY: "use a Kubernetes quantity such as 500m, 4, 16Gi",
    NONNEGATIVE_QUANTITY: "use a non-negative Kubernetes quantity such as 500m, 4, 16Gi",
    POSITIVE_QUANTITY: "use a Kubernetes quantity above zero such as 20Gi",
    LABEL_VALUE: "use at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
    EXTENDED_RESOURCE_NAME: "use the device plugin's domain-qualified extended resource name, such as "
                            "nvidia.com/gpu or amd.com/gpu (cpu, memory and kubernetes.io/ names are not GPUs)",
    NORMALIZED_PATH: "write an absolute path without a trailing slash, '//', '.' or '..', such as /data",
    NO_WHITESPACE: "remove the whitespace",
}


_QUALIFIED_NAME = re.compile(QUALIFIED_NAME)
_LABEL_VALUE = re.compile(LABEL_VALUE)


def is_qualified_name(value: Any) -> bool:
    """A label or annotation key (ValidateQualifiedName): an optional DNS subdomain prefix of at most 253 characters
    and '/', then a name of at most 63."""
    return (isinstance(value, str) and _QUALIFIED_NAME.fullmatch(value) is not None
            and len(value.rpartition("/")[0]) <= 253)


def is_label_value(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def quantity(value: Any) -> Decimal | None:
    """A quantity's amount (int, or a string matching QUANTITY), None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if not isinstance(value, str):
        return None
    text = value.lstrip("+")
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
                "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix) and text[:-len(suffix)][-1:] not in ("e", "E", ""):
            try:
                return Decimal(text[:-len(suffix)]) * suffixes[suffix]
            except InvalidOperation:
                return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def is_extended(resource: str) -> bool:
    """The API server's IsExtendedResourceName (integer amounts, requests equal to limits)."""
    return "/" in resource and "kubernetes.io/" not in resource and not resource.startswith("requests.")


def container_resource_problems(resources: dict[str, Any], *, has_cpu_or_memory: bool) -> list[tuple[str, str]]:
    """(where, problem) for a container's merged requests and limits, as ValidateResourceRequirements finds them."""
    problems = []
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for part, amounts in (("requests", requests), ("limits", limits)):
        for name, value in amounts.items():
            amount = quantity(value)
            if amount is None or amount < 0:
                problems.append((f"{part}.{name}", f"{value!r} is not a non-negative quantity"))
            elif amount > MAX_INT64:
                problems.append((f"{part}.{name}", f"{value!r} is too large"))
            elif is_extended(name) and amount != amount.to_integral_value():
                problems.append((f"{part}.{name}", f"{value!r}: an extended resource is counted in whole units"))
            if name.startswith("hugepages-") and not has_cpu_or_memory:
                problems.append((f"{part}.{name}", "hugepages need a cpu or memory request "
                                                   "(set spec.resources.cpu or spec.resources.memory)"))
    for name, value in requests.items():
        request, limit = quantity(value), quantity(limits.get(name)) if name in limits else None
        if request is None:
            continue
        if limit is not None and request > limit:
            problems.append((f"requests.{name}", f"{value!r} is above its limit {limits[name]!r}"))
        if (is_extended(name) or name.startswith("hugepages-")) and (limit is None or limit != request):
            problems.append((f"requests.{name}", "must equal limits." + name + " (the API server does not "
                                                 "overcommit extended resources and hugepages)"))
    return problems


def schema_problem(schema: dict[str, Any], value: Any, path: str) -> tuple[str, str] | None:
    """The first violation of what a CRD schema declares for a pass-through value (type, maxLength, maxItems,
    maximum, nested properties and items): the API server checks them, so the model does too."""
    kind = schema.get("type")
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}
    if kind in types and (not isinstance(value, types[kind]) or (kind in ("integer", "number")
                                                                  and isinstance(value, bool))):
        return path, f"must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        return path, f"too long: at most {schema['maxLength']} characters"
    if isinstance(value, list) and len(value) > schema.get("maxItems", len(value)):
        return path, f"too many items: at most {schema['maxItems']}"
    if isinstance(value, (int, float)) and "maximum" in schema and value > schema["maximum"]:
        return path, f"must be <= {schema['maximum']}"
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                found = schema_problem(sub, value[key], f"{path}.{key}")
                if found:
                    return found
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found = schema_problem(schema["items"], item, f"{path}[{i}]")
            if found:
                return found
    return None
