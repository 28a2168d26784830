"""Turn a manifest into a DDPJob, or into errors that name the field and the fix.

Used by `ddpjob validate`, `ddpjob run --local` and the operator (as a Failed condition),
so all three say the same thing about the same mistake.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml
from pydantic import BaseModel, ValidationError

from . import k8s_fields, model

# Exit status of every `ddpjob` command that refuses its input (validate, render, run).
EXIT_INVALID = 2


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text}. Fix: {self.fix}" if self.fix else text


class InvalidJob(Exception):
    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def plain(value: Any) -> Any:
    """The object as the API server receives it: dicts and lists (a kopf body is a Mapping view), and a whole
    float as an integer (kubectl sends YAML's `2.0` as JSON `2`). The model is strict about the types of
    values, as the API server is, not about which Python container holds them."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_job(doc: Any) -> model.DDPJob:
    """A whole manifest (apiVersion, kind, metadata, spec) -> DDPJob, or InvalidJob."""
    if not isinstance(doc, dict):
        raise InvalidJob([FieldError("", "a manifest must be a YAML mapping",
                                     "start from examples/cpu-digits.yaml")])
    try:
        return model.DDPJob.model_validate(plain(doc))
    except ValidationError as exc:
        raise InvalidJob(describe(exc, model.DDPJob)) from None


def parse_spec(spec: Any, *, prefix: str = "spec") -> model.DDPJobSpec:
    """Only the spec, as the operator receives it from the API server."""
    try:
        return model.DDPJobSpec.model_validate(plain(spec) if spec is not None else {})
    except ValidationError as exc:
        raise InvalidJob(describe(exc, model.DDPJobSpec, prefix=(prefix,))) from None


def describe(exc: ValidationError, root: type[BaseModel], prefix: tuple[Any, ...] = ()) -> list[FieldError]:
    errors = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        cel_rule = _cel_rule(err)
        if cel_rule is not None:
            field_path = cel_rule.get("fieldPath", "").lstrip(".")
            loc = loc + tuple(field_path.split(".")) if field_path else loc
            errors.append(FieldError(_path(prefix + loc), cel_rule["message"]))
            continue
        message, fix = _explain(err, root, loc)
        errors.append(FieldError(_path(prefix + loc), message, fix))
    return errors


def _cel_rule(err: dict[str, Any]) -> dict[str, str] | None:
    cause = (err.get("ctx") or {}).get("error")
    return cause.rule if isinstance(cause, model.CelRuleError) else None


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _explain(err: dict[str, Any], root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str, str]:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    got = f" (got {value!r})" if not isinstance(value, (dict, list)) else ""
    field = str(loc[-1]) if loc else ""
    if kind == "missing":
        return "required field is missing", f"add `{field}`" + _description_hint(root, loc)
    if kind == "extra_forbidden":
        known = _known_fields(root, loc[:-1])
        same_letters = [k for k in known if k.lower() == field.lower()]  # hostIpc -> hostIPC
        close = same_letters or difflib.get_close_matches(field, known, n=1)
        fix = f"did you mean `{close[0]}`?" if close else f"remove it; known fields: {', '.join(known)}"
        return "unknown field", fix
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
                "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return f"must be {sign} {bound}{got}", f"use a value {sign} {bound}"
    if kind == "quantity":
        return err["msg"], "write a quantity such as 1, 500m or 2Gi"
    if kind == "literal_error":
        return f"unsupported value{got}", f"use one of {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        return f"invalid format{got}", _pattern_fix(ctx.get("pattern", ""))
    if kind in ("string_too_long", "too_long"):
        limit = ctx.get("max_length")
        return f"too long{got}", f"use at most {limit} {'characters' if kind == 'string_too_long' else 'items'}"
    if kind in ("string_too_short", "too_short"):
        return "must not be empty", f"give at least {ctx.get('min_length', 1)}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"must be a whole number{got}", "write an integer without quotes (not true/false, not \"2\")"
    if kind in ("float_parsing", "float_type"):
        return f"must be a number{got}", "write a number without quotes"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false{got}", "write true or false without quotes"
    if kind in ("string_type",):
        return f"must be a string{got}", "quote the value"
    if kind in ("list_type",):
        return "must be a list", "write it as a YAML list (`- item`)"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "must be a mapping", "write it as `key: value` pairs"
    return err["msg"], ""


_PATTERN_FIXES = {
    model.DNS_1035_PATTERN: "use lowercase letters, digits and '-', start with a letter and end with "
                            "a letter or digit (DNS-1035 label)",
    model.DNS_1123_SUBDOMAIN_PATTERN: "use lowercase letters, digits, '-' and '.' (DNS-1123 subdomain)",
    model.ENV_NAME_PATTERN: "use letters, digits, '_', '-' and '.', not starting with a digit",
    r"^[^\s]+$": "remove spaces; put arguments in `args`",
    model.ENTRYPOINT_PATTERN: "name a module or a .py script, not starting with '-' (torchrun would take it for "
                              "one of its own flags); put arguments in `args`",
    **k8s_fields.PATTERN_FIXES,
}


def _pattern_fix(pattern: str) -> str:
    return _PATTERN_FIXES.get(pattern, f"match the pattern {pattern}")


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = root
    for part in loc:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        field = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        current = model.model_in(field.annotation)
    return current


def _known_fields(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    target = _model_at(root, loc)
    if target is None:
        return []
    return [f.alias or n for n, f in target.model_fields.items()]


def _description_hint(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    parent = _model_at(root, loc[:-1])
    if parent is None:
        return ""
    field = next((f for n, f in parent.model_fields.items() if loc[-1] in (n, f.alias)), None)
    return f" ({field.description})" if field is not None and field.description else ""


# ---------------------------------------------------------------- files


@dataclass(frozen=True)
class Document:
    source: str
    index: int
    body: Any

    @property
    def label(self) -> str:
        name = self.body.get("metadata", {}).get("name") if isinstance(self.body, dict) else None
        where = f"{self.source}#{self.index}" if self.index else self.source
        return f"{where} ({name})" if name else where


# The API server's limits: a request body of at most 3 MiB, and aliases that cannot expand a small file into
# a huge object ("billion laughs"). Counted in YAML nodes after expanding every alias; nesting is bounded too.
MAX_YAML_BYTES = 3 * 1024 * 1024
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 100


class _YAMLLimit(yaml.YAMLError):
    def __init__(self, problem: str, mark: Any = None):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and documents whose aliases expand beyond MAX_YAML_NODES."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` entries are meant to be overridden
            key = self.construct_object(key_node, deep=True)
            # The key's offset, not its line: `{replicas: 1, replicas: 200}` is two keys on one line.
            offset = key_node.start_mark.index
            try:
                first = seen.setdefault(key, offset)
            except TypeError:
                continue  # an unhashable key: SafeLoader reports it
            if first != offset:
                raise _YAMLLimit(f"duplicate key {key!r} (first at line {first_lines[key]})", key_node.start_mark)
            first_lines.setdefault(key, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep)


def _check_expansion(root: yaml.Node) -> None:
    sizes: dict[int, int] = {}  # id(node) -> expanded size: shared (aliased) nodes are counted once each

    def size(node: yaml.Node, depth: int) -> int:
        if depth > MAX_YAML_DEPTH:
            raise _YAMLLimit(f"nested deeper than {MAX_YAML_DEPTH} levels", node.start_mark)
        if id(node) in sizes:
            return sizes[id(node)]
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(item, depth + 1) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        if total > MAX_YAML_NODES:
            raise _YAMLLimit(f"aliases expand to more than {MAX_YAML_NODES} values", node.start_mark)
        sizes[id(node)] = total
        return total

    size(root, 0)


def load_documents(path: str | Path) -> Iterator[Document]:
    """Every non-empty YAML document in a file; a YAML syntax error becomes InvalidJob."""
    source = str(path)
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise InvalidJob([FieldError("", f"cannot read {source}: {exc.strerror}", "check the path")]) from None
    if len(raw) > MAX_YAML_BYTES:
        raise InvalidJob([FieldError("", f"{source} is larger than {MAX_YAML_BYTES} bytes (the API server's "
                                         "request limit)", "split it into smaller files")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJob([FieldError("", f"{source} is not UTF-8 text (byte {exc.start})",
                                     "save it as UTF-8")]) from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=StrictLoader) if d is not None]
    except RecursionError:
        raise InvalidJob([FieldError("", f"not valid YAML: nested deeper than {MAX_YAML_DEPTH} levels",
                                     "flatten the document")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        fix = "fix the indentation or quoting there"
        if isinstance(exc, _YAMLLimit):
            fix = "remove one of the two" if problem.startswith("duplicate key") else "write the values out"
        raise InvalidJob([FieldError("", f"not valid YAML{where}: {problem}", fix)]) from None
    for index, body in enumerate(docs):
        yield Document(source, index, body)


def load_jobs(path: str | Path) -> list[model.DDPJob]:
    """All DDPJobs in a file, or InvalidJob with every error (paths prefixed per document)."""
    jobs, errors = [], []
    for doc in load_documents(path):
        try:
            jobs.append(parse_job(doc.body))
        except InvalidJob as exc:
            errors.extend(exc.errors)
    if errors:
        raise InvalidJob(errors)
    if not jobs:
        raise InvalidJob([FieldError("", f"{path} holds no DDPJob", "add a DDPJob manifest")])
    return jobs


# ---------------------------------------------------------------- warnings (valid, but likely to fail on a cluster)

STORAGE_DOC = 'docs/install.md, "Checkpoint storage"'


def checkpoint_sharing(spec: model.DDPJobSpec) -> tuple[bool, str, str] | None:
    """(shared, reason, message): whether every worker can mount the checkpoint claim the operator creates.

    A ReadWriteOnce volume attaches to one node: a worker scheduled elsewhere waits in ContainerCreating
    (Multi-Attach error). None when the spec cannot tell (an existing claim, or no checkpoint)."""
    checkpoint = spec.checkpoint
    if checkpoint is None or checkpoint.claim_template is None:
        return None
    modes = checkpoint.claim_template.access_modes
    if "ReadWriteMany" in modes:
        return True, "ReadWriteMany", "every worker mounts the ReadWriteMany checkpoint claim, on any node"
    if spec.max_nodes == 1:
        return True, "OneWorker", "one worker mounts the checkpoint claim"
    pod_spec = spec.template.pod_spec
    if "kubernetes.io/hostname" in (spec.template.node_selector or {}) or (pod_spec and pod_spec.node_name):
        return True, "OneNode", "every worker runs on one node, which mounts the checkpoint claim"
    return False, "ReadWriteOnce", (
        f"checkpoint.claimTemplate.accessModes is {modes} but up to {spec.max_nodes} workers may run on "
        f"different nodes, and a ReadWriteOnce volume attaches to one node only: a worker elsewhere waits in "
        f"ContainerCreating (Multi-Attach error). Fix: accessModes [ReadWriteMany] with a storage class that "
        f"provides it (NFS, CephFS, Amazon EFS, Filestore, Azure Files; {STORAGE_DOC}), or keep the workers on "
        f"one node (template.nodeSelector kubernetes.io/hostname). Storage whose volumes pin their pods to one "
        f"node (kind's local-path) co-locates the workers by itself")


def warnings(job: model.DDPJob) -> list[FieldError]:
    """What `ddpjob validate` prints for a valid job that is likely not to work as meant on a cluster."""
    found = []
    sharing = checkpoint_sharing(job.spec)
    if sharing is not None and not sharing[0]:
        found.append(FieldError("spec.checkpoint.claimTemplate.accessModes", sharing[2]))
    return found
