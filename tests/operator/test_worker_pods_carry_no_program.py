"""Issue 37: a worker pod carries no program. Its command names the agent's entry file in the job's agent
ConfigMap, mounted read-only; the ConfigMap carries the package's files byte for byte, is named by their
digest (immutable: another agent is another ConfigMap) and exists before the job's first pod; pods an older
operator started with the program in their command keep running after an upgrade."""

from __future__ import annotations

import json
from pathlib import Path

import kmock
import pytest
import trustme

from ddpjob_operator import agent, job_manifests, launch, naming, validation

from .conftest import NAMESPACE, eventually, passes, started
from tests.kube_emulator import PODS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("**/*.yaml"))
CONFIG_MAPS = kmock.resource("", "v1", "configmaps")
POD_LIMIT = 8 * 1024  # bytes of a worker or spare pod as JSON (issue 37's target)
# The chart's progress endpoint over TLS: a worker's largest environment (the CA's PEM in DDPJOB_PROGRESS_CA).
PROGRESS = job_manifests.ProgressEndpoint(
    "https://ddpjob-operator-progress.ddpjob-system.svc:8443", "ddpjob-operator",
    trustme.CA(key_type=trustme.KeyType.RSA).cert_pem.bytes().decode())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_examples_worker_and_spare_pod_is_under_8_kb_as_json(path):
    for job in validation.load_jobs(path):
        ref = naming.JobRef.preview(job.metadata.name, job.metadata.namespace or "default")
        pods = [m for m in job_manifests.all_manifests(ref, job.spec, progress=PROGRESS)
                if m["kind"] == "Pod" and m["metadata"]["labels"][naming.LABEL_ROLE] == naming.ROLE_WORKER]
        assert len(pods) == job.spec.replicas
        pods.append(job_manifests.spare_pod(ref, job.spec, serial=0, generation=0, progress=PROGRESS))
        for pod in pods:
            size = len(json.dumps(pod, separators=(",", ":")))
            assert size < POD_LIMIT, f"{pod['metadata']['name']}: {size} bytes"
            # Nothing in the command but the launcher's path, torchrun's flags and the user's argv.
            assert max(len(part) for part in pod["spec"]["containers"][0]["command"]) < 512


