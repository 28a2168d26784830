"""`ddpjob render FILE`: print every object the operator would create for a DDPJob (as YAML).

A preview for review and debugging: PodGroup, the agent's ConfigMap, Services, checkpoint claim, rendezvous
store pod and the worker pods of generation 0, exactly as the operator's job_manifests.py builds them, the progress
token volume and DDPJOB_PROGRESS_* variables included (the chart turns the progress endpoint on by default). What only
exists at run time is a placeholder: the job's uid is a stable stand-in (override it with --uid), the
progress URL's base is `<progress-url>` unless --progress-url gives the operator's, DDPJOB_PROGRESS_CA is
"" (plain HTTP) unless --progress-ca gives the CA file of an HTTPS endpoint (the chart's `progress.tls`:
its Secret's `ca.crt`), and `$(DDPJOB_POD_IP)` is expanded by Kubernetes in the pod.
"""

from __future__ import annotations

import argparse
import sys

from . import job_manifests, kubeyaml, model, naming, object_names, validation
from .settings import Settings

# Where the operator's progress Service is, known to the operator (its settings), not to the manifest.
PROGRESS_URL_PLACEHOLDER = "<progress-url>"
# Every job renders about 50 KB (the agent's files in its ConfigMap), 70 times a minimal job's manifest: a 3 MiB file
# of 5,800 jobs would print 300 MB. A preview of this many is answered within 2 s of CPU (issue 38, item 15).
MAX_RENDERED_JOBS = 64


def cmd_render(args: argparse.Namespace) -> int:
    try:
        jobs = validation.load_jobs(args.file)
    except validation.InvalidJob as exc:
        for error in exc.errors:
            print(f"{args.file}: {error}", file=sys.stderr)
        return validation.EXIT_INVALID
    if len(jobs) > MAX_RENDERED_JOBS:
        print(f"{args.file}: holds {len(jobs)} DDPJobs; render prints every object of each (about 50 KB a job, the "
              f"agent's files included). Fix: render at most {MAX_RENDERED_JOBS} at a time (split the file); "
              "`ddpjob validate` checks any number", file=sys.stderr)
        return validation.EXIT_INVALID
    if args.namespace is not None:
        try:
            object_names.check(args.namespace, object_names.NAMESPACE, "--namespace")
        except object_names.InvalidName:
            print(f"--namespace {args.namespace!r} is not a namespace the API server accepts. "
                  f"Fix: {object_names.NAMESPACE.fix()}", file=sys.stderr)
            return validation.EXIT_INVALID
    ca = ""
    if args.progress_ca:
        try:  # as the operator reads its DDPJOB_OPERATOR_PROGRESS_CA_FILE (progress_router.read_ca)
            with open(args.progress_ca, encoding="ascii") as f:
                ca = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"--progress-ca {args.progress_ca}: cannot read the CA: {exc}. Fix: give the PEM file of the "
                  "endpoint's CA (the chart's progress.tls Secret, key ca.crt)", file=sys.stderr)
            return validation.EXIT_INVALID
    progress = None if args.no_progress else job_manifests.ProgressEndpoint(args.progress_url, args.progress_audience,
                                                                        ca)
    manifests, failed = [], False
    for job in jobs:
        # As kubectl: the manifest's namespace, unless -n names another (an error), else -n, else default.
        namespace = job.metadata.namespace or args.namespace or "default"
        if args.namespace and job.metadata.namespace and args.namespace != job.metadata.namespace:
            print(f"{args.file}: metadata.namespace: {job.metadata.name} is in namespace {job.metadata.namespace}, not "
                  f"{args.namespace} (kubectl refuses the mismatch too). Fix: pass -n {job.metadata.namespace} or "
                  "remove metadata.namespace", file=sys.stderr)
            failed = True
            continue
        pod_spec = job.spec.template.pod_spec
        longest = model.worker_fqdn_length(job.metadata.name, namespace, job.spec.max_nodes)
        if pod_spec is not None and pod_spec.set_hostname_as_fqdn and longest > model.MAX_FQDN_LENGTH:
            # The model checks the shortest namespace; the real one is known here.
            print(f"{args.file}: metadata.name: with setHostnameAsFQDN the FQDN of worker {job.spec.max_nodes - 1} "
                  f"in namespace {namespace} has {longest} characters (at most {model.MAX_FQDN_LENGTH}). "
                  f"Fix: shorten metadata.name or remove spec.template.podSpec.setHostnameAsFQDN", file=sys.stderr)
            failed = True
            continue
        ref = naming.JobRef.preview(job.metadata.name, namespace)
        if args.uid:
            ref = naming.JobRef(ref.name, ref.namespace, args.uid)
        manifests += job_manifests.all_manifests(ref, job.spec, progress=progress)
    if failed:
        return validation.EXIT_INVALID
    # Quoted wherever kubectl would read a string as something else (`y`, `1e1`, `0o17`).
    sys.stdout.write(kubeyaml.dump_all(manifests, sort_keys=False, width=120))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("render", help="print the Services, store pod and worker pods the operator "
                                             "would create for a DDPJob")
    p.add_argument("file", metavar="FILE", help="manifest with one or more DDPJobs")
    p.add_argument("--namespace", "-n", help="namespace to render into (default: the manifest's metadata.namespace, "
                                               "else default)")
    p.add_argument("--uid", help="job uid to use instead of the stable stand-in (it appears in --rdzv-id)")
    p.add_argument("--progress-url", default=PROGRESS_URL_PLACEHOLDER,
                   help="the operator's progress endpoint base URL (its DDPJOB_OPERATOR_PROGRESS_URL; default: "
                        f"the placeholder {PROGRESS_URL_PLACEHOLDER})")
    p.add_argument("--progress-audience", default=Settings().progress_audience,
                   help="audience of the workers' progress token (default: %(default)s)")
    off = p.add_mutually_exclusive_group()
    off.add_argument("--no-progress", action="store_true",
                     help="render as an operator without the progress endpoint (no token volume, DDPJOB_PROGRESS_* "
                          "empty)")
    off.add_argument("--progress-ca", metavar="FILE",
                     help="the PEM of the CA the HTTPS progress endpoint's certificate chains to (the operator's "
                          "DDPJOB_OPERATOR_PROGRESS_CA_FILE: ca.crt of the chart's progress.tls Secret); workers get "
                          "it as DDPJOB_PROGRESS_CA")
    p.set_defaults(func=cmd_render)
