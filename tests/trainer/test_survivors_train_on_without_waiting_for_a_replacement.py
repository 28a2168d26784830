"""Elastic in place (issue 36): real trainer processes on `Job` (inprocess_view_worker.py), real Gloo, the job's real
TCPStore. When a rank is lost the survivors form a short view among themselves at once and train on, without a
new generation; a replacement joins them live at a step boundary and gets the state by broadcast; below the
minimum they wait and say so."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from inprocess_gang import UID, Gang
from tests.rendezvous_store import StoreProcess
from ddp_trainer.runtime.inprocess import GENERATION_KEY
from trainer_harness import PY, job_dir

pytestmark = pytest.mark.slow

WORKER = [PY, str(Path(__file__).with_name("inprocess_view_worker.py"))]
STEP = re.compile(r"^step (\d+) seat (\d+) rank (\d+) of (\d+) view (\d+):(\d+) pid (\d+) time ([\d.]+)$", re.M)


@pytest.fixture
def gang(tmp_path: Path):
    made = Gang(tmp_path, "views", [])
    yield made
    made.close()


def start(gang: Gang, seat: int, generation: int, nodes: int, steps: int, step_s: float = 0.1, die_at: int = 0):
    return gang.start(seat, generation, nodes, command=WORKER,
                      env={"VIEW_STEPS": str(steps), "VIEW_STEP_S": str(step_s), "VIEW_DIE_AT": str(die_at)})


def steps(gang: Gang, seat: int, generation: int) -> list[dict]:
    """The step lines of one trainer: step, seat, rank, size, its view's generation and round, pid, time. (Rounds
    are a generation's counter: survivors closing a view at the same moment each take one, one view wins.)"""
    return [{"step": int(m[1]), "seat": int(m[2]), "rank": int(m[3]), "size": int(m[4]), "generation": int(m[5]),
             "round": int(m[6]), "pid": int(m[7]), "time": float(m[8])} for m in STEP.finditer(gang.text(seat, generation))]


def final_sum(gang: Gang, seat: int, generation: int) -> str:
    found = re.findall(r"^done step \d+ sum (\S+)$", gang.text(seat, generation), re.M)
    assert found, gang.logs()
    return found[-1]


def newest_generation(gang: Gang) -> int:
    return int(gang.client.get(GENERATION_KEY.format(uid=UID)))


def test_the_survivors_of_a_kill_train_on_within_seconds_without_a_new_generation_and_finish_short(gang) -> None:
    gang.publish(1, 3, fewest=1)
    procs = {seat: start(gang, seat, 1, 3, steps=30, die_at=5 if seat == 2 else 0) for seat in range(3)}
    assert gang.wait(procs.pop(2)) == -signal.SIGKILL
    killed_at = steps(gang, 2, 1)[-1]["time"]
    for seat, proc in procs.items():
        assert gang.wait(proc) == 0, gang.logs()  # nobody came: the job finished short
    assert newest_generation(gang) == 1  # nothing was published: nobody waited for a replacement
    for seat in procs:
        lines = steps(gang, seat, 1)
        assert [line["step"] for line in lines] == list(range(1, 31)), gang.logs()
        assert {line["pid"] for line in lines} == {procs[seat].pid}
        after = [line for line in lines if line["step"] > 5]
        assert {(line["generation"], line["size"], line["rank"]) for line in after} == {(1, 2, seat)}, gang.logs()
        assert len({line["round"] for line in after}) == 1 and after[0]["round"] > 0
        gap = after[0]["time"] - killed_at
        print(f"seat {seat}: kill -> next step {gap:.2f} s")
        assert gap < 3.0, gang.logs()
        assert "recovered in process: generation 1 -> 1, rank" in gang.text(seat, 1)
    assert final_sum(gang, 0, 1) == final_sum(gang, 1, 1)
    progress = json.loads((job_dir(gang.ckpt) / "progress.json").read_text())
    assert (progress["world_size"], progress["desired_world_size"], progress["missing_ranks"]) == (2, 3, [2]), progress
    assert progress["short_since"] is not None and progress["recovery"]["kind"] == "Shrink", progress


