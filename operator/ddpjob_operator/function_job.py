"""A Python function as a DDPJob, without building an image.

    def train(epochs: int = 3):
        import torch.distributed as dist        # everything the function uses is imported inside it
        dist.init_process_group("gloo")
        ...

    job = ddpjob.submit(train, replicas=2, kwargs={"epochs": 5})   # client.submit: sends what build() makes

The function's source (`inspect.getsource`) and its keyword arguments (JSON) become a small program in a
ConfigMap `<job>-function`, mounted into every worker at MOUNT_PATH; the job's entrypoint is that program,
so torchrun runs it in every training process with the bundled trainer image's Python (or any image with
torch). The ConfigMap is owned by the job: deleting the job deletes it.

Limits (each refused here with the fix, before anything is sent):
- size: the program must fit a ConfigMap (1 MiB in all);
- dependencies: only what the image has (the bundled image: torch, numpy, ddp_trainer and its runtime
  library); nothing is pip-installed;
- closures and globals are not shipped: the function must be a top-level `def` whose source is
  available, and must import and define what it uses inside its body (module globals it reads are
  refused, naming them); decorators are dropped; arguments travel as JSON (`kwargs`).

`build()` is pure (the manifest and the ConfigMap); `run_local()` runs that same manifest with the local
runner (`ddpjob run --local`), the ConfigMap's program written to a local directory that stands in for the
mount. Never imports torch.
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import json
import re
import secrets
import textwrap
import types
import unicodedata
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from . import model, validation
from .validation import FieldError

MOUNT_PATH = "/opt/ddpjob-function"
PROGRAM = "ddpjob_function.py"
VOLUME = "function"  # not ddpjob-*: those volume names are the operator's
CONFIG_MAP_LIMIT = 1024 * 1024  # the API server refuses a ConfigMap whose data exceed 1 MiB
HEADROOM = 4096  # the key and the object's metadata


def _default_image() -> str:
    try:
        version = metadata.version("ddpjob-operator")
    except metadata.PackageNotFoundError:  # a source checkout without the package installed
        version = "0.1.0"
    return f"ghcr.io/ddpjob/ddp-trainer:{version}"


DEFAULT_IMAGE = _default_image()


class FunctionError(validation.InvalidJob):
    """The function cannot be shipped as a job; each error says why and the fix."""

    def __init__(self, what: str, fix: str, field: str = "train_fn"):
        super().__init__([FieldError(field, what, fix)])


@dataclass(frozen=True)
class FunctionJob:
    manifest: dict[str, Any]  # the DDPJob
    config_map: dict[str, Any]  # the program the DDPJob's entrypoint runs

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    @property
    def program(self) -> str:
        return self.config_map["data"][PROGRAM]


# ---------------------------------------------------------------- the function's source


def _global_names(code: types.CodeType) -> set[str]:
    """Every name the code (and its nested functions, lambdas, comprehensions) looks up as a global."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def function_source(fn: Callable[..., Any]) -> str:
    """The function's own source, dedented, without decorators; FunctionError when it cannot run alone."""
    if not inspect.isfunction(fn):
        raise FunctionError(f"{fn!r} is not a function", "pass a function defined with `def` at the top level "
                                                         "of a module or notebook cell")
    name = fn.__name__
    if name == "<lambda>":
        raise FunctionError("a lambda has no name to call and no source of its own",
                            "define the function with `def` at the top level")
    if inspect.iscoroutinefunction(fn):
        raise FunctionError(f"{name} is async", "use a plain `def` (torchrun calls it in a normal process)")
    if "<locals>" in fn.__qualname__ or fn.__code__.co_freevars:
        raise FunctionError(f"{name} is defined inside another function (a closure): the variables it "
                            f"captures ({', '.join(fn.__code__.co_freevars) or 'none'}) are not shipped",
                            "define it at the top level and pass values as kwargs")
    if "." in fn.__qualname__:
        raise FunctionError(f"{fn.__qualname__} is a method", "use a top-level function")
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise FunctionError(f"the source of {name} is not available (defined with exec, or in an interactive "
                            f"session without a file)", "define it in a .py file or a notebook cell") from None
    node = next((n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise FunctionError(f"the source of {name} is not a `def {name}`", "use a plain top-level def")
    source = "\n".join(source.splitlines()[node.lineno - 1:]) + "\n"  # from `def`: decorators are dropped
    # Default values are evaluated when the program defines the function (annotations never are: the
    # program starts with `from __future__ import annotations`), so the names they read must exist there too.
    defaults = [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
    in_defaults = {n.id for d in defaults for n in ast.walk(d) if isinstance(n, ast.Name)}
    outside = sorted(n for n in _global_names(fn.__code__) | in_defaults if n != name and not hasattr(builtins, n))
    if outside:
        modules = [n for n in outside if isinstance(fn.__globals__.get(n), types.ModuleType)]
        hint = f" (e.g. `import {fn.__globals__[modules[0]].__name__}` inside the function)" if modules else ""
        raise FunctionError(f"{name} uses the global name(s) {', '.join(outside)}, which are not shipped with "
                            f"its source", f"import modules and define helpers and constants inside {name}{hint}, "
                            f"or pass values as kwargs")
    return source


def program(fn: Callable[..., Any], kwargs: Mapping[str, Any] | None = None) -> str:
    """The file every training process runs: the function, then a call with the JSON kwargs."""
    source = function_source(fn)
    try:
        encoded = json.dumps(dict(kwargs or {}), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise FunctionError(f"kwargs cannot travel as JSON: {exc}", "pass strings, numbers, booleans, None, "
                            "lists and dicts (paths as strings)", field="kwargs") from None
    origin = f"{fn.__module__}.{fn.__name__}"
    return (f"# Generated by ddpjob_operator.function_job from {origin}: torchrun runs it in every training\n"
            f"# process (RANK, WORLD_SIZE, MASTER_ADDR, ... are set). Submit again to change it.\n"
            f"from __future__ import annotations\n\nimport json as _ddpjob_json\n\n\n{source}\n\n"
            f"if __name__ == \"__main__\":\n"
            f"    {fn.__name__}(**_ddpjob_json.loads({encoded!r}))\n")


# ---------------------------------------------------------------- the job


def _ascii(name: str) -> str:
    """A Python name folded to ASCII (`entraînement` -> `entrainement`); what has no ASCII form is dropped
    (`訓練` -> ""): names and label values are ASCII, while a Python identifier need not be."""
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()


def _label_value(name: str) -> str:
    """The function's name as a label value: ASCII, at most 63 characters, starting and ending alphanumeric."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "", _ascii(name)).strip("_.-")[:63].rstrip("_.-")
    return value or "function"


def _job_name(fn: Callable[..., Any]) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", _ascii(fn.__name__).lower()).strip("-") or "function"
    if not base[0].isalpha():
        base = f"fn-{base}"
    return f"{base[:model.MAX_JOB_NAME_LENGTH - 6].rstrip('-')}-{secrets.token_hex(2)}"


def build(fn: Callable[..., Any], *, name: str | None = None, replicas: int = 1, image: str = DEFAULT_IMAGE,
          nproc_per_node: int = 1, kwargs: Mapping[str, Any] | None = None, min_replicas: int | None = None,
          max_replicas: int | None = None, env: Mapping[str, str] | None = None,
          resources: Mapping[str, Any] | None = None, spec: Mapping[str, Any] | None = None,
          namespace: str | None = None) -> FunctionJob:
    """The DDPJob and the ConfigMap that run `fn(**kwargs)` in every training process. `spec`: any other
    DDPJob spec fields (checkpoint, failurePolicy, runPolicy, template, ...), as in a manifest."""
    text = program(fn, kwargs)
    if len(text.encode()) > CONFIG_MAP_LIMIT - HEADROOM:
        raise FunctionError(f"the program is {len(text.encode())} bytes; a ConfigMap holds at most 1 MiB",
                            "ship large code in an image (spec.image) and data on a volume")
    name = name or _job_name(fn)
    extra = dict(spec or {})
    template = dict(extra.pop("template", None) or {})
    template["volumes"] = [*template.get("volumes", []),
                           {"name": VOLUME, "configMap": {"name": f"{name}-function"}}]
    template["volumeMounts"] = [*template.get("volumeMounts", []),
                                {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}]
    # The function forms its process group from torchrun's variables (dist.init_process_group), which under
    # in-process recovery (the default with restartScope Pod) are each pod's alone: the restart path unless named.
    failure_policy = {"recovery": "Restart", **(extra.pop("failurePolicy", None) or {})}
    job_spec: dict[str, Any] = {
        "replicas": replicas, "nprocPerNode": nproc_per_node, "image": image,
        "entrypoint": f"{MOUNT_PATH}/{PROGRAM}", "args": [],
        "env": [{"name": k, "value": str(v)} for k, v in (env or {}).items()],
        "template": template, "failurePolicy": failure_policy, **extra}
    if min_replicas is not None:
        job_spec["minReplicas"] = min_replicas
    if max_replicas is not None:
        job_spec["maxReplicas"] = max_replicas
    if resources is not None:
        job_spec["resources"] = dict(resources)
    metadata_: dict[str, Any] = {"name": name, "labels": {f"{model.GROUP}/function": _label_value(fn.__name__)}}
    if namespace:
        metadata_["namespace"] = namespace
    manifest = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": metadata_, "spec": job_spec}
    validation.parse_job(manifest)  # InvalidJob with validate's words (a bad name, replicas, ...)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{name}-function", **({"namespace": namespace} if namespace else {}),
                               "labels": {f"{model.GROUP}/job-name": name}},
                  "data": {PROGRAM: text}}
    return FunctionJob(manifest=manifest, config_map=config_map)


def local_job(fj: FunctionJob, directory: Path) -> model.DDPJob:
    """The same manifest for `ddpjob run --local`: the ConfigMap's files are written to `directory`, which
    stands in for the mount (the one difference: the entrypoint's path). InvalidJob when `directory` is a link
    or not a directory; a link planted at a file's name is replaced, never written through."""
    from .local.paths import refuse_unusable_directories, replace_file

    refuse_unusable_directories(directory, fix="give another directory")
    directory.mkdir(parents=True, exist_ok=True)
    for key, text in fj.config_map["data"].items():
        replace_file(directory / key, text.encode())
    spec = {**fj.manifest["spec"], "entrypoint": str((directory / PROGRAM).resolve())}
    return validation.parse_job({**fj.manifest, "spec": spec})


def run_local(fj: FunctionJob, *, state_dir: Path | None = None, view: Any = None) -> str:
    """Run the function job on this machine with the local runner (real torchrun); the final phase."""
    from .local.runner import LocalRunner
    from .local.options import STATE_DIR, RunOptions
    from .local.view import make_view

    from .local.paths import refuse_unusable_directories

    root = state_dir or STATE_DIR
    # The run's own directories are checked again by the runner, but the program is written before it starts.
    refuse_unusable_directories(root, root / fj.name, fix="run from another working directory")
    job = local_job(fj, root / fj.name / "function")
    return LocalRunner(job, RunOptions(state_dir=root), view or make_view()).run()
