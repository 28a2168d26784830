"""The progress endpoint: trainers POST their progress here; the operator shows it in the status and
detects hangs (decisions/progress.py).

    POST /v1/namespaces/<namespace>/ddpjobs/<job>/progress
    Authorization: Bearer <the pod's projected service-account token, audience DDPJOB_OPERATOR_PROGRESS_AUDIENCE>
    {"step": 120, "total_steps": 1000, "loss": 0.42, "epoch": 1, "samples_per_second": 812.0, ...}

Authentication: the token is checked with the TokenReview API (authentication.k8s.io/v1, the only
permission this needs) against the operator's own audience, which the answer's `audiences` must list,
so a token meant for the API server, or for anything else, is refused, and a progress token is useless
against the API server. Results are cached for a minute (by the token's SHA-256), so a pod reporting
every few seconds costs one review a minute. Made-up tokens cannot starve real workers: refusals are
cached apart, unknown tokens are limited per peer address and by a budget of their own, and re-reviews
of tokens once valid have another. Authorization: the review names the pod the token is bound to
(user.extra authentication.kubernetes.io/pod-name and pod-uid); that exact pod (name and uid) must be a
worker of the job in the URL, in the operator's pod index, which holds only pods the job controls
(ownerReference). Training pods therefore need no RBAC, and a pod can only write its own job's
progress. The report is attributed to the pod's replica index and generation (its labels), never to
what the body claims.

A worker's agent asks `GET .../<job>/generation` for the generation the operator carried its pod into (200
{"generation", "nnodes", "rdzvId"}, 204 none to tell: pods.generation_in), a warm spare `GET .../<job>/assignment`
for the place it takes (pods.assignment_in); both with the same token.

Answers: 204 accepted; 400 malformed or too deeply nested JSON; 401 no or invalid token (counted); 403
a token of a pod that is not a worker of this job (counted); 404 unknown path; 408 body too slow; 413
body over 4 KiB; 422 invalid fields; 429 over the per-pod rate or a review budget; 503 this replica is
a standby, or the review failed (the client retries at once: another connection reaches another
replica). Reports the operator could not take are recorded for the job (the stall clock holds for
them), but only those a worker of the job could have sent: a spent re-review budget (429) for a token
once valid for a pod that is still the job's worker, a failed review (503), 500. Unknown tokens held back
by a budget are not: anyone can send those, and they would keep a hung job from ever stalling. Headers
must arrive within HEADER_SECONDS and at most MAX_CONNECTIONS are open. Nothing a client sends can raise
out of the handler.

Status writes are bounded: the tracker publishes a job's progress at most every
DDPJOB_OPERATOR_PROGRESS_WRITE_SECONDS (default 5), and publishing only triggers the job's ordinary
reconcile, which merges `status.progress` into its one status patch (accounting writes are untouched:
they go on record first, as always). 100 running jobs cost at most 20 status writes a second.

The package, one concern a module: reports.py (a body -> Report), auth.py (TokenReview, its caches and the
token buckets), pods.py (the pod index lookups: which worker a token's pod is), tracker.py (ProgressTracker:
reports -> the decision layer's ProgressObservation; the local runner uses it too), collector.py (its
Prometheus gauges), tls.py (the reloaded certificate), server.py (the aiohttp endpoint). Modules import
their siblings, never this package's names, so this file only gathers what the rest of the operator uses.
"""

from .auth import (DEFAULT_AUDIENCE, POD_NAME_KEY, POD_UID_KEY, SOURCE_REVIEW_BURST, TOKEN_CACHE_SECONDS,
                   Identity, RateLimited, TokenBucket, TokenReviewer, Unauthenticated)
from .collector import TrackerCollector
from .pods import Worker, assignment_in, attributed_generation, find_worker_in, generation_in, served_generation
from .reports import MAX_STEP, BadReport, Recovery, Report, parse_report, report_from
from .server import BURST_PER_POD, MAX_BODY_BYTES, RATE_PER_POD, RESULTS, ProgressServer
from .tls import ServerCertificate
from .tracker import RANK0_CLAIM_SECONDS, RATE_WINDOW_SECONDS, JobProgress, ProgressTracker

__all__ = ["BURST_PER_POD", "DEFAULT_AUDIENCE", "MAX_BODY_BYTES", "MAX_STEP", "POD_NAME_KEY", "POD_UID_KEY",
           "RANK0_CLAIM_SECONDS", "RATE_PER_POD", "RATE_WINDOW_SECONDS", "RESULTS", "SOURCE_REVIEW_BURST",
           "TOKEN_CACHE_SECONDS", "BadReport", "Identity", "JobProgress", "ProgressServer", "ProgressTracker",
           "RateLimited", "Recovery", "Report", "ServerCertificate", "TokenBucket", "TokenReviewer",
           "TrackerCollector", "Unauthenticated", "Worker", "assignment_in", "attributed_generation",
           "find_worker_in", "generation_in", "parse_report", "report_from", "served_generation"]
