"""The Helm chart, rendered by Helm's own engine: lint, valid Kubernetes objects, hardening,
values wiring, schema rejections, and the CRD copy."""

from __future__ import annotations

import importlib.util
import re
import tomllib

import helm_python as helm
import kubernetes_validate
import pytest

from ddpjob_operator import settings

from .helm_install import CHART_DIR, RELEASE, RELEASE_NAMESPACE, ROOT, install_dry_run

TOP_LEVEL_CRD = ROOT / "crds" / "ddpjobs.elastic.ddp.dev.yaml"
CHART_CRD = CHART_DIR / "crds" / "ddpjobs.elastic.ddp.dev.yaml"

NAMESPACED = {"watchNamespaces": ["team-a", "team-b"]}
CUSTOMIZED = {
    "image": {"repository": "registry.example.com/ml/ddpjob-operator", "tag": "0.2.0-rc1",
              "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "logLevel": "DEBUG",
    "metrics": {"enabled": False},
    "health": {"port": 8181},
    "serviceAccount": {"create": False, "name": "ml-operator"},
    "extraEnv": [{"name": "DDPJOB_OPERATOR_RESYNC_SECONDS", "value": "15"}],
    "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
    "nodeSelector": {"kubernetes.io/os": "linux", "node-role.kubernetes.io/control-plane": ""},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                     "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]}]}}},
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/team": "ml"},
    "podLabels": {"team": "ml"},
    "progress": {"enabled": False},
}
VALUE_SETS = {"default": {}, "namespaced": NAMESPACED, "customized": CUSTOMIZED}


def _operator_version() -> str:
    with open(ROOT / "operator" / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def _container(release) -> dict:
    containers = release.one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


POD_NAME = "ddpjob-operator-7d9f8b6c5-x2x7q"
LEASE_ENV = {"DDPJOB_OPERATOR_LEASE_NAME": "ddpjob-operator", "DDPJOB_OPERATOR_LEASE_DURATION_SECONDS": "15",
             "DDPJOB_OPERATOR_LEASE_RENEW_DEADLINE_SECONDS": "10", "DDPJOB_OPERATOR_LEASE_RETRY_PERIOD_SECONDS": "2"}
LEASE_SETTINGS = {"lease_name": "ddpjob-operator", "lease_namespace": RELEASE_NAMESPACE, "identity": POD_NAME}
PROGRESS_URL = f"http://ddpjob-operator-progress.{RELEASE_NAMESPACE}.svc:8090"
PROGRESS_ENV = {"DDPJOB_OPERATOR_PROGRESS_PORT": "8090", "DDPJOB_OPERATOR_PROGRESS_URL": PROGRESS_URL,
                "DDPJOB_OPERATOR_PROGRESS_AUDIENCE": "progress.elastic.ddp.dev",
                "DDPJOB_OPERATOR_PROGRESS_WRITE_SECONDS": "5", "DDPJOB_OPERATOR_PROGRESS_LEADER_LABEL": "true"}
PROGRESS_SETTINGS = {"progress_port": 8090, "progress_url": PROGRESS_URL,
                     "progress_audience": "progress.elastic.ddp.dev", "progress_write_seconds": 5.0,
                     "progress_leader_label": True}


def _env(release) -> dict[str, str]:
    """The literal environment values (the downward API ones: `_downward`)."""
    return {e["name"]: e.get("value") for e in _container(release)["env"] if "valueFrom" not in e}


def _downward(release) -> dict[str, str]:
    return {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in _container(release)["env"] if "valueFrom" in e}


def _pod_env(release) -> dict[str, str]:
    """The environment as the kubelet gives it to the pod POD_NAME in the release namespace."""
    fields = {"metadata.name": POD_NAME, "metadata.namespace": RELEASE_NAMESPACE}
    return {**_env(release), **{name: fields[path] for name, path in _downward(release).items()}}


# ---------------------------------------------------------------- chart files


def test_chart_crd_is_the_same_bytes_as_the_generated_crd():
    assert CHART_CRD.read_bytes() == TOP_LEVEL_CRD.read_bytes(), "run `make chart-files` and commit"
    with helm.Chart.load(CHART_DIR) as chart:
        shipped = chart.crds
    assert [c["filename"] for c in shipped] == ["ddpjob-operator/crds/ddpjobs.elastic.ddp.dev.yaml"]
    assert shipped[0]["data"].encode() == TOP_LEVEL_CRD.read_bytes()


def test_chart_and_image_version_follow_the_operator_package():
    with helm.Chart.load(CHART_DIR) as chart:
        metadata = chart.metadata
    assert metadata["version"] == metadata["appVersion"] == _operator_version()
    image = _container(install_dry_run())["image"]
    assert image == f"ghcr.io/ddpjob/ddpjob-operator:{_operator_version()}"


def test_operator_image_matches_the_chart():
    """The image's numeric user is the chart's runAsUser, its entrypoint exists, it has no torch."""
    dockerfile = (ROOT / "operator" / "Dockerfile").read_text()
    pod_security = install_dry_run().one("Deployment")["spec"]["template"]["spec"]["securityContext"]
    users = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)
    assert users == [(str(pod_security["runAsUser"]), str(pod_security["runAsGroup"]))]
    entrypoint = re.search(r'^ENTRYPOINT \["python", "-m", "([\w.]+)"\]$', dockerfile, re.MULTILINE)
    assert entrypoint and importlib.util.find_spec(entrypoint.group(1)) is not None
    with open(ROOT / "operator" / "pyproject.toml", "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    assert not any(re.match(r"torch\b", d) for d in dependencies)


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_helm_lint_strict_passes(values_name):
    report = helm.lint(CHART_DIR, VALUE_SETS[values_name], strict=True, namespace=RELEASE_NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert report["errors"] == [] and problems == []


# ---------------------------------------------------------------- rendered objects


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_rendered_manifest_is_a_valid_kubernetes_object(values_name):
    release = install_dry_run(VALUE_SETS[values_name])
    version = kubernetes_validate.latest_version()
    for manifest in release.manifests:
        kubernetes_validate.validate(manifest, version, strict=True)
    kinds = sorted(m["kind"] for m in release.manifests)
    expected = {
        "default": ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment",
                    "PodDisruptionBudget", "Role", "RoleBinding", "Service", "Service", "ServiceAccount"],
        # The progress endpoint's TokenReview grant is cluster-scoped by nature (a ClusterRole of its own).
        "namespaced": ["ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "Role",
                       "Role", "RoleBinding", "RoleBinding", "RoleBinding", "Service", "Service", "ServiceAccount"],
        "customized": ["ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role",
                       "RoleBinding"],
    }[values_name]
    assert kinds == expected


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_object_has_the_standard_labels(values_name):
    for manifest in install_dry_run(VALUE_SETS[values_name]).manifests:
        labels = manifest["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "ddpjob-operator"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == _operator_version()
        assert labels["app.kubernetes.io/component"] == "operator"


def test_deployment_is_hardened_with_two_replicas():
    release = install_dry_run()
    deployment = release.one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(release)
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090, "progress": 8090}
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == release.one("ServiceAccount")["metadata"]["name"]


def test_metrics_service_targets_the_operator_pod():
    release = install_dry_run()
    services = {s["metadata"]["name"]: s for s in release.of_kind("Service")}
    service = services["ddpjob-operator-metrics"]
    pod_labels = release.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics",
                                         "protocol": "TCP"}]
    # Issue 12: trainers reach the progress endpoint through its own Service (DDPJOB_PROGRESS_URL).
    progress = services["ddpjob-operator-progress"]
    # Issue 23: and only to the acting replica, whose pod the operator labels (progress_router.PROGRESS_LEADER_LABEL).
    selector = dict(progress["spec"]["selector"])
    assert selector.pop("elastic.ddp.dev/progress-leader") == "true" and selector.items() <= pod_labels.items()
    assert progress["spec"]["ports"] == [{"name": "progress", "port": 8090, "targetPort": "progress",
                                          "protocol": "TCP"}]


