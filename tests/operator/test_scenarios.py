"""Issue 16, the API tier: every failure-semantics scenario that needs Kubernetes, replayed through the
API double (emulator.py) with the real operator running against it (docs/operator.md, "What users
can rely on (failure semantics)" and "Failure semantics" are the contract).

The test plays the scheduler and the kubelets: pods are bound and run only when a test says so, and
exit, stop after SIGTERM (`kubelet_finish`) or get lost with their node the way the components do it.
Survivors of a crash keep running with restartScope Pod (their launchers join the next generation in
place: test_in_place.py); where a scenario makes one exit anyway, it exits as torch's agents do, exit 1
with the launcher's termination message ending "[generation N] [rendezvous closed]" (launch_agent
closes the rendezvous on any exit but a signal). Every test ends with exact values: the phase and its condition's
reason, status.restarts, status.disruptions, status.generation and the last incident (cause, charged,
ranks), and no pod is ever created twice for one purpose.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from typing import Any

import kmock
import pytest
import pytest_asyncio

from ddpjob_operator import model, naming
from ddpjob_operator.agent import contract

from . import conftest
from .conftest import FAST, NAMESPACE, Harness, OperatorProcess, eventually, operator_fixture, passes
from tests.kube_emulator import NODES, PODS, NodeUnreachable, api_error

pytestmark = pytest.mark.timeout(60)

NS = NAMESPACE
# An incident that would fail the job or keep its survivors waits this long for the exits it causes.
# Container timestamps have whole seconds (as on a real server), so FAST's 1 s could leave a window of
# a few milliseconds; 2 s leaves at least one whole second for exits the test writes back to back.
SETTINGS = dataclasses.replace(FAST, incident_settle_seconds=2.0)
NO_BACKOFF = {"backoff": {"initialSeconds": 0, "maxSeconds": 1}}
STORE_NODE, SPARE_NODE = "node-store", "node-spare"
CLOSED = contract.RENDEZVOUS_CLOSED_MARK
# What the launcher writes (agent/worker.py) in the situations the scenarios play.
PEER_LOST = "rank {rank} (local rank 0) exited with code 1: DistBackendError: [../third_party/gloo/gloo/" \
            "transport/tcp/pair.cc:534] Connection closed by peer [10.244.0.11]:21466 [generation 0] " + CLOSED
SIGTERMED = "torchrun stopped by SIGTERM; exit code 143"
STORE_GONE = "rendezvous failed: RendezvousConnectionError: The connection to the C10d store has failed. " \
             "See inner exception for details. " + CLOSED
JOIN_TIMEOUT = "rendezvous failed: RendezvousTimeoutError: " + CLOSED
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: " \
                "3 No preemption victims found for incoming pod."


operator = operator_fixture(SETTINGS)


# ---------------------------------------------------------------- the scheduler and the kubelets

class Nodes:
    """The test's scheduler and kubelets for one harness. Worker i runs on node-i (its own node), the
    store on node-store, and a pod whose node is down on node-spare (the store included)."""

    def __init__(self, harness: Harness):
        self.h, self.c = harness, harness.cluster

    def node_for(self, pod: dict[str, Any]) -> str:
        labels = pod["metadata"]["labels"]
        if labels.get(naming.LABEL_ROLE) == naming.ROLE_STORE:
            node = STORE_NODE
        elif labels.get(naming.LABEL_ROLE) == naming.ROLE_SPARE:
            node = "node-3"  # off the workers' nodes, as its preferred anti-affinity asks
        else:
            node = f"node-{labels[naming.LABEL_REPLICA_INDEX]}"
        return SPARE_NODE if node in self.c.unreachable_nodes else node

    async def start(self, *names: str) -> None:
        """The scheduler binds each pod and its kubelet starts it."""
        for name in names:
            pod = self.c.get(PODS, NS, name)
            assert pod is not None, f"no pod {name} to start"
            await self.c.bind(NS, name, self.node_for(pod))
            await self.c.kubelet_start(NS, name)

    def waiting(self, job: str) -> list[str]:
        """Pods of the job that no kubelet runs yet (and that are not being deleted)."""
        pods = {**self.h.pods(job), **self.h.pods(job, naming.ROLE_STORE)}
        return sorted(n for n, p in pods.items() if not p["spec"].get("nodeName")
                      and not p["metadata"].get("deletionTimestamp"))

    async def start_all(self, job: str) -> list[str]:
        names = self.waiting(job)
        await self.start(*names)
        return names

    async def exit(self, name: str, code: int, message: str | None = None, reason: str = "Error") -> None:
        await self.c.kubelet_exit(NS, name, code, reason, message)

    async def confirm(self, job: str) -> list[str]:
        """Each reachable kubelet completes the graceful deletions of its pods (SIGTERM -> 143)."""
        done = []
        for role in (naming.ROLE_WORKER, naming.ROLE_STORE):
            for name, pod in self.h.pods(job, role).items():
                if not pod["metadata"].get("deletionTimestamp"):
                    continue
                try:
                    await self.c.kubelet_finish(NS, name, 143, SIGTERMED)
                except NodeUnreachable:
                    continue  # its kubelet is gone: only a force delete removes it
                except Exception as exc:  # noqa: BLE001 - deleted meanwhile (the operator forced it)
                    if getattr(exc, "status", None) != 404:
                        raise
                done.append(name)
        return done

    async def generation_running(self, job: str, generation: int, replicas: int, timeout: float = 10.0) -> None:
        """Wait for the workers of `generation` (confirming the old ones' deletions), start them, and wait
        for the job to be Running."""
        await self.h.settle(job, lambda: self.workers_of(job, generation) == replicas and not [
            p for p in self.h.pods(job).values() if self.served(job, p) != generation]
            and self.h.pods(job, naming.ROLE_STORE), timeout, f"{replicas} workers of generation {generation}",
            confirm=self.confirm)
        await self.start_all(job)
        await self.h.wait_phase(job, "Running", timeout)

    def served(self, job: str, pod: dict[str, Any]) -> int:
        """The generation a pod serves: its label's, or the later one the operator carried its survivor
        into (status.ranks[].uid and .generation: its agent joins that one in place)."""
        label = int(pod["metadata"]["labels"][naming.LABEL_GENERATION])
        index = int(pod["metadata"]["labels"][naming.LABEL_REPLICA_INDEX])
        for rank in self.h.status(job).get("ranks", []):
            if rank["index"] == index and rank.get("uid") == pod["metadata"]["uid"] and rank.get("generation"):
                return max(label, rank["generation"])
        return label

    def workers_of(self, job: str, generation: int) -> int:
        return sum(1 for p in self.h.pods(job).values() if not p["metadata"].get("deletionTimestamp")
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                   and self.served(job, p) == generation)


@pytest_asyncio.fixture()
async def nodes(harness: Harness) -> Nodes:
    """The scheduler's nodes, registered with their kubelets (the operator never reads nodes)."""
    for node in (*(f"node-{i}" for i in range(4)), STORE_NODE, SPARE_NODE):
        await harness.cluster.add_node(node)
    return Nodes(harness)


# ---------------------------------------------------------------- helpers

async def started(harness: Harness, nodes: Nodes, name: str, **spec: Any) -> dict[str, Any]:
    """conftest's started(), the test playing the scheduler and the kubelets."""
    return await conftest.started(harness, name, kubelet=nodes.start_all, **spec)


def creations(harness: Harness, job: str) -> collections.Counter[str]:
    """How many times each pod name of the job was created (every ADDED the API server stored)."""
    return collections.Counter(c.obj["metadata"]["name"] for c in harness.cluster.history(PODS)
                               if c.type == "ADDED" and c.obj["metadata"].get("labels", {})
                               .get(naming.LABEL_JOB_NAME) == job)


def deletions(harness: Harness, name: str) -> list[int | None]:
    """The grace periods of every deletion mark the pod name got (0: a force delete)."""
    seen, marks = set(), []
    for change in harness.cluster.history(PODS):
        meta = change.obj["metadata"]
        if meta["name"] != name or not meta.get("deletionTimestamp") or meta["uid"] in seen:
            continue
        seen.add(meta["uid"])
        marks.append(meta.get("deletionGracePeriodSeconds"))
    return marks


def grace_marks(harness: Harness, name: str) -> list[int | None]:
    """Every grace period the deletion of the first pod of that name went through, in order: [60, 0] is a
    graceful deletion that someone then cut short with grace 0 (a kubelet confirming, or a force delete)."""
    marks: list[int | None] = []
    first = None
    for change in harness.cluster.history(PODS):
        meta = change.obj["metadata"]
        if meta["name"] != name or (first is not None and meta["uid"] != first):
            continue
        first = meta["uid"]
        if meta.get("deletionTimestamp") and (not marks or marks[-1] != meta.get("deletionGracePeriodSeconds")):
            marks.append(meta.get("deletionGracePeriodSeconds"))
    return marks


async def reconciled_past(operator: OperatorProcess, since: float, seconds: float, what: str) -> None:
    """Until `seconds` have passed since `since` (time.monotonic(), taken once what the operator's timer counts
    from was on record) and the operator finished reconcile passes after that: the horizon of a check that
    the timer did not fire, instead of a sleep."""
    await eventually(lambda: time.monotonic() >= since + seconds, seconds + 10, what)
    await passes(operator)


def uids(harness: Harness, job: str) -> dict[str, str]:
    return {n: p["metadata"]["uid"] for n, p in harness.pods(job).items()}


def assert_outcome(harness: Harness, job: str, *, phase: str, reason: str, restarts: int, disruptions: int,
                   generation: int, incident: tuple[str, bool, list[int]] | None) -> dict[str, Any]:
    """The contract's exact values. `reason`: the reason of the phase's condition (for Pending, which has
    none, of the PodsUnschedulable condition). `incident`: (cause, charged, ranks) of the last one, or
    None when there must be none."""
    status = harness.status(job)
    condition = harness.condition(job, "PodsUnschedulable" if phase == "Pending" else phase)
    incidents = status.get("incidents", [])
    got = {"phase": status.get("phase"), "reason": condition and condition["status"] == "True" and condition["reason"],
           "restarts": status.get("restarts"), "disruptions": status.get("disruptions"),
           "generation": status.get("generation"),
           "incident": (incidents[-1]["cause"], incidents[-1]["charged"], incidents[-1]["ranks"]) if incidents else None}
    want = {"phase": phase, "reason": reason, "restarts": restarts, "disruptions": disruptions,
            "generation": generation, "incident": incident}
    assert got == want, f"{status.get('message')}\nincidents: {incidents}"
    return status


# ---------------------------------------------------------------- 1, 2. SIGKILLed workers

@pytest.mark.parametrize("order", ["kill first", "survivor first"])
@pytest.mark.parametrize("scope", ["Pod", "All"])
async def test_sigkilled_worker_is_one_charge_and_a_new_generation(harness, operator, nodes, scope, order):
    """One worker SIGKILLed (exit 137, no message: the launcher died with it); the survivor's trainer fails
    on its next collective and its agent exits 1, closing the rendezvous. Its pod's status may reach the
    operator before the killed one's: the same single charge either way."""
    await started(harness, nodes, "kill", failurePolicy={"maxRestarts": 3, "restartScope": scope, **NO_BACKOFF})
    # A retryable exit is charged at its first exit, without waiting (either scope): with the kill first,
    # the survivor's exit comes once the charge is on record, and belongs to the generation left behind.
    charged_first = order == "kill first"
    if order == "kill first":
        await nodes.exit("kill-worker-1", 137)
        await eventually(lambda: harness.status("kill").get("restarts") == 1, what="the charge")
        await nodes.exit("kill-worker-0", 1, PEER_LOST.format(rank=0))
    else:
        await nodes.exit("kill-worker-0", 1, PEER_LOST.format(rank=0))
        await nodes.exit("kill-worker-1", 137)
    await eventually(lambda: harness.status("kill").get("generation") == 1, what="generation 1")
    await nodes.generation_running("kill", 1, 2)
    # With Pod the survivor's later exit joins the incident that carried it; with All it is left behind.
    ranks = [1] if charged_first and scope == "All" else [0, 1]
    status = assert_outcome(harness, "kill", phase="Running", reason="Running", restarts=1, disruptions=0,
                            generation=1, incident=("Retryable", True, ranks))
    assert len(status["incidents"]) == 1
    assert creations(harness, "kill") == {"kill-worker-0": 2, "kill-worker-1": 2, "kill-rdzv": 1}


async def test_two_workers_sigkilled_in_the_same_instant_are_one_charge(harness, operator, nodes):
    await started(harness, nodes, "kill-two", replicas=3, failurePolicy={"maxRestarts": 3, **NO_BACKOFF})
    await asyncio.gather(nodes.exit("kill-two-worker-1", 137), nodes.exit("kill-two-worker-2", 137))
    await nodes.exit("kill-two-worker-0", 1, PEER_LOST.format(rank=0))
    await eventually(lambda: harness.status("kill-two").get("generation") == 1, what="generation 1")
    await nodes.generation_running("kill-two", 1, 3)
    status = assert_outcome(harness, "kill-two", phase="Running", reason="Running", restarts=1, disruptions=0,
                            generation=1, incident=("Retryable", True, [0, 1, 2]))
    assert len(status["incidents"]) == 1


# ---------------------------------------------------------------- 3. the rendezvous store

@pytest.mark.parametrize("order", ["store first", "agents first"])
async def test_killed_store_is_an_uncharged_disruption_and_a_new_generation(harness, operator, nodes, order):
    """The store pod SIGKILLed: every agent loses its rendezvous (RendezvousConnectionError at its next
    keep-alive) and exits 1. Whichever kubelet reports first, nothing is charged. (recovery Restart: with
    InProcess the workers keep training, test_a_lost_store_is_not_a_lost_gang.py.)"""
    await started(harness, nodes, "store", failurePolicy={"maxRestarts": 3, "recovery": "Restart", **NO_BACKOFF})
    if order == "store first":
        await nodes.exit("store-rdzv", 137)
        await eventually(lambda: harness.status("store").get("generation") == 1, what="generation 1")
        for i in range(2):
            await nodes.exit(f"store-worker-{i}", 1, STORE_GONE)
    else:
        # Agent 0 reports first; a disruption is charged at once, so agent 1's exit (sent once the
        # incident is on record) belongs to the generation it left behind.
        await nodes.exit("store-worker-0", 1, STORE_GONE)
        await eventually(lambda: harness.status("store").get("generation") == 1, what="generation 1")
        await nodes.exit("store-worker-1", 1, STORE_GONE)
        await nodes.exit("store-rdzv", 137)
    await eventually(lambda: harness.status("store").get("generation") == 1, what="generation 1")
    # The replacements start only once the operator has replaced the store: workers started against the
    # dead one would rightly need a generation more (a kubelet can start them that early; then the
    # operator moves on to generation 2, still charging nothing).
    await harness.settle("store", lambda: creations(harness, "store")["store-rdzv"] == 2, what="a fresh store",
                         confirm=nodes.confirm)
    await nodes.generation_running("store", 1, 2)
    last = harness.status("store")["incidents"][-1]
    # Store first: both workers were live when it went. Agents first: only agent 0 had exited.
    ranks = [0, 1] if order == "store first" else [0]
    assert last["reason"] == "RendezvousStoreLost"
    assert_outcome(harness, "store", phase="Running", reason="Running", restarts=0, disruptions=1, generation=1,
                   incident=("Disruption", False, ranks))
    assert creations(harness, "store") == {"store-worker-0": 2, "store-worker-1": 2, "store-rdzv": 2}


# ---------------------------------------------------------------- 4. the budget and user errors

async def test_retryable_code_every_generation_exhausts_the_budget(harness, operator, nodes):
    """The trainer of rank 1 exits 75 (failurePolicy.retryableExitCodes) in every generation; its agent
    closes the rendezvous, and the surviving pod joins each next generation in place (restartScope Pod)."""
    await started(harness, nodes, "budget", failurePolicy={"maxRestarts": 2, "retryableExitCodes": [75],
                                                            **NO_BACKOFF})
    crash = "rank 1 (local rank 0) exited with code 75: RuntimeError: CUDA error: an illegal memory access " \
            "was encountered " + CLOSED
    for generation in range(3):
        await nodes.exit("budget-worker-1", 75, crash)
        if generation == 2:
            break
        await eventually(lambda: harness.status("budget").get("generation") == generation + 1,
                         what=f"generation {generation + 1}")
        await nodes.generation_running("budget", generation + 1, 2)
        assert harness.status("budget")["restarts"] == generation + 1
    await harness.wait_phase("budget", "Failed")
    status = assert_outcome(harness, "budget", phase="Failed", reason="RestartBudgetExhausted", restarts=2,
                            disruptions=0, generation=2, incident=("Retryable", False, [1]))
    assert [i["charged"] for i in status["incidents"]] == [True, True, False]
    assert "exit code 75" in harness.condition("budget", "Failed")["message"]
    assert creations(harness, "budget") == {"budget-worker-0": 1, "budget-worker-1": 3, "budget-rdzv": 1}


# test_operator's test_permanent_failure_fails_the_job: one rank fails while the other runs (cleanPodPolicy, the
# message in the rank's status and the Event); this one: every rank fails (one uncharged incident of all ranks).
async def test_user_error_on_all_ranks_fails_at_once_uncharged(harness, operator, nodes):
    await started(harness, nodes, "user", failurePolicy={"maxRestarts": 3, **NO_BACKOFF})
    for i in range(2):
        await nodes.exit(f"user-worker-{i}", 1, f"rank {i} (local rank 0) exited with code 1: ValueError: "
                                                f"unknown optimizer 'adamw2' {CLOSED}")
    await harness.wait_phase("user", "Failed")
    assert_outcome(harness, "user", phase="Failed", reason="PermanentError", restarts=0, disruptions=0,
                   generation=0, incident=("Permanent", False, [0, 1]))
    assert "unknown optimizer" in harness.condition("user", "Failed")["message"]
    assert creations(harness, "user") == {"user-worker-0": 1, "user-worker-1": 1, "user-rdzv": 1}


# ---------------------------------------------------------------- 5. disruptions

async def _evict(harness: Harness, nodes: Nodes, pod: str) -> None:
    code, body = await harness.request("POST", f"/api/v1/namespaces/{NS}/pods/{pod}/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NS}},
        "application/json")
    assert code == 201, body


async def _kubectl_delete(harness: Harness, nodes: Nodes, pod: str) -> None:
    code, body = await harness.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod}", {}, "application/json")
    assert code == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 60, body
    await nodes.c.kubelet_finish(NS, pod, 143, SIGTERMED)  # SIGTERM: the agent stops and exits 143


