"""The start of every program the agent's package builds (agent/__init__.py appends a call of `run` with the
agent's sources): it makes the package `ddpjob_agent` of those sources, each compiled under its own file
name and registered with linecache, so that a traceback from the pod names the agent's file and line and
shows the source line. Standard library only: it runs before anything else in the container."""

import linecache
import sys
import traceback
import types

PACKAGE = "ddpjob_agent"


def load(sources):
    """The modules `ddpjob_agent.<name>` of {name: source}, executed in order (a module after those it
    imports); returns the last one."""
    package = sys.modules.setdefault(PACKAGE, types.ModuleType(PACKAGE))
    package.__path__ = []
    module = None
    for name, source in sources.items():
        filename = f"{PACKAGE}/{name}.py"
        module = types.ModuleType(f"{PACKAGE}.{name}")
        module.__file__, module.__package__ = filename, PACKAGE
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # no mtime: kept
        sys.modules[module.__name__] = module
        setattr(package, name, module)
        exec(compile(source, filename, "exec"), module.__dict__)
    return module


def print_uncaught(kind, error, trace):
    # The interpreter's own printer reads source lines from disk, where the agent's files are not.
    traceback.print_exception(kind, error, trace)


def run(sources, *args):
    """Loads the sources and calls the last module's `main`."""
    sys.excepthook = print_uncaught
    load(sources).main(*args)
