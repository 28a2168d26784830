"""The worker agent is plain source (ddpjob_operator/agent/) that a pod runs from its job's agent ConfigMap:
those files alone run without the operator package, leave a trainer's own modules its own, name the agent's
file and line in a traceback, and patch only torch code that was checked against the installed torch."""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from ddpjob_operator import agent, launch
from ddpjob_operator.agent import contract

from .pod_agent import mount_agent

AGENT = Path(agent.__file__).parent

# sha256 (first 16 hex digits) of each patched target's source, per torch version checked. A torch whose
# target differs fails here: read the patch in agent/worker.py again, then add the version and its hash.
CHECKED = {
    "torch.distributed.run.config_from_args": {"2.13.0": "6eb348d863484eac"},
    "torch.distributed.elastic.multiprocessing.api._terminate_process_handler": {"2.13.0": "690db341fcce4d93"},
    "torch.distributed.elastic.agent.server.local_elastic_agent.LocalElasticAgent._start_workers":
        {"2.13.0": "3a15b68937f57e63"},
    "torch.distributed.elastic.agent.server.local_elastic_agent.start_processes": {"2.13.0": "c26b08a0ab76da28"},
    "torch.distributed.elastic.agent.server.api.SimpleElasticAgent.run": {"2.13.0": "1f0bf1529692b17f"},
    "torch._logging._internal.TorchLogsFormatter.format": {"2.13.0": "fe59988164d8a234"},
}


def resolve(dotted: str):
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            target = getattr(target, name)
        return target
    raise ImportError(dotted)


def source_hash(target) -> str:
    return hashlib.sha256(inspect.getsource(target).encode()).hexdigest()[:16]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names} | {node.module.split(".")[0] for node in ast.walk(tree)
                                        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}


def test_the_agent_imports_only_the_standard_library_torch_and_itself():
    stdlib = sys.stdlib_module_names
    assert imported_modules(AGENT / "contract.py") == set()
    assert imported_modules(AGENT / "bootstrap.py") <= stdlib
    for name in ("worker", "zygote", "store"):
        assert imported_modules(AGENT / f"{name}.py") - stdlib == {"torch"}, name


@pytest.mark.parametrize("role", [[], ["trainer"], ["../worker"], ["bootstrap"]])
def test_the_agents_entry_refuses_a_role_it_does_not_have_with_its_usage(tmp_path, role):
    entry = mount_agent(tmp_path / "node")[:2]
    done = subprocess.run([*entry, *role], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr == f"usage: python {entry[1]} {{worker,zygote,store}} ARGS... (the ddpjob agent's entry)\n"


torch = pytest.importorskip("torch", reason="the agent's worker module imports torch")
worker = pytest.importorskip("ddpjob_operator.agent.worker")


@pytest.mark.parametrize("target", sorted(worker.TORCH_PATCHES))
def test_each_torch_patch_was_checked_against_the_installed_torch(target):
    version = torch.__version__.split("+")[0]
    assert CHECKED.keys() == worker.TORCH_PATCHES.keys()
    assert version in worker.TORCH_PATCHES[target], \
        f"torch {version}: check the patch of {target} in agent/worker.py and add {version} to TORCH_PATCHES"
    assert source_hash(resolve(target)) == CHECKED[target].get(version), \
        f"torch {version} changed {target}: check its patch in agent/worker.py, then record the new hash here"


def test_patch_torch_replaces_each_target_once(monkeypatch):
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import api as elastic_processes
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.agent.server import local_elastic_agent

    monkeypatch.setattr(worker, "PATCHED", [])
    replaced = [(torchrun, "config_from_args"), (elastic_processes, "_terminate_process_handler"),
                (LocalElasticAgent, "_start_workers"), (LocalElasticAgent, "run"),
                (local_elastic_agent, "start_processes")]
    before = {}
    for owner, name in replaced:
        before[name] = getattr(owner, name)
        monkeypatch.setattr(owner, name, before[name])  # undone after the test
    handlers = [h for n in logging.root.manager.loggerDict if n == "torch" or n.startswith("torch.")
                for h in getattr(logging.getLogger(n), "handlers", ())]
    filters = {id(h): list(h.filters) for h in handlers}
    try:
        worker.patch_torch()
        after = {name: getattr(owner, name) for owner, name in replaced}
        worker.patch_torch()  # a second call changes nothing
        assert all(after[name] is not before[name] and getattr(owner, name) is after[name]
                   for owner, name in replaced)
        assert handlers and all(isinstance(h.filters[-1], worker.PlainTraceback) for h in handlers)
    finally:
        for h in handlers:
            h.filters[:] = filters[id(h)]


def run_program(tmp_path: Path, env: dict[str, str], script: str,
                files: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The pod's launcher, from the ConfigMap's files alone, training `script` (train.py, beside `files`)."""
    launcher = mount_agent(tmp_path / "node")
    work = tmp_path / "work"
    work.mkdir()
    for name, text in {"train.py": script, **(files or {})}.items():
        (work / name).write_text(text)
    # A package named like the operator's that cannot be imported: the program must never need it.
    (tmp_path / "shadow" / "ddpjob_operator").mkdir(parents=True)
    (tmp_path / "shadow" / "ddpjob_operator" / "__init__.py").write_text(
        "raise ImportError('no operator package in the worker image')\n")
    return subprocess.run([*launcher, "--standalone", "--nproc-per-node=1", "train.py"], cwd=work,
                          capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "shadow"),
                               contract.TERMINATION_LOG_ENV: str(tmp_path / "termination-log"), **env})


@pytest.mark.slow
def test_the_pods_program_runs_without_the_operator_package(tmp_path):
    done = run_program(tmp_path, {}, "import sys\nprint('operator loaded:', 'ddpjob_operator' in sys.modules)\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "operator loaded: False" in done.stdout


@pytest.mark.slow
def test_a_trainers_own_modules_named_like_the_agents_files_stay_its_own(tmp_path):
    # The agent runs as a file: its directory must not come first on the path the (forked) trainer imports from.
    files = {f"{name}.py": "ORIGIN = 'the user'\n" for name in ("worker", "contract", "bootstrap")}
    done = run_program(tmp_path, {}, "import bootstrap, contract, worker\n"
                       "print('imported:', {m.ORIGIN for m in (bootstrap, contract, worker)})\n", files)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported: {'the user'}" in done.stdout


@pytest.mark.slow
def test_a_traceback_from_the_pods_program_names_the_agents_file_line_and_source(tmp_path):
    done = run_program(tmp_path, {contract.REJOIN_TIMEOUT_ENV: "not-a-number"}, "print('never started')\n")
    assert done.returncode == 1
    line = next(i for i, text in enumerate((AGENT / "worker.py").read_text().splitlines(), 1)
                if "float(os.environ.get(REJOIN_TIMEOUT_ENV" in text)
    mounted = tmp_path / "node" / launch.AGENT_DIR.lstrip("/") / "worker.py"
    assert f'File "{mounted}", line {line}, in launch\n' \
           "    timeout = float(os.environ.get(REJOIN_TIMEOUT_ENV, str(REJOIN_TIMEOUT_SECONDS)))" in done.stderr
    assert "ValueError: could not convert string to float: 'not-a-number'" in done.stderr
