"""The control plane and the kubelets as test-side methods: binding, kubelet starts and exits,
preemption, the taint manager, evictions, nodes going down and coming back."""

from __future__ import annotations

import copy
from typing import Any

from .resources import (PODS, NODES, UNREACHABLE_TAINT, HEALTHY_NODE, EVICTION_API, TAINT_MANAGER,
                        PREEMPTION_MESSAGE, KUBELET_TERMINATION, NodeUnreachable)
from .rules import rfc3339, not_found, set_condition


class ControlPlane:
    """The scheduler, the kubelets and the node lifecycle (part of Cluster)."""

    @property
    def unreachable_nodes(self) -> frozenset[str]:
        """The nodes that are down (`node_down`): their kubelets answer nothing."""
        return frozenset(self._unreachable)

    def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self._current((PODS, namespace, name))
        if pod is None:
            raise not_found(PODS, name)
        return pod

    def _kubelet_of(self, pod: dict[str, Any]) -> str:
        """The node whose kubelet runs this pod; it must be up to do anything."""
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            raise RuntimeError(f"pod {pod['metadata']['name']} is not bound to a node: no kubelet runs it")
        if node in self._unreachable:
            raise NodeUnreachable(f"node {node} is down: its kubelet cannot update pod {pod['metadata']['name']}")
        return node

    async def bind(self, namespace: str, name: str, node: str) -> None:
        """The scheduler binds a pod: spec.nodeName and PodScheduled in one write."""
        async with self._lock:
            pod = self._pod(namespace, name)
            pod["spec"]["nodeName"] = node
            status = pod.setdefault("status", {})
            status["conditions"], _ = set_condition(status.get("conditions"), "PodScheduled", "True")
            await self.commit((PODS, namespace, name), pod, "MODIFIED")

    async def unschedulable(self, namespace: str, name: str, message: str) -> None:
        """The scheduler cannot place the pod: PodScheduled False, reason Unschedulable, its message."""
        async with self._lock:
            pod = self._pod(namespace, name)
            status = pod.setdefault("status", {})
            status["conditions"], changed = set_condition(status.get("conditions"), "PodScheduled", "False",
                                                          "Unschedulable", message)
            if changed:
                await self.commit((PODS, namespace, name), pod, "MODIFIED")

    async def kubelet_start(self, namespace: str, name: str) -> None:
        """The kubelet has started every container of a bound pod and they are ready."""
        async with self._lock:
            pod = self._pod(namespace, name)
            self._kubelet_of(pod)
            status = pod.setdefault("status", {})
            started = rfc3339()
            status.update(phase="Running", hostIP="10.0.0.1", hostIPs=[{"ip": "10.0.0.1"}],
                          podIP="10.244.0.10", podIPs=[{"ip": "10.244.0.10"}],
                          startTime=status.get("startTime") or started)
            for type_ in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
                status["conditions"], _ = set_condition(status.get("conditions"), type_, "True")
            status["containerStatuses"] = [{
                "name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
                "started": True, "state": {"running": {"startedAt": started}}}
                for c in (pod.get("spec") or {}).get("containers") or ()]
            await self.commit((PODS, namespace, name), pod, "MODIFIED")

    @staticmethod
    def _stopped(pod: dict[str, Any], exit_code: int, container_reason: str, message: str | None = None,
                 pod_reason: str | None = None, pod_message: str | None = None) -> dict[str, Any]:
        """The status the kubelet reports once every container has stopped."""
        status = copy.deepcopy(pod.get("status") or {})
        phase = "Succeeded" if exit_code == 0 else "Failed"
        status["phase"] = phase
        if pod_reason:
            status.update(reason=pod_reason, message=pod_message)
        finished = rfc3339()
        for container in status.get("containerStatuses") or ():
            state = container.get("state") or {}
            if "terminated" in state:
                continue
            terminated: dict[str, Any] = {"exitCode": exit_code, "reason": container_reason}
            if message:
                terminated["message"] = message
            terminated.update(startedAt=(state.get("running") or {}).get("startedAt"), finishedAt=finished)
            container.update(state={"terminated": terminated}, ready=False, started=False)
        # The kubelet's ready conditions for a finished pod (kubelet/status/generate.go).
        why = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        for type_ in ("Ready", "ContainersReady"):
            status["conditions"], _ = set_condition(status.get("conditions"), type_, "False", why)
        return status

    async def kubelet_exit(self, namespace: str, name: str, exit_code: int, reason: str = "Error",
                           message: str | None = None) -> None:
        """The pod's containers stopped on their own (restartPolicy Never): the kubelet reports it.
        The pod stays, Succeeded or Failed, until someone deletes it."""
        async with self._lock:
            pod = self._pod(namespace, name)
            self._kubelet_of(pod)
            pod["status"] = self._stopped(pod, exit_code, "Completed" if exit_code == 0 else reason, message)
            await self.commit((PODS, namespace, name), pod, "MODIFIED")

    async def kubelet_finish(self, namespace: str, name: str, exit_code: int = 143,
                             message: str | None = None) -> None:
        """The kubelet completes a graceful deletion: the containers stopped after SIGTERM
        (`exit_code`); it reports the final status, then deletes the pod with grace 0 and its uid
        as a precondition, which removes it (as in the traces)."""
        async with self._lock:
            pod = self._pod(namespace, name)
            if not pod["metadata"].get("deletionTimestamp"):
                raise RuntimeError(f"pod {name} is not being deleted: its kubelet has nothing to finish")
            self._kubelet_of(pod)
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                pod["status"] = self._stopped(pod, exit_code, "Completed" if exit_code == 0 else "Error", message)
                await self.commit((PODS, namespace, name), pod, "MODIFIED")
        await self._delete((PODS, namespace, name), {"gracePeriodSeconds": 0,
                                                     "preconditions": {"uid": pod["metadata"]["uid"]}})

    async def kubelet_terminate(self, namespace: str, name: str, reason: str = "Evicted",
                                message: str | None = None) -> None:
        """The kubelet stops a pod for its node's sake: node-pressure eviction (reason Evicted) or
        graceful node shutdown (reason Terminated). Its status manager sends the DisruptionTarget
        condition (TerminationByKubelet) in the same write as the Failed phase, once the containers
        have stopped (mergePodStatus in kubelet/status). The pod is not deleted."""
        message = message if message is not None else KUBELET_TERMINATION[reason]
        async with self._lock:
            pod = self._pod(namespace, name)
            self._kubelet_of(pod)
            status = self._stopped(pod, 137, "Error", pod_reason=reason, pod_message=message)
            status["conditions"], _ = set_condition(status.get("conditions"), "DisruptionTarget", "True",
                                                    "TerminationByKubelet", message)
            pod["status"] = status
            await self.commit((PODS, namespace, name), pod, "MODIFIED")

    async def preempt(self, namespace: str, name: str) -> None:
        """kube-scheduler preempts the pod for a higher-priority one: condition, then graceful delete."""
        pod = self._pod(namespace, name)
        scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        await self._disrupt((PODS, namespace, name), "PreemptionByScheduler",
                            PREEMPTION_MESSAGE.format(scheduler=scheduler), {})

    async def taint_manager_evict(self, namespace: str, name: str) -> None:
        """The taint manager (node lifecycle controller) evicts a pod that does not tolerate a
        NoExecute taint of its node (any more: tolerationSeconds ran out): condition, then delete."""
        await self._disrupt((PODS, namespace, name), *TAINT_MANAGER, {})

    async def evict(self, namespace: str, name: str, delete_options: dict[str, Any] | None = None) -> None:
        """What a POST to the pod's eviction subresource does."""
        await self._disrupt((PODS, namespace, name), *EVICTION_API, delete_options or {})

    # ------------------------------------------------------------ nodes

    async def add_node(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A node whose kubelet has registered and posts Ready."""
        now = rfc3339()
        conditions = [{"type": t, "status": s, "lastHeartbeatTime": now, "lastTransitionTime": now,
                       "reason": r, "message": m} for t, s, r, m in HEALTHY_NODE]
        return await self.create(NODES, None, {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {}, "status": {"conditions": conditions}})

    async def node_down(self, name: str) -> None:
        """The node stops answering, and the node lifecycle controller notices: every node condition
        goes Unknown, the node's pods are marked not Ready, the node is tainted unreachable
        (NoSchedule and NoExecute). From then on the node's kubelet writes nothing, so graceful
        deletions of its pods hang (Terminating) until someone deletes them with grace 0."""
        key, now = (NODES, None, name), rfc3339()
        async with self._lock:
            node = self._current(key)
            if node is None:
                raise not_found(NODES, name)
            self._unreachable.add(name)
            for condition in node.setdefault("status", {}).setdefault("conditions", []):
                if condition.get("status") != "Unknown":  # the kubelet's last heartbeat stays
                    condition.update(status="Unknown", reason="NodeStatusUnknown",
                                     message="Kubelet stopped posting node status.", lastTransitionTime=now)
            await self.commit(key, node, "MODIFIED")
            # MarkPodsNotReady: only the Ready condition flips (ContainersReady stays, as in the traces).
            for pod_key, obj in list(self.objects.items()):
                if pod_key[0] != PODS or obj.deleted or (obj.raw.get("spec") or {}).get("nodeName") != name:
                    continue
                pod = self._current(pod_key)
                status = pod.setdefault("status", {})
                ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
                if ready is None:
                    continue
                status["conditions"], changed = set_condition(status["conditions"], "Ready", "False",
                                                              ready.get("reason"), ready.get("message"))
                if changed:
                    await self.commit(pod_key, pod, "MODIFIED")
            node = self._current(key)
            spec = node.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or () if t.get("key") != UNREACHABLE_TAINT]
            spec["taints"] = taints + [{"key": UNREACHABLE_TAINT, "effect": effect, "timeAdded": now}
                                               for effect in ("NoSchedule", "NoExecute")]
            await self.commit(key, node, "MODIFIED")

    async def node_up(self, name: str) -> None:
        """The node's kubelet posts status again: the node is Ready and untainted. What the kubelet
        then reports about each pod (still running: kubelet_start; lost: kubelet_exit) is the test's."""
        key, now = (NODES, None, name), rfc3339()
        async with self._lock:
            node = self._current(key)
            if node is None:
                raise not_found(NODES, name)
            healthy = {t: (s, r, m) for t, s, r, m in HEALTHY_NODE}
            for condition in node.setdefault("status", {}).setdefault("conditions", []):
                if condition.get("type") in healthy:
                    status, reason, message = healthy[condition["type"]]
                    condition.update(status=status, reason=reason, message=message,
                                     lastHeartbeatTime=now, lastTransitionTime=now)
            await self.commit(key, node, "MODIFIED")
            node = self._current(key)
            spec = node.setdefault("spec", {})
            spec["taints"] = [t for t in spec.get("taints") or () if t.get("key") != UNREACHABLE_TAINT]
            if not spec["taints"]:
                del spec["taints"]
            await self.commit(key, node, "MODIFIED")
            self._unreachable.discard(name)
