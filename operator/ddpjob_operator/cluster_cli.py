"""`ddpjob submit | status | logs | list | delete | suspend | resume | scale`: DDPJobs on a cluster, through
the Python API (the client package) with the current kubeconfig context (or in-cluster credentials).

Errors are messages with their fix and a non-zero exit (2: the manifest, or a NAME or --namespace no object
can have, refused before anything is sent; 1: anything else), never a traceback. `status --watch` (and
`submit --watch`) shows the live view `ddpjob run --local` shows.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from . import client, object_names, validation
from .local.view import Snapshot, Summary, WorkerRow, make_view

EXIT_FAILED = 1


def _client(args: argparse.Namespace) -> client.Client:
    """The client for a command, once its NAME and --namespace are ones an object can have: an empty NAME (an
    unset "$JOB") would make a delete one of the whole collection."""
    if "name" in args:
        object_names.check(args.name, object_names.JOB_NAME, "NAME")
    if args.namespace is not None:
        object_names.check(args.namespace, object_names.NAMESPACE, "--namespace")
    return client.Client(namespace=args.namespace)


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except client.InvalidManifest as exc:
            for error in exc.errors:
                print(error, file=sys.stderr)
            return validation.EXIT_INVALID
        except object_names.InvalidName as exc:
            print(f"ddpjob {args.command}: {exc}", file=sys.stderr)
            return validation.EXIT_INVALID
        except client.DDPJobError as exc:
            print(f"ddpjob {args.command}: {exc}", file=sys.stderr)
            return EXIT_FAILED
    return run


# ---------------------------------------------------------------- what a job looks like


def _seconds_since(stamp: str | None, now: datetime) -> float:
    if not stamp:
        return 0.0
    try:
        return max(0.0, (now - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds())
    except ValueError:
        return 0.0


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def snapshot(job: client.Job, now: datetime | None = None) -> Snapshot:
    """A cluster job as the local run's view shows one."""
    now = now or datetime.now(timezone.utc)
    status, spec = job.status, job.raw.get("spec") or {}
    p = status.progress
    stalled = job.condition("Stalled")
    workers = tuple(WorkerRow(name=r.pod, state=r.phase, restarts=r.restarts, exit_code=r.last_exit_code)
                    for r in sorted(status.ranks, key=lambda r: r.index))
    return Snapshot(
        job=job.name, phase=status.phase or "Pending", message=status.message or "", restarts=status.restarts,
        max_restarts=(spec.get("failurePolicy") or {}).get("maxRestarts", 0),
        elapsed_s=_seconds_since(status.start_time or job.raw["metadata"].get("creationTimestamp"), now),
        step=p.step if p else None, loss=p.loss if p else None,
        world_size=(p.world_size if p and p.world_size else status.world_size) or None,
        last_checkpoint_step=p.last_checkpoint_step if p else None, workers=workers,
        percent=p.percent if p else None, eta=p.eta if p else None,
        stalled=stalled.message if stalled is not None and stalled.status == "True" else None)


def summary(job: client.Job) -> Summary:
    status, snap = job.status, snapshot(job)
    claim = (job.raw.get("spec") or {}).get("checkpoint") or {}
    return Summary(job=job.name, phase=snap.phase, message=snap.message, elapsed_s=snap.elapsed_s,
                   restarts=status.restarts, disruptions=status.disruptions,
                   worker_restarts={r.pod: r.restarts for r in status.ranks}, result=None,
                   checkpoint_dir=(claim.get("claimName") or f"claim {job.name}-checkpoints") if claim else None,
                   log_dir=f"ddpjob logs {job.name} -n {job.namespace} --rank R", progress=status.progress)


def describe_lines(job: client.Job) -> list[str]:
    """`ddpjob status NAME` without --watch."""
    s, snap = job.status, snapshot(job)
    spec = job.raw.get("spec") or {}
    out = [f"ddpjob {job.namespace}/{job.name}: {snap.phase}" + (f" - {snap.message}" if snap.message else ""),
           f"workers {s.ready_replicas}/{spec.get('replicas', '?')} ready, world size {s.world_size}, restarts "
           f"{s.restarts}/{snap.max_restarts}, disruptions {s.disruptions}, generation {s.generation}, age "
           f"{_age(_seconds_since(job.raw['metadata'].get('creationTimestamp'), datetime.now(timezone.utc)))}"]
    p = s.progress
    if p is not None and p.step is not None:
        total = f" of {p.total_steps} ({p.percent}%)" if p.total_steps else ""
        out.append(f"progress: step {p.step}{total}, ETA {p.eta or '-'}, loss {_num(p.loss)}, samples/s "
                   f"{_num(p.samples_per_second, '.1f')}, last checkpoint step {_num(p.last_checkpoint_step, 'd')}")
    if snap.stalled:
        out.append(f"STALLED: {snap.stalled}")
    for r in sorted(s.ranks, key=lambda r: r.index):
        last = f", last exit {r.last_exit_code} ({r.last_reason})" if r.last_exit_code is not None else ""
        out.append(f"  rank {r.index}: {r.pod} {r.phase}{' ready' if r.ready else ''} on {r.node or '-'}, "
                   f"restarts {r.restarts}{last}")
    for incident in s.incidents[-3:]:
        out.append(f"  incident (generation {incident.generation}, {incident.cause}"
                   f"{', charged' if incident.charged else ''}): {incident.message}")
    return out


def _num(value: float | int | None, fmt: str = ".4f") -> str:
    return "-" if value is None else format(value, fmt)


