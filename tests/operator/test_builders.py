"""Builders: spec -> torchrun argv, launch-contract env, manifests (table-driven, pure)."""

import re
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import agent, job_manifests, launch, model, naming
from ddpjob_operator.agent import contract
from ddpjob_operator.validation import parse_job

ROOT = Path(__file__).resolve().parents[2]
JOB = naming.JobRef("digits", "team-a", "0b9f6d0e-uid")
# The pod's launcher: the agent's entry file in the agent ConfigMap's read-only mount, never program text.
POD_LAUNCHER = ["python", "/var/run/secrets/ddpjob/agent/bootstrap.py", "worker"]


def spec(**overrides) -> model.DDPJobSpec:
    base = {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer", "args": ["--workload", "digits"]}
    return model.DDPJobSpec.model_validate({**base, **overrides})


def node_loss(seconds: int) -> list[dict]:
    return [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")]


NODE_LOSS_DEFAULT = node_loss(5)


def flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


@pytest.mark.parametrize("overrides, expected", [
    ({}, {"nnodes": "2:2", "nproc-per-node": "1", "max-restarts": "0", "shutdown-timeout": "55",
          "rdzv-conf": "is_host=false,join_timeout=600,last_call_timeout=15,read_timeout=60,"
                       "keep_alive_interval=5,keep_alive_max_attempt=3"}),
    # The generation's maximum is its size: a round completes when its last worker joins.
    ({"minReplicas": 1, "maxReplicas": 4, "replicas": 2}, {"nnodes": "1:2"}),
    # One budget, the operator's: torchrun never restarts a trainer in place (docs/operator.md).
    ({"nprocPerNode": 8, "failurePolicy": {"maxRestarts": 7}}, {"nproc-per-node": "8", "max-restarts": "0"}),
    ({"rendezvous": {"joinTimeoutSeconds": 30, "lastCallTimeoutSeconds": 2, "readTimeoutSeconds": 9,
                     "keepAliveIntervalSeconds": 1, "keepAliveMaxAttempts": 2}},
     {"rdzv-conf": "is_host=false,join_timeout=30,last_call_timeout=2,read_timeout=9,"
                   "keep_alive_interval=1,keep_alive_max_attempt=2"}),
    # torchrun's SIGTERM -> SIGKILL wait ends inside the pod's grace period, and is never 0.
    ({"template": {"terminationGracePeriodSeconds": 90}}, {"shutdown-timeout": "85"}),
    ({"template": {"terminationGracePeriodSeconds": 3}}, {"shutdown-timeout": "1"}),
    ({"template": {"terminationGracePeriodSeconds": 0}}, {"shutdown-timeout": "1"}),
])
def test_torchrun_flags(overrides, expected):
    argv = launch.worker_command(spec(**overrides), endpoint="h:1", rdzv_id="u-g0", local_addr="10.0.0.7")
    got = flags(argv)
    assert argv[:3] == POD_LAUNCHER
    assert got["rdzv-backend"] == "c10d" and got["rdzv-endpoint"] == "h:1" and got["rdzv-id"] == "u-g0"
    assert got["local-addr"] == "10.0.0.7"
    assert "is_host=false" in got["rdzv-conf"]  # no worker ever hosts the store
    for key, value in expected.items():
        assert got[key] == value


@pytest.mark.parametrize("entrypoint, args, tail", [
    ("ddp_trainer", ["--workload", "digits"], ["-m", "ddp_trainer", "--workload", "digits"]),
    ("train.py", ["--lr", "0.1"], ["train.py", "--lr", "0.1"]),
    # Shell metacharacters stay inert: one argv element, never a shell string.
    ("ddp_trainer", ["; rm -rf / $(id)"], ["-m", "ddp_trainer", "; rm -rf / $(id)"]),
])
def test_entrypoint_and_args_are_argv_not_shell(entrypoint, args, tail):
    argv = launch.worker_command(spec(entrypoint=entrypoint, args=args), endpoint="h:1", rdzv_id="x",
                                 local_addr="127.0.0.1")
    assert argv[-len(tail):] == tail
    # No program text at all: the launcher is a file, and user input only ever follows it as argv.
    assert argv[:3] == POD_LAUNCHER and "sh" not in argv and "-c" not in argv


def test_rendezvous_id_is_unique_per_job_and_generation():
    ids = {naming.rendezvous_id(uid, g) for uid in ("a", "b") for g in (0, 1)}
    assert len(ids) == 4 and all(i != "none" for i in ids)


def env_for(s: model.DDPJobSpec, **kw) -> dict[str, str]:
    args = {"job_name": "digits", "namespace": "team-a", "index": 1, "generation": 3,
            "endpoint": "digits-rdzv.team-a.svc:29400", "rdzv_id": "u-g3", "local_addr": "10.0.0.7",
            "master_addr": "digits-worker-0.digits-workers.team-a.svc", **kw}
    return launch.worker_env(s, **args)


def test_worker_env_matches_the_launch_contract():
    env = env_for(spec(minReplicas=1, checkpoint={"claimName": "ck", "intervalSteps": 7, "keep": 4},
                       failurePolicy={"recovery": "Restart"}))
    contract = (ROOT / "docs" / "launch-contract.md").read_text()
    documented = set(re.findall(r"`(DDPJOB_[A-Z_]+)`", contract))
    # The pod IP comes from the downward API (worker_pod); every other variable is set, "" where off.
    assert {k for k in env if k.startswith("DDPJOB_")} | {launch.POD_IP_ENV} == documented
    assert env["DDPJOB_REPLICA_INDEX"] == "1" and env["DDPJOB_GENERATION"] == "3"
    assert env["DDPJOB_CHECKPOINT_DIR"] == "/checkpoints"
    assert env["DDPJOB_CHECKPOINT_INTERVAL_STEPS"] == "7" and env["DDPJOB_CHECKPOINT_KEEP"] == "4"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PET_RDZV_ID"] == "u-g3" and env["PET_NNODES"] == "1:2"
    assert env["PET_RDZV_ENDPOINT"] == "digits-rdzv.team-a.svc:29400" and env["PET_LOCAL_ADDR"] == "10.0.0.7"
    assert env["PET_SHUTDOWN_TIMEOUT"] == "55"
    assert not set(env) & set(model.RESERVED_ENV_NAMES), "an elastic job has no fixed rank 0 to point at"


@pytest.mark.parametrize("replicas, expected", [
    ({"replicas": 2}, {"MASTER_ADDR": "digits-worker-0.digits-workers.team-a.svc", "MASTER_PORT": "29500"}),
    ({"replicas": 3, "minReplicas": 3, "maxReplicas": 3},
     {"MASTER_ADDR": "digits-worker-0.digits-workers.team-a.svc", "MASTER_PORT": "29500"}),
    ({"replicas": 2, "minReplicas": 1}, {}),
    ({"replicas": 2, "maxReplicas": 4}, {}),
])
def test_static_jobs_get_master_addr_and_port(replicas, expected):
    env = env_for(spec(**replicas))
    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT") if k in env} == expected
    assert launch.STATIC_MASTER_PORT != model.Rendezvous().port  # never the store's port


@pytest.mark.parametrize("policy, expected, nccl_errors", [
    ({}, "1", "2"),  # the default with restartScope Pod (the default)
    ({"restartScope": "All"}, "", "1"),  # ... and with All
    ({"recovery": "Restart"}, "", "1"),
    ({"recovery": "InProcess"}, "1", "2"),  # a failed NCCL collective raises; the process (the survivor) stays
])
def test_recovery_in_process_switches_the_runtime_on_in_every_worker(policy, expected, nccl_errors):
    env = env_for(spec(failurePolicy=policy))
    assert (env[contract.INPROCESS_ENV], env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]) == (expected, nccl_errors)


def test_worker_env_sets_what_a_worker_has_not_to_empty():
    """Explicit "" (which the launcher and trainer take as unset) rather than absent: an envFrom without a
    prefix cannot then turn on checkpoints, the spare's wait, or a progress endpoint of its own."""
    env = env_for(spec(failurePolicy={"recovery": "Restart"}))
    off = ["DDPJOB_CHECKPOINT_DIR", "DDPJOB_CHECKPOINT_INTERVAL_STEPS", "DDPJOB_CHECKPOINT_KEEP", contract.SPARE_ENV,
           contract.ASSIGNMENT_FILE_ENV, contract.SPARE_READY_FILE_ENV, contract.PROGRESS_URL_ENV,
           contract.PROGRESS_TOKEN_ENV, contract.PROGRESS_CA_ENV, contract.INPROCESS_ENV]
    assert {name: env.get(name) for name in off} == dict.fromkeys(off, "")
    assert env[contract.TERMINATION_LOG_ENV] == contract.TERMINATION_LOG_PATH  # where the kubelet reads it
    assert contract.FORK_TRAINER_ENV not in env  # the user's to set (spec.env)


def test_worker_pod_shape():
    s = spec(env=[{"name": "OMP_NUM_THREADS", "value": "1"}], checkpoint={"claimTemplate": {"size": "1Gi"}},
             template={"labels": {"team": "a"}, "terminationGracePeriodSeconds": 90})
    pod = job_manifests.worker_pod(JOB, s, index=1, generation=2, attempt=3)
    meta, pod_spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "digits-worker-1" and meta["namespace"] == "team-a"
    assert meta["labels"] == {"team": "a", naming.LABEL_JOB_NAME: "digits", naming.LABEL_JOB_UID: JOB.uid,
                              naming.LABEL_ROLE: "worker", naming.LABEL_REPLICA_INDEX: "1",
                              naming.LABEL_GENERATION: "2", naming.LABEL_ATTEMPT: "3",
                              naming.LABEL_NNODES: "2-2", naming.LABEL_MANAGED_BY: "ddpjob-operator"}
    assert meta["ownerReferences"] == [{"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                        "name": "digits", "uid": JOB.uid, "controller": True,
                                        "blockOwnerDeletion": True}]
    assert pod_spec["restartPolicy"] == "Never"
    assert (pod_spec["hostname"], pod_spec["subdomain"]) == ("digits-worker-1", "digits-workers")
    assert pod_spec["terminationGracePeriodSeconds"] == 90
    container = pod_spec["containers"][0]
    assert container["command"][:3] == POD_LAUNCHER
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    got = flags(container["command"])
    assert got["rdzv-endpoint"] == "digits-rdzv.team-a.svc:29400" and got["rdzv-id"] == f"{JOB.uid}-g2"
    assert got["local-addr"] == "$(DDPJOB_POD_IP)" and got["shutdown-timeout"] == "85"
    # The pod IP comes first: Kubernetes expands $(VAR) in later env values (PET_LOCAL_ADDR) and in args.
    assert container["env"][0] == {"name": "DDPJOB_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OMP_NUM_THREADS"] == "1" and env["DDPJOB_GENERATION"] == "2"
    assert env["PET_LOCAL_ADDR"] == "$(DDPJOB_POD_IP)"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("digits-worker-0.digits-workers.team-a.svc", "29500")
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "digits-checkpoints"}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/dev/shm", "/checkpoints", launch.AGENT_DIR}
    assert pod_spec["tolerations"] == NODE_LOSS_DEFAULT and "resources" not in container
    assert pod_spec["securityContext"] == {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}


