"""The chart's ServiceMonitor and Grafana dashboard, rendered by Helm's own engine: off by default, wired to the
metrics Service, labelled for the Grafana sidecar; the dashboard is valid JSON and every metric (and label) it
queries is one the operator exports, read from the operator's real registry (run.create_operator), not a list."""

from __future__ import annotations

import asyncio
import json
import re

import helm_python as helm
import pytest
from prometheus_client.core import Metric

from ddpjob_operator import run
from ddpjob_operator.kube import Connection
from ddpjob_operator.settings import Settings
from ddpjob_operator.workqueue import WorkQueue

from .helm_install import CHART_DIR, RELEASE_NAMESPACE, install_dry_run

BOTH = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
        "grafanaDashboard": {"enabled": True}}
# Labels Prometheus puts on every target scraped through a ServiceMonitor.
TARGET_LABELS = {"pod", "instance", "job", "service", "namespace", "container", "endpoint"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}


def exported() -> dict[str, set[str]]:
    """Every series name the operator exports (counters' _total, histograms' _bucket/_sum/_count) -> its labels,
    from the registry a real operator process serves (create_operator: metrics.py and the progress tracker),
    with the label names each collector declares (a labelled family has no sample before its first value)."""
    controller, _, _ = run.create_operator(Settings(metrics_port=0, health_port=0),
                                           Connection(server="http://127.0.0.1:9"))
    series: dict[str, set[str]] = {}
    registry = controller.metrics.registry
    family: Metric
    for collector in list(registry._collector_to_names):  # each collector, with its declared label names
        for family in collector.collect():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
            declared = getattr(family, "_labelnames", None) or getattr(collector, "_labelnames", ())
            labels = set(declared) | {k for s in family.samples for k in s.labels} - {"le"}
            for name in {family.name + suffix for suffix in suffixes} | {s.name for s in family.samples}:
                series.setdefault(name, set()).update(labels | ({"le"} if name.endswith("_bucket") else set()))
    return series


