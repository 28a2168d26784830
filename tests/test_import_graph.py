"""The packages' import graphs (read with ast, every import statement, inside functions too): no module
imports itself through others (a cycle worked around with an import inside a function is still a cycle),
and the operator imports torch only in the worker agent's pod-side modules (the operator's image has none)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"ddpjob_operator": ROOT / "operator", "ddpjob": ROOT / "operator", "ddp_trainer": ROOT / "trainer-image"}
# Run in the worker's pod (or the local runner's processes), never imported by the operator.
TORCH_IN_THE_OPERATOR = {"ddpjob_operator.agent.worker", "ddpjob_operator.agent.zygote"}


def modules(package: str) -> dict[str, Path]:
    root = PACKAGES[package]
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_statements(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import that can run: those under `if TYPE_CHECKING:` never do."""
    checking_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                     and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            and id(node) not in checking_only]


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


def graph(package: str) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports: the line}."""
    found = modules(package)
    edges: dict[str, dict[str, int]] = {name: {} for name in found}
    for name, path in found.items():
        for node in import_statements(ast.parse(path.read_text(), str(path))):
            for target in imported(name, path, node, set(found)):
                if target in found and target != name:
                    edges[name].setdefault(target, node.lineno)
    return edges


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
