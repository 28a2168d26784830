"""A DDPJob spec -> the Kubernetes objects the operator creates: worker, spare and store pods, the Services,
the checkpoint claim, the PodGroup and the agent's ConfigMap.

Pure: no I/O and no Kubernetes client; the same inputs give the same objects. Names and labels come from
naming.py, each container's command and environment from launch.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from . import agent, model
from .agent.contract import PROGRESS_CA_ENV, PROGRESS_TOKEN_ENV, PROGRESS_URL_ENV, SPARE_ENV, SPARE_READY_FILE_ENV
from .launch import AGENT_DIR, POD_IP_ENV, POD_IP_REFERENCE, SIMPLE_QUANTITY, store_command, worker_command, worker_env
from .naming import (HOSTNAME_TOPOLOGY, LABEL_ATTEMPT, LABEL_GENERATION, LABEL_JOB_NAME, LABEL_NNODES,
                     LABEL_REPLICA_INDEX, LABEL_ROLE, ROLE_SPARE, ROLE_STORE, ROLE_WORKER, STORE_CONTAINER,
                     TRAINER_CONTAINER, JobRef, checkpoint_claim_name, headless_service_name, job_labels, node_range,
                     pod_group_name, rendezvous_id, spare_name, store_endpoint, store_labels, store_pod_name,
                     store_service_name, worker_address, worker_name, worker_selector)

SHM_VOLUME = model.SHM_VOLUME
CHECKPOINT_VOLUME = model.CHECKPOINT_VOLUME
# Default scheduler taint on GPU nodes (NVIDIA device plugin / GKE / EKS convention).
GPU_TOLERATION_EFFECT = "NoSchedule"
# Taints the node lifecycle controller puts on a node that stops responding. Workers and the store
# tolerate them only failurePolicy.nodeLossTimeoutSeconds (Kubernetes' default is 300 s), so a pod on a
# lost node is evicted, and replaced, soon.
NODE_LOSS_TAINT_KEYS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


# ---------------------------------------------------------------- the agent, by reference (issue 37)

# The job's agent ConfigMap, mounted read-only at launch.AGENT_DIR in every worker and spare.
AGENT_VOLUME = f"{model.OPERATOR_VOLUME_PREFIX}agent"
AGENT_FILE_MODE = 0o444


def agent_config_map_name(job_name: str) -> str:
    # The files' digest in the name: a newer operator's agent is a ConfigMap of its own (they are immutable),
    # and the pods already running keep the one they mounted.
    return f"{job_name}-agent-{agent.POD_DIGEST}"


# ---------------------------------------------------------------- progress reporting (issue 12)

# Where the trainer POSTs its progress, and the file holding the pod's projected service-account token
# it authenticates with (audience: the operator's; the operator checks it with a TokenReview).
# (PROGRESS_URL_ENV, PROGRESS_TOKEN_ENV, PROGRESS_CA_ENV: agent/contract.py, whose spares ask the same endpoint.)
PROGRESS_TOKEN_VOLUME = "ddpjob-progress-token"
PROGRESS_TOKEN_DIR = "/var/run/secrets/ddpjob/progress"
PROGRESS_TOKEN_SECONDS = 3600  # the kubelet rotates it at 80% of this


@dataclass(frozen=True)
class ProgressEndpoint:
    """The operator's progress endpoint as worker pods reach it (its Service) and the token audience."""

    base_url: str
    audience: str
    ca_pem: str = ""  # with an https endpoint: the CA (public) its certificate chains to


def progress_url(base_url: str, namespace: str, job_name: str) -> str:
    return f"{base_url.rstrip('/')}/v1/namespaces/{namespace}/ddpjobs/{job_name}/progress"


# ---------------------------------------------------------------- pods


def owner_reference(job: JobRef) -> dict[str, Any]:
    return {"apiVersion": model.API_VERSION, "kind": model.KIND, "name": job.name, "uid": job.uid,
            "controller": True, "blockOwnerDeletion": True}


