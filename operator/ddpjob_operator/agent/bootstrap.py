"""The agent's entry: `python DIRECTORY/bootstrap.py ROLE ARGS...` loads the files beside it (a pod: the job's
agent ConfigMap, mounted read-only; a local run: the operator package's agent/ directory) as the package
`ddpjob_agent` and calls `main(ARGS)` of its module ROLE. Standard library only: it runs before anything
else in the container, on the user's image, which has no operator package."""

import importlib
import os
import sys
import types

PACKAGE = "ddpjob_agent"
ROLES = ("worker", "zygote", "store")


def start(argv):
    if not argv or argv[0] not in ROLES:
        sys.exit(f"usage: python {sys.argv[0]} {{{','.join(ROLES)}}} ARGS... (the ddpjob agent's entry)")
    directory = os.path.dirname(os.path.abspath(__file__))
    if not getattr(sys.flags, "safe_path", False):  # Python 3.11's -P / PYTHONSAFEPATH adds nothing
        # As under `python -c`: the trainer (forked from the agent) finds the working directory's modules
        # first, never the agent's own files (a user's `worker` or `contract` module stays theirs).
        sys.path[0] = ""
    package = types.ModuleType(PACKAGE)
    package.__path__ = [directory]  # its modules are the files beside this one, whatever the directory
    sys.modules[PACKAGE] = package
    importlib.import_module(f"{PACKAGE}.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    start(sys.argv[1:])
