"""What the API server or the kubelet refuses in a worker pod's pass-through fields, that no CRD schema says
(issue 31, item 5): `ddpjob validate` (and the operator, with the same words) refuses each, naming the field and
the fix; the same features written correctly pass."""

from __future__ import annotations

import copy

import pytest
import yaml

from ddpjob_operator import cli, job_manifests, naming, pod_rules, validation

from .apiserver_rules import object_errors
from .refusals import assert_validate_and_the_operator_refuse

BASE = {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "victim"},
        "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer",
                 "checkpoint": {"claimTemplate": {"size": "1Gi"}}}}
INIT = {"name": "fetch", "image": "busybox:1"}
BIG = "x" * (128 * 1024)


def _pod(**fields) -> dict:
    return {"template": {"podSpec": fields}}


def _trainer(**fields) -> dict:
    return {"template": {"trainer": fields}}


CASES = {
    "windows": (_pod(os={"name": "windows"}), "spec.template.podSpec.os", "name: linux"),
    "init-without-image": (_pod(initContainers=[{"name": "fetch"}]), "spec.template.podSpec.initContainers",
                           "has no image"),
    "subpath-escape": ({"template": {"volumes": [{"name": "d", "emptyDir": {}}],
                                     "volumeMounts": [{"name": "d", "mountPath": "/data", "subPath": "../../etc"}]}},
                       "spec.template.volumeMounts", "without '..'"),
    "init-subpath-absolute": ({"template": {"volumes": [{"name": "d", "emptyDir": {}}], "podSpec": {"initContainers": [
        {**INIT, "volumeMounts": [{"name": "d", "mountPath": "/d", "subPath": "/etc"}]}]}}},
        "spec.template.podSpec.initContainers[0].volumeMounts", "relative path"),
    "annotations-over-256k": ({"template": {"annotations": {f"k{i}": "v" * 60_000 for i in range(5)}}},
                              "spec.template.annotations", "256 KiB"),
    "pod-deletion-cost": ({"template": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "high"}}},
                          "spec.template.annotations", "int32"),
    "pod-deletion-cost-overflow": ({"template": {"annotations": {
        "controller.kubernetes.io/pod-deletion-cost": "2147483648"}}}, "spec.template.annotations", "int32"),
    "priority-class": ({"template": {"priorityClassName": "High_Priority"}}, "spec.template.priorityClassName",
                       "DNS-1123 subdomain"),
    "store-priority-class": ({"rendezvous": {"storeTemplate": {"priorityClassName": "UPPER"}}},
                             "spec.rendezvous.storeTemplate.priorityClassName", "DNS-1123 subdomain"),
    "storage-class": ({"checkpoint": {"claimTemplate": {"size": "1Gi", "storageClassName": "Fast SSD"}}},
                      "spec.checkpoint.claimTemplate.storageClassName", "DNS-1123 subdomain"),
    "probe-without-handler": (_trainer(livenessProbe={"periodSeconds": 10}), "spec.template.trainer.livenessProbe",
                              "exactly one handler"),
    "probe-two-handlers": (_trainer(readinessProbe={"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}}),
                           "spec.template.trainer.readinessProbe", "exactly one handler"),
    "probe-port": (_trainer(startupProbe={"tcpSocket": {"port": 70000}}), "spec.template.trainer.startupProbe",
                   "1-65535"),
    "init-probe-without-handler": (_pod(initContainers=[{**INIT, "restartPolicy": "Always", "readinessProbe": {}}]),
                                   "spec.template.podSpec.initContainers[0].readinessProbe", "exactly one handler"),
    "container-port-zero": (_trainer(ports=[{"containerPort": 0}]), "spec.template.trainer.ports", "1-65535"),
    "container-port-high": (_trainer(ports=[{"containerPort": 65536}]), "spec.template.trainer.ports", "1-65535"),
    "host-port-high": (_trainer(ports=[{"containerPort": 80, "hostPort": 99999}]), "spec.template.trainer.ports",
                       "hostPort"),
    "init-port": (_pod(initContainers=[{**INIT, "ports": [{"containerPort": -1}]}]),
                  "spec.template.podSpec.initContainers[0].ports", "1-65535"),
    "nameserver-not-ip": (_pod(dnsPolicy="None", dnsConfig={"nameservers": ["kube-dns"]}),
                          "spec.template.podSpec.dnsConfig", "not an IP"),
    "host-alias-not-ip": (_pod(hostAliases=[{"ip": "db.local", "hostnames": ["db"]}]),
                          "spec.template.podSpec.hostAliases", "not an IP"),
    "host-network-host-port": ({"template": {"podSpec": {"hostNetwork": True}, "trainer": {
        "ports": [{"containerPort": 8080, "hostPort": 9090}]}}}, "spec.template.trainer.ports", "must equal"),
    "hugepages-not-whole-pages": ({"resources": {"memory": "1Gi"}, **_trainer(resources={
        "requests": {"hugepages-2Mi": "3Mi"}, "limits": {"hugepages-2Mi": "3Mi"}})},
                                  "spec.template.trainer.resources.requests", "multiple of the page size"),
    "share-process-namespace-with-host-pid": (_pod(shareProcessNamespace=True, hostPID=True),
                                              "spec.template.podSpec.shareProcessNamespace", "cannot both"),
    "overhead-without-runtime-class": (_pod(overhead={"cpu": "250m"}), "spec.template.podSpec.overhead",
                                       "runtimeClassName"),
    "arg-over-128k": ({"args": ["--data", BIG]}, "spec.args[1]", "MAX_ARG_STRLEN"),
    "arg-with-nul": ({"args": ["a\x00b"]}, "spec.args[0]", "NUL"),
    "env-over-128k": ({"env": [{"name": "DATA", "value": BIG[:-5]}]}, "spec.env[0].value", "MAX_ARG_STRLEN"),
    "env-with-nul": ({"env": [{"name": "DATA", "value": "a\x00"}]}, "spec.env[0].value", "NUL"),
    "host-network-cluster-first": (_pod(hostNetwork=True, dnsPolicy="ClusterFirst"),
                                   "spec.template.podSpec.dnsPolicy", "ClusterFirstWithHostNet"),
    "second-gpu-vendor": ({"resources": {"gpu": True}, "template": {"trainer": {"resources": {
        "requests": {"amd.com/gpu": "1"}, "limits": {"amd.com/gpu": "1"}}}}},
        "spec.template.trainer.resources.requests", "another device plugin"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_pod_the_api_server_or_kubelet_refuses_is_refused_by_validate(tmp_path, capsys, case):
    spec, field, text = CASES[case]
    doc = copy.deepcopy(BASE)
    doc["spec"].update(copy.deepcopy(spec))
    assert_validate_and_the_operator_refuse(tmp_path, capsys, doc, field, text)


def test_the_same_features_written_correctly_are_accepted(tmp_path, capsys):
    doc = copy.deepcopy(BASE)
    doc["spec"].update({
        "args": ["--data", BIG[:-100]], "env": [{"name": "DATA", "value": BIG[:-100]}],
        "resources": {"gpu": True, "gpuResourceName": "amd.com/gpu", "cpu": "1"},
        "checkpoint": {"claimTemplate": {"size": "1Gi", "storageClassName": "fast-ssd.example.com"}},
        "rendezvous": {"storeTemplate": {"priorityClassName": "store"}},
        "template": {
            "priorityClassName": "high-priority", "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-5"},
            "volumes": [{"name": "d", "emptyDir": {}}],
            "volumeMounts": [{"name": "d", "mountPath": "/data", "subPath": "runs/one..two"}],
            "podSpec": {"os": {"name": "linux"}, "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                        "runtimeClassName": "kata", "overhead": {"cpu": "250m"}, "shareProcessNamespace": True,
                        "dnsConfig": {"nameservers": ["10.96.0.10", "fd00::a"]},
                        "hostAliases": [{"ip": "10.0.0.5", "hostnames": ["db"]}],
                        "initContainers": [{**INIT, "restartPolicy": "Always",
                                            "readinessProbe": {"httpGet": {"port": "metrics"}}}]},
            "trainer": {"ports": [{"containerPort": 9090, "hostPort": 9090, "name": "metrics"}],
                        "livenessProbe": {"tcpSocket": {"port": 9090}},
                        "resources": {"requests": {"hugepages-2Mi": "4Mi"}, "limits": {"hugepages-2Mi": "4Mi"}}}},
    })
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    code = cli.main(["validate", str(path)])
    assert code == 0, capsys.readouterr().err
    assert pod_rules.problems(doc["spec"]) == []


def test_an_empty_storage_class_means_no_class_and_is_kept():
    spec = {**BASE["spec"], "checkpoint": {"claimTemplate": {"size": "1Gi", "storageClassName": ""}}}
    assert pod_rules.problems(spec) == []


def test_validate_says_it_checked_offline(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "valid DDPJob victim" in out and "offline" in out and "ddpjob submit" in out


# One vendor per job is the operator's rule (NCCL and the toleration follow gpuResourceName), not the server's.
SERVER_REFUSES = sorted(set(CASES) - {"second-gpu-vendor"})


@pytest.mark.parametrize("case", SERVER_REFUSES)
def test_without_the_rule_the_rendered_objects_break_the_independent_api_server_rules(monkeypatch, case):
    # A cross-check against tests/api/apiserver_rules.py (written apart from pod_rules): each case is a real refusal.
    spec, _, _ = CASES[case]
    doc = copy.deepcopy(BASE)
    doc["spec"].update(copy.deepcopy(spec))
    monkeypatch.setattr(pod_rules, "problems", lambda spec: [])
    job = validation.parse_job(doc)
    manifests = job_manifests.all_manifests(naming.JobRef.preview("victim", "default"), job.spec)
    assert [e for m in manifests for e in object_errors(m)], case