def test_a_replacement_joins_the_survivors_at_a_step_boundary_and_gets_the_state_by_broadcast(gang) -> None:
    """The replacement starts as soon as the kill is seen (its generation published, as its agent does); its
    interpreter and torch take seconds, which the survivors spend training short."""
    gang.publish(1, 3, fewest=1)
    procs = {seat: start(gang, seat, 1, 3, steps=80, step_s=0.2, die_at=5 if seat == 2 else 0) for seat in range(3)}
    assert gang.wait(procs.pop(2)) == -signal.SIGKILL
    gang.publish(2, 3, fewest=1)
    replacement = start(gang, 2, 2, 3, steps=80, step_s=0.2)
    for proc in (*procs.values(), replacement):
        assert gang.wait(proc) == 0, gang.logs()
    joined = steps(gang, 2, 2)
    assert joined and {(line["generation"], line["size"], line["rank"]) for line in joined} == {(2, 3, 2)}, gang.logs()
    resumed = int(re.search(r"^resumed step=(\d+) from peer rank 0$", gang.text(2, 2), re.M)[1])
    assert joined[0]["step"] == resumed + 1 and 5 < resumed < 80, gang.logs()
    for seat in procs:
        lines = steps(gang, seat, 1)
        assert [line["step"] for line in lines] == list(range(1, 81)), gang.logs()
        assert any(line["size"] == 2 for line in lines if line["step"] <= resumed)  # short until the join
        assert {line["pid"] for line in lines} == {procs[seat].pid}  # the survivors kept their processes
        assert {(line["generation"], line["size"]) for line in lines if line["step"] > resumed} == {(2, 3)}, gang.logs()
        assert re.search(rf"regrouped at step {resumed}: view \d:\d+ -> 2:\d+ \(joined: 2\)", gang.text(seat, 1)), \
            gang.logs()
    assert final_sum(gang, 0, 1) == final_sum(gang, 1, 1) == final_sum(gang, 2, 2)
    progress = json.loads((job_dir(gang.ckpt) / "progress.json").read_text())
    assert (progress["world_size"], progress["missing_ranks"], progress["short_since"]) == (3, [], None), progress
    assert progress["recovery"]["kind"] == "Join" and progress["recovery"]["resumed_step"] == resumed, progress


def test_a_second_loss_while_short_leaves_the_last_survivor_training(gang) -> None:
    gang.publish(1, 3, fewest=1)
    procs = {seat: start(gang, seat, 1, 3, steps=30, die_at={1: 15, 2: 5}.get(seat, 0)) for seat in range(3)}
    for seat in (2, 1):
        assert gang.wait(procs.pop(seat)) == -signal.SIGKILL
    assert gang.wait(procs[0]) == 0, gang.logs()
    lines = steps(gang, 0, 1)
    assert [line["step"] for line in lines] == list(range(1, 31)), gang.logs()
    assert [(line["generation"], line["size"]) for line in lines if line["step"] in (5, 6, 15, 16)] == \
        [(1, 3), (1, 2), (1, 2), (1, 1)], gang.logs()
    assert gang.text(0, 1).count("recovered in process: generation 1 -> 1") == 2
    assert newest_generation(gang) == 1


def test_below_the_minimum_the_survivor_waits_says_so_and_trains_once_a_replacement_arrives(gang) -> None:
    gang.publish(1, 3, fewest=2)
    procs = {seat: start(gang, seat, 1, 3, steps=30, die_at=5 if seat else 0) for seat in range(3)}
    for seat in (1, 2):
        assert gang.wait(procs.pop(seat)) == -signal.SIGKILL
    gang.saw(0, 1, "below minReplicas: 1 of 3 ranks, waiting for 1 more", timeout=30)
    time.sleep(1.0)
    assert [line["step"] for line in steps(gang, 0, 1)][-1] == 5  # no step while below the minimum
    progress = json.loads((job_dir(gang.ckpt) / "progress.json").read_text())
    assert (progress["waiting_for_ranks"], progress["world_size"], progress["step"]) == (1, 0, 5), progress
    gang.publish(2, 3, fewest=2)
    replacement = start(gang, 1, 2, 3, steps=30)
    for proc in (procs[0], replacement):
        assert gang.wait(proc) == 0, gang.logs()
    assert {(line["generation"], line["size"]) for line in steps(gang, 0, 1) if line["step"] > 5} == {(2, 2)}
    assert "resumed step=5 from peer rank 0" in gang.text(1, 2), gang.logs()
    assert gang.text(0, 1).count("below minReplicas") == 1  # said once
    assert final_sum(gang, 0, 1) == final_sum(gang, 1, 2)


