"""`ddpjob render FILE`: print every object the operator would create for a DDPJob (as YAML).

A preview for review and debugging: Services, checkpoint claim, rendezvous store pod and the
worker pods of generation 0, exactly as the operator's builders produce them. The job's uid is
assigned by the API server, so a stable stand-in is used (override it with --uid).
"""

from __future__ import annotations

import argparse
import sys

import yaml

from . import builders, validation


def cmd_render(args: argparse.Namespace) -> int:
    try:
        jobs = validation.load_jobs(args.file)
    except validation.InvalidJob as exc:
        for error in exc.errors:
            print(f"{args.file}: {error}", file=sys.stderr)
        return validation.EXIT_INVALID
    manifests = []
    for job in jobs:
        ref = builders.JobRef.preview(job.metadata.name, args.namespace)
        if args.uid:
            ref = builders.JobRef(ref.name, ref.namespace, args.uid)
        manifests += builders.all_manifests(ref, job.spec)
    sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False, width=120))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("render", help="print the Services, store pod and worker pods the operator "
                                             "would create for a DDPJob")
    p.add_argument("file", metavar="FILE", help="manifest with one or more DDPJobs")
    p.add_argument("--namespace", "-n", default="default", help="namespace to render into (default: default)")
    p.add_argument("--uid", help="job uid to use instead of the stable stand-in (it appears in --rdzv-id)")
    p.set_defaults(func=cmd_render)
