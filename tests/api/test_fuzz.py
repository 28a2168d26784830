"""Property-based: for generated manifests, valid and near-valid (issue 23),

- `validate` and the CRD (schema and CEL rules, as the API server applies them) agree, except for the
  quantity arithmetic a schema cannot express, which only the model checks;
- when `validate` accepts, `render` succeeds and every object it creates passes the Kubernetes schemas
  (kubernetes-validate, its newest Kubernetes) and the API server's rules that schemas miss (apiserver_rules).

Bounded and deterministic: a fixed number of examples from a derandomized generator, no example database.
"""

from __future__ import annotations

import json

import kubernetes_validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpjob_operator import crd, job_manifests, naming, validation

from .apiserver_rules import object_errors
from .schema_checks import api_server_errors, independent_cel

VERSION = kubernetes_validate.latest_version()
SCHEMA = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
PROGRESS = job_manifests.ProgressEndpoint("https://ddpjob-operator-progress.ddpjob-system.svc:8090",
                                          "progress.elastic.ddp.dev")

# Each pool: what is fine, then what is almost fine (the boundaries the API server draws). A draw is near-valid
# one time in RARE, so that a manifest of some twenty draws is as often accepted as refused.
RARE = 16
NAMES = (["digits", "a", "x" * 50, "job-1", "ab"], ["Job", "1job", "x" * 51, "a-", "a" * 14])
INTS = ([1, 2, 3], [0, -1, True, "2", 2.0, 10**20])
QUANTITIES = (["1", "500m", "16Gi", "1.5", "1e3", "0.5Gi", "2Ki", 4, "0"], ["1.2.3", "-1", "1Gi ", "lots", "", True])
IMAGES = (["trainer:1", "registry.example.com/t@sha256:" + "a" * 64], ["trainer :1", " trainer", "", "t\tx"])
ENTRYPOINTS = (["ddp_trainer", "train.py", "pkg.mod"], ["-m", "--standalone", "a b"])
ENV_NAMES = (["LR", "DATA_DIR", "a.b-c", "LR"],
             ["PYTHONUNBUFFERED", "MASTER_ADDR", "PET_NNODES", "DDPJOB_X", "1BAD", "TORCH_NCCL_ASYNC_ERROR_HANDLING"])
PREFIXES = (["APP_", "", "X", "app-"], ["PET_", "P", "TORCH", "1A", "DDPJOB_", "M"])
LABEL_KEYS = (["team", "example.com/team", "Team_1", "a.b/c-d"],
              ["-team", "a/b/c", "x" * 64, "example.com/", "kueue.x-k8s.io/queue-name", "elastic.ddp.dev/x"])
LABEL_VALUES = (["a", "", "A-1.b_c", "x" * 63], ["a b", "x" * 64, "-a", "a-"])
VOLUME_NAMES = (["data", "cache"], ["dshm", "checkpoints", "ddpjob-progress-token", "ddpjob-x", "Data", "x" * 64])
MOUNT_PATHS = (["/data", "/cache", "/a/b", "/"],
               ["/dev/shm", "/dev/shm/", "//data", "data", "/data/../etc", "/a/./b", "/checkpoints", "/checkpoints/",
                "/var/run/secrets/ddpjob/progress", "/dev/termination-log", "/data/"])
RESOURCE_NAMES = (["rdma/hca", "hugepages-2Mi", "ephemeral-storage", "example.com/fpga"],
                  ["foo", "kubernetes.io/x", "nvidia.com/gpu", "cpu"])
GPU_NAMES = (["nvidia.com/gpu", "amd.com/gpu"], ["cpu", "memory", "kubernetes.io/gpu", "gpu", "requests.a.com/gpu"])
TOLERATIONS = ([{"key": "team", "operator": "Exists"}, {"key": "a.b/c", "value": "x", "effect": "NoSchedule"},
                {"operator": "Exists"}, {"key": "n", "effect": "NoExecute", "tolerationSeconds": 30}],
               [{"key": "-x", "operator": "Exists"}, {"value": "x"}, {"key": "a", "operator": "Exists", "value": "b"},
                {"key": "a", "tolerationSeconds": 5}, {"key": "a", "value": "a b"}, {"key": "a", "effect": "Never"}])
DNS_POLICIES = (["ClusterFirst", "ClusterFirstWithHostNet"], ["None", "Default", "cluster"])


def maybe(strategy):
    """A key's value, or the key left out (None: dropped below)."""
    return st.one_of(st.none(), strategy)


def pick(pool):
    good, bad = pool
    return st.integers(0, RARE - 1).flatmap(lambda i: st.sampled_from(bad if i == 0 else good))


def compact(mapping):
    return {k: v for k, v in mapping.items() if v is not None}


volumes = st.lists(pick(VOLUME_NAMES).map(lambda n: {"name": n, "emptyDir": {}}), max_size=3)
mounts = st.lists(st.builds(lambda n, p: {"name": n, "mountPath": p}, pick(VOLUME_NAMES), pick(MOUNT_PATHS)),
                  max_size=3)
labels = st.dictionaries(pick(LABEL_KEYS), pick(LABEL_VALUES), max_size=3)
amounts = st.dictionaries(pick(RESOURCE_NAMES), pick(QUANTITIES), max_size=2)

