"""YAML as kubectl reads and writes it: the file split into documents as kubectl's YAMLReader splits it, each
document read as sigs.k8s.io/yaml reads it (go-yaml v2, then JSON).

kubectl (k8s.io/apimachinery/pkg/util/yaml) cuts a file at every line that starts with `---` before any YAML is
parsed, refuses such a line followed by anything but a comment, and hands each piece to yaml.Unmarshal, which reads
its first YAML document only. So a piece is parsed here on its own too: a `%YAML` directive is left without its
document, a `---` inside a quoted scalar ends the piece, and a second document that only libyaml sees (after a bare
carriage return) is refused rather than validated while kubectl drops it.

PyYAML resolves plain scalars by its own YAML 1.1 table, which differs from go-yaml v2 where it matters to a
manifest: `1:00` is 60 to PyYAML (base 60) and the string "1:00" to kubectl; `y`/`n` are strings to PyYAML and
booleans to kubectl; `1e1` and `0o17` are strings to PyYAML and 10 and 15 to kubectl; an unquoted date is a
date to PyYAML and a string to kubectl (go-yaml keeps a timestamp's text when decoding into interface{}).
So every plain scalar here is resolved by `resolve_plain`, written from go-yaml v2's resolve.go, and a value
JSON cannot carry (`.inf`, `.nan`: kubectl fails with "json: unsupported value") is refused. Merge keys (`<<`)
apply where they stand, as go-yaml v2's decoder applies them, and one that would override a key written above it
is refused (a reader sees one value, kubectl sends the other); keys become JSON keys as sigs.k8s.io/yaml writes
them.

The parser is libyaml's, the C library go-yaml v2 is a port of (and fast: a 3 MiB file in well under a second).
A first pass over each document's events counts values and nesting against budgets for the whole file before any
object is built; aliases are then expanded in count only, against the same budget.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
import struct
import types
from fractions import Fraction
from typing import Any, Iterator

import yaml
from yaml.cyaml import CEmitter

PLAIN_TAG = "tag:ddpjob,plain"  # a plain (unquoted, untagged) scalar, resolved by resolve_plain
_TAG = "tag:yaml.org,2002:"
_MERGE_TAG = _TAG + "merge"
# No file a DDPJob fits in has more documents; each costs a parser, so a file of empty `---` pieces is cut short.
MAX_DOCUMENTS = 10_000


class UnsupportedValue(ValueError):
    """A plain scalar kubectl cannot send, or sends differently by version; `reason` and `fix` say why and how."""

    def __init__(self, text: str, reason: str, fix: str):
        super().__init__(text)
        self.reason, self.fix = reason, fix


_NOT_JSON = ("JSON has no infinity or NaN; kubectl fails with `json: unsupported value`",
             "quote it if you mean the text, or write a finite number")
# 0x/0o/0b beyond uint64: go-yaml v2.4 keeps the text, sigs.k8s.io/yaml's fork of it reads a big integer.
_PREFIXED_INTEGER = re.compile(r"0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+")
_BEYOND_64_BITS = ("an integer beyond 64 bits, which kubectl reads as text or as a number depending on its version",
                   "quote it if you mean the text")


_BOOLS = {**dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
          **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False)}
_NULLS = ("", "~", "null", "Null", "NULL")
_INFINITIES = {**{f"{sign}.{word}": math.inf for word in ("inf", "Inf", "INF") for sign in ("", "+")},
               **{f"-.{word}": -math.inf for word in ("inf", "Inf", "INF")},
               **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan)}
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")  # go-yaml's yamlStyleFloat
# strconv.ParseFloat on a scalar that starts with a dot: underscores only between digits (strconv's underscoreOK).
_LEADING_DOT_FLOAT = re.compile(r"\.[0-9]+(_[0-9]+)*([eE][-+]?[0-9]+(_[0-9]+)*)?")
_DIGITS = {base: re.compile(f"[{digits}]+") for base, digits in ((2, "01"), (8, "0-7"), (10, "0-9"), (16, "0-9a-fA-F"))}
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
    if not _DIGITS[base].fullmatch(body):
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
    if text in _INFINITIES:
        raise UnsupportedValue(text, *_NOT_JSON)
    first = text[0]
    if first == ".":  # go-yaml: strconv.ParseFloat(text) as it stands, underscores and all
        if _LEADING_DOT_FLOAT.fullmatch(text):
            value = float(text.replace("_", ""))
            return text if math.isinf(value) else value
        return text
    if first not in "+-0123456789":
        return text
    # An unquoted timestamp (2024-01-02) stays its text in kubectl; none of them parses as a number below.
    digits = text.replace("_", "")  # go-yaml drops every underscore before trying a number
    for signed in (True, False):
        value = _go_parse_int(digits, signed=signed)
        if value is not None:
            return value
    if _GO_FLOAT.fullmatch(digits):
        value = float(digits)
        if not math.isinf(value):  # Go's ParseFloat: out of range is an error, and go-yaml keeps the string
            return value
    if _PREFIXED_INTEGER.fullmatch(digits):
        raise UnsupportedValue(text, *_BEYOND_64_BITS)
    return text


class _Resolver(yaml.resolver.BaseResolver):
    """Plain scalars get PLAIN_TAG (resolved later by resolve_plain), quoted ones str, as in go-yaml."""

    yaml_implicit_resolvers: dict = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return _MERGE_TAG if value == "<<" else PLAIN_TAG
        return super().resolve(kind, value, implicit)


class KubectlError(yaml.YAMLError):
    """A YAML document kubectl would refuse or the limits refuse; `problem` says what, `mark` where."""

    def __init__(self, problem: str, mark: Any = None, fix: str = ""):
        super().__init__(problem)
        self.problem, self.problem_mark, self.fix = problem, mark, fix


class _Constructor(yaml.constructor.SafeConstructor):
    """Scalars as kubectl sends them; merges applied where they stand (go-yaml v2); duplicate keys refused."""

    yaml_constructors = dict(yaml.constructor.SafeConstructor.yaml_constructors)

    def construct_plain(self, node: yaml.ScalarNode) -> Any:
        try:
            return resolve_plain(node.value)
        except UnsupportedValue as exc:
            raise KubectlError(f"{node.value} is not a number kubectl can send ({exc.reason})", node.start_mark,
                               exc.fix) from None

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

    def construct_value(self, node: yaml.Node) -> Any:
        if node.tag == PLAIN_TAG:  # most values: a plain scalar needs none of construct_object's bookkeeping
            return self.construct_plain(node)
        return self.construct_object(node, deep=True)

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> list:
        return [self.construct_value(item) for item in node.value]

    def construct_key(self, node: yaml.Node) -> str:
        """A mapping key as the JSON key sigs.k8s.io/yaml writes (an infinite key is text there: `.inf`)."""
        if isinstance(node, yaml.ScalarNode) and node.tag in (PLAIN_TAG, _TAG + "float") \
                and node.value in _INFINITIES:
            return json_key(_INFINITIES[node.value], node)
        return json_key(self.construct_value(node), node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        # go-yaml v2 (decode.go, d.mapping) sets each entry in document order, a `<<` merge included, the later
        # winning. An explicit key that a later `<<` overrides is refused: a reader sees one value, kubectl sends
        # another. Explicit keys after a merge override it, as everywhere.
        mapping: dict[str, Any] = {}
        explicit: dict[str, int] = {}  # key -> its line
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG and key_node.value == "<<":
                for key, value in self.construct_merge(value_node, key_node.start_mark).items():
                    if key in explicit:
                        raise KubectlError(
                            f"the merge `<<` overrides {key!r} set at line {explicit[key]}: kubectl applies a "
                            "merge where it stands, so it sends the merged value, not the one written above",
                            key_node.start_mark, f"move `<<` above {key!r}, or remove one of the two")
                    mapping[key] = value
                continue
            key = self.construct_key(key_node)
            if key in explicit:
                raise KubectlError(f"duplicate key {key!r} (first at line {explicit[key]})", key_node.start_mark,
                                   "remove one of the two")
            explicit[key] = key_node.start_mark.line + 1
            mapping[key] = self.construct_value(value_node)
        return mapping

    def construct_merge(self, node: yaml.Node, mark: Any) -> dict[str, Any]:
        """What a `<<` sets: a mapping, or a sequence of mappings of which the earlier wins (go-yaml's d.merge)."""
        parts = node.value if isinstance(node, yaml.SequenceNode) else [node]
        merged: dict[str, Any] = {}
        for part in reversed(parts):
            if not isinstance(part, yaml.MappingNode):
                raise KubectlError("a merge `<<` takes a mapping or a list of mappings (kubectl: map merge requires "
                                   "map or sequence of maps as the value)", mark,
                                   "merge an anchored mapping (`<<: *name`), or write the keys out")
            merged.update(self.construct_object(part, deep=True))
        return merged

    def construct_merge_key_as_text(self, node: yaml.ScalarNode) -> str:
        return node.value  # `<<` anywhere but as a key is the text "<<" to go-yaml, as is `!!merge x` "x"


_Constructor.add_constructor(PLAIN_TAG, _Constructor.construct_plain)
for _kind in ("int", "float", "bool", "null"):
    _Constructor.add_constructor(_TAG + _kind, _Constructor.construct_tagged_number)
_Constructor.add_constructor(_TAG + "binary", _Constructor.construct_binary)
_Constructor.add_constructor(_TAG + "timestamp", yaml.constructor.SafeConstructor.construct_yaml_str)
_Constructor.add_constructor(_MERGE_TAG, _Constructor.construct_merge_key_as_text)
for _kind in ("set", "omap", "pairs"):
    _Constructor.add_constructor(_TAG + _kind, _Constructor.construct_undefined)
_Constructor.add_constructor(None, _Constructor.construct_undefined)


def json_key(key: Any, node: yaml.Node) -> str:
    """A mapping key as sigs.k8s.io/yaml writes it into JSON (yaml.go, convertToJSONableObject): a string as it
    is, a bool as true/false, an int as its decimal, a float as strconv.FormatFloat(key, 'g', -1, 32) with
    infinities as .inf/-.inf; an integer beyond int64 (go-yaml's uint64) and anything else is refused."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int) and -(2**63) <= key < 2**63:
        return str(key)
    if isinstance(key, float):
        return go_float32_text(key)
    what = "an integer beyond int64" if isinstance(key, int) else type(key).__name__ if key is not None else "null"
    raise KubectlError(f"a mapping key kubectl cannot send: {what} (sigs.k8s.io/yaml: unsupported map key)",
                       node.start_mark, "quote the key")


_FLOAT32 = struct.Struct("<f")
_UINT32 = struct.Struct("<I")


def _float32_from_bits(bits: int) -> float:
    return _FLOAT32.unpack(_UINT32.pack(bits))[0]


def go_float32_text(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 32): the value rounded to float32, then the shortest decimal that reads
    back as that float32 (the nearest of those), in %e form below 1e-4 or from 1e6 on."""
    if math.isnan(value):
        return ".nan"
    try:
        single = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:  # beyond float32: Go's conversion gives an infinity
        single = math.copysign(math.inf, value)
    if math.isinf(single):
        return ".inf" if single > 0 else "-.inf"
    sign, single = ("-" if math.copysign(1.0, single) < 0 else ""), abs(single)
    if single == 0:
        return sign + "0"
    digits, point = _shortest_float32_digits(single, value)
    exponent = point - 1
    if exponent < -4 or exponent >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _shortest_float32_digits(single: float, written: float) -> tuple[str, int]:
    """(digits, point) with single == 0.digits x 10**point, digits the shortest that read back as this positive
    float32: a decimal inside the half-way points to its neighbours (on them when the mantissa is even), the
    nearest when several are as short. `written` (the float64 it was rounded from) hints at the length."""
    bits = _UINT32.unpack(_FLOAT32.pack(single))[0]
    below = _float32_from_bits(bits - 1)
    above = _float32_from_bits(bits + 1) if bits + 1 < 0x7F800000 else single + (single - below)
    bounds = ((single + below) / 2, (single + above) / 2, bits % 2 == 0)  # exact in float64
    # Start from the digits the value was written with (repr of the float64); the precisions that read back are
    # upward-closed, so searching down from one that does finds the shortest.
    precision = min(9, max(1, len(repr(abs(written)).split("e")[0].replace(".", "").strip("0"))))
    found = _nearest_that_reads_back(single, precision, bounds)
    while found is None:  # 9 digits always identify a float32
        precision += 1
        found = _nearest_that_reads_back(single, precision, bounds)
    while precision > 1 and (shorter := _nearest_that_reads_back(single, precision - 1, bounds)) is not None:
        precision, found = precision - 1, shorter
    mantissa, exponent = found.split("e")  # d.ddde+XX, or dddeXX: 0.ddd x 10**point either way
    point = int(exponent) + (1 if "." in mantissa else len(mantissa))
    return mantissa.replace(".", "").rstrip("0"), point


def _nearest_that_reads_back(single: float, precision: int, bounds: tuple[float, float, bool]) -> str | None:
    """The nearest decimal of `precision` digits that reads back as `single`, if one does."""
    nearest = f"{single:.{precision - 1}e}"
    if _reads_back(nearest, bounds):
        return nearest
    low, high, _ = bounds
    if high - single == single - low:
        return None  # the decimal on the other side is no nearer, and the interval no wider there
    mantissa, exponent = nearest.split("e")
    other = f"{int(mantissa.replace('.', '')) + (1 if float(nearest) < single else -1)}e{int(exponent) - precision + 1}"
    return other if _reads_back(other, bounds) else None  # the nearest on the other, wider side


def _reads_back(text: str, bounds: tuple[float, float, bool]) -> bool:
    low, high, even = bounds
    number = float(text)  # rounding to float64 cannot cross a half-way point, only land on one
    if low < number < high:
        return True
    if number in (low, high):
        exact = Fraction(text)
        return exact == Fraction(number) and even or (low < exact < high)
    return False


try:
    from yaml.cyaml import CParser as _Parser  # libyaml: what go-yaml v2 is a port of
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = None

if _Parser is not None:
    class Loader(_Parser, _Constructor, _Resolver):  # libyaml parses and composes
        def __init__(self, stream: Any):
            _Parser.__init__(self, stream)
            _Constructor.__init__(self)
            _Resolver.__init__(self)
else:  # pragma: no cover
    class Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser,  # type: ignore[no-redef]
                 yaml.composer.Composer, _Constructor, _Resolver):
        def __init__(self, stream: Any):
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)
            _Constructor.__init__(self)
            _Resolver.__init__(self)