@pytest.mark.parametrize("template, expected", [
    ({}, {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}),  # the bundled image's group
    ({"fsGroup": 2000}, {"fsGroup": 2000, "fsGroupChangePolicy": "OnRootMismatch"}),
])
def test_checkpoint_volume_is_writable_by_the_trainer_group(template, expected):
    pod = job_manifests.worker_pod(JOB, spec(template=template), index=0, generation=0, attempt=0)
    assert pod["spec"].get("securityContext") == expected


@pytest.mark.parametrize("resources, limits", [
    ({"gpu": True}, {"nvidia.com/gpu": "4"}),
    ({"gpu": True, "gpuCount": 8, "cpu": "8", "memory": "32Gi"},  # more GPUs than processes is allowed
     {"nvidia.com/gpu": "8", "cpu": "8", "memory": "32Gi"}),
    ({"gpu": True, "gpuResourceName": "amd.com/gpu"}, {"amd.com/gpu": "4"}),
])
def test_gpu_wiring(resources, limits):
    s = spec(nprocPerNode=4, resources=resources, template={"tolerations": [{"key": "spot", "operator": "Exists"}]})
    pod_spec = job_manifests.worker_pod(JOB, s, index=0, generation=0)["spec"]
    container = pod_spec["containers"][0]
    assert container["resources"]["limits"] == limits == container["resources"]["requests"]
    gpu_name = next(k for k in limits if "gpu" in k)
    assert pod_spec["tolerations"] == [{"key": "spot", "operator": "Exists"},
                                       {"key": gpu_name, "operator": "Exists", "effect": "NoSchedule"}] + NODE_LOSS_DEFAULT