def test_progress_can_be_turned_off():
    release = install_dry_run({"progress": {"enabled": False}})
    assert "ddpjob-operator-progress" not in {s["metadata"]["name"] for s in release.of_kind("Service")}
    assert not any(k.startswith("DDPJOB_OPERATOR_PROGRESS") for k in _env(release))
    assert len(release.of_kind("ClusterRole")) == 1  # no TokenReview grant


def test_default_values_configure_a_cluster_wide_operator():
    release = install_dry_run()
    assert _env(release) == {"DDPJOB_OPERATOR_WATCH_NAMESPACES": "", "DDPJOB_OPERATOR_LOG_LEVEL": "INFO",
                             "DDPJOB_OPERATOR_HEALTH_PORT": "8080", "DDPJOB_OPERATOR_METRICS_PORT": "9090",
                             **PROGRESS_ENV, **LEASE_ENV}
    assert _downward(release) == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_non_default_values_reach_the_pod():
    release = install_dry_run(CUSTOMIZED)
    container = _container(release)
    pod = release.one("Deployment")["spec"]["template"]
    assert container["image"] == "registry.example.com/ml/ddpjob-operator:0.2.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert _env(release) == {
        "DDPJOB_OPERATOR_WATCH_NAMESPACES": "", "DDPJOB_OPERATOR_LOG_LEVEL": "DEBUG",
        "DDPJOB_OPERATOR_HEALTH_PORT": "8181", "DDPJOB_OPERATOR_METRICS_PORT": "0", **LEASE_ENV,
        "DDPJOB_OPERATOR_RESYNC_SECONDS": "15"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8181}
    assert container["resources"] == CUSTOMIZED["resources"]
    for key in ("nodeSelector", "affinity", "priorityClassName", "imagePullSecrets"):
        assert pod["spec"][key] == CUSTOMIZED[key], key
    assert pod["spec"]["tolerations"][2:] == CUSTOMIZED["tolerations"]  # after the node-loss ones
    assert pod["spec"]["serviceAccountName"] == "ml-operator"
    assert pod["metadata"]["annotations"] == CUSTOMIZED["podAnnotations"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    binding = release.one("ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ml-operator",
                                    "namespace": RELEASE_NAMESPACE}]


