"""Hostile and careless manifests (issue 23, items 2, 7, 8, 10, 11): each is refused by `ddpjob validate` and
by the CRD, naming the field, and never renders a pod the API server or the kubelet would refuse."""

from __future__ import annotations

import copy
import re
import resource
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import cli, crd, job_manifests, model, naming, validation
from ddpjob_operator.agent import contract
from ddpjob_operator.settings import Settings

from .apiserver_rules import object_errors
from .schema_checks import api_server_errors, independent_cel

ROOT = Path(__file__).resolve().parents[2]
BASE = {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "victim"},
        "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer",
                 "checkpoint": {"claimTemplate": {"size": "1Gi"}}}}


def _crd_schema() -> dict:
    return crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def manifest(spec: dict | None = None, **top) -> dict:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec or {})
    doc.update(top)
    return doc


def validate(tmp_path: Path, doc: dict | str, capsys) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    code = cli.main(["validate", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def assert_refused(tmp_path, capsys, doc: dict, field: str, text: str, *, crd_too: bool = True) -> None:
    code, err = validate(tmp_path, doc, capsys)
    assert code == validation.EXIT_INVALID, f"validate accepted it; it renders:\n{_render_errors(doc)}"
    lines = [line for line in err.splitlines() if f": {field}" in line]
    assert lines, f"no error naming {field}:\n{err}"
    assert any(text in line for line in lines), f"{text!r} not in {lines}"
    assert any("Fix:" in line or ": " in line for line in lines)
    if crd_too:
        errors = api_server_errors(_crd_schema(), doc, independent_cel)
        assert any(e.startswith(field) for e in errors), f"the CRD accepts what validate refuses: {errors}"


def _render_errors(doc: dict) -> list[str]:
    try:
        job = validation.parse_job(doc)
    except validation.InvalidJob as exc:
        return [str(exc)]
    ref = naming.JobRef.preview(job.metadata.name, "default")
    return [e for m in job_manifests.all_manifests(ref, job.spec) for e in object_errors(m)]


# ---------------------------------------------------------------- 2: numbers the code can represent


@pytest.mark.parametrize("field", ["activeDeadlineSeconds", "ttlSecondsAfterFinished"])
def test_huge_durations_are_refused_naming_the_field(tmp_path, capsys, field):
    doc = manifest({"runPolicy": {field: 10**20}})
    assert_refused(tmp_path, capsys, doc, f"spec.runPolicy.{field}", "must be <=")


def test_every_number_in_the_spec_has_a_maximum_the_code_can_represent():
    spec = _crd_schema()["properties"]["spec"]
    unbounded = []

    def walk(node, path):
        if node.get("type") in ("integer", "number") and "maximum" not in node:
            unbounded.append(path)
        for key, prop in (node.get("properties") or {}).items():
            walk(prop, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}")

    walk(spec, "spec")
    assert unbounded == []
    # The largest duration is still a datetime the operator can compute with.
    assert datetime.now(timezone.utc) + timedelta(seconds=model.k8s.MAX_DURATION_SECONDS) > datetime.now(timezone.utc)


# ---------------------------------------------------------------- 7: the operator's wiring


@pytest.mark.parametrize("entrypoint", ["--standalone", "--max-restarts=100", "-m"])
def test_an_entrypoint_cannot_be_a_torchrun_flag(tmp_path, capsys, entrypoint):
    assert_refused(tmp_path, capsys, manifest({"entrypoint": entrypoint}), "spec.entrypoint", "torchrun")


@pytest.mark.parametrize("prefix", ["PET_", "TORCHELASTIC_", "DDPJOB_", "PET_X_", "P", "MASTER_", "RA", "TORCH_"])
def test_an_env_from_prefix_cannot_produce_a_reserved_name(tmp_path, capsys, prefix):
    doc = manifest({"template": {"trainer": {"envFrom": [{"prefix": prefix, "configMapRef": {"name": "c"}}]}}})
    assert_refused(tmp_path, capsys, doc, "spec.template.trainer.envFrom", "prefix")


def test_a_harmless_env_from_prefix_is_accepted(tmp_path, capsys):
    doc = manifest({"template": {"trainer": {"envFrom": [{"prefix": "APP_", "configMapRef": {"name": "c"}},
                                                         {"secretRef": {"name": "s"}}]}}})
    assert validate(tmp_path, doc, capsys)[0] == 0
    assert api_server_errors(_crd_schema(), doc, independent_cel) == []


def _operator_env_names() -> set[str]:
    spec = validation.parse_job(manifest({"replicas": 2, "minReplicas": 2})).spec  # static: MASTER_* too
    pod = job_manifests.worker_pod(naming.JobRef("victim", "default", "u"), spec, index=0, generation=0,
                                   progress=job_manifests.ProgressEndpoint("https://p", "a"))
    return {e["name"] for e in pod["spec"]["containers"][0]["env"]}


def test_every_variable_the_operator_sets_is_refused_in_spec_env(tmp_path, capsys):
    names = _operator_env_names()
    assert {"PYTHONUNBUFFERED", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "PET_NNODES", "MASTER_ADDR"} <= names
    for name in sorted(names):
        assert_refused(tmp_path, capsys, manifest({"env": [{"name": name, "value": "x"}]}), "spec.env[0].name",
                       "reserved")
        # ...and no envFrom prefix can produce it either (every proper prefix of the name).
        for cut in (1, len(name) // 2, len(name) - 1):
            doc = manifest({"template": {"trainer": {"envFrom": [{"prefix": name[:cut],
                                                                  "secretRef": {"name": "s"}}]}}})
            with pytest.raises(validation.InvalidJob):
                validation.parse_job(doc)


def test_the_operators_env_wins_over_a_user_entry_of_the_same_name():
    # A spec the model would refuse now (stored before the rule): Kubernetes keeps the LAST duplicate.
    spec = validation.parse_job(manifest()).spec
    spec.env.append(model.EnvVar.model_construct(name="PYTHONUNBUFFERED", value="0", value_from=None))
    spec.env.append(model.EnvVar.model_construct(name="DDPJOB_GENERATION", value="7", value_from=None))
    env = job_manifests.worker_pod(naming.JobRef("victim", "default", "u"), spec, index=0, generation=3)[
        "spec"]["containers"][0]["env"]
    last = {e["name"]: e.get("value") for e in env}  # dict keeps the last value of each name
    assert last["PYTHONUNBUFFERED"] == "1" and last["DDPJOB_GENERATION"] == "3"


def _launcher_and_trainer_names() -> set[str]:
    """Every DDPJOB_ variable the worker's agent and the trainer runtime read (from their sources, so a
    new one is covered), but the user's (DDPJOB_FORK_TRAINER) and the local zygote's."""
    sources = [*(ROOT / "operator" / "ddpjob_operator" / "agent").glob("*.py"),
               *(ROOT / "trainer-image" / "ddp_trainer").rglob("*.py")]
    names = {n for path in sources for n in re.findall(r"\bDDPJOB_[A-Z0-9_]+\b", path.read_text())
             if not n.endswith("_")}
    return names - set(model.USER_SETTABLE_ENV_NAMES) - {contract.PRELOAD_ENV}


def _kubelet_env(container: dict, config_maps: dict[str, dict[str, str]]) -> dict[str, str | None]:
    """The environment the kubelet gives the container: envFrom first, then env, the last of a name winning
    (a valueFrom shown as None)."""
    env: dict[str, str | None] = {}
    for source in container.get("envFrom") or ():
        for key, value in config_maps[source["configMapRef"]["name"]].items():
            env[source.get("prefix", "") + key] = value
    for var in container["env"]:
        env[var["name"]] = var.get("value") if "valueFrom" not in var else None
    return env


def test_an_env_from_without_prefix_cannot_set_the_operators_variables(tmp_path, capsys):
    """validate cannot see a ConfigMap's keys: every variable the launcher or trainer reads is the pod's own
    explicit entry (off as ""), which Kubernetes puts over envFrom, in workers and spares alike."""
    names = _launcher_and_trainer_names()
    assert {contract.SPARE_ENV, contract.REJOIN_ENV, contract.ASSIGNMENT_FILE_ENV, contract.PROGRESS_URL_ENV,
            contract.TERMINATION_LOG_ENV, "DDPJOB_CHECKPOINT_DIR"} <= names
    hostile = {name: "/tmp/hostile" for name in names} | {contract.SPARE_ENV: "1", contract.REJOIN_ENV: "1"}
    doc = manifest({"checkpoint": None, "failurePolicy": {"restartScope": "All"},
                    "template": {"trainer": {"envFrom": [{"configMapRef": {"name": "settings"}}]}}})
    assert validate(tmp_path, doc, capsys)[0] == 0
    spec = validation.parse_job(doc).spec
    job = naming.JobRef("victim", "default", "u")
    for progress in (None, job_manifests.ProgressEndpoint("http://p:8090", "a")):
        pod = job_manifests.worker_pod(job, spec, index=0, generation=0, progress=progress)
        [container] = pod["spec"]["containers"]
        explicit = {e["name"] for e in container["env"]}
        assert names <= explicit, sorted(names - explicit)
        seen = _kubelet_env(container, {"settings": hostile})
        assert not [n for n in names if seen[n] == hostile[n]], seen
        assert seen[contract.SPARE_ENV] == "" and seen[contract.REJOIN_ENV] == "0"
        assert seen[contract.TERMINATION_LOG_ENV] == contract.TERMINATION_LOG_PATH
    spare_spec = validation.parse_job(manifest({"failurePolicy": {"restartScope": "Pod", "spares": 1},
                                                "template": doc["spec"]["template"]})).spec
    spare = job_manifests.spare_pod(job, spare_spec, serial=0, generation=0, progress=job_manifests.ProgressEndpoint(
        "http://p:8090", "a"))
    [container] = spare["spec"]["containers"]
    assert [e["name"] for e in container["env"]].count(contract.SPARE_ENV) == 1
    seen = _kubelet_env(container, {"settings": dict.fromkeys(names, "hostile")})
    assert seen[contract.SPARE_ENV] == "1" and "hostile" not in seen.values()


# ---------------------------------------------------------------- 8: resource names


@pytest.mark.parametrize("name", ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "kubernetes.io/gpu",
                                  "example.kubernetes.io/gpu", "requests.nvidia.com/gpu", "nvidia.com/", "gpu"])
def test_gpu_resource_name_must_be_an_extended_resource(tmp_path, capsys, name):
    doc = manifest({"resources": {"gpu": True, "gpuResourceName": name}})
    assert_refused(tmp_path, capsys, doc, "spec.resources.gpuResourceName", "gpu")


def test_a_device_plugin_resource_name_is_accepted(tmp_path, capsys):
    doc = manifest({"resources": {"gpu": True, "gpuResourceName": "amd.com/gpu", "cpu": "4", "memory": "64Gi"}})
    assert validate(tmp_path, doc, capsys)[0] == 0
    pod = job_manifests.worker_pod(naming.JobRef("victim", "default", "u"), validation.parse_job(doc).spec,
                                   index=0, generation=0)
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "4", "memory": "64Gi", "amd.com/gpu": "1"}


# ---------------------------------------------------------------- 10: pods the API server would refuse

HOSTILE = {
    "mount-trailing-slash": ({"template": {"volumes": [{"name": "d", "emptyDir": {}}],
                                           "volumeMounts": [{"name": "d", "mountPath": "/dev/shm/"}]}},
                             "spec.template.volumeMounts", "mountPath"),
    "mount-doubled-slash": ({"template": {"volumes": [{"name": "d", "emptyDir": {}}],
                                          "volumeMounts": [{"name": "d", "mountPath": "//checkpoints"}]}},
                            "spec.template.volumeMounts", "mountPath"),
    "mount-over-the-token": ({"template": {"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [
        {"name": "d", "mountPath": "/var/run/secrets/ddpjob/progress"}]}}, "spec.template.volumeMounts", "operator"),
    "checkpoint-on-shm": ({"checkpoint": {"claimTemplate": {"size": "1Gi"}, "mountPath": "/dev/shm"}},
                          "spec.checkpoint.mountPath", "operator"),
    "duplicate-volumes": ({"template": {"volumes": [{"name": "d", "emptyDir": {}}, {"name": "d", "emptyDir": {}}]}},
                          "spec.template.volumes", "unique"),
    "duplicate-mount-paths": ({"template": {"volumes": [{"name": "d", "emptyDir": {}}, {"name": "e", "emptyDir": {}}],
                                            "volumeMounts": [{"name": "d", "mountPath": "/data"},
                                                             {"name": "e", "mountPath": "/data"}]}},
                              "spec.template.volumeMounts", "unique"),
    "mount-of-no-volume": ({"template": {"volumeMounts": [{"name": "nowhere", "mountPath": "/data"}]}},
                           "spec.template.volumeMounts", "template.volumes"),
    "progress-token-volume-name": ({"template": {"volumes": [{"name": "ddpjob-progress-token", "emptyDir": {}}]}},
                                   "spec.template.volumes", "operator"),
    "volume-name-too-long": ({"template": {"volumes": [{"name": "v" * 64, "emptyDir": {}}]}},
                             "spec.template.volumes", "at most 63"),
    "volume-name-not-a-label": ({"template": {"volumes": [{"name": "Data_1", "emptyDir": {}}]}},
                                "spec.template.volumes", "DNS-1123"),
    "cpu-malformed": ({"resources": {"cpu": "1.2.3"}}, "spec.resources.cpu", "quantity"),
    "memory-negative": ({"resources": {"memory": "-1Gi"}}, "spec.resources.memory", "quantity"),
    "extra-resource-malformed": ({"template": {"trainer": {"resources": {"requests": {"rdma/hca": "lots"}}}}},
                                 "spec.template.trainer.resources.requests", "quantity"),
    "claim-size-zero": ({"checkpoint": {"claimTemplate": {"size": "0Gi"}}}, "spec.checkpoint.claimTemplate.size",
                        "above zero"),
    "label-value": ({"template": {"labels": {"team": "a b"}}}, "spec.template.labels", "invalid format"),
    "label-key": ({"template": {"labels": {"-team": "a"}}}, "spec.template.labels", "key"),
    "node-selector-value": ({"template": {"nodeSelector": {"pool": "x" * 64}}}, "spec.template.nodeSelector",
                            "too long"),
    "dns-none-without-config": ({"template": {"podSpec": {"dnsPolicy": "None"}}},
                                "spec.template.podSpec.dnsConfig", "nameservers"),
    "dns-policy-unknown": ({"template": {"podSpec": {"dnsPolicy": "Cluster"}}}, "spec.template.podSpec.dnsPolicy",
                           "dnsPolicy"),
    "image-whitespace": ({"image": "trainer :1"}, "spec.image", "whitespace"),
    "toleration-key": ({"template": {"tolerations": [{"key": "-gpu", "operator": "Exists"}]}},
                       "spec.template.tolerations", "key"),
    "toleration-exists-with-value": ({"template": {"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}},
                                     "spec.template.tolerations", "Exists"),
    "init-container-mount-of-no-volume": ({"template": {"podSpec": {"initContainers": [
        {"name": "init", "image": "busybox", "volumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}]}}},
        "spec.template.podSpec.initContainers", "template.volumes"),
    "store-image-whitespace": ({"rendezvous": {"storeImage": " torch:2"}}, "spec.rendezvous.storeImage", "whitespace"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE), ids=str)
def test_manifests_that_render_refused_pods_are_refused(tmp_path, capsys, case):
    spec, field, text = HOSTILE[case]
    assert_refused(tmp_path, capsys, manifest(spec), field, text)


def test_extended_resources_are_whole_and_not_overcommitted(tmp_path, capsys):
    # Beyond a CRD schema (quantity arithmetic): validate and the operator refuse it alike, naming the field.
    for requests, limits in (({"rdma/hca": "1"}, {"rdma/hca": "2"}), ({"rdma/hca": "500m"}, {"rdma/hca": "500m"}),
                             ({"hugepages-2Mi": "1Gi"}, {"hugepages-2Mi": "1Gi"}), ({"ephemeral-storage": "2Gi"},
                                                                                     {"ephemeral-storage": "1Gi"})):
        doc = manifest({"template": {"trainer": {"resources": {"requests": requests, "limits": limits}}}})
        assert_refused(tmp_path, capsys, doc, "spec.template.trainer.resources.requests", "", crd_too=False)
    with pytest.raises(validation.InvalidJob, match="spec.template.trainer.resources.requests"):
        validation.parse_spec(doc["spec"])


def test_a_name_whose_worker_fqdn_is_too_long_with_set_hostname_as_fqdn(tmp_path, capsys):
    doc = manifest({"template": {"podSpec": {"setHostnameAsFQDN": True}}, "maxReplicas": 100},
                   metadata={"name": "a" * 14})
    assert_refused(tmp_path, capsys, doc, "metadata.name", "setHostnameAsFQDN")
    short = manifest({"template": {"podSpec": {"setHostnameAsFQDN": True}}}, metadata={"name": "ab"})
    assert validate(tmp_path, short, capsys)[0] == 0
    # The real namespace is known to render: one that makes the FQDN too long is refused there.
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(short))
    assert cli.main(["render", str(path), "-n", "n" * 40]) == validation.EXIT_INVALID
    assert "setHostnameAsFQDN" in capsys.readouterr().err
    assert cli.main(["render", str(path), "-n", "team-a"]) == 0


# ---------------------------------------------------------------- 11: YAML and types

# Mappings, so that the bomb sits in a free-form field (template.affinity) that the model passes through.
BILLION_LAUGHS = "\n".join(
    ["apiVersion: elastic.ddp.dev/v1alpha1", "kind: DDPJob", "metadata: {name: lol}", "a0: &a0 {a: lol, b: lol}"]
    + [f"a{i}: &a{i} {{a: *a{i - 1}, b: *a{i - 1}, c: *a{i - 1}, d: *a{i - 1}, e: *a{i - 1}, f: *a{i - 1}}}"
       for i in range(1, 10)]
    + ["spec: {replicas: 1, image: t, entrypoint: m, template: {affinity: *a9}}"]) + "\n"


@pytest.mark.timeout(60)
def test_nested_aliases_are_refused_without_expanding_them(tmp_path, capsys):
    assert len(BILLION_LAUGHS) < 1024  # 2 x 6^9 = 20 million values when expanded
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, err = validate(tmp_path, BILLION_LAUGHS, capsys)
    assert code == validation.EXIT_INVALID and "aliases expand to more than" in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024  # KiB: nothing was expanded


def test_a_small_alias_still_works(tmp_path, capsys):
    # Inside known fields: an unknown root key holding the anchor would be refused, as by the API server.
    text = ("apiVersion: elastic.ddp.dev/v1alpha1\nkind: DDPJob\nmetadata: {name: ok, labels: &labels {team: a}}\n"
            "spec: {replicas: 1, image: t, entrypoint: m, template: {labels: *labels}}\n")
    code, err = validate(tmp_path, text, capsys)
    assert code == 0, err


def test_oversized_and_deeply_nested_files_are_refused(tmp_path, capsys):
    code, err = validate(tmp_path, "a: " + "x" * (validation.MAX_YAML_BYTES + 1) + "\n", capsys)
    assert code == validation.EXIT_INVALID and "larger than" in err
    code, err = validate(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n", capsys)
    assert code == validation.EXIT_INVALID and "nested deeper" in err


def test_duplicate_keys_are_an_error_naming_the_key_and_line(tmp_path, capsys):
    text = yaml.safe_dump(manifest(), sort_keys=False).replace("  replicas: 2\n", "  replicas: 2\n  replicas: 200\n")
    code, err = validate(tmp_path, text, capsys)
    line = text.splitlines().index("  replicas: 200") + 1
    assert code == validation.EXIT_INVALID
    assert f"duplicate key 'replicas' (first at line {line - 1})" in err and f"line {line}" in err


def test_duplicate_keys_on_one_line_are_an_error(tmp_path, capsys):
    # Flow style puts both keys on one line: the API server's strict decoding still refuses the second.
    doc = "apiVersion: elastic.ddp.dev/v1alpha1\nkind: DDPJob\nmetadata: {name: dup, name: other}\n"
    code, err = validate(tmp_path, doc + yaml.safe_dump({"spec": manifest()["spec"]}), capsys)
    assert code == validation.EXIT_INVALID
    assert "duplicate key 'name' (first at line 3)" in err


@pytest.mark.parametrize("field, value", [("replicas", True), ("replicas", "2"), ("nprocPerNode", False),
                                          ("replicas", 2.5)])
def test_types_are_strict_like_the_api_server(tmp_path, capsys, field, value):
    doc = manifest({field: value})
    assert_refused(tmp_path, capsys, doc, f"spec.{field}", "whole number")


def test_a_whole_float_is_an_integer_as_kubectl_sends_it(tmp_path, capsys):
    # kubectl turns YAML into JSON through a float64: `2.0` reaches the API server as `2`, which it accepts.
    assert validate(tmp_path, yaml.safe_dump(manifest()).replace("replicas: 2", "replicas: 2.0"), capsys)[0] == 0
    assert validation.parse_job(manifest({"replicas": 2.0})).spec.replicas == 2


@pytest.mark.parametrize("spec", [{"runPolicy": {"suspend": "true"}}, {"image": 5},
                                  {"failurePolicy": {"backoff": {"factor": "2"}}}])
def test_no_coercion_of_bools_strings_and_numbers(tmp_path, capsys, spec):
    code, err = validate(tmp_path, manifest(spec), capsys)
    assert code == validation.EXIT_INVALID, "validate coerced a value the API server refuses"
    assert api_server_errors(_crd_schema(), manifest(spec), independent_cel) != []


# ---------------------------------------------------------------- render shows what the operator creates


def test_render_shows_the_progress_token_volume_and_env_as_the_operator_creates_them(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest()))
    url, audience = "http://ddpjob-operator-progress.ddpjob-system.svc:8090", Settings().progress_audience
    assert cli.main(["render", str(path), "-n", "team-a", "--progress-url", url]) == 0
    rendered = list(yaml.safe_load_all(capsys.readouterr().out))
    workers = [m for m in rendered if m["kind"] == "Pod" and "worker" in m["metadata"]["name"]]
    job = validation.parse_job(manifest())
    ref = naming.JobRef.preview("victim", "team-a")
    expected = [job_manifests.worker_pod(ref, job.spec, index=i, generation=0,
                                         progress=job_manifests.ProgressEndpoint(url, audience)) for i in range(2)]
    assert workers == expected
    env = {e["name"] for e in workers[0]["spec"]["containers"][0]["env"]}
    assert {contract.PROGRESS_URL_ENV, contract.PROGRESS_TOKEN_ENV} <= env
    assert job_manifests.PROGRESS_TOKEN_VOLUME in {v["name"] for v in workers[0]["spec"]["volumes"]}
    # Without --progress-url the base is a visible placeholder, never a made-up address.
    assert cli.main(["render", str(path)]) == 0
    assert "<progress-url>/v1/namespaces/default/ddpjobs/victim/progress" in capsys.readouterr().out


def test_render_shows_the_progress_ca_of_an_https_endpoint(tmp_path, capsys):
    """With --progress-ca, render gives workers DDPJOB_PROGRESS_CA as the operator does from its CA file."""
    from ddpjob_operator import progress_router  # the operator's own reader of DDPJOB_OPERATOR_PROGRESS_CA_FILE

    path, ca = tmp_path / "job.yaml", tmp_path / "ca.crt"
    path.write_text(yaml.safe_dump(manifest()))
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n\n")
    url, audience = "https://ddpjob-operator-progress.ddpjob-system.svc:8090", Settings().progress_audience
    assert cli.main(["render", str(path), "-n", "team-a", "--progress-url", url, "--progress-ca", str(ca)]) == 0
    workers = [m for m in yaml.safe_load_all(capsys.readouterr().out)
               if m["kind"] == "Pod" and "worker" in m["metadata"]["name"]]
    spec, ref = validation.parse_job(manifest()).spec, naming.JobRef.preview("victim", "team-a")
    operator = job_manifests.ProgressEndpoint(url, audience, progress_router.read_ca(str(ca)))
    assert workers == [job_manifests.worker_pod(ref, spec, index=i, generation=0, progress=operator) for i in range(2)]
    env = {e["name"]: e.get("value") for e in workers[0]["spec"]["containers"][0]["env"]}
    assert env[contract.PROGRESS_CA_ENV] == ca.read_text().strip()
    # A CA that cannot be read is said, naming the option, never rendered as "no CA".
    assert cli.main(["render", str(path), "--progress-url", url, "--progress-ca", str(tmp_path / "none")]) == \
        validation.EXIT_INVALID
    assert "--progress-ca" in capsys.readouterr().err


def test_the_model_knows_the_operators_volume_and_paths():
    assert job_manifests.PROGRESS_TOKEN_VOLUME.startswith(model.OPERATOR_VOLUME_PREFIX)
    assert job_manifests.PROGRESS_TOKEN_DIR.startswith(model.OPERATOR_SECRETS_DIR + "/")
    assert contract.TERMINATION_LOG_PATH == model.TERMINATION_LOG


def test_validate_is_fast_to_refuse_in_a_fresh_process(tmp_path):
    # The command itself, as a user runs it: an exit status and a message, never a traceback.
    path = tmp_path / "lol.yaml"
    path.write_text(BILLION_LAUGHS)
    done = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == validation.EXIT_INVALID and "Traceback" not in done.stderr