def _metadata(job: JobRef, name: str, labels: dict[str, str],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "labels": labels,
                            "ownerReferences": [owner_reference(job)]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _resources(spec: model.DDPJobSpec) -> dict[str, Any]:
    amounts: dict[str, str] = {}
    if spec.resources.cpu:
        amounts["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        amounts["memory"] = spec.resources.memory
    if spec.gpus_per_pod:
        amounts[spec.resources.gpu_resource_name] = str(spec.gpus_per_pod)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _tolerates(tolerations: list[dict[str, Any]], key: str) -> bool:
    """The list already says how long to stay on a node tainted `key` (an entry for it, or a keyless Exists)."""
    return any(t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists"
                                       and t.get("effect") in (None, "", "NoExecute"))
               for t in tolerations)


def with_node_loss_tolerations(spec: model.DDPJobSpec, tolerations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`tolerations` plus a short NoExecute toleration for each node-loss taint it does not cover."""
    seconds = spec.failure_policy.node_loss_timeout_seconds
    return list(tolerations) + [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
                                for key in NODE_LOSS_TAINT_KEYS if not _tolerates(tolerations, key)]


def worker_tolerations(spec: model.DDPJobSpec) -> list[dict[str, Any]]:
    """The user's template.tolerations, the GPU toleration, then the node-loss ones the user did not set."""
    tolerations = list(spec.template.tolerations or [])
    if spec.resources.gpu:
        tolerations.append({"key": spec.resources.gpu_resource_name, "operator": "Exists",
                            "effect": GPU_TOLERATION_EFFECT})
    return with_node_loss_tolerations(spec, tolerations)


def worker_pod(job: JobRef, spec: model.DDPJobSpec, *, index: int, generation: int,
               attempt: int = 0, progress: ProgressEndpoint | None = None,
               avoid_nodes: tuple[str, ...] = ()) -> dict[str, Any]:
    name = worker_name(job.name, index)
    template = spec.template
    endpoint = store_endpoint(job.name, job.namespace, spec.rendezvous.port)
    rdzv_id = rendezvous_id(job.uid, generation)
    labels = {**(template.labels or {}), **job_labels(job), LABEL_ROLE: ROLE_WORKER,
              LABEL_REPLICA_INDEX: str(index), LABEL_GENERATION: str(generation),
              LABEL_ATTEMPT: str(attempt), LABEL_NNODES: node_range(spec)}
    contract = worker_env(spec, job_name=job.name, namespace=job.namespace, index=index,
                          generation=generation, endpoint=endpoint, rdzv_id=rdzv_id,
                          local_addr=POD_IP_REFERENCE, master_addr=worker_address(job.name, job.namespace, 0))
    # First: `$(DDPJOB_POD_IP)` in later env values (PET_LOCAL_ADDR) only expands to earlier variables.
    pod_ip = {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    if progress is not None:
        contract[PROGRESS_URL_ENV] = progress_url(progress.base_url, job.namespace, job.name)
        contract[PROGRESS_TOKEN_ENV] = f"{PROGRESS_TOKEN_DIR}/token"
        if progress.ca_pem:
            contract[PROGRESS_CA_ENV] = progress.ca_pem
    user_env = [e.wire() for e in spec.env]
    # Kubernetes keeps the LAST of duplicate names: a contract variable the user also set (the model refuses
    # that; a spec stored before the rule) is repeated after the user's, so the operator's value wins.
    clashes = [k for k in contract if k in {e["name"] for e in user_env}]
    env = [pod_ip] + [{"name": k, "value": v} for k, v in contract.items()] + user_env \
        + [{"name": k, "value": contract[k]} for k in clashes]

    agent_mount, agent_files = agent_volume(job)
    mounts = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}, agent_mount]
    volumes: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": {
        "medium": "Memory", "sizeLimit": spec.resources.shared_memory}}, agent_files]
    claim = checkpoint_claim_name(job.name, spec)
    if claim is not None:
        assert spec.checkpoint is not None
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path})
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    if progress is not None:
        # A token only the operator accepts (its audience), bound to this pod: no RBAC for the pod.
        mounts.append({"name": PROGRESS_TOKEN_VOLUME, "mountPath": PROGRESS_TOKEN_DIR, "readOnly": True})
        volumes.append({"name": PROGRESS_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {
            "audience": progress.audience, "expirationSeconds": PROGRESS_TOKEN_SECONDS, "path": "token"}}]}})
    mounts += list(template.volume_mounts or [])
    volumes += list(template.volumes or [])

    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": worker_command(spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr=POD_IP_REFERENCE),
        "env": env,
        # The launcher writes the failure to /dev/termination-log; without one, the log's tail.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    trainer = template.trainer.wire() if template.trainer is not None else {}
    resources = _merge_resources(_resources(spec), trainer.pop("resources", {}))
    if resources:
        container["resources"] = resources
    container.update(trainer)  # the rest of spec.template.trainer: fields the operator never sets

    tolerations = worker_tolerations(spec)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator replaces pods; torchrun restarts processes in-pod
        "hostname": name,
        "subdomain": headless_service_name(job.name),
        "terminationGracePeriodSeconds": template.termination_grace_period_seconds,
        "containers": [container],
        "volumes": volumes,
    }
    # Only relabel the volume when its root does not match: a big checkpoint claim stays fast.
    pod_spec["securityContext"] = {"fsGroup": template.fs_group, "fsGroupChangePolicy": "OnRootMismatch"}
    optional = {"nodeSelector": template.node_selector, "affinity": template.affinity,
                "tolerations": tolerations, "serviceAccountName": template.service_account_name,
                "priorityClassName": template.priority_class_name}
    pod_spec.update({k: v for k, v in optional.items() if v})
    annotations = dict(template.annotations or {})
    _add_pod_spec_overrides(job, spec, pod_spec)
    _avoid_nodes(pod_spec, avoid_nodes)
    _add_gang(job, spec, pod_spec, labels, annotations)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _metadata(job, name, labels, annotations), "spec": pod_spec}


