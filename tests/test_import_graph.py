"""The packages' import graphs (read with ast: every import statement, inside functions and under
`if TYPE_CHECKING:` too): no module imports itself through others (a cycle worked around with an import
inside a function, or for type hints only, is still a cycle); the layering rules the module docstrings state
hold (RULES); and the operator imports torch only in the worker agent's pod-side modules (the operator's
image has none)."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"ddpjob_operator": ROOT / "operator", "ddpjob": ROOT / "operator", "ddp_trainer": ROOT / "trainer-image"}
# Run in the worker's pod (or the local runner's processes), never imported by the operator.
TORCH_IN_THE_OPERATOR = {f"ddpjob_operator.agent.{name}" for name in ("worker", "generations", "spare", "zygote", "store")}


def modules(package: str) -> dict[str, Path]:
    root = PACKAGES[package]
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_statements(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement: at the top, inside functions, and under `if TYPE_CHECKING:`, which never runs
    but still ties the two modules together (a type-only loop is a loop)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The modules `node` (in module `name`) imports: a submodule where `from X import Y` names one, else X."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix for alias in node.names]


@functools.cache  # read once per test run; no caller changes what it returns
def all_imports(package: str) -> dict[str, dict[str, int]]:
    """module -> {every module it imports (of its package, resolved; any other as written): the line}."""
    found = modules(package)
    edges: dict[str, dict[str, int]] = {name: {} for name in found}
    for name, path in found.items():
        for node in import_statements(ast.parse(path.read_text(), str(path))):
            for target in imported(name, path, node, set(found)):
                if target != name:
                    edges[name].setdefault(target, node.lineno)
    return edges


def graph(package: str) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports: the line}."""
    found = modules(package)
    return {name: {target: line for target, line in targets.items() if target in found}
            for name, targets in all_imports(package).items()}


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges[target])))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_an_import_inside_a_function():
    edges = {"a": {"b": 1}, "b": {"c": 3}, "c": {"a": 7}, "d": {"a": 2}}
    assert cycles(edges) == [["a", "b", "c"]] and cycles({"a": {"b": 1}, "b": {}}) == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycles(package):
    edges = graph(package)
    assert edges
    found = cycles(edges)
    assert not found, "; ".join(f"{module} imports {target} (line {line})" for cycle in found for module in cycle
                                for target, line in edges[module].items() if target in cycle)


def test_the_operator_imports_torch_only_in_the_worker_agents_pod_side_modules():
    importers = {name for name, path in modules("ddpjob_operator").items()
                 for node in import_statements(ast.parse(path.read_text()))
                 if any(target.split(".")[0] == "torch" for target in imported(name, path, node, set()))}
    assert importers == TORCH_IN_THE_OPERATOR


# ---------------------------------------------------------------- layering (what the module docstrings state)


def tree(module: str) -> tuple[str, ...]:
    """A module and everything under it, as patterns."""
    return (module, f"{module}.*")


OP = "ddpjob_operator"
# Modules that reach the outside world (cluster, network, processes, files, sleeps, kopf, torch).
INPUT_OUTPUT = tuple(pattern for module in ("kopf", "kubernetes", "aiohttp", "asyncio", "socket", "subprocess",
                                            "urllib.request", "os", "pathlib", "shutil", "prometheus_client", "torch")
                     for pattern in tree(module))


@dataclass(frozen=True)
class Rule:
    """Modules matching `importer` import nothing matching `forbidden` but what matches `allowed`."""

    importer: tuple[str, ...]
    forbidden: tuple[str, ...]
    reason: str
    allowed: tuple[str, ...] = ()


