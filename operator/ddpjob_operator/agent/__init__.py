"""The worker agent: the program every worker and spare container runs, and the local runner's zygote.

Plain modules (contract.py, worker.py, zygote.py, bootstrap.py). The pod's command carries their source,
read here with importlib.resources (`python -c WORKER_PROGRAM <torchrun args...>`), because the trainer
image has torch and no operator package. The operator imports contract.py only; worker.py and zygote.py
import torch and run in the pod (or in the local runner's processes)."""

import io
import tokenize
from importlib import resources

from . import contract

__all__ = ["WORKER_PROGRAM", "ZYGOTE_PROGRAM", "code", "contract"]


def _source(module: str) -> str:
    return resources.files(__name__).joinpath(f"{module}.py").read_text(encoding="utf-8")


def code(source: str) -> str:
    """The source without its comments, every line where it is in the file (a traceback's line numbers stay
    the file's): every pod spec carries the program, and every list and watch event of pods carries it."""
    lines = source.splitlines(True)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            line = lines[row - 1]
            lines[row - 1] = line[:column].rstrip() + line[len(line.rstrip("\r\n")):]
    return "".join(lines)


def _program(modules: tuple[str, ...], arguments: str) -> str:
    """bootstrap.py, then a call that loads `modules` (each after those it imports) and calls the last one's
    main(arguments)."""
    sources = {module: code(_source(module)) for module in modules}
    return f"{code(_source('bootstrap'))}\nrun({sources!r}{arguments})\n"


# Constants, never built from user input: user input only ever follows them as argv.
WORKER_PROGRAM = _program(("contract", "worker"), ", sys.argv[1:]")
ZYGOTE_PROGRAM = _program(("contract", "worker", "zygote"), "")
