"""The worker agent: the program every worker and spare container runs, and the local runner's zygote.

Plain modules (contract.py, worker.py, zygote.py, bootstrap.py). The pod's command carries their source,
read here with importlib.resources (`python -c WORKER_PROGRAM <torchrun args...>`), because the trainer
image has torch and no operator package. The operator imports contract.py only; worker.py and zygote.py
import torch and run in the pod (or in the local runner's processes)."""

from importlib import resources

from . import contract

__all__ = ["WORKER_PROGRAM", "ZYGOTE_PROGRAM", "contract"]


def _source(module: str) -> str:
    return resources.files(__name__).joinpath(f"{module}.py").read_text(encoding="utf-8")


def _program(modules: tuple[str, ...], arguments: str) -> str:
    """bootstrap.py, then a call that loads `modules` (each after those it imports) and calls the last one's
    main(arguments)."""
    sources = {module: _source(module) for module in modules}
    return f"{_source('bootstrap')}\nrun({sources!r}{arguments})\n"


# Constants, never built from user input: user input only ever follows them as argv.
WORKER_PROGRAM = _program(("contract", "worker"), ", sys.argv[1:]")
ZYGOTE_PROGRAM = _program(("contract", "worker", "zygote"), "")