def test_existing_claim_is_used_as_is_and_no_claim_is_created():
    s = spec(checkpoint={"claimName": "shared-ckpt", "mountPath": "/ck"})
    pod = job_manifests.worker_pod(JOB, s, index=0, generation=0)
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared-ckpt"}} in pod["spec"]["volumes"]
    assert job_manifests.checkpoint_claim(JOB, s) is None


def test_claim_template_becomes_an_owned_pvc():
    s = spec(checkpoint={"claimTemplate": {"size": "5Gi", "storageClassName": "fast",
                                           "accessModes": ["ReadWriteOnce"]}})
    claim = job_manifests.checkpoint_claim(JOB, s)
    assert claim["metadata"]["name"] == "digits-checkpoints"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}},
                             "storageClassName": "fast"}


def test_services_and_store_pod():
    s = spec(rendezvous={"port": 29500, "storeImage": "store:2"})
    headless = job_manifests.headless_service(JOB)
    assert headless["metadata"]["name"] == "digits-workers"
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == naming.worker_selector("digits")
    svc = job_manifests.store_service(JOB, s)
    assert svc["metadata"]["name"] == "digits-rdzv" and svc["spec"]["ports"][0]["port"] == 29500
    store = job_manifests.store_pod(JOB, s)
    assert set(svc["spec"]["selector"].items()) <= set(store["metadata"]["labels"].items())
    assert not set(headless["spec"]["selector"].items()) <= set(store["metadata"]["labels"].items())
    container = store["spec"]["containers"][0]
    assert container["image"] == "store:2"
    # The agent's store program from the job's agent ConfigMap, by reference: the pod carries no program.
    assert container["command"] == [*agent.command("store", python="python", directory=launch.AGENT_DIR), "29500"]
    assert store["spec"]["volumes"] == [job_manifests.agent_volume(JOB)[1]]
    assert container["volumeMounts"] == [job_manifests.agent_volume(JOB)[0]]
    assert store["spec"]["restartPolicy"] == "Never"  # a restarted store lost its state: must be seen
    assert job_manifests.store_pod(JOB, spec())["spec"]["containers"][0]["image"] == "trainer:1"


# ---------------------------------------------------------------- node range


@pytest.mark.parametrize("overrides, expected", [
    ({"replicas": 2}, "2-2"),  # minReplicas defaults to replicas
    ({"replicas": 2, "minReplicas": 1, "maxReplicas": 4}, "1-2"),  # up to the generation's size
    ({"replicas": 3, "maxReplicas": 8}, "3-3"),
    ({"replicas": 1024}, "1024-1024"),
])
def test_node_range_is_the_nnodes_flag_as_a_label(overrides, expected):
    s = spec(**overrides)
    assert naming.node_range(s) == expected
    pod = job_manifests.worker_pod(JOB, s, index=0, generation=0)
    assert pod["metadata"]["labels"][naming.LABEL_NNODES] == expected
    assert flags(pod["spec"]["containers"][0]["command"])["nnodes"] == expected.replace("-", ":")
    assert naming.LABEL_NNODES == "elastic.ddp.dev/nnodes"
    assert naming.LABEL_NNODES not in job_manifests.store_pod(JOB, s)["metadata"]["labels"]


# ---------------------------------------------------------------- node loss


