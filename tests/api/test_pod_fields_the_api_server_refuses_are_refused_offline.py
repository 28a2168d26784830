"""Pass-through pod fields that `ddpjob validate` accepted and the API server refuses (issue 38, item 14): env sources,
hostUsers with host namespaces, topology spread constraints, node affinity terms, readiness and scheduling gates,
volume sources. Each is refused naming the field, by the CRD too where a rule fits it; the legal neighbours pass."""

from __future__ import annotations

import copy

import pytest
import yaml

from ddpjob_operator import cli, crd, job_manifests, naming, pod_rules, validation

from .apiserver_rules import object_errors
from .refusals import assert_validate_and_the_operator_refuse
from .schema_checks import api_server_errors, independent_cel

BASE = {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "victim"},
        "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer"}}
INIT = {"name": "fetch", "image": "busybox:1"}
ZONE = "topology.kubernetes.io/zone"


def _env(value_from: dict) -> dict:
    return {"env": [{"name": "X", "valueFrom": value_from}]}


def _pod(**fields) -> dict:
    return {"template": {"podSpec": fields}}


def _spread(*constraints: dict) -> dict:
    return _pod(topologySpreadConstraints=list(constraints))


def _required_nodes(*terms: dict) -> dict:
    return {"template": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}}


SPREAD = {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}
CONFIG = {"name": "settings", "key": "lr"}

