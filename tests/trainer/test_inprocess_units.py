"""The pure parts of in-process recovery (runtime/inprocess.py): who sends the state, the seat, the node range,
the state's skeleton and buckets."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from ddp_trainer.runtime.inprocess import (Seat, buckets, choose_source, flatten, max_nodes, nbytes, slots_of,
                                           split_run_id, unflatten)


@pytest.mark.parametrize("table, expected", [
    ([(False, -1), (True, 12), (True, 12)], (1, [0])),  # the replacement of rank 0 gets it from rank 1
    ([(True, 12), (True, 12), (False, -1)], (0, [2])),
    ([(True, 12), (True, 13), (True, 13), (False, -1)], (1, [0, 3])),  # a survivor a step behind receives too
    ([(True, 5), (True, 5)], (0, [])),  # everyone holds it: nothing travels
    ([(False, -1), (False, -1)], None),  # nobody: the volume
    ([], None),
])
def test_the_lowest_rank_holding_the_newest_step_sends_to_every_rank_without_it(table, expected) -> None:
    assert choose_source(table) == expected


def test_a_rank_is_its_seat_whoever_holds_it() -> None:
    assert Seat(replica_index=0, local_rank=0, nproc=1).rank == 0
    assert Seat(replica_index=2, local_rank=1, nproc=4).rank == 9
    assert Seat(replica_index=3, local_rank=0, nproc=1).rank == 3


@pytest.mark.parametrize("text, size", [("3:3", 3), ("2:4", 4), ("5", 5)])
def test_a_generations_size_is_the_maximum_of_its_node_range(text: str, size: int) -> None:
    assert max_nodes(text) == size


@pytest.mark.parametrize("text", ["", "a:b", "2:0", "x"])
def test_a_node_range_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="node range"):
        max_nodes(text)


def test_the_run_id_names_the_job_and_the_generation() -> None:
    assert split_run_id("1234-abcd-g7") == ("1234-abcd", 7)
    with pytest.raises(ValueError, match="<job uid>-g<generation>"):
        split_run_id("test")


def test_a_state_becomes_a_skeleton_and_its_tensors_and_back() -> None:
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(3, dtype=torch.float16)},
             "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
             "progress": {"step": 12}, "pair": (1, torch.ones(1, dtype=torch.int64)), "rng": None}
    skeleton, tensors = flatten(state)
    assert len(tensors) == 4 and [s.index for s in slots_of(skeleton)] == [0, 1, 2, 3]
    assert skeleton["progress"] == {"step": 12} and skeleton["rng"] is None
    back = unflatten(skeleton, [t.clone() for t in tensors])
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["model"]["b"].dtype == torch.float16
    assert back["pair"][0] == 1 and isinstance(back["pair"], tuple)
    assert [nbytes(s) for s in slots_of(skeleton)] == [24, 6, 4, 8]


def test_buckets_hold_at_most_the_limit_with_aligned_offsets() -> None:
    assert buckets([10, 10, 100, 3], limit=128) == [[(0, 0), (1, 64)], [(2, 0)], [(3, 0)]]
    assert buckets([500], limit=128) == [[(0, 0)]]  # a larger tensor alone in its own bucket
    assert buckets([]) == []


def test_the_trainer_reads_the_store_keys_the_agent_writes() -> None:
    from ddp_trainer.runtime import inprocess
    from ddpjob_operator.agent import contract
    assert (inprocess.GENERATION_KEY, inprocess.NNODES_KEY) == (contract.GENERATION_KEY, contract.NNODES_KEY)
    assert inprocess.REJOIN_TIMEOUT_S == contract.REJOIN_TIMEOUT_SECONDS  # (the variables' names: test_trainer_contract_*)
    assert inprocess.SPARE_BUILT_KEY == contract.SPARE_BUILT_KEY  # its trainers say they are built there


def test_the_agent_gives_torchrun_a_rendezvous_of_the_pods_own_only_in_process(monkeypatch) -> None:
    from ddpjob_operator.agent import worker
    args = ["--nnodes=2:3", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=job-rdzv:29400",
            "--rdzv-id=uid-g4", "--rdzv-conf=is_host=false,join_timeout=600", "--max-restarts=0", "-m", "ddp_trainer",
            "--nnodes=7"]
    monkeypatch.delenv(worker.INPROCESS_ENV, raising=False)
    assert worker.torchrun_args(args) == args
    monkeypatch.setenv(worker.INPROCESS_ENV, "1")
    assert worker.torchrun_args(args) == [
        "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--rdzv-id=uid-g4",
        "--rdzv-conf=is_host=true", "--max-restarts=0", "-m", "ddp_trainer", "--nnodes=7"]  # the script's own: untouched


def test_a_warm_spare_takes_the_seat_its_agent_writes_under_its_key() -> None:
    """The agent writes the operator's assignment under the spare's own store key (SPARE_PLACE_ENV); the trainer's
    seat is then that replica index; a stop while waiting returns None; a malformed assignment is refused."""
    import json

    import torch.distributed as dist

    from ddp_trainer.runtime.inprocess import CannotRecover, Rendezvous

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    rdzv = Rendezvous(store, "uid-spare", Seat(-1, 1, 2), backend="gloo")
    rdzv.place_key = "ddpjob/uid-spare/spare/abc"
    assert rdzv.wait_place(lambda: True) is None and rdzv.place_key is not None  # stopped: no place
    assert store.get("ddpjob/uid-spare/spare/abc/built/1")  # built (local rank 1): the agent may mark it ready
    store.set(rdzv.place_key, json.dumps({"index": 2, "generation": 5, "rdzvId": "uid-spare-g5", "nnodes": "3:3"}))
    assert rdzv.wait_place(lambda: False) == 5
    assert (rdzv.seat, rdzv.seat.rank, rdzv.place_key) == (Seat(2, 1, 2), 5, None)
    rdzv.place_key = "ddpjob/uid-spare/spare/bad"
    store.set(rdzv.place_key, json.dumps({"index": -1, "generation": 5}))
    with pytest.raises(CannotRecover, match="is not {index, generation}"):
        rdzv.wait_place(lambda: False)


def test_a_spare_job_builds_first_and_a_stop_while_it_waits_for_its_place_exits_143(monkeypatch) -> None:
    import os
    import signal

    import torch.distributed as dist

    from ddp_trainer.runtime import Job

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for name, value in {"DDPJOB_INPROCESS": "1", "PET_RDZV_ENDPOINT": f"127.0.0.1:{server.port}",
                        "TORCHELASTIC_RUN_ID": "uid-spare-g1", "DDPJOB_REPLICA_INDEX": "-1", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "1", "DDPJOB_SPARE_PLACE_KEY": "ddpjob/uid-spare/spare/x",
                        "DDPJOB_CHECKPOINT_DIR": ""}.items():
        monkeypatch.setenv(name, value)
    job = Job.start(device="cpu", build_first=True)  # returns before it has a place
    try:
        assert not job.seated and not dist.is_initialized()
        with pytest.raises(RuntimeError, match="this trainer has no place yet; job.resume"):
            job.env
        os.kill(os.getpid(), signal.SIGTERM)  # its pod deleted while it waits
        with pytest.raises(SystemExit) as stopped:
            job.resume()
        assert stopped.value.code == 143
    finally:
        job.close(clean=False)


def test_the_state_lands_in_the_receivers_own_tensors_where_they_match(tmp_path) -> None:
    """A replacement receives a peer's state into the tensors it built (its model's parameters): the large one
    that travels alone and the small ones unpacked from a bucket; one of another shape or dtype is left as it
    is and the state's own arrives beside it, into memory prepared from the layout where there is some. Real
    Gloo, two processes."""
    from trainer_harness import PY, StoreServer, base_env

    store = StoreServer()
    script = Path(__file__).with_name("inprocess_broadcast_rank.py")
    try:
        procs = [subprocess.Popen([PY, str(script), str(rank), str(store.port)], env=base_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        store.close()
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    result = json.loads(outputs[1].strip().splitlines()[-1])
    assert result["equal"] and result["progress"] == {"step": 9} and result["lr"] == 0.1, result
    assert result["in_place"] == result["own_equal_sent"] == ["large", "small"], result
    assert result["untouched"] == ["half", "reshaped"], result  # float32 where float16 came; (2, 3) where (6,)
    # What its own state lacks lands in the memory it prepared from the published layout (runtime/layout.py).
    assert result["prepared"] == ["model/reshaped", "optimizer/state/0/exp_avg", "optimizer/state/0/step"], result
    assert result["stale_untouched"], result


@pytest.mark.parametrize("before", [None, "1", "3", "2"])
def test_nccl_errors_are_raised_in_the_survivor_not_the_end_of_it(monkeypatch, before) -> None:
    """torch's NCCL watchdog ends the process on a failed collective unless TORCH_NCCL_ASYNC_ERROR_HANDLING is 2
    (CleanUpOnly, ProcessGroupNCCL.hpp's ErrorHandlingMode): a survivor must stay to recover in process."""
    from ddp_trainer.runtime.inprocess import NCCL_ERRORS_ENV, nccl_errors_raise

    if before is None:
        monkeypatch.delenv(NCCL_ERRORS_ENV, raising=False)
    else:
        monkeypatch.setenv(NCCL_ERRORS_ENV, before)
    nccl_errors_raise()
    assert os.environ[NCCL_ERRORS_ENV] == "2"
    header = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
    assert "CleanUpOnly = 2" in header.read_text(errors="replace")  # what 2 means in this torch (2.13)
