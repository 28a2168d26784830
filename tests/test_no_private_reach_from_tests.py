"""Tests and benches use the product and the API emulator through their public names only (issue 37).

Every test and bench file is parsed: an attribute access of a private name (one leading underscore) that the
product packages or the emulator define, on anything but the test's own objects, fails here, and so does a test
class that overrides such a name of a product or emulator class it extends. The pokes left are listed in
ALLOWED with their reason; an entry that no longer occurs fails too, so the list only shrinks."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from tests.kube_emulator import Cluster, LogCluster

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = (ROOT / "operator" / "ddpjob_operator", ROOT / "trainer-image" / "ddp_trainer")
EMULATOR = ROOT / "tests" / "kube_emulator"
PRODUCT_MODULES = ("ddpjob_operator", "ddp_trainer", "tests.kube_emulator")

# (file, private name) -> why it is still reached for.
ALLOWED = {
    ("tests/trainer/test_runtime.py", "_send"): "needs a public send seam in ProgressReporter (runtime/progress.py)",
    ("tests/trainer/test_runtime.py", "_thread"): "needs a public send seam in ProgressReporter (runtime/progress.py)",
    ("tests/local/test_a_second_run_of_a_job_in_use_is_refused.py", "_prepare_dirs"):
        "needs a public directory-preparation step in LocalRunner (local/runner.py)",
    ("tests/local/test_runner.py", "_prepare_dirs"): "needs a public seam in LocalRunner (local/runner.py)",
    ("tests/local/test_own_script_guide_and_summary.py", "_signals"): "needs a public seam in LocalRunner (local/runner.py)",
    ("tests/local/test_own_script_guide_and_summary.py", "_on_signal"): "needs a public seam in LocalRunner (local/runner.py)",
    ("tests/operator/test_builders.py", "_times"): "needs a public seam for job_manifests.py's timings",
    ("tests/operator/test_progress_hardening.py", "_runner"):
        "counts the ProgressServer's open connections: needs a public count in progress/server.py",
    ("tests/trainer/test_hf_callback.py", "_write_replica"): "needs a public rescue-write seam in the HF callback",
    ("tests/trainer/test_step_timing.py", "_ready"): "needs an injected clock in the step timer",
    ("tests/trainer/test_step_timing.py", "_done"): "needs an injected clock in the step timer",
    ("tests/trainer/test_checkpoint_safety.py", "_withdraw_if_fenced"):
        "wraps the writer's fence check to race a rescue commit: needs a public hook in the checkpoint writer",
    ("tests/api/test_validation.py", "_cel_program"): "needs a public seam in model/base.py's CEL checks",
    ("tests/api/test_a_legal_affinity_of_98000_nodes_is_checked_in_seconds.py", "_fields_read"):
        "needs a public seam in model/base.py's CEL checks",
    ("tests/api/test_a_legal_affinity_of_98000_nodes_is_checked_in_seconds.py", "_prune"):
        "needs a public seam in model/base.py's CEL checks",
    ("bench/trainer_bench_worker.py", "_train_step"): "times each step by wrapping the Trainer's step: needs a hook",
}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def owned_private_names() -> set[str]:
    """Every private name the product and the emulator define (functions, classes, attributes), and the
    private members the emulator's classes inherit from kmock."""
    names: set[str] = set()
    for package in (*PRODUCT, EMULATOR):
        for path in package.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
    for cls in (Cluster, LogCluster):
        names.update(name for name, _ in inspect.getmembers(cls))
    return {name for name in names if private(name)}


def imports_of(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names a file binds by import: (from the product or the emulator, from anything else)."""
    product, other = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                ours = alias.name.startswith(PRODUCT_MODULES)
                (product if ours else other).add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            ours = node.level > 0 or (node.module or "").startswith(PRODUCT_MODULES)
            for alias in node.names:
                (product if ours else other).add(alias.asname or alias.name)
    return product, other


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def extends_ours(cls: ast.ClassDef, product: set[str]) -> bool:
    return any(root_name(base) in product for base in cls.bases)


def pokes(path: Path, owned: set[str]) -> list[tuple[int, str]]:
    """(line, private name) of each reach into the product's or the emulator's private names."""
    tree = ast.parse(path.read_text(), str(path))
    product, other = imports_of(tree)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, own_class: bool) -> None:
        if isinstance(node, ast.ClassDef):
            own_class = not extends_ours(node, product)
            if not own_class:
                found.extend((item.lineno, item.name) for item in node.body
                             if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in owned)
        if isinstance(node, ast.Attribute) and private(node.attr) and node.attr in owned:
            its_own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and own_class
            if not (its_own or root_name(node.value) in other):
                found.append((node.lineno, node.attr))
        for child in ast.iter_child_nodes(node):
            visit(child, own_class)
    visit(tree, True)
    return found


def test_tests_and_benches_reach_no_private_name_of_the_product_or_the_emulator():
    owned = owned_private_names()
    files = [p for p in (*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*.py"))
             if EMULATOR not in p.parents]
    seen: dict[tuple[str, str], list[int]] = {}
    for path in files:
        for line, name in pokes(path, owned):
            seen.setdefault((str(path.relative_to(ROOT)), name), []).append(line)
    new = {key: lines for key, lines in seen.items() if key not in ALLOWED}
    assert not new, ("private names of the product or the emulator reached from tests or benches (add a public "
                     "hook or an injected clock instead): " + "; ".join(f"{file}:{lines} {name}"
                                                                          for (file, name), lines in new.items()))
    stale = sorted(set(ALLOWED) - set(seen))
    assert not stale, f"no longer reached: remove from ALLOWED: {stale}"
