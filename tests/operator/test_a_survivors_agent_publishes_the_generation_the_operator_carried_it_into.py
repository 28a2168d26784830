"""Issue 36, "Scale in place", the agent's part: an in-place scale down starts no pod whose agent would publish the
smaller generation, so a survivor's agent asks the operator (the progress endpoint's `generation` route) for the
generation its pod was carried into and publishes it in the job's store, where its trainers look at every step
boundary. A real launcher (torchrun, one process that keeps running), a real rendezvous store, a real HTTP route.
Hostile answers (another job's rendezvous id, a bool, a bad node range, not an object) are never published."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from ddpjob_operator.agent import contract, worker

from .test_launcher import SLEEP_UNTIL_SIGTERM, AssignmentRoute, Launched, rendezvous_store  # noqa: F401


UID = "9f3c-job-uid"
HOSTILE = [
    {"generation": 1, "nnodes": "1:2", "rdzvId": "another-job-g1"},
    {"generation": True, "nnodes": "1:2", "rdzvId": f"{UID}-gTrue"},
    {"generation": 1.0, "nnodes": "1:2", "rdzvId": f"{UID}-g1.0"},
    {"generation": -1, "nnodes": "1:2", "rdzvId": f"{UID}-g-1"},
    {"generation": 1, "nnodes": "1:2; rm -rf /", "rdzvId": f"{UID}-g1"},
    {"generation": 1, "nnodes": "0:2", "rdzvId": f"{UID}-g1"},
    {"generation": 1, "nnodes": 2, "rdzvId": f"{UID}-g1"},
    {"generation": 1, "nnodes": "1:2"},
    [1, "1:2"],
    "1",
    None,
]


@pytest.mark.parametrize("given", HOSTILE, ids=[json.dumps(h) for h in HOSTILE])
def test_an_answer_that_is_not_this_jobs_generation_is_refused_naming_what_was_expected(given):
    with pytest.raises(ValueError, match=r"not \{generation, nnodes MIN:MAX, rdzvId 9f3c-job-uid-g<generation>\}"):
        worker.checked_generation(given, UID)


def test_this_jobs_generation_is_taken():
    assert worker.checked_generation({"generation": 7, "nnodes": "1:1024", "rdzvId": f"{UID}-g7"}, UID) == (7, "1:1024")


def wait_until(condition, what: str, launched: Launched, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert launched.proc.poll() is None, f"the launcher ended before {what}"
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {what}"
        time.sleep(0.05)


@pytest.mark.slow  # a torchrun agent (a few seconds)
def test_a_survivors_agent_publishes_the_generation_the_operator_carried_it_into(tmp_path, rendezvous_store):
    route = AssignmentRoute()
    route.answer_with(204)  # nothing to tell yet
    token = tmp_path / "token"
    token.write_text("the-pods-token\n")
    rendezvous = ("--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous_store}", f"--rdzv-id={UID}-g0",
                  "--nnodes=1:3")
    launched = Launched(tmp_path, SLEEP_UNTIL_SIGTERM, rendezvous=rendezvous, **{
        contract.INPROCESS_ENV: "1", contract.REJOIN_ENV: "1", contract.PROGRESS_URL_ENV: route.progress_url,
        contract.PROGRESS_TOKEN_ENV: str(token)})
    host, _, port = rendezvous_store.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    newest = contract.GENERATION_KEY.format(uid=UID)
    try:
        launched.wait_for_line("ready")
        assert store.get(newest) == b"0"  # its own generation, published when it started
        served = route.answer_with(200, json.dumps(HOSTILE[0]).encode())
        route.wait_for(served + 2, launched)  # twice: said once
        assert store.get(newest) == b"0"
        route.answer_with(200, json.dumps({"generation": 2, "nnodes": "1:2", "rdzvId": f"{UID}-g2"}).encode())
        wait_until(lambda: store.get(newest) == b"2", "generation 2 published", launched)
        assert store.get(contract.NNODES_KEY.format(uid=UID, generation=2)) == b"1:2"
        served = route.answer_with(204)
        route.wait_for(served + 1, launched)
        assert launched.proc.poll() is None  # nobody was stopped: its trainer runs on
        launched.proc.terminate()
        code, out = launched.wait()
    finally:
        launched.proc.kill()
        route.close()
    assert code == 143, out
    assert set(route.paths) == {"/v1/namespaces/team-a/ddpjobs/j/generation"}
    assert set(route.tokens) == {"Bearer the-pods-token"}
    complaints = [line for line in out.splitlines() if "cannot follow the operator's rendezvous generation" in line]
    assert len(complaints) == 1 and "another-job-g1" in complaints[0], out  # said once while the answers are bad
    assert out.count("published in the job's store") == 1, out
    assert "following the operator's rendezvous generation again" in out


@pytest.mark.slow  # a torchrun agent (a few seconds)
def test_a_departing_pods_agent_exits_0_when_the_newest_generation_has_no_seat_for_it(tmp_path, rendezvous_store):
    """Scaled down 3 -> 2: the trainers of worker 2 leave the smaller generation with the runtime's stop code (143,
    as after a peer's stop); its agent, seeing that the newest generation (1:2) has no seat for replica index 2,
    exits 0 instead of waiting to rejoin, so the operator removes the pod at once."""
    host, _, port = rendezvous_store.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    store.set(contract.NNODES_KEY.format(uid=UID, generation=1), "1:2")
    store.set(contract.GENERATION_KEY.format(uid=UID), "1")
    rendezvous = ("--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous_store}", f"--rdzv-id={UID}-g0",
                  "--nnodes=1:3")
    launched = Launched(tmp_path, "import sys\nsys.exit(143)\n", rendezvous=rendezvous, **{
        contract.INPROCESS_ENV: "1", contract.REJOIN_ENV: "1", "DDPJOB_REPLICA_INDEX": "2"})
    code, out = launched.wait()
    assert code == 0, out
    assert launched.message() == "no place in rendezvous generation 1 (1:2 nodes) for replica index 2: scaled down, " \
                                 "leaving [generation 1]"
