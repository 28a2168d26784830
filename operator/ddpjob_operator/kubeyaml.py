"""YAML as kubectl reads and writes it: YAML 1.1 scalars resolved the way sigs.k8s.io/yaml (go-yaml v2) resolves
them, then carried as JSON.

PyYAML resolves plain scalars by its own YAML 1.1 table, which differs from go-yaml v2 where it matters to a
manifest: `1:00` is 60 to PyYAML (base 60) and the string "1:00" to kubectl; `y`/`n` are strings to PyYAML and
booleans to kubectl; `1e1` and `0o17` are strings to PyYAML and 10 and 15 to kubectl; an unquoted date is a
date to PyYAML and a string to kubectl (go-yaml keeps a timestamp's text when decoding into interface{}).
So every plain scalar here is resolved by `resolve_plain`, written from go-yaml v2's rules, and a value JSON
cannot carry (`.inf`, `.nan`: kubectl fails with "json: unsupported value") is refused.

The parser is libyaml's when PyYAML has it (a 3 MiB file in about a second, not half a minute), and a first
pass over the event stream bounds the number of values and the nesting before any object is built.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any, Iterator

import yaml

_Emitter = yaml.emitter.Emitter

PLAIN_TAG = "tag:ddpjob,plain"  # a plain (unquoted, untagged) scalar, resolved by resolve_plain
_TAG = "tag:yaml.org,2002:"


class UnsupportedValue(ValueError):
    """A scalar kubectl cannot send (JSON has no infinity or NaN)."""


_BOOLS = {**dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
          **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False)}
_NULLS = ("", "~", "null", "Null", "NULL")
_NOT_JSON = {f"{sign}.{word}" for word in ("inf", "Inf", "INF") for sign in ("", "+", "-")} | {".nan", ".NaN", ".NAN"}
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_LEADING_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")
_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}
_MAX_UINT64 = 2**64 - 1


def _go_parse_int(text: str, *, signed: bool) -> int | None:
    """Go's strconv.ParseInt(text, 0, 64) (ParseUint when not signed): a sign, then 0b/0o/0x or a leading 0
    (octal) or decimal digits; None where Go returns an error."""
    sign, body = 1, text
    if signed and body[:1] in ("+", "-"):
        sign, body = (-1 if body[0] == "-" else 1), body[1:]
    if not body:
        return None
    base = 10
    if body[0] == "0":
        if len(body) >= 3 and body[1] in "bB":
            base, body = 2, body[2:]
        elif len(body) >= 3 and body[1] in "oO":
            base, body = 8, body[2:]
        elif len(body) >= 3 and body[1] in "xX":
            base, body = 16, body[2:]
        else:
            base, body = 8, body[1:]
            if not body:
                return 0
    if not body or any(c not in _DIGITS[base] for c in body):
        return None
    value = sign * int(body, base)
    if signed and not -(2**63) <= value < 2**63:
        return None
    if not signed and value > _MAX_UINT64:
        return None
    return value


def resolve_plain(text: str) -> Any:
    """The value kubectl sends for a plain scalar (go-yaml v2's resolve, then JSON)."""
    if text in _BOOLS:
        return _BOOLS[text]
    if text in _NULLS:
        return None
    if text in _NOT_JSON:
        raise UnsupportedValue(text)
    first = text[0]
    if first == ".":
        if _LEADING_DOT_FLOAT.fullmatch(text):
            return float(text)
        return text
    if first not in "+-0123456789":
        return text
    # An unquoted timestamp (2024-01-02) stays its text in kubectl; none of them parses as a number below.
    digits = text.replace("_", "")
    for signed in (True, False):
        value = _go_parse_int(digits, signed=signed)
        if value is not None:
            return value
    if _GO_FLOAT.fullmatch(digits):
        value = float(digits)
        if not math.isinf(value):  # Go's ParseFloat: out of range is an error, and go-yaml keeps the string
            return value
    if digits.startswith("0b"):
        value = _go_parse_int(digits, signed=False)
        return value if value is not None else text
    if digits.startswith("-0b") and len(digits) > 3 and set(digits[3:]) <= set("01"):
        value = -int(digits[3:], 2)
        return value if value >= -(2**63) else text
    return text


class _Resolver(yaml.resolver.BaseResolver):
    """Plain scalars get PLAIN_TAG (resolved later by resolve_plain), quoted ones str, as in go-yaml."""

    yaml_implicit_resolvers: dict = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return _TAG + "merge" if value == "<<" else PLAIN_TAG
        return super().resolve(kind, value, implicit)


class KubectlError(yaml.YAMLError):
    """A YAML document kubectl would refuse or the limits refuse; `problem` says what, `mark` where."""

    def __init__(self, problem: str, mark: Any = None, fix: str = ""):
        super().__init__(problem)
        self.problem, self.problem_mark, self.fix = problem, mark, fix


class _Constructor(yaml.constructor.SafeConstructor):
    """Scalars as kubectl sends them; duplicate keys refused (the API server's strict decoding refuses them)."""

    yaml_constructors = dict(yaml.constructor.SafeConstructor.yaml_constructors)

    def construct_plain(self, node: yaml.ScalarNode) -> Any:
        try:
            return resolve_plain(node.value)
        except UnsupportedValue:
            raise KubectlError(f"{node.value} is not a number kubectl can send (JSON has no infinity or NaN; "
                               "kubectl fails with `json: unsupported value`)", node.start_mark,
                               "quote it if you mean the text, or write a finite number") from None

    def construct_tagged_number(self, node: yaml.ScalarNode) -> Any:
        kind = node.tag[len(_TAG):]
        value = self.construct_plain(node)
        wanted = {"int": int, "float": (int, float), "bool": bool, "null": type(None)}[kind]
        if not isinstance(value, wanted) or (kind != "bool" and isinstance(value, bool)):
            raise KubectlError(f"cannot decode {node.value!r} as !!{kind}", node.start_mark,
                               "remove the tag or fix the value")
        return float(value) if kind == "float" else value

    def construct_binary(self, node: yaml.ScalarNode) -> Any:
        try:  # go-yaml decodes !!binary into a string
            return base64.b64decode("".join(node.value.split()), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise KubectlError("!!binary value is not base64 of UTF-8 text", node.start_mark,
                               "fix the value or remove the tag") from None

    def construct_undefined(self, node: yaml.Node) -> Any:
        raise KubectlError(f"the tag {node.tag} is not one a Kubernetes manifest uses", node.start_mark,
                           "remove the tag")

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _TAG + "merge":
                continue  # `<<: *base` entries are meant to be overridden
            key = json_key(self.construct_object(key_node, deep=True), key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise KubectlError(f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark,
                                   "remove one of the two")
            seen[key] = line
        self.flatten_mapping(node)  # merges `<<` entries in front, so later keys override them
        # Keys as JSON strings before they meet in a dict (Python's True == 1 would merge `y:` and `1:`).
        return {json_key(self.construct_object(k, deep=True), k): self.construct_object(v, deep=True)
                for k, v in node.value}


def json_key(key: Any, node: yaml.Node) -> str:
    """A mapping key as sigs.k8s.io/yaml writes it into JSON (numbers and booleans as their text)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return str(int(key)) if key.is_integer() and abs(key) < 1e21 else repr(key)
    raise KubectlError(f"a mapping key must be a string, not {key!r}", node.start_mark, "quote the key")


_Constructor.add_constructor(PLAIN_TAG, _Constructor.construct_plain)
for _kind in ("int", "float", "bool", "null"):
    _Constructor.add_constructor(_TAG + _kind, _Constructor.construct_tagged_number)
_Constructor.add_constructor(_TAG + "binary", _Constructor.construct_binary)
_Constructor.add_constructor(_TAG + "timestamp", yaml.constructor.SafeConstructor.construct_yaml_str)
for _kind in ("set", "omap", "pairs"):
    _Constructor.add_constructor(_TAG + _kind, _Constructor.construct_undefined)
_Constructor.add_constructor(None, _Constructor.construct_undefined)


if getattr(yaml, "CParser", None) is not None:
    class Loader(yaml.CParser, _Constructor, _Resolver):  # libyaml parses and composes
        def __init__(self, stream: Any):
            yaml.CParser.__init__(self, stream)
            _Constructor.__init__(self)
            _Resolver.__init__(self)
else:  # pragma: no cover - PyYAML built without libyaml
    class Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser,  # type: ignore[no-redef]
                 yaml.composer.Composer, _Constructor, _Resolver):
        def __init__(self, stream: Any):
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)
            _Constructor.__init__(self)
            _Resolver.__init__(self)


def check_limits(text: str, *, max_values: int, max_depth: int) -> bool:
    """Walk the event stream once, without building anything: refuse more than `max_values` scalars and
    collections, or nesting deeper than `max_depth`. True when the text has aliases (their expansion is
    bounded separately, on the composed graph)."""
    loader = Loader(text)
    values = depth = 0
    aliases = False
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > max_depth:
                    raise KubectlError(f"nested deeper than {max_depth} levels", event.start_mark,
                                       "flatten the document")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
                continue
            elif isinstance(event, yaml.AliasEvent):
                aliases = True
            elif not isinstance(event, yaml.ScalarEvent):
                continue
            values += 1
            if values > max_values:
                raise KubectlError(f"more than {max_values} values in the file (a DDPJob has a few hundred)",
                                   event.start_mark, "split the file, or remove what is not part of a DDPJob")
    finally:
        loader.dispose()
    return aliases


def check_expansion(root: yaml.Node, max_values: int) -> None:
    """Refuse aliases that expand beyond `max_values` values ("billion laughs"), counting each shared node once."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        if total > max_values:
            raise KubectlError(f"aliases expand to more than {max_values} values", node.start_mark,
                               "write the values out")
        sizes[id(node)] = total
        return total

    size(root)


def load_all(text: str, *, max_values: int, max_depth: int) -> Iterator[Any]:
    """Every document of `text` as kubectl sends it (KubectlError or yaml.YAMLError for what it refuses)."""
    aliases = check_limits(text, max_values=max_values, max_depth=max_depth)
    loader = Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if aliases:
                check_expansion(node, max_values)
            yield loader.construct_document(node)
    finally:
        loader.dispose()


# ---------------------------------------------------------------- writing what kubectl reads back the same


class _DumpResolver(yaml.resolver.Resolver):
    """A string is written plain only when both kubectl (go-yaml v2) and PyYAML read it back as that string."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        tag = super().resolve(kind, value, implicit)
        if kind is not yaml.ScalarNode or not implicit[0]:
            return tag
        try:
            kubectl = resolve_plain(value)
        except UnsupportedValue:
            return _TAG + "float"
        if kubectl is None:
            return _TAG + "null"
        if isinstance(kubectl, bool):
            return _TAG + "bool"
        if isinstance(kubectl, (int, float)):
            # An int written by PyYAML is read back as the same int; anything else numeric gets quoted.
            return tag if tag in (_TAG + "int", _TAG + "float") else _TAG + "float"
        return tag if kubectl == value else _TAG + "str-ambiguous"


class Dumper(_Emitter, yaml.serializer.Serializer, yaml.representer.SafeRepresenter, _DumpResolver):
    def __init__(self, stream: Any, default_style: Any = None, default_flow_style: bool = False,
                 canonical: Any = None, indent: Any = None, width: Any = None, allow_unicode: Any = None,
                 line_break: Any = None, encoding: Any = None, explicit_start: Any = None,
                 explicit_end: Any = None, version: Any = None, tags: Any = None, sort_keys: bool = True):
        _Emitter.__init__(self, stream, canonical=canonical, indent=indent, width=width,
                          allow_unicode=allow_unicode, line_break=line_break)
        yaml.serializer.Serializer.__init__(self, encoding=encoding, explicit_start=explicit_start,
                                            explicit_end=explicit_end, version=version, tags=tags)
        yaml.representer.SafeRepresenter.__init__(self, default_style=default_style,
                                                  default_flow_style=default_flow_style, sort_keys=sort_keys)
        _DumpResolver.__init__(self)


def dump_all(documents: list[Any], **options: Any) -> str:
    """YAML that kubectl and PyYAML both read back as `documents`."""
    return yaml.dump_all(documents, Dumper=Dumper, **options)