# A spare's readiness (contract.SPARE_READY_FILE_ENV): its launcher writes `<pod name>.ready` in an emptyDir
# of its own, under the operator's directory (no template mount may go there), once it is warm and the
# operator answered its first assignment request; the readiness probe tests for it. An exec probe spawns a
# process each period: every 3 s, for a spare that is warmed long before it is needed.
SPARE_READY_VOLUME = "ddpjob-spare"
SPARE_READY_DIR = f"{model.OPERATOR_SECRETS_DIR}/spare"
SPARE_READY_PERIOD_SECONDS = 3


def spare_ready_file(pod_name: str) -> str:
    return f"{SPARE_READY_DIR}/{pod_name}.ready"


def spare_readiness_probe(pod_name: str) -> dict[str, Any]:
    """Ready once the mark exists (it is never removed, so one timed-out probe of a loaded node never
    flips it: 3 failures in a row do)."""
    return {"exec": {"command": ["test", "-f", spare_ready_file(pod_name)]},
            "periodSeconds": SPARE_READY_PERIOD_SECONDS, "timeoutSeconds": 2, "successThreshold": 1,
            "failureThreshold": 3}


def spare_pod(job: JobRef, spec: model.DDPJobSpec, *, serial: int, generation: int,
              progress: ProgressEndpoint | None = None) -> dict[str, Any]:
    """A warm spare: a worker's pod (image, resources, volumes, token) whose launcher waits for an
    assignment (contract.SPARE_ENV) instead of joining a rendezvous. It prefers a node without the job's
    workers, so that a node lost with a worker does not take its replacement with it. It is Ready (and only
    then counted in readySpares and promoted) once its launcher marked itself ready: imports done and the
    operator's endpoint answered (spare_readiness_probe); the template's own probes, meant for a trainer,
    are not a spare's."""
    pod = copy.deepcopy(worker_pod(job, spec, index=0, generation=generation, progress=progress))  # owns its dicts
    name = spare_name(job.name, serial)
    meta, pod_spec = pod["metadata"], pod["spec"]
    meta["name"] = name
    labels = meta["labels"]
    labels[LABEL_ROLE] = ROLE_SPARE
    for key in (LABEL_REPLICA_INDEX, LABEL_ATTEMPT):
        labels.pop(key, None)
    pod_spec["hostname"] = name
    container = pod_spec["containers"][0]
    for var in container["env"]:
        if var["name"] == "DDPJOB_REPLICA_INDEX":
            var["value"] = "-1"  # until assigned
        elif var["name"] == SPARE_ENV:
            var["value"] = "1"  # in place: a second entry of the name would draw the API server's warning
        elif var["name"] == SPARE_READY_FILE_ENV:
            var["value"] = spare_ready_file(name)
    container["readinessProbe"] = spare_readiness_probe(name)
    # A trainer's liveness or startup probe fails in an idle spare, which runs no trainer: the kubelet would
    # kill it over and over. A promoted spare trains without them (its rank's next worker pod has them again).
    container.pop("livenessProbe", None)
    container.pop("startupProbe", None)
    container.setdefault("volumeMounts", []).append({"name": SPARE_READY_VOLUME, "mountPath": SPARE_READY_DIR})
    pod_spec["volumes"].append({"name": SPARE_READY_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
    anti = {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
        "matchLabels": {LABEL_JOB_NAME: job.name, LABEL_ROLE: ROLE_WORKER}}}}
    affinity = pod_spec.setdefault("affinity", {})
    preferred = affinity.setdefault("podAntiAffinity", {}).setdefault(
        "preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.append(anti)
    return pod


def _merge_resources(ours: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """spec.resources' requests and limits plus template.trainer.resources' (other resource names only)."""
    merged = {part: dict(ours.get(part, {})) for part in ("requests", "limits")}
    for part in ("requests", "limits"):
        merged[part].update(extra.get(part) or {})
    out: dict[str, Any] = {part: amounts for part, amounts in merged.items() if amounts}
    if extra.get("claims"):
        out["claims"] = extra["claims"]
    return out


def _add_pod_spec_overrides(job: JobRef, spec: model.DDPJobSpec, pod_spec: dict[str, Any]) -> None:
    """spec.template.podSpec: every field as written (the model rejects the operator's own)."""
    extra = spec.template.pod_spec.wire() if spec.template.pod_spec is not None else {}
    security = {**pod_spec["securityContext"], **extra.pop("securityContext", {})}
    pod_spec.update(extra)
    pod_spec["securityContext"] = security
    if extra.get("hostNetwork"):
        # The node's resolver cannot resolve the rendezvous Service; ClusterFirstWithHostNet can.
        pod_spec.setdefault("dnsPolicy", "ClusterFirstWithHostNet")
        # On the node's network a worker publishes its node's IP, and torchrun's rendezvous node id is
        # (address, pid, n): two workers of the job on one node would share it. One worker per node.
        affinity = pod_spec["affinity"] = copy.deepcopy(pod_spec.get("affinity") or {})  # never the spec's own
        anti = affinity.setdefault("podAntiAffinity", {})
        anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
            {"labelSelector": {"matchLabels": worker_selector(job.name)}, "topologyKey": HOSTNAME_TOPOLOGY})


def _avoid_nodes(pod_spec: dict[str, Any], nodes: tuple[str, ...]) -> None:
    """status.avoidedNodes (decisions/nodes.py): required node anti-affinity, `NotIn` on the hostname label,
    ANDed into every required term the user wrote (terms are ORed, a term's expressions ANDed)."""
    if not nodes:
        return
    avoid = {"key": HOSTNAME_TOPOLOGY, "operator": "NotIn", "values": sorted(nodes)}
    affinity = pod_spec["affinity"] = copy.deepcopy(pod_spec.get("affinity") or {})  # never the spec's own
    required = affinity.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution",
                                                                   {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(avoid))


def _add_gang(job: JobRef, spec: model.DDPJobSpec, pod_spec: dict[str, Any], labels: dict[str, str],
              annotations: dict[str, str]) -> None:
    """runPolicy.schedulingPolicy: the gang scheduler, and the pod's membership of the job's PodGroup."""
    policy = spec.run_policy.scheduling_policy
    if policy is None:
        return
    pod_spec["schedulerName"] = policy.effective_scheduler_name
    if policy.gang_scheduler == "Volcano":
        annotations[model.VOLCANO_GROUP_ANNOTATION] = pod_group_name(job.name)
    else:
        labels[model.COSCHEDULING_GROUP_LABEL] = pod_group_name(job.name)


def store_tolerations(spec: model.DDPJobSpec) -> list[dict[str, Any]]:
    """rendezvous.storeTemplate.tolerations, else the workers' (GPU one included); node-loss ones added."""
    own = spec.rendezvous.store_template.tolerations
    if own is None:
        return worker_tolerations(spec)
    return with_node_loss_tolerations(spec, [t.wire() for t in own])


def store_pod(job: JobRef, spec: model.DDPJobSpec) -> dict[str, Any]:
    """The rendezvous store: scheduled like the workers (rendezvous.storeTemplate overrides each part)."""
    port = spec.rendezvous.port
    store = spec.rendezvous.store_template
    mount, volume = agent_volume(job)  # the store's program is the agent's (agent/store.py), by reference
    container = {
        "name": STORE_CONTAINER,
        "image": spec.rendezvous.store_image or spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": store_command(port),
        "ports": [{"name": "rendezvous", "containerPort": port}],
        "volumeMounts": [mount],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": store.resources.cpu, "memory": store.resources.memory}},
        # A TCPStore needs no privileges: this passes the restricted Pod Security level (with the pod's
        # runAsNonRoot and seccompProfile from template.podSpec.securityContext).
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    pod_spec: dict[str, Any] = {
        # Never, not Always: a restarted store has lost its state, so the operator must see the
        # loss (phase Failed / pod gone) and move the job to a fresh rendezvous generation.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
        "volumes": [volume],
    }
    node_selector = store.node_selector if store.node_selector is not None else spec.template.node_selector
    priority = store.priority_class_name if store.priority_class_name is not None \
        else spec.template.priority_class_name
    workers = spec.template.pod_spec
    optional = {"nodeSelector": node_selector, "tolerations": store_tolerations(spec),
                "serviceAccountName": spec.template.service_account_name, "priorityClassName": priority,
                # The store runs the trainer image by default: it needs the same pull secrets, and the same
                # pod security context to pass the namespace's Pod Security level.
                "imagePullSecrets": workers.image_pull_secrets if workers else None,
                "securityContext": workers.security_context if workers else None}
    pod_spec.update({k: v for k, v in optional.items() if v})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _metadata(job, store_pod_name(job.name), store_labels(job)), "spec": pod_spec}


def store_service(job: JobRef, spec: model.DDPJobSpec) -> dict[str, Any]:
    port = spec.rendezvous.port
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(job, store_service_name(job.name), job_labels(job)),
            "spec": {"type": "ClusterIP", "selector": {LABEL_JOB_NAME: job.name, LABEL_ROLE: ROLE_STORE},
                     "ports": [{"name": "rendezvous", "port": port, "targetPort": port}]}}


