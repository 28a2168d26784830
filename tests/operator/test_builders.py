"""Builders: spec -> torchrun argv, launch-contract env, manifests (table-driven, pure)."""

import re
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import builders, model
from ddpjob_operator.validation import parse_job

ROOT = Path(__file__).resolve().parents[2]
JOB = builders.JobRef("digits", "team-a", "0b9f6d0e-uid")


def spec(**overrides) -> model.DDPJobSpec:
    base = {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer", "args": ["--workload", "digits"]}
    return model.DDPJobSpec.model_validate({**base, **overrides})


def flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


@pytest.mark.parametrize("overrides, expected", [
    ({}, {"nnodes": "2:2", "nproc-per-node": "1", "max-restarts": "3", "shutdown-timeout": "55",
          "rdzv-conf": "is_host=false,join_timeout=600,last_call_timeout=15,read_timeout=60,"
                       "keep_alive_interval=5,keep_alive_max_attempt=3"}),
    ({"minReplicas": 1, "maxReplicas": 4, "replicas": 2}, {"nnodes": "1:4"}),
    ({"nprocPerNode": 8, "failurePolicy": {"maxRestarts": 7}}, {"nproc-per-node": "8", "max-restarts": "7"}),
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
    argv = builders.worker_command(spec(**overrides), endpoint="h:1", rdzv_id="u-g0", local_addr="10.0.0.7")
    got = flags(argv)
    assert argv[:3] == ["python", "-c", builders.LAUNCHER_PROGRAM]
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
    argv = builders.worker_command(spec(entrypoint=entrypoint, args=args), endpoint="h:1", rdzv_id="x",
                                   local_addr="127.0.0.1")
    assert argv[-len(tail):] == tail
    # The only program text is the fixed launcher; user input only ever follows it as argv.
    assert argv[1:3] == ["-c", builders.LAUNCHER_PROGRAM] and "sh" not in argv and argv.count("-c") == 1
    assert "$(" not in builders.LAUNCHER_PROGRAM, "Kubernetes would expand $(VAR) inside the program text"


def test_rendezvous_id_is_unique_per_job_and_generation():
    ids = {builders.rendezvous_id(uid, g) for uid in ("a", "b") for g in (0, 1)}
    assert len(ids) == 4 and all(i != "none" for i in ids)


def env_for(s: model.DDPJobSpec, **kw) -> dict[str, str]:
    args = {"job_name": "digits", "namespace": "team-a", "index": 1, "generation": 3,
            "endpoint": "digits-rdzv.team-a.svc:29400", "rdzv_id": "u-g3", "local_addr": "10.0.0.7",
            "master_addr": "digits-worker-0.digits.team-a.svc", **kw}
    return builders.worker_env(s, **args)


def test_worker_env_matches_the_launch_contract():
    env = env_for(spec(minReplicas=1, checkpoint={"claimName": "ck", "intervalSteps": 7, "keep": 4}))
    contract = (ROOT / "docs" / "launch-contract.md").read_text()
    documented = set(re.findall(r"`(DDPJOB_[A-Z_]+)`", contract))
    # The pod IP comes from the downward API and the termination log path from the local runner.
    assert {k for k in env if k.startswith("DDPJOB_")} | {builders.POD_IP_ENV, builders.TERMINATION_LOG_ENV} \
        == documented
    assert env["DDPJOB_REPLICA_INDEX"] == "1" and env["DDPJOB_GENERATION"] == "3"
    assert env["DDPJOB_CHECKPOINT_DIR"] == "/checkpoints"
    assert env["DDPJOB_CHECKPOINT_INTERVAL_STEPS"] == "7" and env["DDPJOB_CHECKPOINT_KEEP"] == "4"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PET_RDZV_ID"] == "u-g3" and env["PET_NNODES"] == "1:2"
    assert env["PET_RDZV_ENDPOINT"] == "digits-rdzv.team-a.svc:29400" and env["PET_LOCAL_ADDR"] == "10.0.0.7"
    assert env["PET_SHUTDOWN_TIMEOUT"] == "55"
    assert not set(env) & set(model.RESERVED_ENV_NAMES), "an elastic job has no fixed rank 0 to point at"


@pytest.mark.parametrize("replicas, expected", [
    ({"replicas": 2}, {"MASTER_ADDR": "digits-worker-0.digits.team-a.svc", "MASTER_PORT": "29500"}),
    ({"replicas": 3, "minReplicas": 3, "maxReplicas": 3},
     {"MASTER_ADDR": "digits-worker-0.digits.team-a.svc", "MASTER_PORT": "29500"}),
    ({"replicas": 2, "minReplicas": 1}, {}),
    ({"replicas": 2, "maxReplicas": 4}, {}),
])
def test_static_jobs_get_master_addr_and_port(replicas, expected):
    env = env_for(spec(**replicas))
    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT") if k in env} == expected
    assert builders.STATIC_MASTER_PORT != model.Rendezvous().port  # never the store's port


def test_worker_env_without_checkpoint_has_no_checkpoint_dir():
    assert "DDPJOB_CHECKPOINT_DIR" not in env_for(spec())


def test_worker_pod_shape():
    s = spec(env=[{"name": "OMP_NUM_THREADS", "value": "1"}], checkpoint={"claimTemplate": {"size": "1Gi"}},
             template={"labels": {"team": "a", builders.LABEL_ROLE: "spoofed"}, "terminationGracePeriodSeconds": 90})
    pod = builders.worker_pod(JOB, s, index=1, generation=2, attempt=3)
    meta, pod_spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "digits-worker-1" and meta["namespace"] == "team-a"
    assert meta["labels"] == {"team": "a", builders.LABEL_JOB_NAME: "digits", builders.LABEL_JOB_UID: JOB.uid,
                              builders.LABEL_ROLE: "worker", builders.LABEL_REPLICA_INDEX: "1",
                              builders.LABEL_GENERATION: "2", builders.LABEL_ATTEMPT: "3",
                              builders.LABEL_MANAGED_BY: "ddpjob-operator"}
    assert meta["ownerReferences"] == [{"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob",
                                        "name": "digits", "uid": JOB.uid, "controller": True,
                                        "blockOwnerDeletion": True}]
    assert pod_spec["restartPolicy"] == "Never"
    assert (pod_spec["hostname"], pod_spec["subdomain"]) == ("digits-worker-1", "digits")
    assert pod_spec["terminationGracePeriodSeconds"] == 90
    container = pod_spec["containers"][0]
    assert container["command"][:3] == ["python", "-c", builders.LAUNCHER_PROGRAM]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    got = flags(container["command"])
    assert got["rdzv-endpoint"] == "digits-rdzv.team-a.svc:29400" and got["rdzv-id"] == f"{JOB.uid}-g2"
    assert got["local-addr"] == "$(DDPJOB_POD_IP)" and got["shutdown-timeout"] == "85"
    # The pod IP comes first: Kubernetes expands $(VAR) in later env values (PET_LOCAL_ADDR) and in args.
    assert container["env"][0] == {"name": "DDPJOB_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OMP_NUM_THREADS"] == "1" and env["DDPJOB_GENERATION"] == "2"
    assert env["PET_LOCAL_ADDR"] == "$(DDPJOB_POD_IP)"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("digits-worker-0.digits.team-a.svc", "29500")
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "digits-checkpoints"}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/dev/shm", "/checkpoints"}
    assert "tolerations" not in pod_spec and "resources" not in container
    assert pod_spec["securityContext"] == {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}


@pytest.mark.parametrize("template, expected", [
    ({}, {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}),  # the bundled image's group
    ({"fsGroup": 2000}, {"fsGroup": 2000, "fsGroupChangePolicy": "OnRootMismatch"}),
])
def test_checkpoint_volume_is_writable_by_the_trainer_group(template, expected):
    pod = builders.worker_pod(JOB, spec(template=template), index=0, generation=0, attempt=0)
    assert pod["spec"].get("securityContext") == expected


@pytest.mark.parametrize("resources, limits", [
    ({"gpu": True}, {"nvidia.com/gpu": "4"}),
    ({"gpu": True, "gpuCount": 2, "cpu": "8", "memory": "32Gi"},
     {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}),
    ({"gpu": True, "gpuResourceName": "amd.com/gpu"}, {"amd.com/gpu": "4"}),
])
def test_gpu_wiring(resources, limits):
    s = spec(nprocPerNode=4, resources=resources, template={"tolerations": [{"key": "spot", "operator": "Exists"}]})
    pod_spec = builders.worker_pod(JOB, s, index=0, generation=0)["spec"]
    container = pod_spec["containers"][0]
    assert container["resources"]["limits"] == limits == container["resources"]["requests"]
    gpu_name = next(k for k in limits if "gpu" in k)
    assert pod_spec["tolerations"] == [{"key": "spot", "operator": "Exists"},
                                       {"key": gpu_name, "operator": "Exists", "effect": "NoSchedule"}]


def test_existing_claim_is_used_as_is_and_no_claim_is_created():
    s = spec(checkpoint={"claimName": "shared-ckpt", "mountPath": "/ck"})
    pod = builders.worker_pod(JOB, s, index=0, generation=0)
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared-ckpt"}} in pod["spec"]["volumes"]
    assert builders.checkpoint_claim(JOB, s) is None


def test_claim_template_becomes_an_owned_pvc():
    s = spec(checkpoint={"claimTemplate": {"size": "5Gi", "storageClassName": "fast",
                                           "accessModes": ["ReadWriteOnce"]}})
    claim = builders.checkpoint_claim(JOB, s)
    assert claim["metadata"]["name"] == "digits-checkpoints"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}},
                             "storageClassName": "fast"}