def queried(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and label names a PromQL expression uses."""
    labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {g.strip() for g in group.split(",") if g.strip()}
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    names = {m.group(1) for m in re.finditer(r"\b([a-zA-Z_:][\w:]*)\b(?!\s*\()", bare)
             if m.group(1).lower() not in PROMQL_WORDS and not m.group(1)[0].isdigit()}
    return names, labels


def dashboard(release) -> dict:
    config_map = next(m for m in release.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-dashboard"))
    return json.loads(config_map["data"]["ddpjob-operator.json"])


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_off_by_default():
    release = install_dry_run()
    assert release.of_kind("ServiceMonitor") == []
    assert not [m for m in release.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-dashboard")]


def test_the_service_monitor_scrapes_the_metrics_service_of_every_replica():
    release = install_dry_run(BOTH)
    monitor = release.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    services = [s for s in release.of_kind("Service")
                if all(s["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())]
    ports = {p["name"] for s in services for p in s["spec"]["ports"]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in ports and endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    metrics_service = next(s for s in services if any(p["name"] == "metrics" for p in s["spec"]["ports"]))
    pod_labels = release.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in metrics_service["spec"]["selector"].items())
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "10s")


def test_the_dashboard_config_map_is_labelled_for_the_grafana_sidecar():
    config_map = next(m for m in install_dry_run(BOTH).of_kind("ConfigMap") if m["metadata"]["name"].endswith("-dashboard"))
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == RELEASE_NAMESPACE
    custom = install_dry_run({"grafanaDashboard": {"enabled": True, "namespace": "monitoring",
                                                   "label": "dashboards", "labelValue": "ml",
                                                   "annotations": {"grafana_folder": "Training"}}})
    config_map = next(m for m in custom.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-dashboard"))
    assert config_map["metadata"]["labels"]["dashboards"] == "ml" and "grafana_dashboard" not in config_map["metadata"]["labels"]
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Training"}


def test_the_dashboard_is_valid_and_covers_what_it_must():
    board = dashboard(install_dry_run(BOTH))
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in panels(board)}
    assert {"Jobs by phase", "Restarts and disruptions", "Step", "Samples/s", "Seconds since the step advanced",
            "Leader", "Reconcile latency", "Queue depth"} <= titles
    for p in panels(board):
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        grid = p["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
    variables = {v["name"] for v in board["templating"]["list"]}
    used = {m for p in panels(board) for t in p["targets"] for m in re.findall(r"\$(\w+)", t["expr"])}
    assert used - {"__range", "__rate_interval", "__interval"} <= variables


def test_every_metric_the_dashboard_queries_is_one_the_operator_exports():
    series = exported()
    board = dashboard(install_dry_run(BOTH))
    expressions = [t["expr"] for p in panels(board) for t in p["targets"]]
    expressions += [v["definition"] for v in board["templating"]["list"] if v.get("definition")]
    used: set[str] = set()
    for expr in expressions:
        variable = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", expr)  # Grafana's, for a variable
        names, labels = ({variable.group(1)}, {variable.group(2)}) if variable else queried(expr)
        unknown = names - set(series)
        assert not unknown, f"{expr}: not exported by the operator: {unknown}"
        known_labels = set().union(*(series[n] for n in names)) | TARGET_LABELS
        assert labels <= known_labels, f"{expr}: labels {labels - known_labels} are on none of {names}"
        used |= names
    # ...and the operator's health and job metrics are all on it (the queue depth included).
    assert {"ddpjob_jobs", "ddpjob_restarts_total", "ddpjob_disruptions_total", "ddpjob_stalls_total",
            "ddpjob_job_progress_step", "ddpjob_job_samples_per_second", "ddpjob_job_seconds_since_progress",
            "ddpjob_leader", "ddpjob_reconcile_duration_seconds_bucket", "ddpjob_reconcile_queue_depth",
            "ddpjob_rank_step_seconds", "ddpjob_recovery_seconds_bucket"} <= used


def test_the_checker_catches_a_metric_the_operator_does_not_export():
    series = exported()
    names, labels = queried('sum by (phase) (rate(ddpjob_job_restarts_total{namespace=~"$namespace"}[5m]))')
    assert names == {"ddpjob_job_restarts_total"} and labels == {"phase", "namespace"}
    assert "ddpjob_job_restarts_total" not in series and "ddpjob_restarts_total" in series


def test_the_queue_depth_gauge_reads_the_controllers_work_queue():
    controller, _, _ = run.create_operator(Settings(metrics_port=0, health_port=0),
                                           Connection(server="http://127.0.0.1:9"))

    async def scenario() -> None:
        release = asyncio.Event()

        async def blocked_pass(key: tuple[str, str]) -> None:
            await release.wait()

        # The gauge reads whatever queue the controller holds: one whose passes wait on us.
        controller.queue = WorkQueue(blocked_pass, concurrency=1, settle_seconds=0)
        controller.queue.add(("ns", "a"))
        controller.queue.add(("ns", "b"))  # one pass running, one queued behind it
        await asyncio.sleep(0)
        assert "ddpjob_reconcile_queue_depth 2.0" in controller.metrics.text()
        release.set()
        while not controller.queue.idle():
            await asyncio.sleep(0)
        assert "ddpjob_reconcile_queue_depth 0.0" in controller.metrics.text()

    asyncio.run(scenario())


@pytest.mark.parametrize("values", [BOTH, {**BOTH, "watchNamespaces": ["team-a"]}])
def test_helm_lint_strict_passes_with_both(values):
    report = helm.lint(CHART_DIR, values, strict=True, namespace=RELEASE_NAMESPACE)
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values, words", [
    ({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
     "metrics.serviceMonitor.enabled needs metrics.enabled=true"),
    ({"grafanaDashboard": {"enabled": True, "label": ""}}, "label"),
    ({"grafanaDashboard": {"enabled": True, "folder": "x"}}, "folder"),
    ({"metrics": {"serviceMonitor": {"enabled": True, "interval": "often"}}}, "interval"),
])
def test_bad_values_are_refused_naming_the_field(values, words):
    with pytest.raises(Exception) as raised:
        install_dry_run(values)
    assert words in str(raised.value)