def headless_service(job: JobRef) -> dict[str, Any]:
    """Gives each worker stable DNS `<job>-worker-<i>.<job>-workers.<ns>.svc`, even before it is Ready."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(job, headless_service_name(job.name), job_labels(job)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": worker_selector(job.name)}}


def agent_config_map(job: JobRef) -> dict[str, Any]:
    """The agent's files, keyed by file name, byte for byte the operator package's; immutable (the kubelet
    watches none of it, and nobody can change what a running pod's agent is)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(job, agent_config_map_name(job.name), job_labels(job)),
            "immutable": True, "data": dict(agent.POD_SOURCES)}


def agent_volume(job: JobRef) -> tuple[dict[str, Any], dict[str, Any]]:
    """The worker container's mount of the agent ConfigMap, and the pod's volume."""
    return ({"name": AGENT_VOLUME, "mountPath": AGENT_DIR, "readOnly": True},
            {"name": AGENT_VOLUME, "configMap": {"name": agent_config_map_name(job.name),
                                                  "defaultMode": AGENT_FILE_MODE}})


def checkpoint_claim(job: JobRef, spec: model.DDPJobSpec) -> dict[str, Any] | None:
    """The PVC to create from claimTemplate; None when the job uses an existing claim or none."""
    if spec.checkpoint is None or spec.checkpoint.claim_template is None:
        return None
    template = spec.checkpoint.claim_template
    claim_spec: dict[str, Any] = {"accessModes": list(template.access_modes),
                                  "resources": {"requests": {"storage": template.size}}}
    if template.storage_class_name is not None:  # "" binds a volume of no class; omitted, the default class's
        claim_spec["storageClassName"] = template.storage_class_name
    name = checkpoint_claim_name(job.name, spec)
    assert name is not None
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _metadata(job, name, job_labels(job)), "spec": claim_spec}