template = st.builds(lambda **kw: compact(kw), **{
    "labels": maybe(labels),
    "annotations": maybe(st.dictionaries(pick(LABEL_KEYS), st.just("v"), max_size=2)),
    "nodeSelector": maybe(labels),
    "volumes": maybe(volumes),
    "volumeMounts": maybe(mounts),
    "tolerations": maybe(st.lists(pick(TOLERATIONS), max_size=2)),
    "podSpec": maybe(st.builds(lambda **kw: compact(kw), **{
        "dnsPolicy": maybe(pick(DNS_POLICIES)),
        "dnsConfig": maybe(pick(([{"nameservers": ["10.96.0.10"]}], [{"searches": ["svc.cluster.local"]}]))),
        "setHostnameAsFQDN": maybe(st.booleans()),
        "hostNetwork": maybe(st.booleans()),
        "runtimeClassName": maybe(pick((["nvidia"], ["Not_A_Name"]))),
        "initContainers": maybe(pick(([[{"name": "init", "image": "busybox", "command": ["true"]}],
                                       [{"name": "init", "image": "busybox", "volumeMounts": [
                                           {"name": "dshm", "mountPath": "/dev/shm"}]}]],
                                      [[{"name": "trainer", "image": "b"}],
                                       [{"name": "init", "image": "busybox", "volumeMounts": [
                                           {"name": "nowhere", "mountPath": "/x"}]}]]))),
    })),
    "trainer": maybe(st.builds(lambda **kw: compact(kw), **{
        "envFrom": maybe(st.lists(pick(PREFIXES).map(lambda p: {"prefix": p, "configMapRef": {"name": "c"}}),
                                  max_size=2)),
        "resources": maybe(st.builds(lambda **kw: compact(kw), requests=maybe(amounts), limits=maybe(amounts))),
        "workingDir": maybe(st.just("/workspace")),
    })),
})

spec = st.builds(lambda **kw: compact(kw), **{
    "replicas": pick(INTS),
    "minReplicas": maybe(pick(([1, 2], [3, "1"]))),
    "maxReplicas": maybe(pick(([3, 16, 100, 1024], [1, 2000]))),
    "nprocPerNode": maybe(pick(([1, 2], [True, 0]))),
    "image": pick(IMAGES),
    "entrypoint": pick(ENTRYPOINTS),
    "args": maybe(st.lists(pick((["--lr", "0.1", "-m", "$(DDPJOB_POD_IP)"], [""])), max_size=3)),
    "env": maybe(st.lists(st.builds(lambda n, v: {"name": n, "value": v}, pick(ENV_NAMES), pick((["1", ""], ["x"]))),
                          max_size=3)),
    "resources": maybe(st.builds(lambda **kw: compact(kw), **{
        "cpu": maybe(pick(QUANTITIES)), "memory": maybe(pick(QUANTITIES)), "sharedMemory": maybe(pick(QUANTITIES)),
        "gpu": maybe(st.booleans()), "gpuResourceName": maybe(pick(GPU_NAMES)),
    })),
    "template": maybe(template),
    "checkpoint": maybe(st.builds(lambda size, path: compact({"claimTemplate": {"size": size}, "mountPath": path}),
                                  pick(QUANTITIES), maybe(pick(MOUNT_PATHS)))),
    "runPolicy": maybe(st.builds(lambda d, t: compact({"activeDeadlineSeconds": d, "ttlSecondsAfterFinished": t}),
                                 maybe(pick(([60, 315360000], [0, 10**12, "60"]))),
                                 maybe(pick(([0, 86400], [10**15, -1]))))),
    "rendezvous": maybe(st.builds(lambda image, ns: compact({"storeImage": image,
                                                             "storeTemplate": compact({"nodeSelector": ns})}),
                                  maybe(pick(IMAGES)), maybe(labels))),
})

manifests = st.builds(lambda name, body: {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                          "metadata": {"name": name}, "spec": body}, pick(NAMES), spec)


def as_kubectl_sends(doc):
    """YAML -> JSON through Go's float64, as kubectl converts it: a whole float is written as an integer."""
    def number(text):
        value = float(text)
        return int(value) if value.is_integer() else value
    return json.loads(json.dumps(doc), parse_float=number)


def _only_quantity_arithmetic(exc: validation.InvalidJob) -> bool:
    """The model's one rule a CRD schema cannot express (requests <= limits, whole extended resources, ...)."""
    return all(e.path.startswith("spec.template.trainer.resources") and "quantity" not in e.message
               for e in exc.errors)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(manifests)
def test_validate_agrees_with_the_crd_and_accepted_jobs_render_valid_objects(doc):
    crd_errors = api_server_errors(SCHEMA, as_kubectl_sends(doc), independent_cel)
    try:
        job = validation.parse_job(doc)
    except validation.InvalidJob as exc:
        assert crd_errors or _only_quantity_arithmetic(exc), f"validate refused what the CRD accepts: {exc}"
        return
    assert crd_errors == [], f"validate accepted what the CRD refuses: {crd_errors}"
    ref = naming.JobRef.preview(job.metadata.name, "default")
    created = job_manifests.all_manifests(ref, job.spec, progress=PROGRESS)
    assert created
    for obj in created:
        assert object_errors(obj) == [], f"{obj['kind']} {obj['metadata']['name']}: the API server would refuse it"
        if obj["kind"] != "PodGroup":  # not a Kubernetes kind (test_manifest_schemas checks its fields)
            kubernetes_validate.validate(obj, VERSION, strict=True)


def test_the_generator_reaches_both_verdicts():
    # A fuzz test that only ever sees refusals (or only acceptances) proves nothing: count both.
    verdicts = {"accepted": 0, "refused": 0}

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(manifests)
    def count(doc):
        try:
            validation.parse_job(doc)
            verdicts["accepted"] += 1
        except validation.InvalidJob:
            verdicts["refused"] += 1

    count()
    print(verdicts)
    assert verdicts["accepted"] >= 20 and verdicts["refused"] >= 20, verdicts
