"""Every Kubernetes API permission the operator needs: the one list RBAC is generated from.

The Helm chart's ClusterRole (cluster-wide mode) and per-namespace Roles (`watchNamespaces`
mode) are rendered from `charts/ddpjob-operator/files/rbac-rules.yaml` (its `jobs` rules), which
is generated from `PERMISSIONS` (`ddpjob rbac-rules`, `make chart-files`); tests prove the chart
grants all of it and nothing broader, and that the operator's recorded API calls stay within it.
Leader election needs `LEADER_ELECTION_PERMISSIONS` (the file's `leaderElection` rules) only in the
operator's own namespace, where its Lease lives: the chart grants them with a Role there, never
cluster-wide.

Verbs the code does not call are not granted; when the operator starts calling one (a `get`, a
patch of the job), add it here: tests/operator records every call against the API emulator and
fails on one outside this list.

What kopf 1.45 itself calls, with peering off and `settings.scanning.disabled = True`: list and
watch of the resources it handles or indexes, create of core v1 Events (handler problems), and,
only for change handlers (on.create/update/delete, which this operator does not use), patches of
the handled object. API discovery (`/api`, `/apis`) is a non-resource URL every authenticated
user may read. Scanning must stay disabled (settings.configure_kopf): otherwise kopf also
lists/watches `customresourcedefinitions` cluster-wide and, in namespaced mode, `namespaces`,
which this list deliberately does not grant.
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

import yaml

from . import model


class Permission(NamedTuple):
    api_group: str  # "" is the core group
    resource: str  # plural, with "/subresource" where one is used
    verbs: tuple[str, ...]


PERMISSIONS: tuple[Permission, ...] = (
    # kopf lists and watches DDPJobs (event handlers only: it never patches them); the operator
    # deletes finished jobs after their TTL.
    Permission(model.GROUP, model.PLURAL, ("list", "watch", "delete")),
    Permission(model.GROUP, f"{model.PLURAL}/status", ("patch",)),
    # Owner references with blockOwnerDeletion require update on the owner's finalizers.
    Permission(model.GROUP, f"{model.PLURAL}/finalizers", ("update",)),
    # kopf indexes and watches the operator's pods; workers and the store are created and deleted.
    # A create that meets an existing name reads it back (get) to check that the job owns it.
    Permission("", "pods", ("list", "watch", "get", "create", "delete")),
    Permission("", "services", ("get", "create")),
    # The job's agent ConfigMap `<job>-agent-<digest>`, which every worker and spare mounts
    # (job_manifests.agent_config_map).
    Permission("", "configmaps", ("get", "create")),
    # kopf posts handler problems as Events; the operator posts lifecycle Events, and lists a pod's
    # FailedMount Events when it has waited in ContainerCreating past the cannot-start timeout.
    Permission("", "events", ("list", "create")),
    # Only for checkpoint.claimTemplate: the operator creates `<job>-checkpoints`.
    Permission("", "persistentvolumeclaims", ("get", "create")),
    # Only for runPolicy.schedulingPolicy: the job's PodGroup `<job>`, of Volcano or of the scheduler-plugins
    # coscheduling plugin (a create that meets the name reads it back, as for the others).
    *(Permission(api_version.split("/")[0], "podgroups", ("get", "create"))
      for api_version, _ in model.GANG_SCHEDULERS.values()),
)


# Leader election (leader.py), in the operator's namespace only: the replicas read the Lease, the
# first creates it, the holder renews it and a standby takes it over (updates carry the
# resourceVersion read, so two replicas never both win).
LEADER_ELECTION_PERMISSIONS: tuple[Permission, ...] = (
    Permission("coordination.k8s.io", "leases", ("get", "create", "update")),
    # The leader labels its own pod (and a replica that stops leading removes the label), so the progress
    # Service routes reports to the acting replica only (progress_router.PROGRESS_LEADER_LABEL).
    Permission("", "pods", ("patch",)),
)


# The progress endpoint (progress.py) authenticates trainers' projected service-account tokens with the
# TokenReview API: create only (a review stores nothing and reads nothing else). TokenReviews are
# cluster-scoped, so the chart grants this one verb with a ClusterRole of its own, also in watchNamespaces
# mode (what Kubernetes' own system:auth-delegator grants, minus SubjectAccessReviews). Training pods
# themselves need no RBAC.
PROGRESS_PERMISSIONS: tuple[Permission, ...] = (
    Permission("authentication.k8s.io", "tokenreviews", ("create",)),
)


def allows(api_group: str, resource: str, verb: str) -> bool:
    """Whether the chart grants `verb` on `resource` (with "/subresource") in `api_group`: the job
    permissions, the leader election ones (in the operator's namespace) or the progress endpoint's."""
    return any(p.api_group == api_group and p.resource == resource and verb in p.verbs
               for p in PERMISSIONS + LEADER_ELECTION_PERMISSIONS + PROGRESS_PERMISSIONS)


def rbac_rules(permissions: tuple[Permission, ...] = PERMISSIONS) -> list[dict[str, list[str]]]:
    """Permissions as RBAC PolicyRules, one rule per (group, resource), in a stable order."""
    return [{"apiGroups": [p.api_group], "resources": [p.resource], "verbs": list(p.verbs)}
            for p in permissions]


def render_rules_yaml() -> str:
    header = ("# Generated from operator/ddpjob_operator/permissions.py by `make chart-files`. "
              "Do not edit.\n"
              "# jobs: the ClusterRole (or a Role per watched namespace); leaderElection: a Role in the "
              "release namespace;\n# progress: a ClusterRole of its own (TokenReviews are cluster-scoped).\n")
    rules = {"jobs": rbac_rules(PERMISSIONS), "leaderElection": rbac_rules(LEADER_ELECTION_PERMISSIONS),
             "progress": rbac_rules(PROGRESS_PERMISSIONS)}
    return header + yaml.safe_dump(rules, sort_keys=False, width=100)


def cmd_rbac_rules(args: argparse.Namespace) -> int:
    sys.stdout.write(render_rules_yaml())
    return 0


def add_subcommand(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rbac-rules", help="print the operator's RBAC rules (the chart's Role/ClusterRole)")
    p.set_defaults(func=cmd_rbac_rules)
