"""`ddpjob run FILE --local`: argument parsing and the exit status; the work is in runner.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import model, validation
from .runner import EXIT_FAILED, EXIT_INTERRUPTED, LocalRunner
from .options import COLD_CPU_NODE, COLD_STARTS, FaultInjection, RunOptions, SpecChange
from .view import make_view


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help="run a DDPJob on this machine with the operator's launch and restart semantics",
        description="Run every worker pod of the DDPJob as a local torchrun agent (plus the rendezvous "
                    "store), with the same command line, environment and restart decisions as the operator.")
    p.add_argument("file", metavar="FILE", help="manifest holding one DDPJob")
    p.add_argument("--local", action="store_true", required=True,
                   help="run here instead of on a cluster (the only mode; for a cluster use kubectl apply)")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="start with N workers instead of spec.replicas (within minReplicas..maxReplicas)")
    p.add_argument("--checkpoint-dir", type=Path, metavar="DIR",
                   help="local directory for the checkpoint volume, kept as is like an existing claim "
                        "(default: .ddpjob/<name>/checkpoints, emptied at start unless --resume)")
    p.add_argument("--resume", action="store_true",
                   help="keep the checkpoints of the previous run in the default directory and continue")
    p.add_argument("--logs", action="store_true", help="also print every worker log line, prefixed with its pod")
    p.add_argument("--cold-start", nargs="?", const=COLD_CPU_NODE, choices=COLD_STARTS, metavar="NODE",
                   help="start every worker and spare as its pod's container starts (a new `python -c <agent>` "
                        "interpreter with the pod's argv and env, nothing preloaded, no zygote), so that recovery "
                        f"times predict a cluster's; NODE: {COLD_CPU_NODE} (default: the agent forks its trainers, "
                        f"as on a node without GPUs) or {COLD_STARTS[1]} (each trainer a new interpreter, as on a "
                        "node with GPUs)")
    fault = p.add_argument_group("fault injection (demonstrates recovery)")
    fault.add_argument("--kill-worker", type=int, metavar="I", help="SIGKILL worker I (its whole process tree)")
    when = fault.add_mutually_exclusive_group()
    when.add_argument("--kill-after", type=float, metavar="SECONDS",
                      help="... this many seconds after the run started")
    when.add_argument("--kill-at-step", type=int, metavar="STEP",
                      help="... once the trainer reports this optimizer step")
    scale = p.add_argument_group("scaling during the run (like kubectl scale)")
    scale.add_argument("--scale-to", type=int, metavar="N",
                       help="set spec.replicas to N during the run (within minReplicas..maxReplicas)")
    scale.add_argument("--scale-at-step", type=int, metavar="STEP",
                       help="... once the trainer reports this optimizer step")
    p.set_defaults(func=cmd_run)


def _fault(args: argparse.Namespace, replicas: int) -> tuple[FaultInjection, ...]:
    timed = args.kill_after is not None or args.kill_at_step is not None
    if args.kill_worker is None:
        if timed:
            raise validation.InvalidJob([validation.FieldError(
                "--kill-after/--kill-at-step", "no worker to kill", "add --kill-worker I")])
        return ()
    if not timed:
        raise validation.InvalidJob([validation.FieldError(
            "--kill-worker", "needs a moment to strike", "add --kill-after SECONDS or --kill-at-step STEP")])
    if not 0 <= args.kill_worker < replicas:
        raise validation.InvalidJob([validation.FieldError(
            "--kill-worker", f"no worker {args.kill_worker} in a run of {replicas}", f"pick 0..{replicas - 1}")])
    return (FaultInjection(index=args.kill_worker, after_seconds=args.kill_after, at_step=args.kill_at_step),)


def _changes(args: argparse.Namespace, spec: model.DDPJobSpec) -> tuple[SpecChange, ...]:
    if (args.scale_to is None) != (args.scale_at_step is None):
        raise validation.InvalidJob([validation.FieldError(
            "--scale-to/--scale-at-step", "need each other", "give both: --scale-to N --scale-at-step STEP")])
    if args.scale_to is None:
        return ()
    # The API server's check, before the run starts rather than midway.
    validation.parse_spec({**spec.wire(), "replicas": args.scale_to}, prefix="--scale-to: spec")
    return (SpecChange(replicas=args.scale_to, at_step=args.scale_at_step),)


def _check_progress_source(args: argparse.Namespace, spec: model.DDPJobSpec) -> None:
    """A moment given as a training step needs the trainer's progress, which a local run reads from the
    checkpoint volume (progress.json) or rank 0's log lines: say now what would otherwise never fire."""
    given = [flag for flag, value in (("--kill-at-step", args.kill_at_step), ("--scale-at-step", args.scale_at_step))
             if value is not None]
    if given and spec.checkpoint is None:
        raise validation.InvalidJob([validation.FieldError(
            "/".join(given), "waits for a training step, but a job without spec.checkpoint has no progress "
            "report to read it from", "add spec.checkpoint (the trainer's job.report() writes progress.json "
            "there), or use --kill-after SECONDS")])
    if args.kill_at_step is not None:
        print(f"--kill-at-step {args.kill_at_step}: worker {args.kill_worker} is killed at the first step the trainer "
              f"reports at or past {args.kill_at_step} (job.report(step=...), the HF/Lightning callback, or rank 0's "
              f"`step=N epoch=E loss=L` lines); a trainer that reports nothing never triggers it", file=sys.stderr)