def test_the_agent_config_map_is_the_packages_files_byte_for_byte_named_by_their_digest():
    job = naming.JobRef("digits", "team-a", "0b9f6d0e-uid")
    config_map = job_manifests.agent_config_map(job)
    directory = Path(agent.__file__).parent
    files = {name: (directory / name).read_bytes() for name in config_map["data"]}
    assert {name: text.encode() for name, text in config_map["data"].items()} == files
    assert {"bootstrap.py", "contract.py", "worker.py"} <= set(files)
    assert config_map["immutable"] is True
    assert config_map["metadata"]["ownerReferences"] == [job_manifests.owner_reference(job)]
    assert config_map["metadata"]["labels"] == naming.job_labels(job)
    assert config_map["metadata"]["name"] == f"digits-agent-{agent.digest(config_map['data'])}"
    # Any change of any file is another name: a newer operator never reuses an older agent's ConfigMap.
    for name in config_map["data"]:
        changed = {**config_map["data"], name: config_map["data"][name] + "\n"}
        assert agent.digest(changed) != agent.digest(config_map["data"]), name
    assert agent.digest({"a.py": "x", "b.py": ""}) != agent.digest({"a.py": "", "b.py": "x"})
    # Every worker and spare mounts it read-only and runs its entry file.
    spec = validation.load_jobs(ROOT / "examples" / "cpu-digits.yaml")[0].spec
    for pod in (job_manifests.worker_pod(job, spec, index=0, generation=0),
                job_manifests.spare_pod(job, spec, serial=0, generation=0)):
        volume = next(v for v in pod["spec"]["volumes"] if "configMap" in v)
        assert volume["configMap"] == {"name": config_map["metadata"]["name"], "defaultMode": 0o444}
        container = pod["spec"]["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
        assert mount["readOnly"] is True
        assert container["command"][1:3] == [f"{mount['mountPath']}/bootstrap.py", "worker"]


async def created_at(harness, plural: str) -> dict[str, int]:
    """name -> the resourceVersion each object of the namespace was created at (the API server's one counter
    for all objects, as etcd's), from a watch replaying every change since the first."""
    async with harness.session.get(f"{harness.url}/api/v1/namespaces/{NAMESPACE}/{plural}",
                                   params={"watch": "true", "resourceVersion": "1", "timeoutSeconds": "1"}) as response:
        assert response.status == 200, await response.text()
        events = [json.loads(line) for line in (await response.text()).splitlines() if line.strip()]
    return {e["object"]["metadata"]["name"]: int(e["object"]["metadata"]["resourceVersion"])
            for e in events if e["type"] == "ADDED"}


# Spares ask the progress endpoint for their assignment: the operator creates them only with one.
@pytest.mark.settings(progress_url="http://ddpjob-progress.ddpjob-system.svc:8090", bind_address="127.0.0.1")
async def test_the_agent_config_map_exists_before_the_jobs_first_pod(harness, operator):
    job = await started(harness, "digits", checkpoint={"claimTemplate": {"size": "1Gi"}},
                        failurePolicy={"maxRestarts": 3, "spares": 1})
    await eventually(lambda: harness.pods("digits", naming.ROLE_SPARE), what="the spare")
    maps = await created_at(harness, "configmaps")
    pods = await created_at(harness, "pods")
    name = job_manifests.agent_config_map_name("digits")
    assert set(maps) == {name} and len(pods) == 4, (maps, pods)  # the store, 2 workers, the spare
    assert maps[name] < min(pods.values())
    stored = next(c for c in harness.cluster.live(CONFIG_MAPS, NAMESPACE) if c["metadata"]["name"] == name)
    assert stored["data"] == agent.POD_SOURCES and stored["immutable"] is True
    assert stored["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    for pod in [*harness.pods("digits").values(), *harness.pods("digits", naming.ROLE_SPARE).values()]:
        assert {"name": job_manifests.AGENT_VOLUME, "configMap": {"name": name, "defaultMode": 0o444}} \
            in pod["spec"]["volumes"], pod["metadata"]["name"]


def with_the_program_in_its_command(pod: dict) -> dict:
    """The pod as an operator before issue 37 made it: the agent's source in the command, no agent volume."""
    container = dict(pod["spec"]["containers"][0])
    container["command"] = ["python", "-c", "# the agent's source (24 KB) was here\n", *container["command"][3:]]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != job_manifests.AGENT_VOLUME]
    return {"spec": {"containers": [container],
                     "volumes": [v for v in pod["spec"]["volumes"] if v["name"] != job_manifests.AGENT_VOLUME]}}


async def test_pods_an_older_operator_started_keep_running_after_an_upgrade(harness, operator):
    await started(harness, "upgraded", failurePolicy={"maxRestarts": 3, "backoff": {"initialSeconds": 0}})
    await operator.stop()
    # What the older operator left: pods with the program in their command, and no agent ConfigMap.
    await harness.cluster.remove((CONFIG_MAPS, NAMESPACE, job_manifests.agent_config_map_name("upgraded")))
    old = harness.pods("upgraded")
    for name, pod in old.items():
        await harness.cluster.write((PODS, NAMESPACE, name), with_the_program_in_its_command(pod))
    await operator.start()  # the new operator version
    await passes(operator, 3)
    pods = harness.pods("upgraded")
    assert {n: p["metadata"]["uid"] for n, p in pods.items()} == {n: p["metadata"]["uid"] for n, p in old.items()}
    assert not any(p["metadata"].get("deletionTimestamp") for p in pods.values())
    assert harness.status("upgraded")["phase"] == "Running" and harness.status("upgraded")["restarts"] == 0
    # A rank lost after the upgrade: its replacement runs the new agent, the old survivor stays in place.
    await harness.exit("upgraded-worker-1", 137, "OOMKilled")
    replacement = await eventually(lambda: harness.pods("upgraded").get("upgraded-worker-1") if harness.pods(
        "upgraded").get("upgraded-worker-1", {}).get("metadata", {}).get("uid") != old["upgraded-worker-1"][
        "metadata"]["uid"] else None, what="the replacement")
    assert replacement["spec"]["containers"][0]["command"][1] == f"{launch.AGENT_DIR}/bootstrap.py"
    assert harness.pods("upgraded")["upgraded-worker-0"]["metadata"]["uid"] == old["upgraded-worker-0"]["metadata"]["uid"]
    assert [c["metadata"]["name"] for c in harness.cluster.live(CONFIG_MAPS, NAMESPACE)] == \
        [job_manifests.agent_config_map_name("upgraded")]
