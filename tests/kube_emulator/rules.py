"""The API server's rules as plain functions: timestamps, merge patches, Status errors, conditions,
tolerations, label and field selectors, structural-schema pruning and defaults."""

from __future__ import annotations

import copy
import datetime
import re
from typing import Any

from kmock._internal.k8s import KubernetesError

from .resources import PODS


# ---------------------------------------------------------------- small helpers

def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def rfc3339(moment: datetime.datetime | None = None) -> str:
    """The API's timestamps have whole seconds."""
    return (moment or utcnow()).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386: what a merge patch turns `base` into (null removes a key; lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def qualified(resource: Any) -> str:
    """How error messages name a resource: `pods`, `ddpjobs.elastic.ddp.dev`."""
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def api_error(code: int, reason: str, message: str, resource: Any = None, name: str | None = None) -> KubernetesError:
    details: dict[str, Any] = {}
    if name is not None:
        details["name"] = name
    if resource is not None:
        details.update({"group": resource.group} if resource.group else {})
        details["kind"] = resource.plural
    return KubernetesError(status=code, reason=reason, message=message, details=details or None)


def not_found(resource: Any, name: str) -> KubernetesError:
    return api_error(404, "NotFound", f'{qualified(resource)} "{name}" not found', resource, name)


def conflict(resource: Any, name: str, why: str) -> KubernetesError:
    return api_error(409, "Conflict", f'Operation cannot be fulfilled on {qualified(resource)} "{name}": {why}',
                     resource, name)


def bad_request(message: str) -> KubernetesError:
    return api_error(400, "BadRequest", message)


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: str,
                  reason: str | None = None, message: str | None = None) -> tuple[list[dict[str, Any]], bool]:
    """UpdatePodCondition (k8s.io/kubernetes/pkg/api/v1/pod) on a copy: replace or append the
    condition; its transition time moves only with its status. False when nothing changed."""
    new: dict[str, Any] = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": rfc3339()}
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    conditions = [dict(c) for c in conditions or ()]
    for index, old in enumerate(conditions):
        if old.get("type") == type_:
            if old.get("status") == status:
                new["lastTransitionTime"] = old.get("lastTransitionTime")
            same = all(old.get(k) == new.get(k) for k in ("status", "reason", "message", "lastTransitionTime"))
            conditions[index] = new
            return conditions, not same
    return conditions + [new], True


def tolerates(toleration: dict[str, Any], key: str, effect: str) -> bool:
    """Toleration.ToleratesTaint for a taint without a value."""
    if toleration.get("effect") and toleration["effect"] != effect:
        return False
    if toleration.get("key") and toleration["key"] != key:
        return False
    operator = toleration.get("operator") or "Equal"
    return operator == "Exists" or (operator == "Equal" and not toleration.get("value"))


# ---------------------------------------------------------------- selectors

_REQUIREMENT = re.compile(r"""\s*(?:
      (?P<absent>!)\s*(?P<akey>[\w./-]+)
    | (?P<key>[\w./-]+)\s*(?:
          (?P<op>==|=|!=)\s*(?P<value>[\w.-]*)
        | \s(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)
      )?
    )\s*(?:,|$)""", re.VERBOSE)


def parse_label_selector(text: str | None) -> list[tuple[str, str, frozenset[str]]]:
    """`a=b,c!=d,e,!f,g in (h,i),j notin (k)` -> [(key, operator, values)]; 400 if malformed."""
    requirements, text, pos = [], (text or "").strip(), 0
    while pos < len(text):
        match = _REQUIREMENT.match(text, pos)
        if not match or match.end() == pos:
            raise bad_request(f"unable to parse requirement: found {text[pos:]!r} in label selector {text!r}")
        if match["absent"]:
            requirements.append((match["akey"], "!", frozenset()))
        elif match["setop"]:
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            requirements.append((match["key"], match["setop"], values))
        elif match["op"]:
            requirements.append((match["key"], "!=" if match["op"] == "!=" else "=", frozenset([match["value"]])))
        else:
            requirements.append((match["key"], "exists", frozenset()))
        pos = match.end()
    return requirements


