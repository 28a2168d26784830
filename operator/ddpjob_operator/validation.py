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

from . import k8s_fields, kubeyaml, model

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
    unknown = unknown_fields(doc)
    if unknown:
        raise InvalidJob(unknown)
    try:
        return model.DDPJob.model_validate(plain(doc))
    except ValidationError as exc:
        raise InvalidJob(describe(exc, model.DDPJob)) from None


# What the API server knows at a custom resource's root and in its metadata (ObjectMeta): anything else is refused
# by kubectl's default strict field validation (`unknown field "metadata.lables"`).
ROOT_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
METADATA_FIELDS = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
                   "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
                   "ownerReferences", "finalizers", "managedFields")


# Unknown fields named one by one, each with a suggestion; the rest in one line (a manifest of 49,000 unknown keys
# took seconds of suggestions and as many lines).
MAX_UNKNOWN_FIELDS_NAMED = 20


def unknown_fields(doc: dict[str, Any]) -> list[FieldError]:
    """Unknown fields at the root and in metadata, as the API server's strict field validation names them."""
    found = [(key, ROOT_FIELDS) for key in doc if key not in ROOT_FIELDS]
    metadata = doc.get("metadata")
    if isinstance(metadata, dict):
        found += [(f"metadata.{key}", METADATA_FIELDS) for key in metadata if key not in METADATA_FIELDS]
    errors = []
    for path, known in found[:MAX_UNKNOWN_FIELDS_NAMED]:
        field = str(path).rpartition(".")[2]
        close = difflib.get_close_matches(field, known, n=1)
        fix = f"did you mean `{close[0]}`?" if close else f"remove it; known fields: {', '.join(known)}"
        errors.append(FieldError(str(path), f'unknown field "{path}" (the API server refuses it)', fix))
    if len(found) > MAX_UNKNOWN_FIELDS_NAMED:
        path, rest = found[MAX_UNKNOWN_FIELDS_NAMED][0], len(found) - MAX_UNKNOWN_FIELDS_NAMED - 1
        errors.append(FieldError(path, f'unknown field "{path}" and {rest} more after it (the API server refuses '
                                 f"them too)", f"keep only {', '.join(ROOT_FIELDS)} at the root and "
                                 f"{', '.join(METADATA_FIELDS)} in metadata"))
    return errors


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
    item: int | None = None  # its index in a `kind: List` document's items

    @property
    def label(self) -> str:
        name = self.body.get("metadata", {}).get("name") if isinstance(self.body, dict) else None
        where = f"{self.source}#{self.index}" if self.index else self.source
        if self.item is not None:
            where += f" items[{self.item}]"
        return f"{where} ({name})" if isinstance(name, str) and name else where


# The API server's limits: a request body of at most 3 MiB; and no file a DDPJob fits in needs more values (after
# expanding aliases: "billion laughs") or deeper nesting than these.
MAX_YAML_BYTES = 3 * 1024 * 1024
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 100


def _is_list(body: Any) -> bool:
    """A `kind: List` (or any *List) document, which kubectl unpacks into its items."""
    return (isinstance(body, dict) and isinstance(body.get("kind"), str) and body["kind"].endswith("List")
            and isinstance(body.get("items"), list))


def load_documents(path: str | Path) -> Iterator[Document]:
    """Every non-empty YAML document in a file, read as kubectl reads it (kubeyaml), a List's items one by
    one; a YAML error or a value kubectl cannot send becomes InvalidJob."""
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
        docs = [d for d in kubeyaml.load_all(text, max_values=MAX_YAML_NODES, max_depth=MAX_YAML_DEPTH)
                if d is not None]
    except RecursionError:
        raise InvalidJob([FieldError("", f"not valid YAML: nested deeper than {MAX_YAML_DEPTH} levels",
                                     "flatten the document")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        fix = getattr(exc, "fix", "") or "fix the indentation or quoting there"
        what = "refused" if isinstance(exc, kubeyaml.KubectlError) else "not valid YAML"  # valid, but not sendable
        raise InvalidJob([FieldError("", f"{what}{where}: {problem}", fix)]) from None
    for index, body in enumerate(docs):
        if _is_list(body):
            for item, entry in enumerate(body["items"]):
                yield Document(source, index, entry, item)
        else:
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
    template = job.spec.checkpoint.claim_template if job.spec.checkpoint is not None else None
    # Only where it can bite: with no storageClassName the cluster's default class decides, which validate cannot
    # see (kind's local-path pins every worker to the volume's node); the job's CheckpointVolumeShared condition
    # and its one Warning event say it on the cluster.
    if sharing is not None and not sharing[0] and template is not None and template.storage_class_name is not None:
        found.append(FieldError("spec.checkpoint.claimTemplate.accessModes", sharing[2]))
    return found
