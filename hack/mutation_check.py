#!/usr/bin/env python3
"""Hand-written mutation check: do the tests fail when the behaviour they guard is broken?

Each mutant below breaks one behaviour on purpose (an exact snippet of the source replaced by a mutated
one), and names the pytest selection that should notice. The script applies one mutant at a time in the
tree it runs in, runs that selection (with -x and a timeout), restores the file (always), and prints a
table: mutant, killed or survived, and the first test that failed.

It refuses to run when a mutant's snippet is not found exactly once in its file, so the table stays
honest as the code changes: fix the snippet (or the mutant) instead of letting it pass silently. Before
the mutants, each distinct selection is run once unmutated (skip with --no-baseline): a selection that
fails without a mutant would "kill" everything.

    python hack/mutation_check.py                      # every mutant, in the repository this file is in
    python hack/mutation_check.py --repo /tmp/clone    # in another checkout (never mutate a shared one)
    python hack/mutation_check.py --only leader- --only progress-audience   # names starting with these
    python hack/mutation_check.py --list               # the table of mutants, nothing run

Run it in a checkout nobody else is using: the source files are edited in place while a mutant runs.
Imports resolve to --repo (PYTHONPATH=<repo>/operator:<repo>/trainer-image), bytecode is not written
(a mutated .pyc could otherwise outlive its mutant). Exit status: 0 when every mutant was killed, 1 when
one survived, 2 on a refusal (snippet not found exactly once, a baseline selection failing, a bad name).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    original: str  # exactly once in the file
    mutated: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions
    breaks: str  # the behaviour the mutant breaks, in one line
    also: tuple[tuple[str, str], ...] = ()  # further (original, mutated) edits of the same file, each exactly once

    @property
    def edits(self) -> tuple[tuple[str, str], ...]:
        return ((self.original, self.mutated), *self.also)


LEADER = "operator/ddpjob_operator/leader.py"
PROGRESS = "operator/ddpjob_operator/progress/"  # + the module: auth.py, pods.py, reports.py, server.py, tracker.py
ACCOUNTING = "operator/ddpjob_operator/decisions/accounting.py"
COMPLETION = "operator/ddpjob_operator/decisions/completion.py"
STALLS = "operator/ddpjob_operator/decisions/progress.py"
OBSERVATIONS = "operator/ddpjob_operator/observations.py"
RBAC = "charts/ddpjob-operator/templates/rbac.yaml"

# The end of the progress ClusterRoleBinding (the template's last lines).
_BINDING_SUBJECTS = ("  name: {{ $fullname }}-progress\nsubjects:\n  - kind: ServiceAccount\n"
                     "    name: {{ $serviceAccount }}\n    namespace: {{ $releaseNamespace }}\n")

T = "tests/operator/"
LEADER_UNITS = (T + "test_leader.py", "-k", "decide or fenced or old_holder or lease_body or release_empties")

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------ leader election
    Mutant("leader-never-fenced", LEADER,
           "return renewed_at is None or now >= renewed_at + timing.renew_deadline",
           "return renewed_at is None",
           LEADER_UNITS, "a holder that renewed once is never fenced, however long ago"),
    Mutant("leader-fence-boundary", LEADER,
           "return renewed_at is None or now >= renewed_at + timing.renew_deadline",
           "return renewed_at is None or now > renewed_at + timing.renew_deadline",
           LEADER_UNITS, "the holder may still act at exactly renewDeadline (>= turned into >)"),
    Mutant("leader-takeover-early", LEADER,
           "    if now >= expires_at:\n        return Action(Verb.TAKE_OVER)",
           "    if now >= expires_at - timing.retry_period:\n        return Action(Verb.TAKE_OVER)",
           LEADER_UNITS, "a standby takes over a live Lease one retry period before it expires"),
    Mutant("leader-ignore-lease-duration", LEADER,
           "expires_at = observed_at + (lease.duration if lease.duration > 0 else timing.lease_duration)",
           "expires_at = observed_at + timing.lease_duration",
           LEADER_UNITS, "the holder's own leaseDurationSeconds is ignored (a longer Lease taken over early)"),
    Mutant("leader-never-take-expired", LEADER,
           "    if now >= expires_at:\n        return Action(Verb.TAKE_OVER)",
           "    if False:\n        return Action(Verb.TAKE_OVER)",
           LEADER_UNITS, "an expired Lease is never taken over (a SIGKILLed leader is never replaced)"),
    Mutant("leader-released-not-taken", LEADER,
           "    if not lease.holder:\n        return Action(Verb.TAKE_OVER)\n",
           "",
           LEADER_UNITS, "a released Lease (empty holder) is waited out instead of taken at once"),
    Mutant("leader-fenced-client-writes", LEADER,
           'if method != "GET" and not self.elector.leading():',
           'if method == "POST" and not self.elector.leading():',
           (T + "test_leader.py::test_fenced_client_sends_no_write_once_the_renew_deadline_passed",),
           "a fenced replica still sends deletes and status patches (only creates are refused)"),
    Mutant("leader-409-keeps-leading", LEADER,
           "                self._lease = None\n                self._renewed_at = None\n",
           "                self._lease = None\n",
           (T + "test_leader.py", "-k", "refused_renewal or leads_again or racing"),
           "a renewal refused with 409 (someone else took the Lease) leaves the replica acting until its deadline"),

    # ------------------------------------------------------------ the progress endpoint
    Mutant("progress-empty-audiences", PROGRESS + "auth.py",
           'if self.audience not in (status.get("audiences") or []):',
           'if status.get("audiences") and self.audience not in status["audiences"]:',
           (T + "test_progress_auth.py",
            T + "test_progress_hardening.py::test_an_empty_audiences_list_is_the_api_servers_not_ours"),
           "a TokenReview with an empty audiences list (the API server's own) is accepted"),
    Mutant("progress-no-token-cache", PROGRESS + "auth.py",
           "        if valid is not None and valid[0] > now:\n            return valid[1]\n",
           "",
           (T + "test_progress.py::test_progress_appears_and_advances",),
           "a valid token is reviewed again on every report (no positive cache)"),
    Mutant("progress-no-negative-cache", PROGRESS + "auth.py",
           "        if refused is not None and refused[0] > now:\n            raise Unauthenticated(refused[1])\n",
           "",
           (T + "test_progress_auth.py",
            T + "test_progress_hardening.py::test_review_rate_limit_failed_review_and_negative_cache"),
           "a refused token is reviewed again on every request (no negative cache)"),
    Mutant("progress-pod-uid-unchecked", PROGRESS + "pods.py",
           "if pod.name == identity.pod_name and pod.uid == identity.pod_uid and uid and pod.controller_uid == uid:",
           "if pod.name == identity.pod_name and uid and pod.controller_uid == uid:",
           (T + "test_progress_pods.py", T + "test_ownership.py",
            T + "test_progress_hardening.py::test_a_token_of_a_replaced_pod_of_the_same_name_is_refused"),
           "the token of a replaced pod of the same name is accepted (pod uid not compared)"),
    Mutant("progress-lookup-not-owned", PROGRESS + "pods.py",
           "if pod.name == identity.pod_name and pod.uid == identity.pod_uid and uid and pod.controller_uid == uid:",
           "if pod.name == identity.pod_name and pod.uid == identity.pod_uid and uid:",
           (T + "test_ownership.py",),
           "the progress lookup takes a pod the job does not control (labels copied onto a pod of one's own)"),
    Mutant("progress-rank0-claim-taken", PROGRESS + "tracker.py",
           "        elif report.rank == 0:\n"
           "            report = dataclasses.replace(report, rank=None)\n",
           "",
           (T + "test_progress_tracker.py",
            T + "test_progress_hardening.py::test_a_rank_claim_is_attributed_to_the_pod_its_token_names"),
           "a worker claiming rank 0 (another pod holds it) sets the job's loss and values"),
    Mutant("progress-rank-from-body", PROGRESS + "server.py",
           "self.tracker.record(worker.uid, (namespace, name), worker.index, attributed_generation(worker, report),",
           "self.tracker.record(worker.uid, (namespace, name), report.rank if report.rank is not None else "
           "worker.index, attributed_generation(worker, report),",
           (T + "test_progress_tracker.py",
            T + "test_progress_hardening.py::test_a_rank_claim_is_attributed_to_the_pod_its_token_names"),
           "a report is attributed to the rank its body claims, not to the pod its token names"),
    Mutant("progress-no-source-limit", PROGRESS + "auth.py",
           "            elif not self._sources.allow(source):\n"
           '                raise RateLimited("too many unknown tokens from this address; try again later")\n',
           "",
           (T + "test_stall_refusals.py",
            T + "test_progress_hardening.py::test_review_rate_limit_failed_review_and_negative_cache"),
           "one address may spend the whole budget of unknown-token reviews (no per-source limit)"),
    Mutant("progress-no-per-pod-rate", PROGRESS + "server.py",
           "        if not self.limiter.allow(identity.pod_uid):\n",
           "        if False:\n",
           (T + "test_progress.py::test_rate_limit_and_bounded_status_writes",),
           "a pod may report without limit (no per-pod rate limit, no 429)"),
    Mutant("progress-huge-step", PROGRESS + "reports.py",
           "or not 0 <= step <= MAX_STEP:",
           "or not 0 <= step:",
           (T + "test_progress_reports.py",
            T + "test_progress_hardening.py::test_deep_json_huge_steps_and_slow_bodies_are_refused_cleanly"),
           "a step beyond MAX_STEP is accepted (it would freeze the stall clock)"),
    Mutant("progress-nan-accepted", PROGRESS + "reports.py",
           "or not isinstance(value, (int, float)) or not math.isfinite(value):",
           "or not isinstance(value, (int, float)):",
           (T + "test_progress_reports.py",),
           "NaN and infinite loss / samples_per_second / step_seconds are accepted"),
    Mutant("progress-made-up-tokens-hold-stall", PROGRESS + "server.py",
           "            if who is not None and who.namespace == namespace and self.find_worker(namespace, name, who) "
           "is not None:\n                self._refused(request)\n",
           "            self._refused(request)\n",
           (T + "test_stall_refusals.py",),
           "any rate-limited report (made-up tokens included) holds the job's stall clock"),

    # ------------------------------------------------------------ the decision layer
    Mutant("decisions-incident-charged-twice", ACCOUNTING,
           "        if ended and w.attempt == rank.restarts:\n",
           "        if ended:\n",
           (T + "test_incidents.py", T + "test_decisions.py"),
           "an exit already accounted for is charged again on the next pass"),
    Mutant("decisions-charge-per-member", ACCOUNTING,
           "        status.restarts += 1\n",
           "        status.restarts += len(members)\n",
           (T + "test_incidents.py", T + "test_decisions.py"),
           "a retryable incident of several workers is charged once per worker"),
    Mutant("decisions-disruption-charged", ACCOUNTING,
           "    if disruption:\n        return DISRUPTION\n",
           "",
           (T + "test_decisions.py", T + "test_incidents.py"),
           "a disrupted worker (eviction, preemption: DisruptionTarget) is charged as a retryable failure"),
    Mutant("store-disruption-target-ignored", OBSERVATIONS,
           'disruption_condition = conditions.get("DisruptionTarget", {}).get("status") == "True"',
           "disruption_condition = False",
           (T + "test_observations.py", T + "test_scenarios.py::test_disruption_is_uncharged_and_the_job_comes_back"),
           "a pod's DisruptionTarget condition is ignored (only its reason or deletion tells a disruption)"),
    Mutant("decisions-user-error-retried", ACCOUNTING,
           "    return PERMANENT  # 1-127: the user's program said no",
           "    return RETRYABLE  # 1-127: the user's program said no",
           (T + "test_decisions.py", T + "test_incidents.py"),
           "a user error (exit 1-127) is retried within the budget instead of failing the job"),
    Mutant("decisions-budget-one-early", ACCOUNTING,
           "budget_spent = charged and status.restarts + 1 > policy.max_restarts",
           "budget_spent = charged and status.restarts + 1 >= policy.max_restarts",
           (T + "test_decisions.py", T + "test_incidents.py"),
           "the restart budget is spent one restart early (maxRestarts=N allows N-1)"),
    Mutant("decisions-budget-one-late", ACCOUNTING,
           "budget_spent = charged and status.restarts + 1 > policy.max_restarts",
           "budget_spent = charged and status.restarts > policy.max_restarts",
           (T + "test_decisions.py", T + "test_incidents.py"),
           "the restart budget allows one restart more than maxRestarts"),
    Mutant("decisions-stall-budget-one-early", STALLS,
           "budget_spent = status.restarts + 1 > policy.max_restarts",
           "budget_spent = status.restarts + 1 >= policy.max_restarts",
           (T + "test_progress_decisions.py",),
           "a stall is not restarted with the budget's last restart (maxRestarts=N allows N-1)"),
    Mutant("decisions-stall-budget-one-late", STALLS,
           "budget_spent = status.restarts + 1 > policy.max_restarts",
           "budget_spent = status.restarts > policy.max_restarts",
           (T + "test_progress_decisions.py",),
           "a stall is charged one restart beyond maxRestarts"),
    Mutant("decisions-hang-not-stalled", ACCOUNTING,
           "            if cause == PEER_FAILURE and stalled(plan, spec):\n                return True\n",
           "",
           (T + "test_hang_is_one_stall_incident.py", T + "test_incidents.py"),
           "a hang past the progress deadline is told as a Retryable timeout, not as Stalled (two stories)"),
    Mutant("decisions-refusals-dont-hold-stall", STALLS,
           "        expires = max(expires, p.last_refused + timedelta(seconds=deadline))\n",
           "        pass\n",
           (T + "test_stall_refusals.py", T + "test_progress_decisions.py"),
           "a stall is charged while the operator itself refuses (cannot review) the job's reports"),
    Mutant("decisions-success-keeps-workers", COMPLETION,
           '        cleanup(plan, "All" if spec.run_policy.clean_pod_policy == "All" else "Running")\n'
           "        return True\n",
           "        return True\n",
           (T + "test_decisions.py", T + "test_incidents.py"),
           "success does not stop the workers still running"),
    Mutant("decisions-survivor-charged-again", ACCOUNTING,
           "        if ended and w.attempt == rank.restarts and _left_behind(plan, w):\n",
           "        if ended and w.attempt == rank.restarts and False:\n",
           (T + "test_incidents.py", T + "test_decisions.py", T + "test_in_place.py"),
           "a survivor that died with the incident that carried it is charged as a new incident"),
    Mutant("store-not-owned-counted", OBSERVATIONS,
           "        if job_uid is not None and pod.controller_uid != job_uid:\n            continue\n",
           "",
           (T + "test_ownership.py",),
           "pods the job does not control (labels copied) are observed, counted and charged"),

    # ------------------------------------------------------------ the chart
    Mutant("chart-progress-rbac-always", RBAC,
           "{{- if .Values.progress.enabled }}",
           "{{- if true }}",
           ("tests/chart/test_rbac.py",),
           "the progress ClusterRole and ClusterRoleBinding are rendered with progress disabled"),
    Mutant("chart-progress-binding-leaks", RBAC,
           "  {{- include \"ddpjob-operator.progressRules\" . | nindent 2 }}\n---\n",
           "  {{- include \"ddpjob-operator.progressRules\" . | nindent 2 }}\n{{- end }}\n---\n",
           ("tests/chart/test_rbac.py",),
           "the progress ClusterRoleBinding alone is rendered with progress disabled (the role is not)",
           # the `end` moved up above: the one that closed the binding goes
           also=((_BINDING_SUBJECTS + "{{- end }}\n", _BINDING_SUBJECTS),)),
)


def _check(repo: Path, mutants: list[Mutant]) -> list[str]:
    problems = []
    for mutant in mutants:
        path = repo / mutant.file
        if not path.is_file():
            problems.append(f"{mutant.name}: {mutant.file} does not exist")
            continue
        text = path.read_text()
        for original, _ in mutant.edits:
            count = text.count(original)
            if count != 1:
                problems.append(f"{mutant.name}: snippet found {count} times in {mutant.file} (must be exactly "
                                f"once): {original.strip()[:90]!r}")
    return problems


FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)  # -ra's summary: the node id


def _env(repo: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(repo / "operator"), str(repo / "trainer-image")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _pytest(repo: Path, python: str, tests: tuple[str, ...], timeout: float) -> tuple[str, str, float]:
    """(outcome, detail, seconds): outcome passed | failed | timeout | error."""
    command = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra", *tests]
    began = time.monotonic()
    process = subprocess.Popen(command, cwd=repo, env=_env(repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # pytest and whatever it started (operator replicas)
        process.communicate()
        return "timeout", f"no result within {timeout:g}s", time.monotonic() - began
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    seconds = time.monotonic() - began
    if process.returncode == 0:
        return "passed", "", seconds
    failed = FAILED_LINE.search(output)
    if process.returncode == 1 and failed:
        return "failed", failed.group(1), seconds
    tail = " | ".join(line for line in output.strip().splitlines()[-3:])
    return "error", f"pytest exit {process.returncode}: {tail[-300:]}", seconds


def _run_mutant(repo: Path, python: str, mutant: Mutant, timeout: float) -> tuple[str, str, float]:
    path = repo / mutant.file
    original = path.read_bytes()
    try:
        text = original.decode()
        for before, after in mutant.edits:
            text = text.replace(before, after, 1)
        path.write_text(text)
        outcome, detail, seconds = _pytest(repo, python, mutant.tests, timeout)
    finally:
        path.write_bytes(original)
    verdict = {"failed": "killed", "timeout": "killed (timeout)", "passed": "SURVIVED", "error": "error"}[outcome]
    return verdict, detail, seconds


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the finally that restores the file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout to mutate (default: %(default)s)")
    parser.add_argument("--only", action="append", default=[], metavar="PREFIX",
                        help="run the mutants whose name starts with PREFIX (repeatable)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per selection (default %(default)s)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest")
    parser.add_argument("--no-baseline", action="store_true", help="do not run the selections unmutated first")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()

    mutants = [m for m in MUTANTS if not args.only or any(m.name.startswith(p) for p in args.only)]
    if not mutants:
        print(f"no mutant's name starts with {args.only}", file=sys.stderr)
        return 2
    if len({m.name for m in MUTANTS}) != len(MUTANTS):
        print("two mutants share a name", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(f"{m.name:38} {m.file}\n{'':38} breaks: {m.breaks}\n{'':38} tests: {' '.join(m.tests)}")
        return 0
    problems = _check(repo, mutants)
    if problems:
        print("refusing to run: the mutants no longer match the code\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)

    if not args.no_baseline:
        for tests in dict.fromkeys(m.tests for m in mutants):
            outcome, detail, seconds = _pytest(repo, args.python, tests, args.timeout)
            print(f"baseline {' '.join(tests)}: {outcome} ({seconds:.0f}s) {detail}", flush=True)
            if outcome != "passed":
                print("refusing to run: a selection fails without any mutant", file=sys.stderr)
                return 2

    results = []
    for mutant in mutants:
        verdict, detail, seconds = _run_mutant(repo, args.python, mutant, args.timeout)
        results.append((mutant, verdict, detail, seconds))
        print(f"{mutant.name}: {verdict} ({seconds:.0f}s) {detail}", flush=True)

    print()
    width = max(len(m.name) for m, *_ in results)
    print(f"{'mutant':{width}}  {'result':16}  {'seconds':>7}  killed by / breaks")
    for mutant, verdict, detail, seconds in results:
        print(f"{mutant.name:{width}}  {verdict:16}  {seconds:7.0f}  {detail or mutant.breaks}")
    not_killed = [m.name for m, verdict, *_ in results if not verdict.startswith("killed")]
    print(f"\n{len(results) - len(not_killed)} of {len(results)} killed" +
          (f"; not killed: {', '.join(not_killed)}" if not_killed else ""))
    return 1 if not_killed else 0


if __name__ == "__main__":
    sys.exit(main())