def follow_status(api: client.Client, name: str, console: Console | None = None) -> int:
    """The live view until the job ends; 0 when it Succeeded."""
    view = make_view(console)
    last = None
    try:
        for job in api.watch(name):
            last = job
            view.update(snapshot(job))
    finally:
        if last is not None:
            view.close(summary(last))
    return 0 if last is not None and last.phase == "Succeeded" else EXIT_FAILED


# ---------------------------------------------------------------- commands


@_guarded
def cmd_submit(args: argparse.Namespace) -> int:
    api = _client(args)
    bodies = client.load_manifests(args.file)
    # The API server judges every job, and what each creates, before the first is created (dryRun=All).
    for body in bodies:
        for note in api.judge(body, args.namespace):
            print(f"ddpjob submit: note: {note}", file=sys.stderr)
    created = [api.create(body, args.namespace, judge=False) for body in bodies]
    for job in created:
        print(f"ddpjob {job.namespace}/{job.name} created")
    if args.watch:
        if len(created) != 1:
            print("ddpjob submit: --watch follows one job; use `ddpjob status NAME --watch`", file=sys.stderr)
            return EXIT_FAILED
        return follow_status(api, created[0].name)
    return 0


@_guarded
def cmd_status(args: argparse.Namespace) -> int:
    api = _client(args)
    if args.watch:
        return follow_status(api, args.name)
    for line in describe_lines(api.get(args.name)):
        print(line)
    return 0


@_guarded
def cmd_logs(args: argparse.Namespace) -> int:
    for line in _client(args).logs(args.name, rank=args.rank, follow=args.follow, tail_lines=args.tail,
                                   previous=args.previous):
        print(line, flush=True)
    return 0


@_guarded
def cmd_list(args: argparse.Namespace) -> int:
    api = _client(args)
    jobs = api.list(all_namespaces=args.all_namespaces)
    if not jobs:
        print("no DDPJobs" + ("" if args.all_namespaces else f" in namespace {api.namespace}"), file=sys.stderr)
        return 0
    now = datetime.now(timezone.utc)
    table = Table(box=None, pad_edge=False)
    columns = (["NAMESPACE"] if args.all_namespaces else []) + [
        "NAME", "PHASE", "READY", "DESIRED", "WORLD", "RESTARTS", "STEP", "PROGRESS%", "ETA", "AGE"]
    for column in columns:
        table.add_column(column)
    for job in jobs:
        s, p = job.status, job.status.progress
        row: list[Any] = [job.namespace] if args.all_namespaces else []
        row += [job.name, s.phase or "", s.ready_replicas, (job.raw.get("spec") or {}).get("replicas", ""),
                s.world_size, s.restarts, _num(p.step if p else None, "d"), _num(p.percent if p else None, "d"),
                (p.eta if p else None) or "-", _age(_seconds_since(job.raw["metadata"].get("creationTimestamp"), now))]
        table.add_row(*(str(v) for v in row))
    Console(width=200, soft_wrap=True).print(table)
    return 0


@_guarded
def cmd_delete(args: argparse.Namespace) -> int:
    api = _client(args)
    api.delete(args.name, wait=args.wait)
    print(f"ddpjob {api.namespace if args.namespace is None else args.namespace}/{args.name} deleted")
    return 0


@_guarded
def cmd_suspend(args: argparse.Namespace) -> int:
    job = _client(args).suspend(args.name)
    print(f"ddpjob {job.namespace}/{job.name} suspended (workers stop after a checkpoint; `ddpjob resume` "
          f"continues)")
    return 0


@_guarded
def cmd_resume(args: argparse.Namespace) -> int:
    job = _client(args).resume(args.name)
    print(f"ddpjob {job.namespace}/{job.name} resumed")
    return 0


@_guarded
def cmd_scale(args: argparse.Namespace) -> int:
    job = _client(args).scale(args.name, args.replicas)
    print(f"ddpjob {job.namespace}/{job.name} scaled to {job.raw['spec']['replicas']} workers")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    def verb(name: str, help_: str, func: Callable[[argparse.Namespace], int], *, job: bool = True
             ) -> argparse.ArgumentParser:
        p = subparsers.add_parser(name, help=help_)
        if job:
            p.add_argument("name", metavar="NAME", help="the DDPJob's name")
        p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, or default)")
        p.set_defaults(func=func)
        return p

    p = verb("submit", "create the DDPJobs of a manifest on the cluster (checked first, as validate does)",
             cmd_submit, job=False)
    p.add_argument("file", metavar="FILE")
    p.add_argument("-w", "--watch", action="store_true", help="then show its progress live until it ends")
    p = verb("status", "a job's phase, workers, restarts and progress on the cluster", cmd_status)
    p.add_argument("-w", "--watch", action="store_true", help="live view until the job ends (exit 0 if it Succeeded)")
    p = verb("logs", "a worker's trainer log (through the API server)", cmd_logs)
    p.add_argument("--rank", type=int, default=0, metavar="R", help="worker R (<job>-worker-R; default 0)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="stream until the job ends, on to the rank's replacement pod when it is replaced")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    p.add_argument("--previous", action="store_true", help="the previous container's log (kubelet restarts)")
    p = verb("list", "the DDPJobs of a namespace", cmd_list, job=False)
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p = verb("delete", "delete a job (its pods, Services and claim go with it)", cmd_delete)
    p.add_argument("--wait", action="store_true", help="return once it is gone")
    verb("suspend", "stop a job's workers gracefully (checkpoint), keep the job and its claim", cmd_suspend)
    verb("resume", "start a suspended job again from its newest checkpoint", cmd_resume)
    p = verb("scale", "change spec.replicas within minReplicas..maxReplicas (the scale subresource)", cmd_scale)
    p.add_argument("--replicas", type=int, required=True, metavar="N")