def test_services_and_store_pod():
    s = spec(rendezvous={"port": 29500, "storeImage": "store:2"})
    headless = builders.headless_service(JOB)
    assert headless["metadata"]["name"] == "digits"
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == builders.worker_selector("digits")
    svc = builders.store_service(JOB, s)
    assert svc["metadata"]["name"] == "digits-rdzv" and svc["spec"]["ports"][0]["port"] == 29500
    store = builders.store_pod(JOB, s)
    assert set(svc["spec"]["selector"].items()) <= set(store["metadata"]["labels"].items())
    assert not set(headless["spec"]["selector"].items()) <= set(store["metadata"]["labels"].items())
    container = store["spec"]["containers"][0]
    assert container["image"] == "store:2"
    assert container["command"] == ["python", "-c", builders.STORE_PROGRAM, "29500"]
    assert store["spec"]["restartPolicy"] == "Never"  # a restarted store lost its state: must be seen
    assert builders.store_pod(JOB, spec())["spec"]["containers"][0]["image"] == "trainer:1"


def test_examples_render_deterministically():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        job = parse_job(yaml.safe_load(path.read_text()))
        ref = builders.JobRef.preview(job.metadata.name, "default")
        first, second = builders.all_manifests(ref, job.spec), builders.all_manifests(ref, job.spec)
        assert first == second
        names = [m["metadata"]["name"] for m in first]
        assert len(names) == len(set((m["kind"], n) for m, n in zip(first, names)))
        assert sum(m["kind"] == "Pod" for m in first) == job.spec.replicas + 1


def test_store_program_serves_a_tcpstore_and_stops_on_sigterm(unused_tcp_port):
    """The fixed store program really runs: a client sets and reads a key; SIGTERM exits 0."""
    import torch.distributed as dist  # the test process may import torch; the operator never does

    proc = subprocess.Popen(builders.store_command(unused_tcp_port, python=sys.executable),
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