# ---------------------------------------------------------------- the file as kubectl splits and reads it

_SEPARATOR_LINE = re.compile(r"^---([^\n]*)", re.MULTILINE)
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000"  # unicode.IsSpace, which strings.TrimSpace strips
_DIRECTIVE_FIRST = re.compile(r"(?:[ \t]*(?:#[^\n]*)?\r?\n)*%")


def _mark(line: int, column: int = 0) -> yaml.error.Mark:
    return yaml.error.Mark("<file>", 0, line, column, None, None)


def kubectl_documents(text: str) -> Iterator[tuple[int, str, bool]]:
    """(first line, text, whether a separator ends it) of each piece kubectl's YAMLReader cuts `text` into: at
    every line that starts with `---`, which may be followed by spaces and a comment only (apimachinery
    util/yaml, YAMLReader.Read)."""
    start = line = 0
    for separator in _SEPARATOR_LINE.finditer(text):
        rest = separator.group(1).strip(_GO_SPACE)
        separator_line = line + text.count("\n", start, separator.start())
        if rest and not rest.startswith("#"):
            raise KubectlError(f"a line that starts with `---` is a document separator to kubectl, and may only "
                               f"be followed by a comment, not {rest[:40]!r} (kubectl: invalid Yaml document "
                               "separator)", _mark(separator_line), "move what follows `---` to the next line")
        yield line, text[start:separator.start()], True
        start, line = separator.end() + 1, separator_line + 1
    yield line, text[start:], False