async def _force_delete(harness: Harness, nodes: Nodes, pod: str) -> None:
    """`kubectl delete --grace-period=0 --force`: gone at once, no final status from its kubelet."""
    code, body = await harness.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod}", {"gracePeriodSeconds": 0},
                                       "application/json")
    assert code == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 0, body


async def _preempt(harness: Harness, nodes: Nodes, pod: str) -> None:
    await harness.cluster.preempt(NS, pod)


async def _taint_manager(harness: Harness, nodes: Nodes, pod: str) -> None:
    await harness.cluster.taint_manager_evict(NS, pod)


async def _kubelet_terminate(harness: Harness, nodes: Nodes, pod: str) -> None:
    await harness.cluster.kubelet_terminate(NS, pod)


@pytest.mark.parametrize("disrupt, reason", [
    # Without a condition the reason depends on which of the pod's last bodies the operator acted on
    # (terminating: PodDeleted; its exit: Error; gone: PodVanished), so it is not pinned.
    (_evict, "EvictionByEvictionAPI"), (_kubectl_delete, None), (_force_delete, None),
    (_preempt, "PreemptionByScheduler"), (_taint_manager, "DeletionByTaintManager"),
    (_kubelet_terminate, "TerminationByKubelet"),
], ids=["eviction-api", "kubectl-delete", "force-delete", "preemption", "taint-manager", "kubelet"])
async def test_disruption_is_uncharged_and_the_job_comes_back(harness, operator, nodes, disrupt, reason):
    """maxRestarts 0: a single charge would fail the job. The incident's reason is the one the component
    wrote on the pod's DisruptionTarget condition (what the user sees of why)."""
    await started(harness, nodes, "dis", failurePolicy={"maxRestarts": 0, **NO_BACKOFF})
    before = uids(harness, "dis")
    await disrupt(harness, nodes, "dis-worker-1")
    await eventually(lambda: harness.status("dis").get("generation") == 1, what="generation 1")
    await nodes.generation_running("dis", 1, 2)
    status = assert_outcome(harness, "dis", phase="Running", reason="Running", restarts=0, disruptions=1,
                            generation=1, incident=("Disruption", False, [1]))
    assert reason is None or status["incidents"][-1]["reason"] == reason, status["incidents"]
    after = uids(harness, "dis")
    # Only the disrupted pod was replaced: the survivor kept its pod and joined generation 1 in place.
    assert after["dis-worker-0"] == before["dis-worker-0"] and after["dis-worker-1"] != before["dis-worker-1"]
    assert deletions(harness, "dis-worker-0") == []


