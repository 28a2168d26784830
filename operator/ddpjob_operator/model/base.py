"""The machinery every DDPJob model is built on: one typed, validated model that is also the CRD's schema.

Field constraints (types, ranges, enums, patterns) become the OpenAPI schema; cross-field rules are CEL
expressions (`cel()`) that the API server evaluates at `kubectl apply` (x-kubernetes-validations) and that
`APIModel` evaluates locally with the same text (`evaluate_cel`), so `ddpjob validate` and the cluster agree.
`salvage` reads back what a cluster stored (a status) keeping every valid field.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, TypeVar, get_origin

# common-expression-language: cel-go's semantics in Rust (celpy, pure Python, took seconds for one legal list).
import cel as cel_runtime
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from .. import k8s_fields as k8s

DNS_1035_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUANTITY_PATTERN = k8s.NONNEGATIVE_QUANTITY


# Rules the model judges with a Python function of the same verdict: CEL that walks lists within lists costs seconds
# offline (32 init containers x 64 mounts x 64 volumes: 5 s of CPU) where the API server bounds its cost itself.
# tests/api/test_offline_checks_agree_with_their_cel_rules.py proves each one agrees with its rule.
OFFLINE_CHECKS: dict[str, Callable[[Any], bool]] = {}


def cel(rule: str, message: str, field_path: str | None = None, *,
        offline: Callable[[Any], bool] | None = None) -> dict[str, str]:
    """One cross-field rule, in the shape of a CRD `x-kubernetes-validations` entry; `offline`: its verdict in
    Python, which the model uses instead of evaluating the rule (the CRD keeps the rule for the API server)."""
    if offline is not None:
        OFFLINE_CHECKS[rule] = offline
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def distinct(entries: list[dict[str, Any]], key: str) -> bool:
    """Whether the entries that have `key` all differ in it: `l.all(e, !has(e.k) || l.exists_one(f, has(f.k) &&
    f.k == e.k))` in linear time. The values are strings: the CRD's schema is checked before any rule."""
    values = [entry[key] for entry in entries if key in entry]
    return len(set(values)) == len(values)


def cel_string(text: str) -> str:
    """`text` as a CEL string literal: a regex's backslashes doubled (`\\.` alone is an invalid escape in
    CEL's grammar, and an API server would refuse the CRD)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def free_form(description: str) -> Any:
    """A Kubernetes object passed through as-is (affinity, tolerations, volumes...)."""
    return Field(default=None, description=description,
                 json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"})


class APIModel(BaseModel):
    """camelCase on the wire, unknown fields rejected, CEL rules checked after field validation."""

    # strict: no true -> 1 or "2" -> 2, as the API server's `type: integer` refuses both.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True, strict=True)
    cel_rules: ClassVar[tuple[dict[str, str], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.cel_rules:
            extra = dict(cls.model_config.get("json_schema_extra") or {})
            extra["x-kubernetes-validations"] = [dict(r) for r in cls.cel_rules]
            cls.model_config = {**cls.model_config, "json_schema_extra": extra}

    @model_validator(mode="after")
    def _check_cel_rules(self) -> "APIModel":
        # First what the CRD declares for pass-through objects (maxLength of a volume's name, ...): the
        # model's types do not check it, the API server does, and the rules below rely on it.
        for name, key, declared, declared_items in _declared_schemas(type(self)):
            value = getattr(self, name)
            if value is None:
                continue
            problem = k8s.schema_problem(declared_items if isinstance(value, list) else declared, value, key)
            if problem:
                raise CelRuleError({"rule": "", "message": f"{problem[0]}: {problem[1]}", "fieldPath": f".{key}"})
        if self.cel_rules:
            # Each rule gets only the fields it reads, converted to CEL values per evaluation: a legal 98,000-value
            # affinity that no rule reads cost seconds per rule, and 128 env entries cost every rule of the spec.
            wire = self.model_dump(by_alias=True, exclude_none=True, mode="json")
            for rule in self.cel_rules:
                pruned = _prune(wire, _fields_read(rule["rule"]))
                if not (_holds(rule["rule"], pruned) if pruned else _holds_without_fields(rule["rule"])):
                    raise CelRuleError(rule)
        return self

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, no nulls)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")



@functools.lru_cache(maxsize=None)
def _declared_schemas(model_cls: type[APIModel]) -> tuple[tuple[str, str, dict[str, Any], dict[str, Any]], ...]:
    """(name, key, schema, schema of a list) of each field whose CRD schema the model's types do not check."""
    return tuple((name, field.alias or name, field.json_schema_extra,
                  {k: v for k, v in field.json_schema_extra.items() if k != "type"})
                 for name, field in model_cls.model_fields.items() if isinstance(field.json_schema_extra, dict))