class _Budget:
    """The values (and the documents) one file may hold, aliases expanded, over all its documents together."""

    def __init__(self, max_values: int, max_documents: int):
        self.values, self.documents = max_values, max_documents
        self.max_values, self.max_documents = max_values, max_documents

    def document(self, line: int) -> None:
        self.documents -= 1
        if self.documents < 0:
            raise KubectlError(f"more than {self.max_documents} documents in the file", _mark(line),
                               "split the file")

    def spend(self, values: int, mark: Any, *, expanded: bool = False) -> None:
        self.values -= values
        if self.values < 0:
            if expanded:
                raise KubectlError(f"aliases expand to more than {self.max_values} values in the file", mark,
                                   "write the values out, or split the file")
            raise KubectlError(f"more than {self.max_values} values in the file (a DDPJob has a few hundred)",
                               mark, "split the file, or remove what is not part of a DDPJob")


def check_limits(text: str, budget: _Budget, *, max_depth: int) -> tuple[int, bool]:
    """Walk one piece's events once, without building anything: spend its scalars and collections from the
    file's budget, refuse nesting deeper than `max_depth`, and refuse what kubectl reads otherwise than libyaml
    does here (a second document, a scalar tagged `!`). Returns (values, whether it has aliases)."""
    loader = Loader(text)
    values = depth = documents = 0
    aliases = False
    try:
        while loader.check_event():
            event = loader.get_event()
            kind = type(event)
            if kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                depth += 1
                if depth > max_depth:
                    raise KubectlError(f"nested deeper than {max_depth} levels", event.start_mark,
                                       "flatten the document")
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                depth -= 1
                continue
            elif kind is yaml.AliasEvent:
                aliases = True
            elif kind is yaml.ScalarEvent:
                if event.tag == "!":  # go-yaml keeps such a scalar as text; libyaml resolves it like a plain one
                    raise KubectlError("the non-specific tag `!`: kubectl reads the value as text, other YAML "
                                       "readers as a number or boolean", event.start_mark, "quote the value instead")
            elif kind is yaml.DocumentStartEvent:
                documents += 1
                if documents > 1:
                    raise KubectlError("a second YAML document that kubectl does not read: it splits documents "
                                       "only at lines starting with `---` (not after a bare carriage return or a "
                                       "Unicode line break), and reads the first document of each piece",
                                       event.start_mark, "end each line with a newline (\\n)")
                continue
            else:
                continue
            values += 1
            budget.spend(1, event.start_mark)
    finally:
        loader.dispose()
    return values, aliases


