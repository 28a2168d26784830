"""`ddpjob`: validate, render and run DDPJob manifests; print the CRD.

User mistakes end with a message and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from . import crd, render_cli, validation

EXIT_INVALID = validation.EXIT_INVALID


def cmd_validate(args: argparse.Namespace) -> int:
    failed = valid = 0
    for path in args.files:
        documents = 0
        try:
            for doc in validation.load_documents(path):
                documents += 1
                try:
                    job = validation.parse_job(doc.body)
                except validation.InvalidJob as exc:
                    failed += 1
                    for error in exc.errors:
                        print(f"{doc.label}: {error}", file=sys.stderr)
                else:
                    valid += 1
                    print(f"{doc.label}: valid DDPJob {job.metadata.name}")
                    for warning in validation.warnings(job):  # valid, so the exit status stays 0
                        print(f"{doc.label}: warning: {warning}", file=sys.stderr)
        except validation.InvalidJob as exc:
            failed += 1
            for error in exc.errors:
                print(f"{path}: {error}", file=sys.stderr)
            continue
        if documents == 0:
            failed += 1
            print(f"{path}: no DDPJob in file. Fix: add a DDPJob manifest", file=sys.stderr)
    if valid:
        # No API server was asked: its admission (quotas, policies, the classes a cluster has) may still refuse.
        print("note: checked offline against ddpjob's copy of the API server's rules (no server asked); "
              "`ddpjob submit` has the API server dry-run the job before creating it")
    return EXIT_INVALID if failed else 0


def cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(crd.render_crd_yaml())
    return 0


# Commands that read manifests only: their parser leaves out the other commands' modules, which import kopf,
# kubernetes and aiohttp (about 0.9 s of CPU, half of what validating a large manifest may take).
OFFLINE_COMMANDS = ("validate", "render", "crd")


def build_parser(*, offline_only: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddpjob", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check DDPJob manifests; print each error with its field and fix")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("crd", help="print the DDPJob CustomResourceDefinition generated from the model")
    p.set_defaults(func=cmd_crd)

    # Subcommands from other modules register themselves here, one line each.
    render_cli.register(sub)
    if not offline_only:
        from . import cluster_cli, local, permissions

        permissions.add_subcommand(sub)
        local.register(sub)
        cluster_cli.register(sub)  # submit, status, logs, list, delete, suspend, resume, scale
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(offline_only=bool(argv) and argv[0] in OFFLINE_COMMANDS).parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
