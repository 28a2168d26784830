"""Check objects against the generated CRD the way the API server does, without one.

Defaulting, strict unknown-field rejection, OpenAPI keywords (via jsonschema) and the
x-kubernetes-validations CEL rules, evaluated by default with the CEL runtime the model uses, or
with `independent_cel` (another CEL implementation, celpy: the model uses `common-expression-language`): the oracle
that judges the CRD's rules must not be the code under test. The e2e suite repeats the corpus against a
real API server where a cluster is reachable.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable

import celpy
import jsonschema

from ddpjob_operator import model


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict) and "properties" in schema:
        for key, prop in schema["properties"].items():
            if key not in value and "default" in prop:
                value[key] = copy.deepcopy(prop["default"])
            if key in value:
                value[key] = apply_defaults(prop, value[key])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return value


class RuleDoesNotCompile(ValueError):
    pass


@functools.lru_cache(maxsize=None)
def independent_program(rule: str) -> Any:
    """The rule compiled by a CEL implementation the product does not use (RuleDoesNotCompile: the API
    server, whose cel-go has the same grammar, would refuse the CRD)."""
    env = celpy.Environment()
    try:
        return env.program(env.compile(rule))
    except celpy.CELParseError as exc:
        raise RuleDoesNotCompile(f"{rule}: {exc}") from None


def independent_cel(rule: str, value: Any) -> bool:
    """A rule that does not compile raises RuleDoesNotCompile: the API server would refuse the CRD. One that fails
    to evaluate raises celpy.CELEvalError (celpy also fails on some errors that cel-go absorbs, `false && error`
    inside a macro among them)."""
    return bool(independent_program(rule).evaluate({"self": celpy.json_to_cel(value)}))


def api_server_errors(schema: dict[str, Any], obj: dict[str, Any],
                      evaluate: Callable[[str, Any], bool] = model.evaluate_cel) -> list[str]:
    """Errors as `path: message`, in the spirit of the API server's field errors."""
    obj = apply_defaults(schema, copy.deepcopy(obj))
    errors = []
    for err in jsonschema.Draft4Validator(schema).iter_errors(obj):
        where = tuple(err.absolute_path)
        if err.validator == "required":  # the API server names the missing field itself
            missing = [f for f in err.validator_value if f not in err.instance]
            errors += [f"{_path(where + (f,))}: Required value" for f in missing]
            continue
        errors.append(f"{_path(where)}: {err.message}")
    errors += _unknown_fields(schema, obj, ())
    if not errors:  # like the API server, CEL runs on an object that passed the schema
        errors += _cel_errors(schema, obj, (), evaluate)
    return errors


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _unknown_fields(schema: dict[str, Any], value: Any, loc: tuple) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    errors = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                if loc == ("metadata",):
                    continue  # the API server owns the rest of metadata
                errors.append(f"{_path(loc + (key,))}: field not declared in schema")
            else:
                errors += _unknown_fields(schema["properties"][key], item, loc + (key,))
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _unknown_fields(schema["items"], item, loc + (i,))
    return errors


def _cel_errors(schema: dict[str, Any], value: Any, loc: tuple, evaluate: Callable[[str, Any], bool]) -> list[str]:
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        if not evaluate(rule["rule"], value):
            field = rule.get("fieldPath", "").lstrip(".")
            where = loc + tuple(field.split(".")) if field else loc
            errors.append(f"{_path(where)}: {rule['message']}")
    if isinstance(value, dict):
        for key, prop in schema.get("properties", {}).items():
            if key in value:
                errors += _cel_errors(prop, value[key], loc + (key,), evaluate)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _cel_errors(schema["items"], item, loc + (i,), evaluate)
    return errors


def structural_problems(schema: Any, loc: str = "") -> list[str]:
    """Violations of the apiextensions.k8s.io/v1 structural schema rules."""
    problems = []
    if not isinstance(schema, dict):
        return [f"{loc}: schema node is not an object"]
    for banned in ("$ref", "anyOf", "oneOf", "allOf", "not", "definitions", "$defs", "nullable"):
        if banned in schema:
            problems.append(f"{loc}: uses {banned}")
    if "type" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields") \
            and not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{loc}: node has no type")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{loc}: properties and additionalProperties together")
    if schema.get("type") == "array" and "items" not in schema:
        problems.append(f"{loc}: array without items")
    if "default" in schema:
        try:
            jsonschema.Draft4Validator(_without_defaults(schema)).validate(schema["default"])
        except jsonschema.ValidationError as exc:
            problems.append(f"{loc}: default does not validate: {exc.message}")
    for key, prop in schema.get("properties", {}).items():
        problems += structural_problems(prop, f"{loc}.{key}")
    if isinstance(schema.get("items"), dict):
        problems += structural_problems(schema["items"], f"{loc}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += structural_problems(schema["additionalProperties"], f"{loc}{{}}")
    return problems


def _without_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    return node
