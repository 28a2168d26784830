"""`python -m ddpjob_operator.run`: the operator process (the image's entrypoint).

Settings come from DDPJOB_OPERATOR_* variables (settings.py); credentials from the in-cluster
service account or the current kubeconfig context.
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
from .metrics import Metrics
from .settings import Settings, SettingsError

EXIT_BAD_SETTINGS = 2


def create_operator(settings: Settings, connection: Connection) -> tuple[Controller, kopf.OperatorRegistry,
                                                                          kopf.OperatorSettings]:
    controller = Controller(Kube(connection, timeout_seconds=settings.request_timeout_seconds), settings, Metrics())
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