async def test_node_down_then_up_is_one_uncharged_disruption(harness, operator, nodes):
    """node-1 (worker 1's) stops answering: the pod is marked not Ready, then the taint manager deletes it
    when its toleration (nodeLossTimeoutSeconds) runs out. Its kubelet will never confirm: the operator
    force-deletes it, and the replacement runs elsewhere; then the node comes back."""
    await started(harness, nodes, "lost", failurePolicy={"maxRestarts": 0, "nodeLossTimeoutSeconds": 5,
                                                          **NO_BACKOFF})
    before = uids(harness, "lost")
    await harness.cluster.node_down("node-1")
    await eventually(lambda: harness.status("lost").get("readyReplicas") == 1, what="worker 1 not ready")
    await passes(operator)
    assert harness.status("lost")["phase"] == "Running" and harness.status("lost")["generation"] == 0
    await harness.cluster.taint_manager_evict(NS, "lost-worker-1")
    await eventually(lambda: harness.status("lost").get("generation") == 1, what="generation 1")
    await harness.settle("lost", lambda: harness.pods("lost").get("lost-worker-1", {}).get("metadata", {})
                         .get("uid") not in (None, before["lost-worker-1"]), 5, "worker 1 force-deleted and replaced",
                         confirm=nodes.confirm)
    # The taint manager's graceful deletion (60 s), cut short by the operator: no kubelet answers for node-1.
    assert grace_marks(harness, "lost-worker-1") == [60, 0]
    await nodes.generation_running("lost", 1, 2)
    assert harness.pods("lost")["lost-worker-1"]["spec"]["nodeName"] == SPARE_NODE
    await harness.cluster.node_up("node-1")
    await passes(operator)
    assert_outcome(harness, "lost", phase="Running", reason="Running", restarts=0, disruptions=1, generation=1,
                   incident=("Disruption", False, [1]))