def check_expansion(root: yaml.Node, *, max_depth: int) -> int:
    """The values `root` holds with its aliases expanded ("billion laughs"), computed visiting each node once;
    refused when nested beyond `max_depth` or when an anchor holds itself (go-yaml refuses that too)."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height)
    open_nodes: set[int] = set()

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        known = sizes.get(id(node))
        if known is None:
            if id(node) in open_nodes:
                raise KubectlError("an anchor whose value contains itself (kubectl: anchor value contains itself)",
                                   node.start_mark, "remove the alias to the anchor from inside its own value")
            open_nodes.add(id(node))
            values, height = 1, 0
            if isinstance(node, yaml.CollectionNode):
                children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
                height = 1
                for child in children:  # each node is walked once: the anchor's own place comes before its aliases
                    child_values, child_height = walk(child, depth + 1)
                    values, height = values + child_values, max(height, child_height + 1)
            open_nodes.discard(id(node))
            known = sizes[id(node)] = (values, height)
        if depth + known[1] > max_depth:
            raise KubectlError(f"aliases nest deeper than {max_depth} levels", node.start_mark,
                               "write the values out")
        return known

    return walk(root, 0)[0]


def load_all(text: str, *, max_values: int, max_depth: int, max_documents: int = MAX_DOCUMENTS) -> Iterator[Any]:
    """Every document of `text` as kubectl sends it (KubectlError or yaml.YAMLError for what it refuses), within
    budgets for the whole file: `max_values` values with aliases expanded, `max_documents` documents."""
    budget = _Budget(max_values, max_documents)
    for index, (first_line, piece, separated) in enumerate(kubectl_documents(text)):
        blank = not piece.strip(" \t\r\n")
        try:
            if index or not blank:  # empty ones after a `---` too: a file of nothing but `---` lines is cut short
                budget.document(first_line)
            if blank:
                continue  # kubectl skips an empty document
            if _DIRECTIVE_FIRST.match(piece):
                raise KubectlError("a %YAML or %TAG directive: kubectl cuts the file at the `---` below it and "
                                   "reads the directive alone, which fails (did not find expected <document "
                                   "start>)", _mark(0), "remove the directive line")
            values, aliases = check_limits(piece, budget, max_depth=max_depth)
            loader = Loader(piece)
            try:
                node = loader.get_single_node()
                if node is None:
                    continue
                if aliases:
                    budget.spend(check_expansion(node, max_depth=max_depth) - values, node.start_mark,
                                 expanded=True)
                document = loader.construct_document(node)
            finally:
                loader.dispose()
        except yaml.YAMLError as exc:
            raise _in_file(exc, first_line, piece, separated) from None
        yield document


def _in_file(exc: yaml.YAMLError, first_line: int, piece: str, separated: bool) -> yaml.YAMLError:
    """`exc` with its marks moved from the piece's lines to the file's. libyaml puts the end of a text without a
    final newline on the line after it: that is the end of the last line. An error at the end of a piece cut by a
    separator (an unclosed quote, bracket or block) is the separator's doing."""
    last_line = piece.count("\n")
    for name in ("context_mark", "problem_mark"):
        mark = getattr(exc, name, None)
        if mark is None:
            continue
        line, column = mark.line, mark.column
        if line > last_line:
            line, column = last_line, len(piece) - piece.rfind("\n") - 1
        setattr(exc, name, _mark(first_line + line, column))
        if name == "problem_mark" and separated and line >= last_line and not isinstance(exc, KubectlError):
            exc.fix = (f"kubectl ends the document at the `---` of line {first_line + last_line + 1}, even inside "
                       "quotes or brackets: indent that line, or start it otherwise")
    return exc


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