def pod_group(job: JobRef, spec: model.DDPJobSpec) -> dict[str, Any] | None:
    """The PodGroup of runPolicy.schedulingPolicy's gang scheduler; None without a policy."""
    policy = spec.run_policy.scheduling_policy
    if policy is None:
        return None
    group: dict[str, Any] = {"minMember": spec.min_available}
    if policy.gang_scheduler == "Volcano":
        priority = policy.priority_class or spec.template.priority_class_name
        group.update({k: v for k, v in (("queue", policy.queue), ("priorityClassName", priority)) if v})
    elif policy.schedule_timeout_seconds is not None:
        group["scheduleTimeoutSeconds"] = policy.schedule_timeout_seconds
    minimum = gang_resources(spec)
    if minimum:
        group["minResources"] = minimum
    return {"apiVersion": policy.api_version, "kind": "PodGroup",
            "metadata": _metadata(job, pod_group_name(job.name), job_labels(job)), "spec": group}


def _times(quantity: int | str, factor: int) -> str | None:
    """`quantity` x `factor` as a quantity (`500m` x 2 = `1000m`); None for a form this does not handle."""
    match = SIMPLE_QUANTITY.match(str(quantity))
    if match is None:
        return None
    try:
        number = Decimal(match.group(1)) * factor
    except InvalidOperation:
        return None
    return f"{number.normalize():f}{match.group(2)}"