@pytest.mark.parametrize("overrides, expected", [
    ({}, NODE_LOSS_DEFAULT),
    ({"failurePolicy": {"nodeLossTimeoutSeconds": 15}}, node_loss(15)),
    # The user's entry for a key wins; the other key still gets the short default.
    ({"template": {"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                    "effect": "NoExecute", "tolerationSeconds": 600}]}},
     [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
       "tolerationSeconds": 600}, NODE_LOSS_DEFAULT[1]]),
    ({"template": {"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]}},
     [{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}, NODE_LOSS_DEFAULT[0]]),
    # A keyless Exists toleration tolerates every taint forever: adding ours would cut it to 60 s.
    ({"template": {"tolerations": [{"operator": "Exists"}]}}, [{"operator": "Exists"}]),
    ({"template": {"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}},
     [{"operator": "Exists", "effect": "NoSchedule"}] + NODE_LOSS_DEFAULT),
])
def test_workers_and_store_tolerate_node_loss_only_briefly(overrides, expected):
    s = spec(**overrides)
    assert job_manifests.worker_pod(JOB, s, index=0, generation=0)["spec"]["tolerations"] == expected
    assert job_manifests.store_pod(JOB, s)["spec"]["tolerations"] == expected


@pytest.mark.parametrize("seconds, ok", [(4, False), (5, True), (60, True), (3600, True), (3601, False)])
def test_node_loss_timeout_bounds(seconds, ok):
    if ok:
        assert spec(failurePolicy={"nodeLossTimeoutSeconds": seconds}).failure_policy.node_loss_timeout_seconds \
            == seconds
    else:
        with pytest.raises(ValueError, match="nodeLossTimeoutSeconds"):
            spec(failurePolicy={"nodeLossTimeoutSeconds": seconds})


# ---------------------------------------------------------------- where the store pod runs

GPU_POOL = {"template": {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "training",
                         "serviceAccountName": "trainer",
                         "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml",
                                          "effect": "NoSchedule"}]},
            "resources": {"gpu": True}}
GPU_POOL_TOLERATIONS = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}] + NODE_LOSS_DEFAULT


@pytest.mark.parametrize("store_template, expected", [
    # Unset: exactly the workers' scheduling, so the store fits a tainted GPU-only pool and has their priority.
    (None, {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "training", "serviceAccountName": "trainer",
            "tolerations": GPU_POOL_TOLERATIONS, "requests": {"cpu": "100m", "memory": "256Mi"}}),
    ({}, {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "training", "serviceAccountName": "trainer",
          "tolerations": GPU_POOL_TOLERATIONS, "requests": {"cpu": "100m", "memory": "256Mi"}}),
    # Each field set replaces only its part.
    ({"nodeSelector": {"pool": "cpu"}, "priorityClassName": "critical",
      "resources": {"cpu": "250m", "memory": "1Gi"}},
     {"nodeSelector": {"pool": "cpu"}, "priorityClassName": "critical", "serviceAccountName": "trainer",
      "tolerations": GPU_POOL_TOLERATIONS, "requests": {"cpu": "250m", "memory": "1Gi"}}),
    ({"nodeSelector": {}, "tolerations": [{"key": "cpu-pool", "operator": "Exists", "effect": "NoSchedule"}]},
     {"nodeSelector": None, "priorityClassName": "training", "serviceAccountName": "trainer",
      "tolerations": [{"key": "cpu-pool", "operator": "Exists", "effect": "NoSchedule"}] + NODE_LOSS_DEFAULT,
      "requests": {"cpu": "100m", "memory": "256Mi"}}),
    # Its own node-loss toleration wins over the default, as the workers' does.
    ({"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                       "tolerationSeconds": 30}]},
     {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "training", "serviceAccountName": "trainer",
      "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                       "tolerationSeconds": 30}, NODE_LOSS_DEFAULT[0]],
      "requests": {"cpu": "100m", "memory": "256Mi"}}),
])
def test_store_pod_schedules_like_the_workers_unless_its_template_says_otherwise(store_template, expected):
    overrides = dict(GPU_POOL)
    if store_template is not None:
        overrides["rendezvous"] = {"storeTemplate": store_template}
    s = spec(**overrides)
    store_spec = job_manifests.store_pod(JOB, s)["spec"]
    got = {key: store_spec.get(key) for key in ("nodeSelector", "priorityClassName", "serviceAccountName",
                                                 "tolerations")}
    got["requests"] = store_spec["containers"][0]["resources"]["requests"]
    assert got == expected
    assert "limits" not in store_spec["containers"][0]["resources"]
    assert "affinity" not in store_spec  # worker (anti-)affinity is about workers
    # The store never gets the workers' GPUs, only their placement.
    assert "nvidia.com/gpu" not in str(store_spec["containers"][0]["resources"])
    if store_template is None:
        worker_spec = job_manifests.worker_pod(JOB, s, index=0, generation=0)["spec"]
        for key in ("nodeSelector", "priorityClassName", "serviceAccountName", "tolerations"):
            assert store_spec[key] == worker_spec[key], key


@pytest.mark.parametrize("toleration, field", [
    ({"operator": "Equal", "value": "x"}, "key"),
    ({"key": "k", "operator": "Exists", "value": "x"}, "value"),
    ({"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}, "tolerationSeconds"),
    ({"key": "k", "operator": "Sometimes"}, "operator"),
    ({"key": "k", "tolerations": 1}, "tolerations"),
])
def test_store_template_tolerations_are_typed(toleration, field):
    from ddpjob_operator.validation import InvalidJob, parse_spec
    with pytest.raises(InvalidJob) as info:
        parse_spec({"replicas": 1, "image": "i", "entrypoint": "m",
                    "rendezvous": {"storeTemplate": {"tolerations": [toleration]}}})
    assert any(e.path.startswith("spec.rendezvous.storeTemplate.tolerations[0]." + field) for e in info.value.errors), \
        info.value.errors


# ---------------------------------------------------------------- names

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def names_of(job_name: str, replicas: int = 12) -> dict[str, set[str]]:
    """Every name a job creates, by the kind of thing it names (one namespace)."""
    ref = naming.JobRef(job_name, "team-a", f"uid-{job_name}")
    s = spec(replicas=replicas, checkpoint={"claimTemplate": {"size": "1Gi"}})
    names: dict[str, set[str]] = {}
    for manifest in job_manifests.all_manifests(ref, s):
        names.setdefault(manifest["kind"], set()).add(manifest["metadata"]["name"])
        pod_spec = manifest.get("spec", {})
        if manifest["kind"] == "Pod" and "hostname" in pod_spec:
            names.setdefault("hostname", set()).add(pod_spec["hostname"])
            names.setdefault("subdomain", set()).add(pod_spec["subdomain"])
    # Everything resolvable in the namespace: Services, and workers through the headless Service.
    names["dns"] = ({f"{n}.team-a.svc" for n in names["Service"]}
                    | {naming.worker_address(job_name, "team-a", i) for i in range(replicas)})
    return names


ADVERSARIAL = [("x", "x-rdzv"), ("x", "x-workers"), ("a", "a-worker-1"), ("a", "a-worker"),
               ("x", "x-checkpoints"), ("x-rdzv", "x-rdzv-rdzv"), ("a-worker-1", "a-worker-1-worker-1"),
               ("x-workers", "x-workers-workers"), ("digits", "digits-worker-0"),
               ("x", f"x-agent-{agent.POD_DIGEST}"), ("x", "x-agent")]


@pytest.mark.parametrize("first, second", ADVERSARIAL)
def test_names_of_two_jobs_never_collide(first, second):
    one, two = names_of(first), names_of(second)
    assert set(one) == set(two) == {"ConfigMap", "Service", "Pod", "PersistentVolumeClaim", "hostname", "subdomain",
                                    "dns"}
    for kind in one:
        assert not one[kind] & two[kind], f"{kind}: {first} and {second} both create {one[kind] & two[kind]}"


def test_names_of_all_adversarial_jobs_are_pairwise_distinct():
    jobs = sorted({name for pair in ADVERSARIAL for name in pair})
    seen: dict[tuple[str, str], str] = {}
    for job in jobs:
        for kind, names in names_of(job).items():
            for name in names:
                assert seen.setdefault((kind, name), job) == job, f"{kind} {name}: {seen[(kind, name)]} and {job}"


@pytest.mark.parametrize("job_name", ["a", "x" * model.MAX_JOB_NAME_LENGTH, "a-" * 24 + "zz"])
def test_every_generated_name_fits_a_dns_label(job_name):
    assert len(job_name) <= model.MAX_JOB_NAME_LENGTH
    ref = naming.JobRef(job_name, "team-a", "uid")
    s = spec(replicas=1024, checkpoint={"claimTemplate": {"size": "1Gi"}})  # the highest index is 1023
    last = job_manifests.worker_pod(ref, s, index=1023, generation=0)
    manifests = job_manifests.shared_manifests(ref, s) + [job_manifests.store_pod(ref, s), last]
    # A ConfigMap's name is a DNS subdomain (up to 253 characters); every other name is also a label or host name.
    config_map = next(m["metadata"]["name"] for m in manifests if m["kind"] == "ConfigMap")
    assert len(config_map) <= 253 and DNS_LABEL.match(config_map), config_map
    names = [m["metadata"]["name"] for m in manifests if m["kind"] != "ConfigMap"]
    names += [last["spec"]["hostname"], last["spec"]["subdomain"]]
    names += [v for m in manifests for v in m["metadata"]["labels"].values()]
    for name in names:
        assert len(name) <= 63 and DNS_LABEL.match(name.replace(".", "-")), name
    assert last["metadata"]["name"] == f"{job_name}-worker-1023"


def test_job_names_are_capped_at_max_job_name_length():
    """The schema enforces the bound the test above relies on (the CRD gets it from the model)."""
    schema_max = model.JobMetadata.model_fields["name"].metadata
    assert any(getattr(m, "max_length", None) == model.MAX_JOB_NAME_LENGTH for m in schema_max)


def test_examples_render_deterministically():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        job = parse_job(yaml.safe_load(path.read_text()))
        ref = naming.JobRef.preview(job.metadata.name, "default")
        first, second = job_manifests.all_manifests(ref, job.spec), job_manifests.all_manifests(ref, job.spec)
        assert first == second
        names = [m["metadata"]["name"] for m in first]
        assert len(names) == len(set((m["kind"], n) for m, n in zip(first, names)))
        assert sum(m["kind"] == "Pod" for m in first) == job.spec.replicas + 1


def test_store_program_serves_a_tcpstore_and_stops_on_sigterm(unused_tcp_port):
    """The fixed store program really runs: a client sets and reads a key; SIGTERM exits 0."""
    import torch.distributed as dist  # the test process may import torch; the operator never does

    proc = subprocess.Popen(launch.store_command(unused_tcp_port, python=sys.executable, agent_dir=agent.DIRECTORY),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in proc.stdout.readline()
        client = dist.TCPStore("127.0.0.1", unused_tcp_port, is_master=False, timeout=timedelta(seconds=10))
        client.set("rdzv", "ok")
        assert client.get("rdzv") == b"ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the whole pod template

# What a Kubeflow PyTorchJob user copies over from a production worker template.
KUBEFLOW_POD_SPEC = {
    "imagePullSecrets": [{"name": "regcred"}],
    "initContainers": [
        {"name": "fetch-data", "image": "busybox:1.36", "command": ["sh", "-c", "echo fetched > /data/ok"],
         "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        {"name": "log-shipper", "image": "fluent/fluent-bit:3.0", "restartPolicy": "Always"},  # a native sidecar
    ],
    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
    "hostIPC": True,
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {naming.LABEL_JOB_NAME: "digits"}}}],
    "runtimeClassName": "nvidia", "schedulerName": "my-scheduler", "dnsPolicy": "ClusterFirst",
    "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
    "hostAliases": [{"ip": "10.0.0.9", "hostnames": ["registry.local"]}],
    "priorityClassName": None,
    "enableServiceLinks": False, "shareProcessNamespace": True, "preemptionPolicy": "Never",
    "setHostnameAsFQDN": True, "automountServiceAccountToken": False,
}
KUBEFLOW_POD_SPEC = {k: v for k, v in KUBEFLOW_POD_SPEC.items() if v is not None}
KUBEFLOW_TRAINER = {
    "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}, "allowPrivilegeEscalation": False},
    "resources": {"requests": {"rdma/hca": 1, "hugepages-2Mi": "1Gi"},
                  "limits": {"rdma/hca": 1, "hugepages-2Mi": "1Gi"}},
    "envFrom": [{"configMapRef": {"name": "nccl-env"}}],
    "ports": [{"name": "metrics", "containerPort": 9400}],
    "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 10},
    "lifecycle": {"preStop": {"exec": {"command": ["sync"]}}},
    "workingDir": "/workspace",
}


def kubeflow_spec(**extra) -> model.DDPJobSpec:
    return spec(resources={"cpu": "4", "memory": "16Gi"},
                template={"podSpec": KUBEFLOW_POD_SPEC, "trainer": KUBEFLOW_TRAINER,
                          "volumes": [{"name": "data", "emptyDir": {}}]}, **extra)


def test_every_pod_level_field_reaches_the_worker_pod():
    pod_spec = job_manifests.worker_pod(JOB, kubeflow_spec(), index=0, generation=0)["spec"]
    for key, value in KUBEFLOW_POD_SPEC.items():
        if key != "securityContext":
            assert pod_spec[key] == value, key
    # The user's security context, with the checkpoint group the operator sets.
    assert pod_spec["securityContext"] == {**KUBEFLOW_POD_SPEC["securityContext"], "fsGroup": 1000,
                                           "fsGroupChangePolicy": "OnRootMismatch"}
    # Still the operator's: one container, its restart policy, its DNS identity.
    assert [c["name"] for c in pod_spec["containers"]] == ["trainer"]
    assert pod_spec["restartPolicy"] == "Never" and pod_spec["hostname"] == "digits-worker-0"


def test_every_container_level_field_reaches_the_trainer():
    container = job_manifests.worker_pod(JOB, kubeflow_spec(), index=0, generation=0)["spec"]["containers"][0]
    for key, value in KUBEFLOW_TRAINER.items():
        if key != "resources":
            assert container[key] == value, key
    # spec.resources plus the extra resources, requests and limits alike.
    assert container["resources"] == {"requests": {"cpu": "4", "memory": "16Gi", "rdma/hca": 1, "hugepages-2Mi": "1Gi"},
                                      "limits": {"cpu": "4", "memory": "16Gi", "rdma/hca": 1, "hugepages-2Mi": "1Gi"}}
    # The launch contract is untouched.
    assert container["command"][:3] == POD_LAUNCHER
    assert container["env"][0]["name"] == launch.POD_IP_ENV
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/dev/shm", launch.AGENT_DIR}


def test_the_store_pod_gets_pull_secrets_and_the_pod_security_context_only():
    store = job_manifests.store_pod(JOB, kubeflow_spec())["spec"]
    assert store["imagePullSecrets"] == [{"name": "regcred"}]
    assert store["securityContext"] == KUBEFLOW_POD_SPEC["securityContext"]
    assert store["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}
    for key in ("initContainers", "hostIPC", "runtimeClassName", "schedulerName", "topologySpreadConstraints"):
        assert key not in store, key
    assert "imagePullSecrets" not in job_manifests.store_pod(JOB, spec())["spec"]


@pytest.mark.parametrize("pod_spec, dns_policy", [
    ({"hostNetwork": True}, "ClusterFirstWithHostNet"),  # so workers still resolve <job>-rdzv
    ({"hostNetwork": True, "dnsPolicy": "None", "dnsConfig": {"nameservers": ["10.96.0.10"]}}, "None"),
])
def test_host_network_keeps_cluster_dns_and_one_worker_per_node(pod_spec, dns_policy):
    s = spec(template={"podSpec": pod_spec, "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "other"}}, "topologyKey": "kubernetes.io/hostname"}]}}})
    pod_spec_out = job_manifests.worker_pod(JOB, s, index=1, generation=0)["spec"]
    assert pod_spec_out["hostNetwork"] is True and pod_spec_out["dnsPolicy"] == dns_policy
    # With the node's IP as its address, two workers on one node would share a rendezvous node id.
    required = pod_spec_out["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == [{"labelSelector": {"matchLabels": {"app": "other"}}, "topologyKey": "kubernetes.io/hostname"},
                        {"labelSelector": {"matchLabels": naming.worker_selector("digits")},
                         "topologyKey": "kubernetes.io/hostname"}]
    assert s.template.affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][1:] == [], \
        "the spec itself is never modified"
    plain = job_manifests.worker_pod(JOB, spec(), index=0, generation=0)["spec"]
    assert "dnsPolicy" not in plain and "affinity" not in plain


@pytest.mark.parametrize("template, path, text", [
    ({"podSpec": {"containers": [{"name": "sidecar", "image": "x"}]}}, "spec.template.podSpec.containers", "native sidecars"),
    ({"podSpec": {"restartPolicy": "Always"}}, "spec.template.podSpec.restartPolicy", "replaces failed workers"),
    ({"podSpec": {"subdomain": "x"}}, "spec.template.podSpec.subdomain", "headless Service"),
    ({"podSpec": {"tolerations": []}}, "spec.template.podSpec.tolerations", "spec.template.tolerations"),
    ({"podSpec": {"volumes": []}}, "spec.template.podSpec.volumes", "spec.template.volumes"),
    ({"podSpec": {"terminationGracePeriodSeconds": 5}}, "spec.template.podSpec.terminationGracePeriodSeconds",
     "spec.template.terminationGracePeriodSeconds"),
    ({"podSpec": {"activeDeadlineSeconds": 5}}, "spec.template.podSpec.activeDeadlineSeconds",
     "spec.runPolicy.activeDeadlineSeconds"),
    ({"podSpec": {"hostIpc": True}}, "spec.template.podSpec.hostIpc", "did you mean `hostIPC`"),
    ({"trainer": {"args": ["--lr", "1"]}}, "spec.template.trainer.args", "spec.args"),
    ({"trainer": {"image": "other:1"}}, "spec.template.trainer.image", "spec.image"),
    ({"trainer": {"name": "main"}}, "spec.template.trainer.name", "always `trainer`"),
    ({"trainer": {"terminationMessagePath": "/tmp/x"}}, "spec.template.trainer.terminationMessagePath", "launcher"),
    ({"trainer": {"resources": {"requests": {"memory": "1Gi"}}}}, "spec.template.trainer.resources.requests",
     "spec.resources.memory"),
    ({"labels": {"app.kubernetes.io/managed-by": "me"}}, "spec.template.labels", "operator"),
    ({"labels": {"scheduling.x-k8s.io/pod-group": "g"}}, "spec.template.labels", "schedulingPolicy"),
    ({"volumes": [{"name": "checkpoints", "emptyDir": {}}]}, "spec.template.volumes", "rename the volume"),
])
def test_operator_owned_fields_are_rejected_naming_the_field(template, path, text):
    from ddpjob_operator.validation import InvalidJob, parse_spec
    with pytest.raises(InvalidJob) as info:
        parse_spec({"replicas": 2, "image": "i", "entrypoint": "m", "template": template})
    assert any(e.path == path and text in str(e) for e in info.value.errors), info.value.errors


# ---------------------------------------------------------------- gang scheduling


@pytest.mark.parametrize("policy, api_version, scheduler, group_spec", [
    ({"gangScheduler": "Volcano", "queue": "research"}, "scheduling.volcano.sh/v1beta1", "volcano",
     {"minMember": 2, "queue": "research", "priorityClassName": "training",
      "minResources": {"cpu": "8", "memory": "32Gi", "rdma/hca": "2"}}),
    ({"gangScheduler": "Volcano", "priorityClass": "urgent", "minAvailable": 3}, "scheduling.volcano.sh/v1beta1",
     "volcano", {"minMember": 3, "priorityClassName": "urgent",
                 "minResources": {"cpu": "12", "memory": "48Gi", "rdma/hca": "3"}}),
    ({"gangScheduler": "Coscheduling", "scheduleTimeoutSeconds": 120, "schedulerName": "default-scheduler"},
     "scheduling.x-k8s.io/v1alpha1", "default-scheduler",
     {"minMember": 2, "scheduleTimeoutSeconds": 120, "minResources": {"cpu": "8", "memory": "32Gi", "rdma/hca": "2"}}),
    ({"gangScheduler": "Coscheduling"}, "scheduling.x-k8s.io/v1alpha1", "scheduler-plugins-scheduler",
     {"minMember": 2, "minResources": {"cpu": "8", "memory": "32Gi", "rdma/hca": "2"}}),
])
def test_scheduling_policy_creates_an_owned_pod_group_the_workers_belong_to(policy, api_version, scheduler, group_spec):
    s = spec(replicas=3, minReplicas=2, resources={"cpu": "4", "memory": "16Gi"},
             template={"priorityClassName": "training", "trainer": {"resources": {"limits": {"rdma/hca": 1}}}},
             runPolicy={"schedulingPolicy": policy})
    group = job_manifests.pod_group(JOB, s)
    assert (group["apiVersion"], group["kind"], group["metadata"]["name"]) == (api_version, "PodGroup", "digits")
    assert group["metadata"]["ownerReferences"] == [job_manifests.owner_reference(JOB)]
    assert group["spec"] == group_spec
    assert job_manifests.shared_manifests(JOB, s)[0] == group  # created before any pod
    pod = job_manifests.worker_pod(JOB, s, index=2, generation=0)
    assert pod["spec"]["schedulerName"] == scheduler
    if policy["gangScheduler"] == "Volcano":
        assert pod["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "digits"}
        assert "scheduling.x-k8s.io/pod-group" not in pod["metadata"]["labels"]
    else:
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "digits"
        assert "annotations" not in pod["metadata"]
    # The store is no member of the gang: it runs first, on the default scheduler.
    store = job_manifests.store_pod(JOB, s)
    assert "schedulerName" not in store["spec"] and "annotations" not in store["metadata"]
    assert "scheduling.x-k8s.io/pod-group" not in store["metadata"]["labels"]


def test_no_scheduling_policy_no_pod_group():
    assert job_manifests.pod_group(JOB, spec()) is None
    assert [m["kind"] for m in job_manifests.shared_manifests(JOB, spec())] == ["ConfigMap", "Service", "Service"]


@pytest.mark.parametrize("quantity, factor, expected", [
    ("4", 2, "8"), ("500m", 3, "1500m"), ("1.5Gi", 2, "3Gi"), (1, 4, "4"), ("16Gi", 1, "16Gi"), ("1e3", 2, None),
])
def test_gang_resources_multiply_quantities(quantity, factor, expected):
    assert job_manifests._times(quantity, factor) == expected


def test_worker_pod_progress_endpoint_and_projected_token():
    """Issue 12: with an operator progress endpoint, workers get its URL and a projected token whose
    audience only the operator accepts; without one, neither (the URL is "", so the client is a no-op over
    HTTP whatever an envFrom says)."""
    endpoint = job_manifests.ProgressEndpoint("http://ddpjob-progress.ddpjob-system.svc:8090",
                                              "progress.elastic.ddp.dev")
    pod = job_manifests.worker_pod(JOB, spec(), index=0, generation=0, progress=endpoint)
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[contract.PROGRESS_URL_ENV] == \
        "http://ddpjob-progress.ddpjob-system.svc:8090/v1/namespaces/team-a/ddpjobs/digits/progress"
    assert env[contract.PROGRESS_TOKEN_ENV] == "/var/run/secrets/ddpjob/progress/token"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == job_manifests.PROGRESS_TOKEN_VOLUME)
    assert volume["projected"]["sources"] == [{"serviceAccountToken": {
        "audience": "progress.elastic.ddp.dev", "expirationSeconds": 3600, "path": "token"}}]
    mount = next(m for m in container["volumeMounts"] if m["name"] == job_manifests.PROGRESS_TOKEN_VOLUME)
    assert mount == {"name": job_manifests.PROGRESS_TOKEN_VOLUME, "mountPath": job_manifests.PROGRESS_TOKEN_DIR,
                     "readOnly": True}
    # No RBAC for the pod: the token is the pod's own service account's, bound to the pod.
    assert "serviceAccountName" not in pod["spec"]
    plain = job_manifests.worker_pod(JOB, spec(), index=0, generation=0)
    plain_env = {e["name"]: e.get("value") for e in plain["spec"]["containers"][0]["env"]}
    assert plain_env[contract.PROGRESS_URL_ENV] == plain_env[contract.PROGRESS_TOKEN_ENV] == ""
    assert job_manifests.PROGRESS_TOKEN_VOLUME not in {v["name"] for v in plain["spec"]["volumes"]}


def test_spare_pod_is_a_workers_pod_that_waits_outside_every_rendezvous():
    """Issue 25: a warm spare runs the worker's own command and env (DDPJOB_SPARE=1, no replica index until
    assigned), is the job's (controller ownerReference), has no index label, and prefers a node without
    the job's workers, after the user's own preferences."""
    endpoint = job_manifests.ProgressEndpoint("http://ddpjob-progress.ddpjob-system.svc:8090",
                                              "progress.elastic.ddp.dev")
    mine = {"weight": 10, "podAffinityTerm": {"topologyKey": "zone", "labelSelector": {"matchLabels": {"a": "b"}}}}
    s = spec(template={"labels": {"team": "a"},
                       "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [mine]}}})
    worker = job_manifests.worker_pod(JOB, s, index=0, generation=3, progress=endpoint)
    spare = job_manifests.spare_pod(JOB, s, serial=2, generation=3, progress=endpoint)
    meta, pod_spec = spare["metadata"], spare["spec"]
    assert (meta["name"], pod_spec["hostname"]) == ("digits-spare-2", "digits-spare-2")
    assert meta["labels"] == {"team": "a", naming.LABEL_JOB_NAME: "digits", naming.LABEL_JOB_UID: JOB.uid,
                              naming.LABEL_ROLE: naming.ROLE_SPARE, naming.LABEL_GENERATION: "3",
                              naming.LABEL_NNODES: "2-2", naming.LABEL_MANAGED_BY: "ddpjob-operator"}
    assert naming.LABEL_REPLICA_INDEX not in meta["labels"]  # never selected as a worker of an index
    assert meta["ownerReferences"] == worker["metadata"]["ownerReferences"]
    assert [r["controller"] for r in meta["ownerReferences"]] == [True]
    container, theirs = pod_spec["containers"][0], worker["spec"]["containers"][0]
    assert container["command"] == theirs["command"] and container["image"] == theirs["image"]

    def env(c):  # Kubernetes keeps the last of duplicate names
        return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    mark = "/var/run/secrets/ddpjob/spare/digits-spare-2.ready"  # the pod's own emptyDir, named for the pod
    assert env(container) == {**env(theirs), "DDPJOB_REPLICA_INDEX": "-1", contract.SPARE_ENV: "1",
                              contract.SPARE_READY_FILE_ENV: mark}
    assert [e["name"] for e in container["env"]].count(contract.SPARE_READY_FILE_ENV) == 1
    # Ready only once its launcher wrote the mark (warm, and the operator's endpoint answered): an exec probe
    # every few seconds (a process spawn each period), never flipped back by one slow probe.
    assert container["readinessProbe"] == {"exec": {"command": ["test", "-f", mark]}, "periodSeconds": 3,
                                           "timeoutSeconds": 2, "successThreshold": 1, "failureThreshold": 3}
    assert "readinessProbe" not in theirs
    assert container["volumeMounts"] == theirs["volumeMounts"] + [
        {"name": "ddpjob-spare", "mountPath": "/var/run/secrets/ddpjob/spare"}]
    assert pod_spec["volumes"] == worker["spec"]["volumes"] + [
        {"name": "ddpjob-spare", "emptyDir": {"sizeLimit": "1Mi"}}]
    anti = pod_spec["affinity"]["podAntiAffinity"]
    assert anti == {"preferredDuringSchedulingIgnoredDuringExecution": [mine, {
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
            "matchLabels": {naming.LABEL_JOB_NAME: "digits", naming.LABEL_ROLE: naming.ROLE_WORKER}}}}]}
    # The spec's own affinity is untouched: the next spare (and every worker) starts from it again.
    assert job_manifests.spare_pod(JOB, s, serial=3, generation=3)["spec"]["affinity"]["podAntiAffinity"] == anti
    assert worker["spec"]["affinity"]["podAntiAffinity"] == {"preferredDuringSchedulingIgnoredDuringExecution": [mine]}


def test_a_spare_is_ready_by_its_own_probe_not_the_trainers():
    """template.trainer's probes are meant for a trainer (its port, its file): a spare runs none, so the
    spare's own readiness probe replaces the user's and their liveness and startup probes are dropped (they
    would get an idle spare killed); a worker keeps all three."""
    theirs = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10}
    s = spec(template={"trainer": {"readinessProbe": theirs, "livenessProbe": theirs, "startupProbe": theirs}})
    worker = job_manifests.worker_pod(JOB, s, index=0, generation=0)["spec"]["containers"][0]
    assert worker["readinessProbe"] == worker["livenessProbe"] == worker["startupProbe"] == theirs
    container = job_manifests.spare_pod(JOB, s, serial=0, generation=0)["spec"]["containers"][0]
    assert "livenessProbe" not in container and "startupProbe" not in container
    mark = job_manifests.spare_ready_file("digits-spare-0")
    assert container["readinessProbe"]["exec"] == {"command": ["test", "-f", mark]}