# name: (spec fields, the field named, a word of the message, whether the CRD refuses it too)
CASES = {
    "value-from-no-source": (_env({}), "spec.env[0].valueFrom", "exactly one source", False),
    "value-from-two-sources": (_env({"configMapKeyRef": CONFIG, "secretKeyRef": CONFIG}), "spec.env[0].valueFrom",
                               "exactly one source", False),
    "value-from-resource-not-exposed": (_env({"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}),
                                        "spec.env[0].valueFrom", "resourceFieldRef.resource", False),
    "value-from-resource-missing": (_env({"resourceFieldRef": {"divisor": "1Mi"}}), "spec.env[0].valueFrom",
                                    "resourceFieldRef.resource", False),
    "value-from-field-not-exposed": (_env({"fieldRef": {"fieldPath": "spec.restartPolicy"}}), "spec.env[0].valueFrom",
                                     "fieldRef.fieldPath", False),
    "value-from-label-key-invalid": (_env({"fieldRef": {"fieldPath": "metadata.labels['-x']"}}),
                                     "spec.env[0].valueFrom", "fieldRef.fieldPath", False),
    "init-value-from-no-source": (_pod(initContainers=[{**INIT, "env": [{"name": "X", "valueFrom": {}}]}]),
                                  "spec.template.podSpec.initContainers[0].env[0].valueFrom", "exactly one", False),
    "host-users-with-host-network": (_pod(hostUsers=False, hostNetwork=True), "spec.template.podSpec.hostUsers",
                                     "hostNetwork", True),
    "host-users-with-host-pid": (_pod(hostUsers=False, hostPID=True), "spec.template.podSpec.hostUsers", "hostPID",
                                 True),
    "host-users-with-host-ipc": (_pod(hostUsers=False, hostIPC=True), "spec.template.podSpec.hostUsers", "hostIPC",
                                 True),
    "spread-zero-skew": (_spread({**SPREAD, "maxSkew": 0}), "spec.template.podSpec.topologySpreadConstraints",
                         "maxSkew", False),
    "spread-unknown-action": (_spread({**SPREAD, "whenUnsatisfiable": "Never"}),
                              "spec.template.podSpec.topologySpreadConstraints", "whenUnsatisfiable", False),
    "spread-no-topology-key": (_spread({**SPREAD, "topologyKey": ""}),
                               "spec.template.podSpec.topologySpreadConstraints", "topologyKey", False),
    "spread-duplicate": (_spread(SPREAD, {**SPREAD, "maxSkew": 2}), "spec.template.podSpec.topologySpreadConstraints",
                         "same topologyKey", False),
    "spread-min-domains-schedule-anyway": (_spread({**SPREAD, "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}),
                                           "spec.template.podSpec.topologySpreadConstraints", "minDomains", False),
    "spread-selector-without-values": (_spread({**SPREAD, "labelSelector": {"matchExpressions": [
        {"key": "app", "operator": "In"}]}}), "spec.template.podSpec.topologySpreadConstraints", "needs values", False),
    "spread-match-label-keys-without-selector": (_spread({**SPREAD, "matchLabelKeys": ["pod-template-hash"]}),
                                                 "spec.template.podSpec.topologySpreadConstraints", "labelSelector",
                                                 False),
    "node-selector-terms-empty": (_required_nodes(), "spec.template.affinity", "at least one term", False),
    "node-requirement-in-without-values": (_required_nodes({"matchExpressions": [{"key": "pool", "operator": "In"}]}),
                                           "spec.template.affinity", "needs values", False),
    "node-requirement-exists-with-values": (_required_nodes({"matchExpressions": [
        {"key": "pool", "operator": "Exists", "values": ["a"]}]}), "spec.template.affinity", "takes no values", False),
    "node-requirement-gt-two-values": (_required_nodes({"matchExpressions": [
        {"key": "cores", "operator": "Gt", "values": ["1", "2"]}]}), "spec.template.affinity", "exactly one", False),
    "node-requirement-bad-value": (_required_nodes({"matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["a b"]}]}), "spec.template.affinity", "label value", False),
    "node-preference-weight-zero": ({"template": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}}}},
        "spec.template.affinity", "weight", False),
    "pod-anti-affinity-without-topology-key": ({"template": {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"a": "b"}}}]}}}},
        "spec.template.affinity", "topologyKey", False),
    "pod-affinity-weight-over-100": ({"template": {"affinity": {"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101, "podAffinityTerm": {"topologyKey": ZONE}}]}}}},
        "spec.template.affinity", "weight", False),
    "readiness-gate-name": (_pod(readinessGates=[{"conditionType": "ready now"}]),
                            "spec.template.podSpec.readinessGates", "conditionType", True),
    "scheduling-gate-duplicate": (_pod(schedulingGates=[{"name": "example.com/quota"}, {"name": "example.com/quota"}]),
                                  "spec.template.podSpec.schedulingGates", "unique", True),
    "scheduling-gate-name": (_pod(schedulingGates=[{"name": "-quota"}]), "spec.template.podSpec.schedulingGates",
                             "every name", True),
    "volume-without-source": ({"template": {"volumes": [{"name": "data"}]}}, "spec.template.volumes",
                              "exactly one volume source", False),
    "volume-null-source": ({"template": {"volumes": [{"name": "data", "emptyDir": None}]}}, "spec.template.volumes",
                           "exactly one volume source", False),
    "volume-two-sources": ({"template": {"volumes": [{"name": "data", "emptyDir": {}, "hostPath": {"path": "/d"}}]}},
                           "spec.template.volumes", "it has emptyDir, hostPath", False),
}


def _manifest(spec: dict) -> dict:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(copy.deepcopy(spec))
    return doc


def _crd_schema() -> dict:
    return crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_refuses_what_the_api_server_refuses_naming_the_field(tmp_path, capsys, case):
    spec, field, text, crd_too = CASES[case]
    doc = _manifest(spec)
    assert_validate_and_the_operator_refuse(tmp_path, capsys, doc, field, text)
    if crd_too:  # `kubectl apply` refuses it too, judged by another CEL implementation
        errors = api_server_errors(_crd_schema(), doc, independent_cel)
        assert any(e.startswith(field) for e in errors), errors


@pytest.mark.parametrize("case", sorted(c for c in CASES if not CASES[c][3]))
def test_without_the_rule_the_rendered_pods_break_the_independent_api_server_rules(monkeypatch, case):
    doc = _manifest(CASES[case][0])
    monkeypatch.setattr(pod_rules, "problems", lambda spec: [])
    job = validation.parse_job(doc)
    manifests = job_manifests.all_manifests(naming.JobRef.preview("victim", "default"), job.spec)
    assert [e for m in manifests for e in object_errors(m)], case


LEGAL = {
    "env": [{"name": "POD", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
            {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['example.com/team']"}}},
            {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['Example.com/Note']"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "HUGE", "valueFrom": {"resourceFieldRef": {"resource": "limits.hugepages-2Mi"}}},
            {"name": "LR", "valueFrom": {"configMapKeyRef": {**CONFIG, "optional": True}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token.txt"}}}],
    "template": {
        "volumes": [{"name": "data", "emptyDir": {}}, {"name": "conf", "configMap": {"name": "c"}}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {}, {"matchExpressions": [{"key": "pool", "operator": "Exists"},
                                              {"key": "cores", "operator": "Gt", "values": ["8"]},
                                              {"key": "zone", "operator": "NotIn", "values": ["", "a"]}],
                         "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}}]},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"a": "b"}},
                                                  "namespaces": ["team-a"]}}]}},
        "podSpec": {
            "hostUsers": False, "hostNetwork": False,
            "readinessGates": [{"conditionType": "example.com/ready"}],
            "schedulingGates": [{"name": "example.com/quota"}, {"name": "capacity"}],
            "initContainers": [{**INIT, "env": [{"name": "POD", "valueFrom": {"fieldRef": {
                "fieldPath": "status.podIP"}}}]}],
            "topologySpreadConstraints": [
                {**SPREAD, "minDomains": 3, "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore",
                 "matchLabelKeys": ["pod-template-hash"],
                 "labelSelector": {"matchLabels": {"elastic.ddp.dev/job-name": "victim"}}},
                {**SPREAD, "whenUnsatisfiable": "ScheduleAnyway"},
                {**SPREAD, "topologyKey": "kubernetes.io/hostname"}]}},
}


def test_the_legal_neighbours_are_accepted_by_validate_the_crd_and_the_api_server(tmp_path, capsys):
    doc = _manifest(LEGAL)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", str(path)]) == 0, capsys.readouterr().err
    assert api_server_errors(_crd_schema(), doc, independent_cel) == []
    job = validation.parse_job(doc)
    manifests = job_manifests.all_manifests(naming.JobRef.preview("victim", "default"), job.spec)
    assert [e for m in manifests for e in object_errors(m)] == []