def gang_resources(spec: model.DDPJobSpec) -> dict[str, str]:
    """The trainer requests of minAvailable workers (the PodGroup's minResources, for queue admission)."""
    container = _merge_resources(_resources(spec), spec.template.trainer.resources.wire()
                                 if spec.template.trainer and spec.template.trainer.resources else {})
    per_pod = {**container.get("limits", {}), **container.get("requests", {})}  # requests default to limits
    total = {name: _times(amount, spec.min_available) for name, amount in per_pod.items()}
    return {name: amount for name, amount in total.items() if amount is not None}


def shared_manifests(job: JobRef, spec: model.DDPJobSpec) -> list[dict[str, Any]]:
    """Objects that live as long as the job: the PodGroup (gang scheduling), the agent's ConfigMap, the two
    Services and the checkpoint claim. All exist before any pod is created."""
    claim, group = checkpoint_claim(job, spec), pod_group(job, spec)
    return ([group] if group else []) + [agent_config_map(job), headless_service(job), store_service(job, spec)] \
        + ([claim] if claim else [])


def all_manifests(job: JobRef, spec: model.DDPJobSpec, *, generation: int = 0,
                  progress: ProgressEndpoint | None = None) -> list[dict[str, Any]]:
    """Everything a fresh job creates, in creation order (for `ddpjob render`)."""
    workers = [worker_pod(job, spec, index=i, generation=generation, progress=progress)
               for i in range(spec.replicas)]
    return shared_manifests(job, spec) + [store_pod(job, spec)] + workers
