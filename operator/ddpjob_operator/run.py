"""`python -m ddpjob_operator.run`: the operator process (the image's entrypoint).

Settings come from DDPJOB_OPERATOR_* variables (settings.py); credentials from the in-cluster
service account or the current kubeconfig context. With DDPJOB_OPERATOR_LEASE_NAME set, replicas
elect the one that acts on a Lease (leader.py); the others watch and wait.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import Callable

import kopf

from . import settings as settings_module
from .handlers import Controller, build_registry
from .kube import Connection, Kube
from .leader import Elector, FencedKube, NamedKube, Timing
from .metrics import Metrics
from .settings import Settings, SettingsError

EXIT_BAD_SETTINGS = 2


def create_operator(settings: Settings, connection: Connection) -> tuple[Controller, kopf.OperatorRegistry,
                                                                          kopf.OperatorSettings]:
    timeout = settings.request_timeout_seconds
    elector = None
    if settings.leader_election:
        timing = Timing(settings.lease_duration_seconds, settings.lease_renew_deadline_seconds,
                        settings.lease_retry_period_seconds)
        # The Lease has a client of its own: renewals never queue behind a burst of pod calls.
        elector = Elector(NamedKube(connection, settings.identity, timeout_seconds=timeout),
                          settings.lease_namespace, settings.lease_name, settings.identity, timing)
        api: Kube = FencedKube(connection, elector, timeout_seconds=timeout)
    else:
        api = Kube(connection, timeout_seconds=timeout)
    controller = Controller(api, settings, Metrics(), elector=elector)
    # Every job with a pass queued, running or about to run again (workqueue.WorkQueue).
    controller.metrics.watch_queue(lambda: len(controller.queue))
    kopf_settings = kopf.OperatorSettings()
    settings_module.configure_kopf(kopf_settings, settings)
    return controller, build_registry(controller, connection), kopf_settings


async def run_operator(settings: Settings, connection: Connection, *,
                       stop_flag: threading.Event | asyncio.Event | None = None,
                       ready_flag: threading.Event | asyncio.Event | None = None,
                       on_controller: Callable[[Controller], None] | None = None) -> None:
    """Run until stop_flag is set (or forever). Tests and benchmarks run this in a thread."""
    controller, registry, kopf_settings = create_operator(settings, connection)
    if on_controller is not None:
        on_controller(controller)
    await kopf.operator(registry=registry, settings=kopf_settings, standalone=True,
                        clusterwide=settings.clusterwide, namespaces=settings.watch_namespaces,
                        liveness_endpoint=settings.liveness_endpoint, stop_flag=stop_flag, ready_flag=ready_flag)


def main() -> int:
    try:
        settings = settings_module.from_env()
    except SettingsError as exc:
        print(f"ddpjob-operator: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        connection = Connection.from_environment()
    except Exception as exc:  # kubernetes.config raises several unrelated types
        print(f"ddpjob-operator: no Kubernetes credentials ({exc}). Fix: run in a pod with a service "
              f"account, or set KUBECONFIG", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    asyncio.run(run_operator(settings, connection))
    return 0


if __name__ == "__main__":
    sys.exit(main())