def test_a_lost_store_does_not_stop_a_view_that_trains(gang) -> None:
    """Rank 0 looks in the store for joiners (on a thread of its own): a store that is gone, which its client waits
    for up to a minute, never holds a step up; it is said at most once and the view trains on."""
    gang.publish(1, 2, fewest=1)
    procs = [start(gang, seat, 1, 2, steps=40) for seat in range(2)]
    gang.saw(0, 1, "step 5 seat 0", timeout=60)
    gang.store.close()
    for proc in procs:
        assert gang.wait(proc) == 0, gang.logs()
    lines = steps(gang, 0, 1)
    assert [line["step"] for line in lines] == list(range(1, 41)), gang.logs()
    gaps = [b["time"] - a["time"] for a, b in zip(lines[5:], lines[6:])]
    assert max(gaps) < 1.0, gaps  # 0.1 s steps: nothing waited for the store
    assert gang.text(0, 1).count("the job's rendezvous store cannot be read (") <= 1, gang.logs()
    assert "Traceback" not in gang.logs()


def test_a_scale_down_moves_the_others_at_a_step_boundary_and_the_seat_past_it_leaves(gang) -> None:
    gang.publish(1, 3, fewest=1)
    procs = [start(gang, seat, 1, 3, steps=40) for seat in range(3)]
    gang.saw(0, 1, "step 5 seat 0", timeout=60)
    gang.publish(2, 2, fewest=1)  # what the survivors' agents publish on the operator's word (kubectl scale)
    assert gang.wait(procs[2]) == 0, gang.logs()
    assert "rank 2 (seat 2) has no place in view 2:" in gang.text(2, 1)
    for seat in (0, 1):
        assert gang.wait(procs[seat]) == 0, gang.logs()
        lines = steps(gang, seat, 1)
        assert [line["step"] for line in lines] == list(range(1, 41)) and {line["pid"] for line in lines} == \
            {procs[seat].pid}, gang.logs()
        assert {(line["generation"], line["size"]) for line in lines[-5:]} == {(2, 2)}, gang.logs()
    assert final_sum(gang, 0, 1) == final_sum(gang, 1, 1)
    progress = json.loads((job_dir(gang.ckpt) / "progress.json").read_text())
    assert (progress["world_size"], progress["desired_world_size"], progress["missing_ranks"]) == (2, 2, []), progress


def test_a_store_recreated_empty_gets_the_view_again_and_a_later_loss_shrinks_through_it(tmp_path) -> None:
    """The store is SIGKILLed and started anew on its port (as the operator recreates it under its Service): the
    trainers reconnect, publish their view there again, train on; a rank lost later is shrunk away through the new
    store, every survivor keeping its process. The launchers publish their generation and its node range again only
    at their own next store call (rarely, in process: a seeded chaos run found survivors that could not recover,
    "generation 0 has no node range in the store"), so the trainers publish those again too."""
    gang = Gang(tmp_path, "recreated", [], store=StoreProcess())
    try:
        gang.publish(1, 3, fewest=1)
        # The loss comes 10 s after the store's: the new store (a Python process of its own) is up by then.
        procs = {seat: start(gang, seat, 1, 3, steps=90, step_s=0.15, die_at=70 if seat == 2 else 0)
                 for seat in range(3)}
        gang.saw(0, 1, "step 5 seat 0", timeout=60)
        gang.store.kill()
        gang.store.start()
        gang.connect()  # the test's own client; no launcher publishes anything again
        assert gang.wait(procs.pop(2)) == -signal.SIGKILL, gang.logs()
        for seat, proc in procs.items():
            assert gang.wait(proc) == 0, gang.logs()
            lines = steps(gang, seat, 1)
            assert [line["step"] for line in lines] == list(range(1, 91)), gang.logs()
            assert {(line["generation"], line["size"]) for line in lines if line["step"] > 70} == {(1, 2)}, gang.logs()
        assert "reconnected after" in gang.text(0, 1) and "recovered in process" in gang.text(1, 1), gang.logs()
        assert final_sum(gang, 0, 1) == final_sum(gang, 1, 1)
    finally:
        gang.close()
