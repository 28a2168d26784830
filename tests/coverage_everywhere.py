"""pytest plugin for `make coverage` (-p tests.coverage_everywhere): measure every Python process the tests
start, the worker agent's included. Coverage's own subprocess patch passes its settings through the
environment, and the tests, like the local runner and a pod, give their processes an environment of their
own; this carries the one variable coverage needs into every such environment. Inactive outside coverage."""

from __future__ import annotations

import os
import subprocess

CONFIG_ENV = "COVERAGE_PROCESS_CONFIG"


def pytest_configure(config) -> None:
    setting = os.environ.get(CONFIG_ENV)
    if not setting:
        return
    original = subprocess.Popen.__init__

    def with_coverage(self, *args, env=None, **kwargs):
        if env is not None and CONFIG_ENV not in env:
            env = {**env, CONFIG_ENV: setting}
        original(self, *args, env=env, **kwargs)

    subprocess.Popen.__init__ = with_coverage