def _holds(rule: str, value: Any) -> bool:
    offline = OFFLINE_CHECKS.get(rule)
    return offline(value) if offline else evaluate_cel(rule, value)


@functools.lru_cache(maxsize=None)
def _holds_without_fields(rule: str) -> bool:
    """The verdict where none of the fields the rule reads is set (most rules, on most objects): judged once."""
    return _holds(rule, {})


class StatusModel(APIModel):
    """What the operator writes: built in code, so not strict (the spec's models are, as the API server is)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True, strict=False)


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class inside a field annotation such as `Backoff`, `list[EnvVar]` or `X | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = model_in(arg)
        if found is not None:
            return found
    return None


M = TypeVar("M", bound=BaseModel)


def salvage(model_cls: type[M], raw: Any) -> M | None:
    """`model_cls` from `raw`, keeping every valid field (for data read back, such as a stored status).

    Unknown keys are ignored; an invalid field is dropped alone (its default applies); in a list of
    objects only the entries that cannot be built are dropped; nested objects are salvaged the same
    way. None when `raw` is not a mapping or a required field is missing or invalid.
    """
    if not isinstance(raw, Mapping):
        return None
    kept: dict[str, Any] = {}
    for name, field in model_cls.model_fields.items():
        key = field.alias or name
        if key not in raw and name not in raw:
            continue
        value = raw[key] if key in raw else raw[name]
        inner = model_in(field.annotation)
        if inner is not None:
            if isinstance(value, list) and _is_list(field.annotation):
                value = [item for item in (salvage(inner, v) for v in value) if item is not None]
            elif isinstance(value, Mapping):
                value = salvage(inner, value)
                if value is None:
                    continue
        try:
            kept[name] = _field_adapter(model_cls, name).validate_python(value)
        except ValidationError:
            continue
    try:
        return model_cls.model_validate(kept)
    except ValidationError:
        return None


def _is_list(annotation: Any) -> bool:
    if get_origin(annotation) is list:
        return True
    return any(_is_list(arg) for arg in getattr(annotation, "__args__", ()) or ())


@functools.lru_cache(maxsize=None)
def _field_adapter(model_cls: type[BaseModel], name: str) -> TypeAdapter[Any]:
    field = model_cls.model_fields[name]  # its type and constraints (ge, pattern...), not its alias
    return TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)


class CelRuleError(ValueError):
    """A failed cross-field rule; carries the rule so the error can name its field."""

    def __init__(self, rule: dict[str, str]):
        self.rule = rule
        super().__init__(rule["message"])


@functools.lru_cache(maxsize=None)
def _cel_program(rule: str) -> Any:
    return cel_runtime.compile(rule)


def evaluate_cel(rule: str, value: Any) -> bool:
    """Whether `value` (JSON) passes the rule. A rule that fails to evaluate (no such key, no such overload) refuses
    the object, as the API server's does."""
    try:
        return bool(_cel_program(rule).execute({"self": value}))
    except Exception:  # noqa: BLE001 - the library raises plain exceptions (KeyError, TypeError...) for CEL's errors
        return False


# `self.a.b` in a rule, and whether a call follows (`self.env.all(`: a macro or method on `self.env`).
_SELF_PATH = re.compile(r"\bself((?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\s*\()?")
_PRESENCE_TEST = re.compile(r"\bhas\(\s*self((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*\)")
WHOLE: Any = None  # a field a rule reads as a whole: kept entire


@functools.lru_cache(maxsize=None)
def _fields_read(rule: str) -> Any:
    """The tree of fields the rule reads: {name: subtree}, WHOLE for a field read as a value; an empty subtree
    for one only tested with has() (its presence is kept, not its content). WHOLE when the rule reads `self`
    other than through named fields."""
    tree: dict[str, Any] = {}
    presence = {m.start(1) - len("self") for m in _PRESENCE_TEST.finditer(rule)}
    for match in _SELF_PATH.finditer(rule):
        names = match.group(1).split(".")[1:]
        if match.group(2):  # a call: the last name is the method, the field before it is read whole
            names = names[:-1]
        if not names:
            return WHOLE
        node = tree
        for name in names[:-1]:
            if node.get(name, {}) is WHOLE:
                break
            node = node.setdefault(name, {})
        else:
            if match.start() in presence and not match.group(2):
                node.setdefault(names[-1], {})
            else:
                node[names[-1]] = WHOLE
    return tree


def _prune(value: Any, read: Any) -> Any:
    """`value` with only the fields in `read` (_fields_read's tree)."""
    if read is WHOLE:
        return value
    if isinstance(value, dict):
        return {key: _prune(value[key], sub) for key, sub in read.items() if key in value}
    if isinstance(value, list) and not read:
        return []  # tested for presence only
    return value
