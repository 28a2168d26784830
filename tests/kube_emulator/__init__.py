"""kmock's Kubernetes emulator, made to act like a Kubernetes v1.36 API server and the parts of
the control plane around it, wherever the operator's failure handling depends on what they do.

kmock keeps objects in memory and serves discovery over HTTP. Every request that reads or changes
objects is served here, with the real server's rules (checked against watch traces recorded on a
real v1.36 cluster: tests/operator/test_emulator.py):

- server metadata on create: uid, resourceVersion (one counter for all objects, like etcd's
  revision), creationTimestamp, generation (pods and custom resources), names from generateName;
  409 AlreadyExists; `metadata.resourceVersion` in a PATCH or PUT makes it conditional (409 Conflict);
- the status subresource: /status writes change only status, main-resource writes never change
  status; `generation` moves when anything but metadata and status changes; the scale subresource;
- the DDPJob CRD's structural schema: unknown fields pruned, `default`s applied (on write and on
  read), the spec validated with the operator's own model (the CRD's rules): 422;
- pods: admission (DefaultTolerationSeconds, terminationGracePeriodSeconds, phase Pending),
  graceful deletion (deletionTimestamp, deletionGracePeriodSeconds, generation + 1; gone only when
  the kubelet confirms, or with grace 0, or when the pod has finished), uid and resourceVersion
  preconditions, finalizers, the Eviction subresource;
- list and watch: label and field selectors, resourceVersion (a watch resumes after it; 410 Gone
  when it is too old), timeoutSeconds;
- deletecollection: a DELETE on a namespace's collection URL deletes every object it selects;
- background garbage collection through ownerReferences (the kube-controller-manager's job);
- the control plane and kubelets as test-side methods: scheduler preemption, the taint manager,
  kubelet node-pressure eviction and graceful node shutdown, a node going down and coming back,
  a pod the scheduler cannot place;
- faults a test sets: a validating admission step for pods (`admit_pods`: Pod Security, quota, a
  webhook), and an API server that answers the operator 503 for a while (`unavailable_until`);
- a record of every (API group, resource, verb) the operator calls;
- a public inspection API and hooks for tests and benches (docs/testing.md): they reach nothing private.

Not emulated (so a test must not rely on them): PodDisruptionBudgets (every eviction is allowed),
strategic-merge and server-side-apply patches (415), Foreground and Orphan propagation (501),
pod spec immutability, quantities, qosClass, and admission other than DefaultTolerationSeconds
(and what a test puts in `admit_pods`).
"""

from .cluster import Cluster
from .logs import LogCluster
from .resources import (CLAIMS, DDPJOBS, EVENTS, LEASES, NODES, OPERATOR_AGENTS, PODS, SERVICES, TOKEN_REVIEWS,
                        UNREACHABLE_TAINT, Change, NodeUnreachable)
from .rules import api_error, labels_match, not_found, parse_label_selector

__all__ = ["CLAIMS", "DDPJOBS", "EVENTS", "LEASES", "NODES", "OPERATOR_AGENTS", "PODS", "SERVICES", "TOKEN_REVIEWS",
           "UNREACHABLE_TAINT", "Change", "Cluster", "LogCluster", "NodeUnreachable", "api_error", "labels_match",
           "not_found", "parse_label_selector"]