def labels_match(labels: dict[str, str] | None, requirements: list[tuple[str, str, frozenset[str]]]) -> bool:
    labels = labels or {}
    for key, op, values in requirements:
        present, value = key in labels, labels.get(key)
        ok = {"exists": present, "!": not present, "=": present and value in values,
              "!=": not present or value not in values,  # as in Kubernetes: a missing label is "not equal"
              "in": present and value in values, "notin": not present or value not in values}[op]
        if not ok:
            return False
    return True


# The fields a real server lets a field selector use (a few per kind; any other is a 400).
SELECTABLE_FIELDS = {"metadata.name", "metadata.namespace"}
SELECTABLE_POD_FIELDS = {"spec.nodeName", "status.phase", "spec.restartPolicy", "spec.schedulerName"}
SELECTABLE_EVENT_FIELDS = {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                           "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.fieldPath",
                           "reason", "reportingComponent", "source", "type"}


def parse_field_selector(text: str | None, resource: Any) -> list[tuple[str, bool, str]]:
    """`metadata.name=x,status.phase!=Running` -> [(path, equal, value)]."""
    requirements = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        match = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", part)
        if not match:
            raise bad_request(f"invalid selector: {text!r}; can't understand {part!r}")
        path, op, value = match.groups()
        if path not in SELECTABLE_FIELDS and not (resource == PODS and path in SELECTABLE_POD_FIELDS) \
                and not (getattr(resource, "plural", None) == "events" and path in SELECTABLE_EVENT_FIELDS):
            raise bad_request(f'field label not supported: {path}')
        requirements.append((path, op != "!=", value))
    return requirements


def fields_match(obj: dict[str, Any], requirements: list[tuple[str, bool, str]]) -> bool:
    for path, equal, value in requirements:
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if ((node if node is not None else "") == value) != equal:
            return False
    return True


# ---------------------------------------------------------------- structural schemas (CRDs)

def prune(value: Any, schema: dict[str, Any] | None) -> Any:
    """What the API server keeps of a custom resource: fields its schema does not declare go,
    unless the schema preserves unknown fields (apiextensions' pruning algorithm)."""
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        if isinstance(value, dict):  # unknown fields stay; known ones are still pruned inside
            props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
            return {k: prune(v, props[k]) if k in props else prune(v, extra) if isinstance(extra, dict) else v
                    for k, v in value.items()}
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            return [prune(v, schema["items"]) for v in value]
        return value
    if isinstance(value, dict):
        if schema is None:
            return {}
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        return {k: prune(v, props[k] if k in props else extra) for k, v in value.items()
                if k in props or isinstance(extra, dict)}
    if isinstance(value, list):
        return [prune(v, (schema or {}).get("items")) for v in value]
    return value


def apply_defaults(value: Any, schema: dict[str, Any] | None) -> Any:
    """Structural defaulting: an absent field (or a null one that is not nullable) gets its
    schema's `default`, then defaults apply inside it too (apiextensions' defaulting algorithm)."""
    if schema is None:
        return value
    if isinstance(value, dict):
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        out = dict(value)
        for key, prop in props.items():
            if "default" in prop and (key not in out or (out[key] is None and not prop.get("nullable"))):
                out[key] = copy.deepcopy(prop["default"])
        return {k: apply_defaults(v, props[k] if k in props else extra if isinstance(extra, dict) else None)
                for k, v in out.items()}
    if isinstance(value, list):
        return [apply_defaults(v, schema.get("items")) for v in value]
    return value


def schema_path(obj: dict[str, Any], path: str) -> Any:
    """A CRD's JSON path like `.spec.replicas`."""
    node: Any = obj
    for part in path.strip(".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node