class Dumper(yaml.emitter.Emitter, yaml.serializer.Serializer, yaml.representer.SafeRepresenter, _DumpResolver):
    def __init__(self, stream: Any, default_style: Any = None, default_flow_style: bool = False,
                 canonical: Any = None, indent: Any = None, width: Any = None, allow_unicode: Any = None,
                 line_break: Any = None, encoding: Any = None, explicit_start: Any = None,
                 explicit_end: Any = None, version: Any = None, tags: Any = None, sort_keys: bool = True):
        yaml.emitter.Emitter.__init__(self, stream, canonical=canonical, indent=indent, width=width,
                                      allow_unicode=allow_unicode, line_break=line_break)
        yaml.serializer.Serializer.__init__(self, encoding=encoding, explicit_start=explicit_start,
                                            explicit_end=explicit_end, version=version, tags=tags)
        yaml.representer.SafeRepresenter.__init__(self, default_style=default_style,
                                                  default_flow_style=default_flow_style, sort_keys=sort_keys)
        _DumpResolver.__init__(self)

    def analyze_scalar(self, scalar: str) -> Any:
        # Analysed once per text: every job of a file carries the same agent files, each 20 KB read char by char.
        return _analyze_scalar(scalar, bool(self.allow_unicode))


@functools.lru_cache(maxsize=1024)
def _analyze_scalar(scalar: str, allow_unicode: bool) -> Any:
    # The analysis reads the emitter's allow_unicode only, and nothing writes to it once made.
    return yaml.emitter.Emitter.analyze_scalar(types.SimpleNamespace(allow_unicode=allow_unicode), scalar)