def load_one_job(path: str) -> model.DDPJob:
    """The single DDPJob in `path`; errors are worded exactly as `ddpjob validate` words them."""
    try:
        documents = list(validation.load_documents(path))
    except validation.InvalidJob as exc:
        raise validation.InvalidJob([validation.FieldError(path, str(e)) for e in exc.errors]) from None
    jobs, errors = [], []
    for doc in documents:
        try:
            jobs.append(validation.parse_job(doc.body))
        except validation.InvalidJob as exc:
            errors += [validation.FieldError(doc.label, str(e)) for e in exc.errors]
    if errors:
        raise validation.InvalidJob(errors)
    if len(jobs) != 1:
        raise validation.InvalidJob([validation.FieldError(
            path, f"holds {len(jobs)} DDPJobs", "put the one to run in a file of its own")])
    return jobs[0]


def with_replicas(job: model.DDPJob, replicas: int | None) -> model.DDPJob:
    """`--replicas` is a local `kubectl scale`: any count within the job's elastic bounds."""
    spec = job.spec
    if replicas is None or replicas == spec.replicas:
        return job
    if not spec.min_nodes <= replicas <= spec.max_nodes:
        raise validation.InvalidJob([validation.FieldError(
            "--replicas", f"must be within minReplicas..maxReplicas ({spec.min_nodes}..{spec.max_nodes}), "
            f"got {replicas}", f"pick a count in {spec.min_nodes}..{spec.max_nodes} or widen the bounds in the manifest")])
    # min/max default to replicas: pin them so scaling the start size does not move the bounds.
    scaled = spec.model_copy(update={"replicas": replicas, "min_replicas": spec.min_nodes,
                                     "max_replicas": spec.max_nodes})
    return job.model_copy(update={"spec": scaled})


def cmd_run(args: argparse.Namespace) -> int:
    try:
        job = with_replicas(load_one_job(args.file), args.replicas)
        _check_progress_source(args, job.spec)
        options = RunOptions(checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                             print_logs=args.logs, faults=_fault(args, job.spec.replicas),
                             changes=_changes(args, job.spec), cold_start=args.cold_start)
        runner = LocalRunner(job, options, make_view())
        phase = runner.run()  # InvalidJob before anything starts: its directories are another run's, or planted
    except validation.InvalidJob as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return validation.EXIT_INVALID
    if runner.interrupted:
        return EXIT_INTERRUPTED
    return 0 if phase == "Succeeded" else EXIT_FAILED