@pytest.mark.parametrize(("values", "expected"), [
    ({}, settings.Settings(**LEASE_SETTINGS, **PROGRESS_SETTINGS)),
    (NAMESPACED, settings.Settings(watch_namespaces=("team-a", "team-b"), **LEASE_SETTINGS, **PROGRESS_SETTINGS)),
    (CUSTOMIZED, settings.Settings(log_level="DEBUG", health_port=8181, metrics_port=0,
                                   resync_seconds=15.0, **LEASE_SETTINGS)),
    ({"replicaCount": 1, "leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20.5,
                                            "retryPeriodSeconds": 4}},
     settings.Settings(lease_duration_seconds=30, lease_renew_deadline_seconds=20.5, lease_retry_period_seconds=4.0,
                       **LEASE_SETTINGS, **PROGRESS_SETTINGS)),
], ids=["default", "namespaced", "customized", "one-replica-slow-lease"])
def test_rendered_environment_is_what_the_operator_reads(values, expected):
    """The operator's own settings parser accepts the chart's environment and gets the values."""
    assert settings.from_env(_pod_env(install_dry_run(values))) == expected


def test_watch_namespaces_reach_the_operator_and_the_notes():
    release = install_dry_run(NAMESPACED)
    assert _env(release)["DDPJOB_OPERATOR_WATCH_NAMESPACES"] == "team-a,team-b"
    assert "only in: team-a, team-b" in release.notes
    assert "every namespace" in install_dry_run().notes


# ---------------------------------------------------------------- bad values fail at install


@pytest.mark.parametrize(("values", "message"), [
    ({"logLevel": "LOUD"}, "at '/logLevel': value must be one of 'DEBUG', 'INFO', 'WARNING', 'ERROR'"),
    ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
    ({"image": {"repository": ""}}, "at '/image/repository'"),
    ({"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0'"),
    ({"watchNamespaces": "team-a"}, "at '/watchNamespaces': got string, want array"),
    ({"metrics": {"port": 80}}, "at '/metrics/port': minimum: got 80, want 1,024"),
    ({"metrics": {"enabled": "yes"}}, "at '/metrics/enabled': got string, want boolean"),
    ({"health": {"port": 70000}}, "at '/health/port': maximum"),
    ({"resources": {"limits": {"memory": "lots"}}}, "at '/resources/limits/memory'"),
    ({"nodeSelector": {"gpu": True}}, "at '/nodeSelector/gpu': got boolean, want string"),
    ({"replicas": 2}, "additional properties 'replicas' not allowed"),
    ({"replicaCount": 0}, "at '/replicaCount': minimum: got 0, want 1"),
    ({"leaderElection": {"leaseDurationSeconds": 1.5}}, "at '/leaderElection/leaseDurationSeconds'"),
    ({"leaderElection": {"renewDeadlineSeconds": 15}},
     "retryPeriodSeconds (2) < renewDeadlineSeconds (15) < leaseDurationSeconds (15) must hold"),
    ({"leaderElection": {"retryPeriodSeconds": 10}},
     "retryPeriodSeconds (10) < renewDeadlineSeconds (10) < leaseDurationSeconds (15) must hold"),
    ({"podDisruptionBudget": {"enabled": "yes"}}, "at '/podDisruptionBudget/enabled'"),
    ({"image": {"tags": "v1"}}, "at '/image': additional properties 'tags' not allowed"),
    ({"progress": {"writeSeconds": 30}}, "at '/progress/writeSeconds': maximum"),
    ({"progress": {"port": 80}}, "at '/progress/port': minimum"),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_bad_values_fail_at_install_naming_the_field(values, message):
    with pytest.raises(helm.HelmError) as failure:
        install_dry_run(values)
    assert message in str(failure.value)


def test_existing_service_account_must_be_named():
    with pytest.raises(helm.HelmError) as failure:
        install_dry_run({"serviceAccount": {"create": False}})
    assert "serviceAccount.name is required when serviceAccount.create is false" in str(failure.value)


# ---------------------------------------------------------------- high availability


def test_two_replicas_spread_across_nodes_with_a_budget_and_short_node_loss_tolerations():
    release = install_dry_run()
    deployment = release.one("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert pod["affinity"] == {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": selector}}}]}}
    assert pod["tolerations"] == [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")]
    budget = release.one("PodDisruptionBudget")
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    assert "get lease ddpjob-operator" in release.notes


def test_one_replica_has_no_budget_that_would_block_drains_and_still_elects_itself():
    release = install_dry_run({"replicaCount": 1})
    assert release.one("Deployment")["spec"]["replicas"] == 1
    assert release.of_kind("PodDisruptionBudget") == []
    assert settings.from_env(_pod_env(release)).leader_election


def test_budget_can_be_turned_off_and_tolerations_tuned():
    release = install_dry_run({"podDisruptionBudget": {"enabled": False}, "nodeLossTolerationSeconds": 10})
    assert release.of_kind("PodDisruptionBudget") == []
    assert {t["tolerationSeconds"] for t in release.one("Deployment")["spec"]["template"]["spec"]["tolerations"]} == {10}