RULES = (
    Rule(tree(f"{OP}.naming"), tree(OP), "names are the decision layer's as much as the manifests': the model only "
         "(the agent's package reads files at import)", tree(f"{OP}.model")),
    Rule(tree(f"{OP}.decisions"), tree(OP), "the pure decision layer takes names from naming only, never launch flags "
         "or manifests", (*tree(f"{OP}.decisions"), *tree(f"{OP}.model"), f"{OP}.naming", f"{OP}.agent.contract",
                          f"{OP}.validation")),
    Rule(tree(f"{OP}.launch"), tree(OP), "how a worker starts: the model, names and the agent's command; no objects",
         (*tree(f"{OP}.model"), f"{OP}.naming", *tree(f"{OP}.agent"))),
    Rule(tree(f"{OP}.job_manifests"), tree(OP), "manifests are built from names and launch flags, with no client",
         (*tree(f"{OP}.model"), f"{OP}.naming", f"{OP}.launch", *tree(f"{OP}.agent"))),
    Rule(tree(f"{OP}.observations"), tree(OP), "bodies in, the decision layer's frozen values out",
         (*tree(f"{OP}.decisions"), *tree(f"{OP}.model"), f"{OP}.naming", f"{OP}.validation")),
    *(Rule(tree(f"{OP}.{pure}"), INPUT_OUTPUT, "pure: no I/O, no kopf, no clock of its own")
      for pure in ("naming", "decisions", "launch", "job_manifests", "observations")),
    Rule(tree(f"{OP}.model"), tree(OP), "the API's source of truth imports only the field rules it is written with "
         "and the agent's contract constants", (*tree(f"{OP}.model"), f"{OP}.k8s_fields", f"{OP}.pod_rules",
                                                f"{OP}.agent.contract")),
    Rule(tree(f"{OP}.agent"), tree(OP), "a pod runs the agent's files without the operator package",
         tree(f"{OP}.agent")),
    Rule((f"{OP}.agent.contract",), ("*",), "its source is carried into the pod: no imports of its own"),
    Rule((f"{OP}.workqueue", f"{OP}.side_tasks"), (*tree(OP), *tree("kopf")),
         "pure asyncio: imports nothing of the operator"),
    Rule((f"{OP}.job_cache",), (*tree(OP), *tree("kopf")), "the model and observations only: no kopf, no API calls",
         (*tree(f"{OP}.model"), f"{OP}.observations")),
    Rule((f"{OP}.informer",), (*tree(OP), *tree("kopf")), "kube, naming and observations only; no kopf",
         (f"{OP}.kube", f"{OP}.naming", f"{OP}.observations")),
    Rule((f"{OP}.reconciler",), (*tree("kopf"), f"{OP}.handlers", f"{OP}.run"), "never kopf or the controller"),
    Rule((f"{OP}.actuator",), (*tree("kopf"), f"{OP}.reconciler", f"{OP}.handlers", f"{OP}.run"),
         "never kopf, the reconciler or the controller"),
    Rule((f"{OP}.progress_router",), (f"{OP}.reconciler", f"{OP}.actuator"), "never the reconciler or the actuator"),
    Rule((f"{OP}.progress.*",), (f"{OP}.progress",),
         "the progress modules import their siblings, never the package's gathered names"),
    Rule(tuple(f"{OP}.{room}" for room in ("handlers", "run", "reconciler", "actuator", "informer", "job_cache",
                                           "progress_router", "leader", "kube")),
         tree(f"{OP}.local"), "the operator's controller never imports the local runner"),
    Rule((f"{OP}.local.faults", f"{OP}.local.display"), (f"{OP}.local.runner",),
         "they read the few names of a RunView (run_view.py), never runner.py"),
    Rule(tree(OP), tree("ddp_trainer"), "the operator never imports the trainer image's package"),
    Rule(tree("ddp_trainer"), (*tree(OP), *tree("ddpjob")), "the trainer image has no operator package"),
    Rule(("ddp_trainer.runtime.contract",), (*tree("ddp_trainer"), *tree("torch")),
         "standard library only: every runtime module imports it, and it imports none of them"),
)


def matches(module: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(module, pattern) for pattern in patterns)


def violations(edges: dict[str, dict[str, int]], rules: tuple[Rule, ...]) -> list[str]:
    return [f"{module} imports {target} (line {line}): {rule.reason}"
            for module, targets in edges.items() for target, line in targets.items() for rule in rules
            if matches(module, rule.importer) and matches(target, rule.forbidden)
            and not matches(target, rule.allowed)]


def example(patterns: tuple[str, ...], avoid: tuple[str, ...] = ()) -> str:
    """A module name the patterns match and `avoid` does not."""
    for name in (pattern.replace("*", "x") for pattern in patterns):
        if not matches(name, avoid):
            return name
    raise AssertionError(f"no example of {patterns} outside {avoid}")


def every_import() -> dict[str, dict[str, int]]:
    return {module: targets for package in PACKAGES for module, targets in all_imports(package).items()}


def rule_id(rule: Rule) -> str:
    return f"{rule.importer[0]}-not-{rule.forbidden[0]}"


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_each_rule_catches_an_import_it_forbids_and_lets_its_exceptions_through(rule):
    importer, forbidden = example(rule.importer), example(rule.forbidden, rule.allowed)
    assert violations({importer: {forbidden: 3}}, (rule,)) == [f"{importer} imports {forbidden} (line 3): {rule.reason}"]
    assert violations({"elsewhere": {forbidden: 3}}, (rule,)) == []
    if rule.allowed:
        assert violations({importer: {example(rule.allowed): 3}}, (rule,)) == []


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_each_rules_importer_is_a_module_that_exists(rule):
    """A rule about a module that was renamed or removed would hold for nothing."""
    assert any(matches(module, rule.importer) for module in every_import())


def test_the_modules_keep_the_layering_their_docstrings_state():
    assert violations(every_import(), RULES) == []


def test_an_import_for_type_hints_only_is_an_import():
    source = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .runner import Runner\n")
    targets = [target for node in import_statements(source)
               for target in imported("pkg.faults", Path("pkg/faults.py"), node, {"pkg.runner"})]
    assert targets == ["typing", "pkg.runner"]