class FastDumper(CEmitter, yaml.representer.SafeRepresenter, _DumpResolver):
    """Dumper with libyaml's emitter and serializer, which PyYAML's are a port of: the same text, 10x faster (10 MB
    of pods took 8 s of CPU), except where a double-quoted string is folded (see dump_all)."""

    def __init__(self, stream: Any, default_style: Any = None, default_flow_style: bool = False,
                 canonical: Any = None, indent: Any = None, width: Any = None, allow_unicode: Any = None,
                 line_break: Any = None, encoding: Any = None, explicit_start: Any = None,
                 explicit_end: Any = None, version: Any = None, tags: Any = None, sort_keys: bool = True):
        CEmitter.__init__(self, stream, canonical=canonical, indent=indent, width=width, encoding=encoding,
                          allow_unicode=allow_unicode, line_break=line_break, explicit_start=explicit_start,
                          explicit_end=explicit_end, version=version, tags=tags)
        yaml.representer.SafeRepresenter.__init__(self, default_style=default_style,
                                                  default_flow_style=default_flow_style, sort_keys=sort_keys)
        _DumpResolver.__init__(self)


def _printable(text: str) -> bool:
    return text.isascii() and text.isprintable()


def _literal_block(text: str) -> bool:
    """A multi-line value written as a literal block (`|`), as go-yaml v2 writes one (kubectl's `-o yaml` of a
    ConfigMap's files): lines of printable ASCII without spaces at their ends, which both emitters write alike
    (a literal block is never folded) and read back as the same string."""
    lines = text.split("\n")
    return len(lines) > 1 and bool(lines[0]) and not text[0].isspace() and all(
        _printable(line) and line == line.rstrip() for line in lines)


def _represent_str(representer: Any, text: str) -> Any:
    if _literal_block(text):
        return representer.represent_scalar(_TAG + "str", text, style="|")
    return yaml.representer.SafeRepresenter.represent_str(representer, text)


def _holds_escaped_string(node: Any, key: bool = False) -> bool:
    """Whether a string here has a character outside printable ASCII (a line break, a tab, é) and is no literal
    block (a key never is one): such a string is written double-quoted, and libyaml folds a long one at other
    places than PyYAML."""
    if isinstance(node, str):
        return not (_printable(node) or (not key and _literal_block(node)))
    if isinstance(node, dict):
        return any(_holds_escaped_string(k, True) or _holds_escaped_string(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_holds_escaped_string(v) for v in node)
    return False


def dump_all(documents: list[Any], **options: Any) -> str:
    """YAML that kubectl and PyYAML both read back as `documents`: each document by libyaml's emitter, or by
    PyYAML's where a string would be folded differently, so the text is the same either way."""
    return "".join(yaml.dump(document, Dumper=Dumper if _holds_escaped_string(document) else FastDumper,
                             explicit_start=index > 0, **options) for index, document in enumerate(documents))


for _dumper in (Dumper, FastDumper):
    _dumper.add_representer(str, _represent_str)