PEER_SILENT = "rank 0 (local rank 0) exited with code 1: DistBackendError: [../third_party/gloo/gloo/transport/" \
              "tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete " + CLOSED


async def test_node_lost_silently_survivor_times_out_first_one_uncharged_disruption(harness, operator, nodes):
    """node-1 stops answering mid-step: nothing resets worker 0's connection, so its collective times out
    (the trainer's --dist-steady-timeout, 30 s) and it exits with its rescue checkpoint before the node
    controller declares node-1 lost (40-50 s). The incident waits for that verdict instead of charging a
    hang; the taint manager's eviction then makes it one disruption, and the lost pod is force-deleted."""
    await started(harness, nodes, "silent", failurePolicy={"maxRestarts": 0, **NO_BACKOFF})
    await harness.cluster.node_down("node-1")
    await nodes.exit("silent-worker-0", 1, PEER_SILENT)
    exited = time.monotonic()  # its finishedAt (whole seconds) is no later
    # While the incident waits, the status is left as it was: past the ordinary settle time, still waiting.
    await reconciled_past(operator, exited, SETTINGS.incident_settle_seconds, "the ordinary settle time")
    status = harness.status("silent")
    assert (status["phase"], status["restarts"], status["generation"]) == ("Running", 0, 0), status.get("message")
    await harness.cluster.taint_manager_evict(NS, "silent-worker-1")
    await eventually(lambda: harness.status("silent").get("generation") == 1, what="generation 1")
    await nodes.generation_running("silent", 1, 2)
    assert grace_marks(harness, "silent-worker-1") == [60, 0]  # cut short: no kubelet answers for node-1
    assert_outcome(harness, "silent", phase="Running", reason="Running", restarts=0, disruptions=1, generation=1,
                   incident=("Disruption", False, [0, 1]))


