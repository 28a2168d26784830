"""The local runner's worker starter (a zygote): one process per local run imports what every worker
imports once (torch for the agent; torch._dynamo, which the trainer's first optimizer imports), then forks a
worker agent per request in milliseconds: a new generation costs no imports, where each worker took 4-5 s
of CPU (2.3 s for torch, 2 s for torch._dynamo) on a 2-core machine (bench/recovery.py).

Protocol, one line each way: stdin gets {"args", "env", "log"} as JSON; stdout answers "started PID" per
request and "exit PID CODE" (CODE as Popen's returncode) when a worker ends. Its own diagnostics go to
stderr. It exits when stdin closes; its workers live on. Run as `python agent/bootstrap.py zygote`
(agent.command), like the worker, with no operator package imported."""

import io
import json
import os
import select
import sys
import traceback

import torch._dynamo  # noqa: F401 (preloaded for every worker's trainer)
import torch.optim  # noqa: F401 (preloaded for every worker's trainer)

from .worker import finish, launch, patch_torch, preload_from_env


def become_worker(request, sibling_fds):
    # Like a new container: a session of its own (the runner signals its process group and finds its
    # processes by session), the request's environment, output to its log, and never back here.
    try:
        os.setsid()
        for fd in sibling_fds:
            os.close(fd)
        if "numpy.random" in sys.modules:  # forked processes share the RNG state a new one seeds afresh
            sys.modules["numpy.random"].seed()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for target, source in ((0, null), (1, log), (2, log)):
            os.dup2(source, target)
        os.close(null)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        if os.environ.get("PYTHONUNBUFFERED"):  # read when an interpreter starts: as if this one had
            sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(open(2, "wb", 0, closefd=False), write_through=True,
                                          errors="backslashreplace")
        sys.argv = [sys.argv[0], "worker", *request["args"]]  # as the worker's own command has it
        launch(request["args"])
    except SystemExit as stop:
        finish(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:
        traceback.print_exc()
    finish(1)


def serve():
    preload_from_env()
    pending, children = b"", {}  # pidfd -> pid of every worker still running
    while True:
        readable, _, _ = select.select([0, *children], [], [])
        for fd in readable:
            if fd != 0:
                pid = children.pop(fd)
                os.close(fd)
                code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                os.write(1, f"exit {pid} {code}\n".encode())
                continue
            data = os.read(0, 1 << 16)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    become_worker(request, list(children))
                children[os.pidfd_open(pid)] = pid
                os.write(1, f"started {pid}\n".encode())


def main(args):
    if args:
        sys.exit(f"the zygote takes no arguments (its requests come on stdin), not {args}")
    patch_torch()
    serve()
