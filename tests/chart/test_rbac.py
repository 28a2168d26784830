"""The chart grants the operator exactly `permissions.PERMISSIONS` (and the Lease permissions of leader
election, in its own namespace only): all of it, nothing broader."""

from __future__ import annotations

from ddpjob_operator import permissions

from .helm_install import CHART_DIR, RELEASE_NAMESPACE, install_dry_run

RULES_FILE = CHART_DIR / "files" / "rbac-rules.yaml"


def _grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a list of PolicyRules allows, refusing broad forms."""
    triples = set()
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, (
            f"unexpected rule keys (resourceNames/nonResourceURLs are not used): {rule}")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    triples.add((group, resource, verb))
    return triples


REQUIRED = {(p.api_group, p.resource, verb) for p in permissions.PERMISSIONS for verb in p.verbs}
LEASE = {(p.api_group, p.resource, verb) for p in permissions.LEADER_ELECTION_PERMISSIONS for verb in p.verbs}
PROGRESS = {(p.api_group, p.resource, verb) for p in permissions.PROGRESS_PERMISSIONS for verb in p.verbs}
LEADER_ROLE = "ddpjob-operator-leader-election"
PROGRESS_ROLE = "ddpjob-operator-progress"


def _jobs_cluster_roles(release) -> list[dict]:
    return [r for r in release.of_kind("ClusterRole") if r["metadata"]["name"] != PROGRESS_ROLE]


def _progress_role(release) -> dict:
    """The progress endpoint's ClusterRole: exactly TokenReview create, bound to the operator."""
    roles = [r for r in release.of_kind("ClusterRole") if r["metadata"]["name"] == PROGRESS_ROLE]
    bindings = [b for b in release.of_kind("ClusterRoleBinding") if b["metadata"]["name"] == PROGRESS_ROLE]
    assert len(roles) == len(bindings) == 1, (roles, bindings)
    assert bindings[0]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": PROGRESS_ROLE}
    account = release.one("ServiceAccount")["metadata"]["name"]
    assert bindings[0]["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}]
    return roles[0]


def _leader_election_role(release) -> dict:
    """The leader election Role and its binding: in the release namespace, bound to the operator."""
    roles = [r for r in release.of_kind("Role") if r["metadata"]["name"] == LEADER_ROLE]
    bindings = [b for b in release.of_kind("RoleBinding") if b["metadata"]["name"] == LEADER_ROLE]
    assert len(roles) == len(bindings) == 1, (roles, bindings)
    assert roles[0]["metadata"]["namespace"] == bindings[0]["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert bindings[0]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEADER_ROLE}
    account = release.one("ServiceAccount")["metadata"]["name"]
    assert bindings[0]["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}]
    return roles[0]


def test_rules_file_is_generated_from_permissions():
    assert RULES_FILE.read_text() == permissions.render_rules_yaml(), "run `make chart-files` and commit"


def test_permissions_list_is_well_formed():
    keys = [(p.api_group, p.resource) for p in permissions.PERMISSIONS]
    assert len(keys) == len(set(keys)), "one entry per (apiGroup, resource)"
    known_verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    for p in permissions.PERMISSIONS:
        assert p.verbs and set(p.verbs) <= known_verbs and len(set(p.verbs)) == len(p.verbs), p
    assert permissions.allows("", "pods", "create")
    assert not permissions.allows("", "pods", "deletecollection")
    assert not permissions.allows("", "secrets", "get")


def test_lease_permissions_are_exactly_get_create_update_on_leases():
    assert LEASE == {("coordination.k8s.io", "leases", "get"), ("coordination.k8s.io", "leases", "create"),
                     ("coordination.k8s.io", "leases", "update"), ("", "pods", "patch")}  # its own pod's label
    assert not LEASE & REQUIRED, "the Lease is never granted cluster-wide or in the watched namespaces"
    assert permissions.allows("coordination.k8s.io", "leases", "update")
    assert not permissions.allows("coordination.k8s.io", "leases", "delete")
    assert not permissions.allows("coordination.k8s.io", "leases", "list")


def test_cluster_wide_mode_grants_exactly_the_permissions():
    release = install_dry_run()
    assert _grants(_leader_election_role(release)["rules"]) == LEASE
    assert len(release.of_kind("Role")) == len(release.of_kind("RoleBinding")) == 1  # only the Lease's
    assert _grants(_progress_role(release)["rules"]) == PROGRESS
    [role] = _jobs_cluster_roles(release)
    assert _grants(role["rules"]) == REQUIRED
    [binding] = [b for b in release.of_kind("ClusterRoleBinding") if b["metadata"]["name"] != PROGRESS_ROLE]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    account = release.one("ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": RELEASE_NAMESPACE}]


def test_watch_namespaces_mode_grants_exactly_the_permissions_in_each_namespace_only():
    namespaces = ["team-a", "team-b", "research"]
    release = install_dry_run({"watchNamespaces": namespaces})
    # Nothing cluster-wide but the progress endpoint's TokenReview create (cluster-scoped by nature).
    assert _jobs_cluster_roles(release) == [] and len(release.of_kind("ClusterRoleBinding")) == 1
    assert _grants(_progress_role(release)["rules"]) == PROGRESS
    assert _grants(_leader_election_role(release)["rules"]) == LEASE
    roles = {r["metadata"]["namespace"]: r for r in release.of_kind("Role") if r["metadata"]["name"] != LEADER_ROLE}
    bindings = {b["metadata"]["namespace"]: b for b in release.of_kind("RoleBinding")
                if b["metadata"]["name"] != LEADER_ROLE}
    assert sorted(roles) == sorted(bindings) == sorted(namespaces)
    account = release.one("ServiceAccount")["metadata"]
    for namespace in namespaces:
        assert _grants(roles[namespace]["rules"]) == REQUIRED, namespace
        assert bindings[namespace]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
            "name": roles[namespace]["metadata"]["name"]}
        assert bindings[namespace]["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": RELEASE_NAMESPACE}]


def test_one_replica_still_gets_the_lease_role():
    release = install_dry_run({"replicaCount": 1})
    assert _grants(_leader_election_role(release)["rules"]) == LEASE
    assert _grants(_jobs_cluster_roles(release)[0]["rules"]) == REQUIRED


def test_no_object_grants_anything_else():
    """Only the operator's own roles exist: nothing aggregates into or extends them."""
    for values in ({}, {"watchNamespaces": ["team-a"]}):
        release = install_dry_run(values)
        for manifest in release.manifests:
            if manifest["kind"] in ("ClusterRole", "Role"):
                assert "aggregationRule" not in manifest
                assert not any(key.startswith("rbac.authorization.k8s.io/aggregate")
                               for key in manifest["metadata"]["labels"])


def test_progress_permission_is_exactly_tokenreview_create():
    """Least privilege for issue 12: the endpoint reviews tokens, nothing else; training pods get no RBAC."""
    assert PROGRESS == {("authentication.k8s.io", "tokenreviews", "create")}
    assert not PROGRESS & (REQUIRED | LEASE)
    assert not permissions.allows("authorization.k8s.io", "subjectaccessreviews", "create")
    assert not permissions.allows("", "serviceaccounts/token", "create")
    # Disabled, the progress role and its binding are gone, while the jobs' own binding stays.
    disabled = install_dry_run({"progress": {"enabled": False}})
    names = [o["metadata"]["name"] for kind in ("ClusterRole", "ClusterRoleBinding") for o in disabled.of_kind(kind)]
    assert PROGRESS_ROLE not in names, names
    assert len(disabled.of_kind("ClusterRoleBinding")) == 1 and _jobs_cluster_roles(disabled)