# The production default: a store that waited out its grace period and then the stuck-terminating time
# would take minutes, far beyond any wait below.
@pytest.mark.settings(stuck_terminating_seconds=300.0)
async def test_node_lost_with_the_store_on_it_moves_on_at_once(harness, operator, nodes):
    """Issue 10's measured case: the lost node held worker 1 and the rendezvous store. The taint manager
    evicts both; neither kubelet will confirm, so the store is force-deleted like the worker (it used to
    wait DDPJOB_OPERATOR_STUCK_TERMINATING_SECONDS, 300 s, with the job Restarting), and a fresh store
    serves the next generation. Nothing is charged."""
    await started(harness, nodes, "both", failurePolicy={"maxRestarts": 0, **NO_BACKOFF})
    store = naming.store_pod_name("both")
    old_store = harness.pods("both", naming.ROLE_STORE)[store]["metadata"]["uid"]
    await harness.cluster.node_down("node-1")
    await harness.cluster.node_down(STORE_NODE)
    await nodes.exit("both-worker-0", 1, PEER_SILENT)
    await harness.cluster.taint_manager_evict(NS, store)
    await harness.cluster.taint_manager_evict(NS, "both-worker-1")
    await eventually(lambda: harness.status("both").get("generation") == 1, what="generation 1")
    # Force-deleted because its node is lost, not after DDPJOB_OPERATOR_STUCK_TERMINATING_SECONDS (300 s).
    await eventually(lambda: harness.pods("both", naming.ROLE_STORE).get(store, {}).get("metadata", {})
                     .get("uid") not in (None, old_store), timeout=30, what="a fresh store pod")
    assert grace_marks(harness, store)[-1] == 0  # force-deleted: no kubelet answers for its node
    await nodes.generation_running("both", 1, 2)
    assert_outcome(harness, "both", phase="Running", reason="Running", restarts=0, disruptions=1, generation=1,
                   incident=("Disruption", False, [0, 1]))


async def test_taint_manager_eviction_from_a_healthy_node_lets_the_worker_checkpoint(harness, operator, nodes):
    """`kubectl taint node node-1 maintenance=now:NoExecute`: the taint manager deletes worker 1 gracefully
    and node-1's kubelet, alive, sends SIGTERM; the worker checkpoints, then exits 143."""
    await started(harness, nodes, "drain", failurePolicy={"maxRestarts": 0, **NO_BACKOFF})
    await harness.cluster.write((NODES, None, "node-1"), {"spec": {"taints": [
        {"key": "maintenance", "value": "now", "effect": "NoExecute"}]}})
    await harness.cluster.taint_manager_evict(NS, "drain-worker-1")
    await eventually(lambda: harness.status("drain").get("generation") == 1, what="generation 1")
    await passes(operator)
    assert grace_marks(harness, "drain-worker-1") == [60], "the checkpointing worker was cut short"
    await nodes.c.kubelet_finish(NS, "drain-worker-1", 143, SIGTERMED)
    await nodes.generation_running("drain", 1, 2)
    assert_outcome(harness, "drain", phase="Running", reason="Running", restarts=0, disruptions=1, generation=1,
                   incident=("Disruption", False, [1]))


async def test_node_back_before_the_taint_manager_acts_is_an_uncharged_disruption(harness, operator, nodes):
    """node-1 reboots and is back within the pods' toleration: its kubelet finds worker 1's container gone
    and reports it as the API server traces show (Failed, 137, ContainerStatusUnknown). Node loss."""
    await started(harness, nodes, "reboot", failurePolicy={"maxRestarts": 0, **NO_BACKOFF})
    await harness.cluster.node_down("node-1")
    await eventually(lambda: harness.status("reboot").get("readyReplicas") == 1, what="worker 1 not ready")
    await harness.cluster.node_up("node-1")
    await nodes.exit("reboot-worker-1", 137, "The container could not be located when the pod was terminated",
                     reason="ContainerStatusUnknown")
    await eventually(lambda: harness.status("reboot").get("generation") == 1
                     or harness.status("reboot").get("phase") == "Failed", what="generation 1")
    status = harness.status("reboot")
    assert (status["phase"], status["restarts"], status["disruptions"]) == ("Restarting", 0, 1), status["message"]
    await nodes.generation_running("reboot", 1, 2)
    assert_outcome(harness, "reboot", phase="Running", reason="Running", restarts=0, disruptions=1, generation=1,
                   incident=("Disruption", False, [1]))


# ---------------------------------------------------------------- 6. scale, suspend

async def test_scale_up_restarts_every_worker_gracefully_at_the_new_size(harness, operator, nodes):
    """Restart recovery (in place: test_scale_in_place_on_the_api.py). Every agent of a generation gets
    --nnodes=minReplicas:replicas: a new size is a new generation."""
    await started(harness, nodes, "grow", minReplicas=1, maxReplicas=4, failurePolicy={"recovery": "Restart"})
    code, body = await harness.scale("grow", 3)
    assert code == 200, body
    await eventually(lambda: harness.status("grow").get("generation") == 1, what="generation 1")
    await nodes.generation_running("grow", 1, 3)
    assert_outcome(harness, "grow", phase="Running", reason="Running", restarts=0, disruptions=0, generation=1,
                   incident=("NodeRangeChanged", False, [0, 1]))
    assert {i: deletions(harness, f"grow-worker-{i}") for i in range(2)} == {0: [60], 1: [60]}
    assert {p["metadata"]["labels"][naming.LABEL_NNODES] for p in harness.pods("grow").values()} == {"1-3"}
    assert creations(harness, "grow") == {"grow-worker-0": 2, "grow-worker-1": 2, "grow-worker-2": 1,
                                          "grow-rdzv": 1}


