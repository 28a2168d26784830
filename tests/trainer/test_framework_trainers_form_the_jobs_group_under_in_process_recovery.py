"""Under in-process recovery (DDPJOB_INPROCESS=1, the default with restartScope Pod) the launcher starts each pod's
trainers in a torchrun rendezvous of the pod's own (RANK 0, WORLD_SIZE 1). A Hugging Face or Lightning trainer forms
the job's process group through the job's store (as `Job.start` does) before its framework initialises distributed,
takes the restart path on a peer's failure, and says so once a job (issue 36, "The default").

Before: every Hugging Face and Lightning job under DDPJOB_INPROCESS=1 ended at once with exit 1
(`frameworks.check_restart_path`: "needs a script on ddp_trainer.runtime.Job"). Real processes, the job's real
TCPStore, real Gloo."""

from __future__ import annotations

import json
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

import torch.distributed as dist

from ddp_trainer.runtime.inprocess import GENERATION_KEY, NNODES_KEY
from trainer_harness import PY, StoreServer, base_env, kill_tree, start, tail

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "framework_forms_the_jobs_group.py")
RESTART_PATH = "the Test Trainer takes the restart path"
UID = "uid-framework"


@pytest.fixture
def store():
    server = StoreServer()
    yield server
    server.close()


def launched_env(tmp_path: Path, store: StoreServer, replica: int, generation: int, **extra: str) -> dict[str, str]:
    """A trainer's environment as each pod's torchrun --nnodes=1 gives it under DDPJOB_INPROCESS=1: RANK 0 of
    WORLD_SIZE 1 (a rendezvous of the pod's own), the job's store, the generation and the pod's replica index."""
    return base_env(tmp_path, DDPJOB_INPROCESS="1", PET_RDZV_ENDPOINT=store.endpoint,
                    TORCHELASTIC_RUN_ID=f"{UID}-g{generation}", DDPJOB_GENERATION=str(generation),
                    DDPJOB_REPLICA_INDEX=str(replica), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                    **extra)


def test_each_pods_trainer_joins_the_jobs_group_and_the_restart_path_is_said_once_a_job(tmp_path: Path,
                                                                                       store: StoreServer) -> None:
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False)
    logs: dict[tuple[int, int], Path] = {}
    # The second generation: rank 0's trainer started again after a peer's failure (the restart path), in a world
    # of one (fewer processes for the test; what it shows is that a later rank 0 does not say it again).
    for generation, nodes in ((1, 2), (2, 1)):
        client.set(NNODES_KEY.format(uid=UID, generation=generation), f"{nodes}:{nodes}")  # what launchers publish
        client.set(GENERATION_KEY.format(uid=UID), str(generation))
        procs = {}
        for replica in range(nodes):
            logs[replica, generation] = tmp_path / f"r{replica}-g{generation}.log"
            procs[replica] = start([PY, SCRIPT], launched_env(tmp_path, store, replica, generation),
                                   logs[replica, generation])
        try:
            for replica, proc in procs.items():
                assert proc.wait(60) == 0, tail(logs[replica, generation])
        finally:
            for proc in procs.values():
                kill_tree(proc, signal.SIGKILL)
        for replica in procs:
            assert f"rank={replica} world={nodes} WORLD_SIZE={nodes} RANK={replica} sum={nodes}" in \
                logs[replica, generation].read_text(), tail(logs[replica, generation])
    said = {where: log.read_text().count(RESTART_PATH) for where, log in logs.items()}
    assert said == {(0, 1): 1, (1, 1): 0, (0, 2): 0}, said  # rank 0, once for the job


def test_a_group_the_framework_formed_first_is_refused_with_the_fix(tmp_path: Path) -> None:
    done = subprocess.run([PY, SCRIPT, "--framework-first"], env=base_env(tmp_path, DDPJOB_INPROCESS="1"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert ("DDPJob: the Test Trainer formed its process group before DDPJob could (in-process recovery, "
            "DDPJOB_INPROCESS=1, forms it through the job's store): each pod would train alone. Fix: call form_group "
            "first, or set failurePolicy.recovery: Restart") in done.stderr
    assert "Traceback" not in done.stderr


def test_in_process_recovery_outside_the_launcher_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    done = subprocess.run([PY, SCRIPT], env=base_env(tmp_path, DDPJOB_INPROCESS="1"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    assert "DDPJob: DDPJOB_INPROCESS=1 needs PET_RDZV_ENDPOINT=<host>:<port> (the job's rendezvous store)" \
        in done.stderr and "set failurePolicy.recovery: Restart" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_warm_spares_trainer_waits_for_its_place_then_joins_the_jobs_group(tmp_path: Path,
                                                                            store: StoreServer) -> None:
    """A spare's launcher starts its trainers before it has a place (DDPJOB_SPARE_PLACE_KEY): the framework's
    trainer waits in `form_group` until the launcher writes its place, then joins that generation as that rank."""
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False)
    client.set(NNODES_KEY.format(uid=UID, generation=1), "2:2")
    client.set(GENERATION_KEY.format(uid=UID), "1")
    place = f"ddpjob/{UID}/spare/test"

    logs = {who: tmp_path / f"{who}.log" for who in ("spare", "worker")}
    spare = start([PY, SCRIPT], launched_env(tmp_path, store, -1, 0, DDPJOB_SPARE_PLACE_KEY=place), logs["spare"])
    worker = None
    try:
        client.wait([f"{place}/built/0"], timedelta(seconds=60))  # built, waiting for its place
        assert spare.poll() is None, tail(logs["spare"])
        worker = start([PY, SCRIPT], launched_env(tmp_path, store, 0, 1), logs["worker"])
        client.set(place, json.dumps({"index": 1, "generation": 1}))  # the launcher, given worker 1's place
        assert spare.wait(60) == 0 and worker.wait(60) == 0, tail(logs["spare"]) + tail(logs["worker"])
    finally:
        for proc in (spare, worker):
            if proc is not None:
                kill_tree(proc, signal.SIGKILL)
    assert "rank=1 world=2 WORLD_SIZE=2 RANK=1 sum=2" in logs["spare"].read_text()
    assert "rank=0 world=2 WORLD_SIZE=2 RANK=0 sum=2" in logs["worker"].read_text()
