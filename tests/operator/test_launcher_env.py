"""The operator's wiring cannot be overridden through the environment (issue 23: 7): the launcher drops
every PET_* and TORCHELASTIC_* variable that is not the operator's own mirror of a flag it passes, so an
envFrom without a prefix cannot make torchrun run standalone (its own store, its own rendezvous id).

A real launcher and torchrun against a real TCPStore (Gloo, one node)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the launcher runs torchrun: the trainer's dependencies")
import torch.distributed as dist  # noqa: E402

from ddpjob_operator import agent, launch, validation  # noqa: E402
from ddpjob_operator.agent import contract  # noqa: E402

SCRIPT = "import os\nprint('RUN_ID=' + os.environ.get('TORCHELASTIC_RUN_ID', '-'), flush=True)\n"


def test_a_foreign_pet_standalone_is_ignored_and_the_operators_rendezvous_is_used(tmp_path: Path):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    script = tmp_path / "show.py"
    script.write_text(SCRIPT)
    spec = validation.parse_spec({"replicas": 1, "image": "t:1", "entrypoint": str(script),
                                  "failurePolicy": {"restartScope": "All"}})
    endpoint, rdzv_id = f"127.0.0.1:{store.port}", "uid-env-g0"
    env = {**os.environ, **launch.worker_env(spec, job_name="env", namespace="local", index=0, generation=0,
                                             endpoint=endpoint, rdzv_id=rdzv_id, local_addr="127.0.0.1",
                                             master_addr="127.0.0.1"),
           "PET_STANDALONE": "1", "TORCHELASTIC_MAX_RESTARTS": "100",  # what an unprefixed envFrom could bring
           contract.TERMINATION_LOG_ENV: str(tmp_path / "termination-log")}
    argv = launch.worker_command(spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr="127.0.0.1",
                                 python=sys.executable, agent_dir=agent.DIRECTORY)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"RUN_ID={rdzv_id}" in done.stdout, done.stdout  # standalone would have made up its own id
    assert "ignoring PET_STANDALONE" in done.stderr and "ignoring TORCHELASTIC_MAX_RESTARTS" in done.stderr