async def test_scale_down_stops_every_worker_gracefully_for_a_new_generation(harness, operator, nodes):
    await started(harness, nodes, "shrink", replicas=3, minReplicas=1, maxReplicas=4,
                  failurePolicy={"recovery": "Restart"})
    code, body = await harness.scale("shrink", 1)
    assert code == 200, body
    await eventually(lambda: harness.status("shrink").get("generation") == 1, what="generation 1")
    await nodes.generation_running("shrink", 1, 1)
    assert_outcome(harness, "shrink", phase="Running", reason="Running", restarts=0, disruptions=0, generation=1,
                   incident=("ScaleDown", False, [0, 1, 2]))
    assert {i: deletions(harness, f"shrink-worker-{i}") for i in range(3)} == {0: [60], 1: [60], 2: [60]}
    assert set(harness.pods("shrink")) == {"shrink-worker-0"}
    assert harness.pods("shrink")["shrink-worker-0"]["metadata"]["labels"][naming.LABEL_NNODES] == "1-1"
    # Outside [minReplicas, maxReplicas] the scale subresource refuses: nothing changes.
    for bad in (0, 5):
        code, body = await harness.scale("shrink", bad)
        assert code == 422 and "replicas" in body["message"], body
    assert harness.job("shrink")["spec"]["replicas"] == 1


async def test_scaling_a_static_job_starts_a_new_generation(harness, operator, nodes):
    await started(harness, nodes, "static", failurePolicy={"recovery": "Restart"})
    code, body = await harness.scale("static", 3)
    assert code == 200, body
    await eventually(lambda: harness.status("static").get("generation") == 1, what="generation 1")
    await nodes.generation_running("static", 1, 3)
    assert_outcome(harness, "static", phase="Running", reason="Running", restarts=0, disruptions=0, generation=1,
                   incident=("NodeRangeChanged", False, [0, 1]))
    assert {i: deletions(harness, f"static-worker-{i}") for i in range(2)} == {0: [60], 1: [60]}
    for pod in harness.pods("static").values():
        assert pod["metadata"]["labels"][naming.LABEL_NNODES] == "3-3"


async def test_suspend_then_resume(harness, operator, nodes):
    await started(harness, nodes, "nap", checkpoint={"claimTemplate": {"size": "1Gi"}})
    await harness.patch_spec("nap", {"runPolicy": {"suspend": True}})
    await harness.wait_phase("nap", "Suspended")
    await harness.settle("nap", lambda: not harness.pods("nap") and not harness.pods("nap", naming.ROLE_STORE),
                         what="every pod stopped", confirm=nodes.confirm)
    assert_outcome(harness, "nap", phase="Suspended", reason="Suspended", restarts=0, disruptions=0, generation=1,
                   incident=None)
    assert deletions(harness, "nap-worker-0") == [60] and deletions(harness, "nap-worker-1") == [60]
    # The checkpoint claim stays: the resumed job goes on from its checkpoints.
    claims = harness.cluster.live(kmock.resource("", "v1", "persistentvolumeclaims"), NS)
    assert [c["metadata"]["name"] for c in claims] == ["nap-checkpoints"]
    await harness.patch_spec("nap", {"runPolicy": {"suspend": False}})
    await nodes.generation_running("nap", 1, 2)
    assert_outcome(harness, "nap", phase="Running", reason="Running", restarts=0, disruptions=0, generation=1,
                   incident=None)
    assert harness.condition("nap", "Suspended")["status"] == "False"


# ---------------------------------------------------------------- 7. workers that can never start

async def test_unschedulable_worker_is_shown_and_nothing_is_charged(harness, operator, nodes):
    await harness.apply("queued")
    await harness.wait_workers("queued", 2)
    await eventually(lambda: harness.pods("queued", naming.ROLE_STORE), what="the store pod")
    await nodes.start("queued-rdzv", "queued-worker-0")
    await harness.cluster.unschedulable(NS, "queued-worker-1", UNSCHEDULABLE)
    unschedulable = time.monotonic()  # its PodScheduled condition's time (whole seconds) is no later
    await eventually(lambda: harness.condition("queued", "PodsUnschedulable"), what="PodsUnschedulable")
    status = assert_outcome(harness, "queued", phase="Pending", reason="Unschedulable", restarts=0, disruptions=0,
                            generation=0, incident=None)
    assert UNSCHEDULABLE in status["message"] and UNSCHEDULABLE in harness.condition("queued", "PodsUnschedulable")[
        "message"]
    # Longer than cannotStartSeconds: queueing is not a failure.
    await reconciled_past(operator, unschedulable, SETTINGS.cannot_start_seconds, "cannotStartSeconds")
    assert harness.status("queued")["phase"] == "Pending"
    # Worker 0's agent gives up waiting for its peer (join timeout): queueing, not charged.
    await nodes.exit("queued-worker-0", 1, JOIN_TIMEOUT)
    await eventually(lambda: harness.status("queued").get("generation") == 1, what="generation 1")
    await harness.settle("queued", lambda: nodes.workers_of("queued", 1) == 2, what="generation 1 workers",
                         confirm=nodes.confirm)
    await nodes.start("queued-worker-0")
    await harness.cluster.unschedulable(NS, "queued-worker-1", UNSCHEDULABLE)
    await eventually(lambda: UNSCHEDULABLE in (harness.status("queued").get("message") or "")
                     and harness.status("queued").get("replicas") == 2
                     and harness.status("queued")["ranks"][0]["phase"] == "Running", what="queueing again")
    assert_outcome(harness, "queued", phase="Restarting", reason="Replace", restarts=0, disruptions=0,
                   generation=1, incident=("Consequence", False, [0]))
    assert UNSCHEDULABLE in harness.condition("queued", "PodsUnschedulable")["message"]


