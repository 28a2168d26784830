"""Issue 23 (items 12, 13): the chart's optional NetworkPolicy for the progress and metrics ports (workers
and warm spares may reach the progress port), and the progress Service routing reports to the acting
replica only. Rendered by Helm's own engine."""

from __future__ import annotations

import kubernetes_validate
import pytest

from ddpjob_operator import naming, progress_router

from .helm_install import RELEASE_NAMESPACE, install_dry_run

ENABLED = {"networkPolicy": {"enabled": True}}


def _policy(values: dict) -> dict:
    release = install_dry_run(values)
    [policy] = release.of_kind("NetworkPolicy")
    kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)
    pod_labels = release.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # the operator still reaches the API server
    return policy


def _rules(policy: dict) -> dict[str, list[dict]]:
    out = {}
    for rule in policy["spec"]["ingress"]:
        [port] = rule["ports"]
        out[port["port"]] = rule["from"]
    return out


def test_off_by_default():
    assert install_dry_run().of_kind("NetworkPolicy") == []


def test_progress_only_from_ddpjob_workers_and_spares_and_metrics_only_from_monitoring():
    rules = _rules(_policy(ENABLED))
    assert sorted(rules) == ["metrics", "progress"]  # nothing else may connect (the health port: the kubelet)
    [workers] = rules["progress"]
    # Warm spares poll the assignment route and report once they take a rank's place: admitted too.
    assert workers["podSelector"] == {
        "matchLabels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
        "matchExpressions": [{"key": naming.LABEL_ROLE, "operator": "In",
                              "values": [naming.ROLE_WORKER, naming.ROLE_SPARE]}]}
    assert workers["namespaceSelector"] == {}  # cluster-wide: jobs in any namespace
    [monitoring] = rules["metrics"]
    assert monitoring == {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]}, "podSelector": {}}


def test_watched_namespaces_and_a_custom_scraper():
    prometheus = {"namespaces": ["observability"],
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    rules = _rules(_policy({"watchNamespaces": ["team-a", "team-b"],
                            "networkPolicy": {"enabled": True, "metrics": prometheus}}))
    [workers] = rules["progress"]
    assert workers["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}
    assert rules["metrics"] == [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["observability"]}]},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def test_disabled_ports_get_no_rule():
    policy = _policy({**ENABLED, "progress": {"enabled": False}, "metrics": {"enabled": False}})
    assert policy["spec"].get("ingress") in (None, [])  # deny all ingress but the kubelet's


@pytest.mark.parametrize("bad", [{"enabled": "yes"}, {"enabled": True, "extra": 1},
                                 {"enabled": True, "metrics": {"namespaces": [], "podSelector": {}}},
                                 {"enabled": True, "metrics": {"namespaces": ["x"],
                                                               "podSelector": {"matchLabelz": {}}}}])
def test_bad_values_are_refused(bad):
    with pytest.raises(Exception, match="networkPolicy"):
        install_dry_run({"networkPolicy": bad})


def test_the_progress_service_selects_the_acting_replica_only():
    release = install_dry_run()
    [service] = [s for s in release.of_kind("Service") if s["metadata"]["name"].endswith("-progress")]
    assert service["spec"]["selector"][progress_router.PROGRESS_LEADER_LABEL] == "true"
    env = {e["name"]: e.get("value") for e in release.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
           ["env"]}
    assert env["DDPJOB_OPERATOR_PROGRESS_LEADER_LABEL"] == "true"
    # Not a readiness probe: standbys stay Ready, so rolling updates and drains still proceed.
    probe = release.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["port"] == "health"