async def test_missing_claim_fails_with_volume_unavailable(harness, operator, nodes):
    await harness.apply("noclaim", checkpoint={"claimName": "ckpt"})
    await harness.wait_workers("noclaim", 2)
    await eventually(lambda: harness.pods("noclaim", naming.ROLE_STORE), what="the store pod")
    await nodes.start("noclaim-rdzv")
    for i in range(2):
        await harness.cluster.unschedulable(NS, f"noclaim-worker-{i}", '0/3 nodes are available: persistentvolumeclaim '
                                            '"ckpt" not found. preemption: 0/3 nodes are available: 3 Preemption is '
                                            'not helpful for scheduling.')
    await harness.wait_phase("noclaim", "Failed", timeout=8)
    assert_outcome(harness, "noclaim", phase="Failed", reason="VolumeUnavailable", restarts=0, disruptions=0,
                   generation=0, incident=None)
    message = harness.condition("noclaim", "Failed")["message"]
    assert 'persistentvolumeclaim "ckpt" not found' in message and "spec.checkpoint.claimName" in message


def pod_security(pod: dict[str, Any]) -> Any:
    """Pod Security admission enforcing restricted:latest, in the API server's words."""
    bad = [c["name"] for c in pod["spec"]["containers"]
           if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if not bad:
        return None
    name = pod["metadata"]["name"]
    return api_error(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": '
                     f'allowPrivilegeEscalation != false (container "{bad[0]}" must set '
                     f'securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container '
                     f'"{bad[0]}" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod '
                     f'or container "{bad[0]}" must set securityContext.runAsNonRoot=true)', PODS, name)


async def test_pod_rejected_by_admission_fails_quoting_the_server(harness, operator, nodes):
    refusals: dict[str, str] = {}

    def admission(pod: dict[str, Any]) -> Any:
        refusal = pod_security(pod)
        if refusal is not None:
            refusals[pod["metadata"]["name"]] = refusal.message
        return refusal

    harness.cluster.admit_pods = admission
    await harness.apply("psa")
    await harness.wait_phase("psa", "Failed")
    assert_outcome(harness, "psa", phase="Failed", reason="PodRejected", restarts=0, disruptions=0, generation=0,
                   incident=None)
    message = harness.condition("psa", "Failed")["message"]
    quoted = [name for name, refusal in refusals.items()
              if f"Pod {name}: " + refusal[:100] in message and "HTTP 403 Forbidden" in message]
    assert quoted, (message, refusals)
    assert not harness.pods("psa")  # the trainer container breaks the profile: no worker was admitted
    await eventually(lambda: not harness.pods("psa", naming.ROLE_STORE), what="the store removed")


QUOTA = (403, "Forbidden", 'pods "quota-worker-1" is forbidden: exceeded quota: compute, requested: '
         'requests.cpu=2, used: requests.cpu=4, limited: requests.cpu=4', "exceeded quota")
# The API server's priority and fairness (or a webhook's) throttling: try again later, not a rejection.
THROTTLED = (429, "TooManyRequests", "Too many requests, please try again later.", "Too many requests")


@pytest.mark.parametrize("refusal", [QUOTA, THROTTLED], ids=["quota", "throttled"])
async def test_quota_rejection_is_shown_and_retried_until_it_fits(harness, operator, nodes, refusal):
    refused: list[float] = []
    code, reason, message, shown = refusal

    def quota(pod: dict[str, Any]) -> Any:
        name = pod["metadata"]["name"]
        if name != "quota-worker-1":
            return None
        refused.append(time.monotonic())
        return api_error(code, reason, message, PODS, name)

    harness.cluster.admit_pods = quota
    await harness.apply("quota", failurePolicy={"backoff": {"initialSeconds": 1, "maxSeconds": 1}})
    blocked = await eventually(lambda: (c := harness.condition("quota", "CreateBlocked")) and c["status"] == "True"
                               and c, what="CreateBlocked")
    assert shown in blocked["message"] and blocked["reason"] == "QuotaExceeded"
    await eventually(lambda: len(refused) >= 3, timeout=30, what="retries")
    assert harness.status("quota")["phase"] == "Pending"
    assert not harness.pods("quota")  # the server judged the whole job first (dryRun=All): nothing half-created
    gaps = [b - a for a, b in zip(refused, refused[1:])]
    assert min(gaps) >= 0.8, gaps  # retried after the backoff, never hammered
    harness.cluster.admit_pods = None  # quota freed
    await harness.wait_workers("quota", 2)
    await nodes.start_all("quota")
    await harness.wait_phase("quota", "Running")
    await eventually(lambda: harness.condition("quota", "CreateBlocked") is None, what="CreateBlocked cleared")
    assert_outcome(harness, "quota", phase="Running", reason="Running", restarts=0, disruptions=0, generation=0,
                   incident=None)
    assert creations(harness, "quota") == {"quota-worker-0": 1, "quota-worker-1": 1, "quota-rdzv": 1}


# ---------------------------------------------------------------- 8. success while a replacement is Pending

async def test_training_finishes_while_a_replacement_is_pending(harness, operator, nodes):
    await started(harness, nodes, "finish", replicas=3, minReplicas=2,
                  failurePolicy={"maxRestarts": 3, **NO_BACKOFF}, runPolicy={"successPolicy": "AllWorkers"})
    await nodes.exit("finish-worker-2", 137, reason="OOMKilled")
    await eventually(lambda: harness.pods("finish").get("finish-worker-2", {}).get("metadata", {}).get("labels", {})
                     .get(naming.LABEL_ATTEMPT) == "1", what="the replacement of worker 2")
    # The survivors (minReplicas 2) re-rendezvoused without it and finish training; it never runs.
    await nodes.exit("finish-worker-0", 0)
    await nodes.exit("finish-worker-1", 0)
    await harness.wait_phase("finish", "Succeeded")
    assert_outcome(harness, "finish", phase="Succeeded", reason="Succeeded", restarts=1, disruptions=0, generation=1,
                   incident=("Retryable", True, [2]))
    await eventually(lambda: "finish-worker-2" not in harness.pods("finish"), what="the pending replacement removed")


# ---------------------------------------------------------------- 9. the operator and the API server

def dies_after_the_charge(operator: OperatorProcess, *, deletes: bool = False) -> list[str]:
    """From the moment the operator's status write that charges a restart is stored, the operator's process
    is dead: no further API call of it arrives (with `deletes`, only the deletes of that pass still do).
    Returns the calls it went on to make (none of which was sent), as they come."""
    api, dead, unsent = operator.controller.api, {"now": False}, []
    patch_status, delete, create = api.patch_status, api.delete, api.create

    async def hang(call: str) -> None:
        unsent.append(call)
        await asyncio.sleep(3600)  # a dead process sends nothing

    async def patching(namespace: str, name: str, patch: dict[str, Any]) -> bool:
        if dead["now"]:
            await hang("patch_status")
        done = await patch_status(namespace, name, patch)
        dead["now"] = dead["now"] or "restarts" in patch
        return done

    async def deleting(*args: Any, **kwargs: Any) -> bool:
        if dead["now"] and not deletes:
            await hang("delete")
        return await delete(*args, **kwargs)

    async def creating(*args: Any, **kwargs: Any) -> Any:
        if dead["now"]:
            await hang("create")
        return await create(*args, **kwargs)

    api.patch_status, api.delete, api.create = patching, deleting, creating
    return unsent


# test_operator's test_operator_restart_mid_job_duplicates_nothing_and_loses_nothing: a clean stop, the failure
# while none runs; these: the operator dies mid-pass once its charge is on record (no second charge).
@pytest.mark.parametrize("point", ["after the charge is on record", "after the failed pod is removed"])
async def test_operator_killed_mid_reconcile_duplicates_and_charges_nothing(harness, operator, nodes, point):
    """The operator dies right after it observed a failure: its accounting is written, the pod calls that
    follow never happen (or only the delete). A new operator finishes the job's recovery."""
    await started(harness, nodes, "crash", minReplicas=1, failurePolicy={"maxRestarts": 3, **NO_BACKOFF})
    unsent = dies_after_the_charge(operator, deletes=point == "after the failed pod is removed")
    failed_uid = harness.pods("crash")["crash-worker-1"]["metadata"]["uid"]
    await nodes.exit("crash-worker-1", 137)
    await eventually(lambda: harness.status("crash").get("restarts") == 1, what="the charge")
    if point == "after the failed pod is removed":
        await eventually(lambda: "crash-worker-1" not in harness.pods("crash"), what="the failed pod removed")
    # It went on as if alive (its next call is one a dead process never sends), then it is gone.
    await eventually(lambda: unsent, what="the dead operator's next call")
    await operator.stop()
    pods = uids(harness, "crash")
    assert pods.get("crash-worker-1") == (failed_uid if point == "after the charge is on record" else None)
    await operator.start()
    await eventually(lambda: harness.pods("crash").get("crash-worker-1", {}).get("metadata", {}).get("labels", {})
                     .get(naming.LABEL_ATTEMPT) == "1", what="the replacement of worker 1")
    await nodes.start_all("crash")
    await harness.wait_phase("crash", "Running")
    await passes(operator)  # nothing more happens
    assert_outcome(harness, "crash", phase="Running", reason="Running", restarts=1, disruptions=0, generation=1,
                   incident=("Retryable", True, [1]))
    assert creations(harness, "crash") == {"crash-worker-0": 1, "crash-worker-1": 2, "crash-rdzv": 1}


async def test_operator_killed_after_charging_a_gang_restart(harness, operator, nodes):
    """restartScope All: the new generation is on record, no old pod was touched, the operator dies."""
    await started(harness, nodes, "gang", failurePolicy={"maxRestarts": 3, "restartScope": "All", **NO_BACKOFF})
    unsent = dies_after_the_charge(operator)
    await nodes.exit("gang-worker-1", 137)
    await eventually(lambda: harness.status("gang").get("restarts") == 1, what="the charge")
    await eventually(lambda: unsent, what="the dead operator's next call")
    await operator.stop()
    assert harness.status("gang")["generation"] == 1
    assert not [n for n, p in harness.pods("gang").items() if p["metadata"].get("deletionTimestamp")]
    await nodes.exit("gang-worker-0", 1, PEER_LOST.format(rank=0))  # while no operator runs
    await operator.start()
    await nodes.generation_running("gang", 1, 2)
    await passes(operator)
    assert_outcome(harness, "gang", phase="Running", reason="Running", restarts=1, disruptions=0, generation=1,
                   incident=("Retryable", True, [1]))
    assert creations(harness, "gang") == {"gang-worker-0": 2, "gang-worker-1": 2, "gang-rdzv": 1}


async def test_api_server_unavailable_while_a_job_starts(harness, operator, nodes):
    """The API server answers the operator 503 (watches stay open) until the test has seen two of its passes
    fail: nothing is created meanwhile, and once it answers again the job starts, each pod created once."""
    # From when the operator watches (kopf's own first lists done): the job's event arrives, its passes fail.
    await eventually(lambda: {(model.GROUP, model.PLURAL, "watch"), ("", "pods", "watch")} <= harness.cluster.calls,
                     what="the operator watching DDPJobs and pods")
    registry = operator.controller.metrics.registry
    before = registry.get_sample_value("ddpjob_reconcile_errors_total")
    harness.cluster.unavailable_until = float("inf")
    await harness.apply("outage")
    await eventually(lambda: registry.get_sample_value("ddpjob_reconcile_errors_total") >= before + 2, what="two failed passes (retried)")
    assert not harness.pods("outage") and not harness.status("outage")
    harness.cluster.unavailable_until = 0.0  # the outage ends when the test saw the retries, not at a time
    await harness.wait_workers("outage", 2)
    await eventually(lambda: harness.pods("outage", naming.ROLE_STORE), what="the store pod")
    await nodes.start_all("outage")
    await harness.wait_phase("outage", "Running")
    await passes(operator)
    assert_outcome(harness, "outage", phase="Running", reason="Running", restarts=0, disruptions=0, generation=0,
                   incident=None)
    assert creations(harness, "outage") == {"outage-worker-0": 1, "outage-worker-1": 1, "outage-rdzv": 1}
