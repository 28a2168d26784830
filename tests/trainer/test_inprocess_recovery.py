"""In-process recovery (issue 29, DDPJOB_INPROCESS=1): real trainer processes, real Gloo, the job's real
TCPStore. Each trainer is started as the launcher starts one for a generation (the seat and generation in its
environment, the generation published in the store); a rank is killed; the survivors keep their processes
and state, and the replacement gets the state by broadcast from a survivor, not from the volume."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from ddp_trainer.runtime import CheckpointManager
from ddpjob_operator.agent import command as agent_command
from inprocess_gang import UID, Gang
from trainer_harness import job_dir, PY, descendants, kill_tree, steps_dir, wait_for

pytestmark = pytest.mark.slow

STEPS = 30
# No dropout in the digits MLP: every rank's arithmetic is deterministic. DDP sums the gradients in its bucket
# layout, which it rebuilds once, in the first step after it is built (the order gradients became ready): the
# survivors' new wrapper reduces its first step in the construction layout, and three ranks' float sums in
# another order differ in the last bit (1e-8 seen). find_unused_parameters keeps the construction layout
# throughout (DDP never rebuilds then), in both runs, so the recovered run is bit-identical.
ARGS = ["--workload", "digits", "--batch-size", "16", "--max-steps", str(STEPS), "--checkpoint-every", "10",
        "--log-every", "5", "--epochs", "5", "--ddp-find-unused-parameters"]
KILL_AT = 12  # after this optimizer step (the fault injection: after the step, before any checkpoint of it)


@pytest.fixture
def gangs(tmp_path: Path):
    made: list[Gang] = []
    yield lambda name: made.append(Gang(tmp_path, name, ARGS)) or made[-1]
    for gang in made:
        gang.close()


def fault(rank: int) -> list[str]:
    """Global rank `rank` crashes (SIGSEGV) right after optimizer step KILL_AT of generation 1."""
    return ["--fault-at-step", str(KILL_AT), "--fault-rank", str(rank), "--fault-exit-code", "139",
            "--fault-generation", "1"]


def final_state(gang: Gang) -> dict:
    return torch.load(steps_dir(gang.ckpt) / f"step-{STEPS:08d}.pt", map_location="cpu", weights_only=True)


def assert_survivors_recovered_and_fed_the_replacement(gang, survivors: dict, replacement, step: int) -> None:
    """Generation 1's survivors finished in process; worker 0's replacement (generation 2) got step `step` from
    rank 1 by broadcast."""
    for replica, proc in survivors.items():
        assert gang.wait(proc) == 0, gang.logs()
        assert "recovered in process: generation 1 -> 2" in gang.text(replica, 1)
    assert gang.wait(replacement) == 0, gang.logs()
    assert f"resumed from peer rank 1 by broadcast step={step}" in gang.text(0, 2)


def assert_bit_identical(got: dict, want: dict) -> None:
    for part in ("model", "optimizer"):
        flat_got, flat_want = _tensors(got[part]), _tensors(want[part])
        assert flat_got.keys() == flat_want.keys(), part
        different = [k for k in flat_want if not torch.equal(flat_got[k], flat_want[k])]
        assert not different, f"{part}: {different[:5]} differ from the undisturbed run's at step {STEPS}"
    assert got["progress"] == want["progress"]


def _tensors(obj, key: str = "") -> dict[str, torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return {key: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {k: t for name, v in items for k, t in _tensors(v, f"{key}/{name}").items()}


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> dict:
    """The model and optimizer at step STEPS of three ranks that nothing disturbed (once per module)."""
    gang = Gang(tmp_path_factory.mktemp("undisturbed"), "undisturbed", ARGS)
    try:
        gang.publish(1, 3)
        for proc in [gang.start(replica, 1, 3) for replica in range(3)]:
            assert gang.wait(proc) == 0, gang.logs()
        return final_state(gang)
    finally:
        gang.close()


def assert_recovery_reported(gang: Gang, path: str, generation: int, reason: str = "") -> None:
    """Rank 0's last report (progress.json) carries its generation's recovery timeline (recovery_contract)."""
    progress = json.loads((job_dir(gang.ckpt) / "progress.json").read_text())
    recovery = progress.get("recovery") or {}
    assert progress["generation"] == generation and progress["step"] == STEPS, progress
    assert (recovery.get("path"), recovery.get("reason"), recovery.get("resumed_step")) == (path, reason, KILL_AT), \
        progress
    assert time.time() - 120 < recovery["rendezvous_time"] <= recovery["first_step_time"] <= progress["time"], progress


def corrupt_checkpoints(gang: Gang) -> None:
    """Every checkpoint on the volume unusable (same size, other bytes): a trainer that reads one finds none."""
    for path in steps_dir(gang.ckpt).glob("step-*.pt"):
        path.write_bytes(bytes(path.stat().st_size))


def test_killed_rank_0_survivors_keep_their_processes_and_the_replacement_gets_the_state_by_broadcast(
        gangs, undisturbed) -> None:
    """The survivors' rescue write is held until they are in generation 2 (inprocess_slow_rescue.py): they join
    it without waiting for that write, and the rescue of the step generation 2 resumes from is committed in
    generation 2, not withdrawn by the fence the replacement's rank 0 raised while it was being written."""
    gang = gangs("killed")
    gang.publish(1, 3)
    keep = ["--checkpoint-keep", "5"]  # the rescue of step 12 is still there at the end
    held = [PY, str(Path(__file__).with_name("inprocess_slow_rescue.py")), *ARGS, *keep]
    survivors = {replica: gang.start(replica, 1, 3, command=[*held, *fault(0)]) for replica in range(3)}
    assert gang.wait(survivors.pop(0)) == -signal.SIGSEGV  # a crash in native code
    for replica in survivors:
        gang.saw(replica, 1, f"at step {KILL_AT}: a peer failed in generation 1")
    corrupt_checkpoints(gang)  # the replacement must not need the volume
    gang.publish(2, 3)
    # Rank 0 of generation 2 a straggler: its step 20 checkpoint comes well after the rescue (a later step
    # committed first would make the rescue of step 12 pointless: not committed).
    replacement = gang.start(0, 2, 3, [*keep, "--fault-slow-rank", "0", "--fault-slow-factor", "10",
                                       "--fault-generation", "2"])

    assert_survivors_recovered_and_fed_the_replacement(gang, survivors, replacement, KILL_AT)
    assert "resumed from checkpoint" not in gang.text(0, 2) and "skipping unreadable" not in gang.text(0, 2)
    assert_bit_identical(final_state(gang), undisturbed)
    assert_recovery_reported(gang, "InProcess", 2)  # rank 0 is the replacement: its state came from a peer
    # One survivor wrote the rescue after it had joined generation 2, and committed it there.
    saved = f"rescue checkpoint: rank %d saved step {KILL_AT} after a peer failed (committed in generation 2)"
    writers = [r for r in survivors if saved % r in gang.text(r, 1)]
    assert len(writers) == 1, gang.logs()
    text = gang.text(writers[0], 1)
    assert text.index("rescue write released in generation 2") < text.index(saved % writers[0])
    assert "withdrawn" not in gang.logs() and "not written" not in gang.logs()
    marker = json.loads((steps_dir(gang.ckpt) / f"step-{KILL_AT:08d}.committed").read_text())
    assert marker["generation"] == 2, marker
    rescued = CheckpointManager(gang.ckpt, is_writer=False, job_name="test", namespace="local").load(KILL_AT)  # verified against it
    assert rescued["progress"]["step"] == KILL_AT and rescued["ddpjob"]["generation"] == 1


def test_a_second_failure_during_the_hand_over_moves_everyone_to_the_next_generation(gangs, undisturbed) -> None:
    gang = gangs("twice")
    gang.publish(1, 3)
    survivors = {replica: gang.start(replica, 1, 3, fault(0)) for replica in range(3)}
    assert gang.wait(survivors.pop(0)) == -signal.SIGSEGV
    for replica in survivors:
        gang.saw(replica, 1, f"at step {KILL_AT}: a peer failed in generation 1")
    kill_tree(survivors.pop(2), signal.SIGKILL)  # the second failure: a survivor, while it waits (3:3: no rank
    gang.publish(2, 3)  # may be missing) for the first incident's replacement...
    first = gang.start(0, 2, 3)
    waiting = [f"ddpjob/{UID}/inprocess/g1/r0/left/1", f"ddpjob/{UID}/inprocess/g2/arrived/0"]
    wait_for(lambda: gang.client.check(waiting), "rank 1 left generation 1, rank 0 arrived in generation 2", 60,
             explain=gang.logs)
    gang.publish(3, 3)  # ...and the second's, whose generation the first replacement moves to
    second = gang.start(2, 3, 3)

    for proc in (survivors[1], first, second):
        assert gang.wait(proc) == 0, gang.logs()
    assert "recovered in process: generation 1 -> 3, rank 1 of 3, state kept" in gang.text(1, 1)
    for replica, generation in ((0, 2), (2, 3)):
        assert f"resumed from peer rank 1 by broadcast step={KILL_AT}" in gang.text(replica, generation)
    assert_bit_identical(final_state(gang), undisturbed)


def test_the_rescue_of_a_periodic_step_is_left_to_the_writer_when_it_lives_on(gangs, undisturbed) -> None:
    """Rank 2 dies right after step 10, a periodic checkpoint's step: rank 0, the writer, may be writing that
    step's file when rank 1 starts its rescue of it. Rank 1 waits until it knows rank 0 is in the next generation,
    then leaves the step to it: one copy of the step, which rank 0's own rescue commits."""
    gang = gangs("periodic")
    gang.publish(1, 3)
    keep = ["--checkpoint-keep", "5"]  # step 10 still there at the end
    at_10 = ["--fault-at-step", "10", "--fault-rank", "2", "--fault-exit-code", "139", "--fault-generation", "1"]
    survivors = {replica: gang.start(replica, 1, 3, [*keep, *at_10]) for replica in range(3)}
    assert gang.wait(survivors.pop(2)) == -signal.SIGSEGV
    for replica in survivors:
        gang.saw(replica, 1, "at step 10: a peer failed in generation 1")
    gang.publish(2, 3)
    replacement = gang.start(2, 2, 3, keep)
    for proc in (*survivors.values(), replacement):
        assert gang.wait(proc) == 0, gang.logs()
    assert "rescue checkpoint: rank 0 saved step 10 after a peer failed" in gang.text(0, 1), gang.logs()
    assert "rescue checkpoint: rank 1 saved" not in gang.text(1, 1), gang.logs()
    rescued = CheckpointManager(gang.ckpt, is_writer=False, job_name="test", namespace="local").load(10)  # verified against its marker
    assert rescued["ddpjob"]["rescued_by_rank"] == 0 and rescued["progress"]["step"] == 10
    assert_bit_identical(final_state(gang), undisturbed)


def test_a_scale_down_while_the_survivors_wait_is_taken_in_place(gangs) -> None:
    """Rank 2 dies; its survivors wait (3:3: no rank may be missing) until generation 2 scales the job down to two
    nodes: they form it among themselves and train on in process, at the new world size (no volume read, no
    process restarted; until then the old exit path restarted them from the rescue checkpoint)."""
    gang = gangs("resized")
    gang.publish(1, 3)
    survivors = {replica: gang.start(replica, 1, 3, fault(2)) for replica in range(3)}
    assert gang.wait(survivors.pop(2)) == -signal.SIGSEGV
    for replica in survivors:
        gang.saw(replica, 1, "below minReplicas: 2 of 3 ranks, waiting for 1 more")
    gang.publish(2, 2)  # a scale-down to two nodes instead of a replacement
    for replica, proc in survivors.items():
        assert gang.wait(proc) == 0, gang.logs()
        assert f"recovered in process: generation 1 -> 2, rank {replica} of 2, state kept" in gang.text(replica, 1)
    assert "resumed from checkpoint" not in gang.logs()
    progress = json.loads((job_dir(gang.ckpt) / "progress.json").read_text())
    assert (progress["generation"], progress["step"], progress["world_size"]) == (2, STEPS, 2), progress
    assert (progress["desired_world_size"], progress["missing_ranks"]) == (2, []), progress


def test_a_group_that_cannot_be_left_falls_back_to_the_exit_path_and_says_why(gangs) -> None:
    gang = gangs("wedged")
    gang.publish(1, 2)
    script = str(Path(__file__).with_name("inprocess_frozen_peer.py"))
    procs = [gang.start(replica, 1, 2, command=[PY, script]) for replica in range(2)]
    gang.saw(1, 1, "rank 1 freezing")
    started = time.monotonic()
    assert gang.wait(procs[0], 30) == 3, gang.logs()
    assert time.monotonic() - started < 20  # not the group's 60 s: the bounded leave, then the exit at once
    text = gang.text(0, 1)
    assert "in-process recovery not possible: the process group of generation 1 could not be left within 2 s" in text


def test_a_failure_after_the_last_step_is_recovered_in_process_too(gangs, undisturbed) -> None:
    """Rank 0 crashes in the work after step 30, before the final evaluation: the survivors' evaluation fails,
    they recover in process, and every rank of the next generation (the replacement's state from a peer)
    evaluates, saves the final checkpoint and writes result.json. In the evaluation's all_reduce one survivor
    waits on the other, not on the dead rank, under the long collective timeout (1800 s): it fails as soon as
    the other leaves the group (which closes its connections), not at that timeout."""
    gang = gangs("after")
    gang.publish(1, 3)
    crash = ["--fault-after-training", "--fault-rank", "0", "--fault-exit-code", "139", "--fault-generation", "1"]
    survivors = {replica: gang.start(replica, 1, 3, crash) for replica in range(3)}
    assert gang.wait(survivors.pop(0)) == -signal.SIGSEGV
    for replica in survivors:
        gang.saw(replica, 1, f"at step {STEPS}: a peer failed in generation 1", timeout=20)
    gang.publish(2, 3)
    replacement = gang.start(0, 2, 3)
    assert_survivors_recovered_and_fed_the_replacement(gang, survivors, replacement, STEPS)
    assert_bit_identical(final_state(gang), undisturbed)
    result = json.loads((job_dir(gang.ckpt) / "result.json").read_text())
    assert (result["status"], result["step"], result["world_size"]) == ("completed", STEPS, 3)
    progress = json.loads((job_dir(gang.ckpt) / "progress.json").read_text())
    assert progress["generation"] == 2 and progress["recovery"]["path"] == "InProcess"
    assert progress["recovery"]["resumed_step"] == STEPS and progress["recovery"]["first_step_time"] is None


@pytest.mark.parametrize("replacement_kind", ["worker", "spare"])
def test_the_pods_agents_leave_survivors_training_and_start_a_replacement_that_joins_them(
        gangs, tmp_path, replacement_kind: str) -> None:
    """The worker agent (agent_command("worker"), the pod's command) with DDPJOB_INPROCESS=1: each pod's torchrun only
    starts and watches its own trainer; the survivors' trainers keep their PIDs through the incident, and the
    replacement's agent (a new worker's) publishes generation 2 and starts a trainer that joins them and gets the
    state by broadcast. A warm spare's trainer runs before the incident (its model built, waiting for its place)
    and is the one that takes the place: a rendezvous and a broadcast, no checkpoint read."""
    gang = gangs("agents")

    def agent(replica: int, generation: int, args: list[str] = ()) -> subprocess.Popen:
        flags = ["--nnodes=3:3", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={gang.store.endpoint}",
                 f"--rdzv-id={UID}-g{generation}", "--rdzv-conf=is_host=false,join_timeout=60,last_call_timeout=1",
                 "--local-addr=127.0.0.1", "--max-restarts=0", "--monitor-interval=0.2"]
        command = [*agent_command("worker", python=PY), *flags, "-m", "ddp_trainer", *ARGS, *args]
        proc = gang.start(replica, generation, 3, command=command)
        return proc

    # The launcher's own environment (the operator's for a pod): it publishes the generation itself.
    worker_env = {"DDPJOB_REJOIN": "1", "DDPJOB_TERMINATION_LOG": str(tmp_path / "termination-log")}
    if replacement_kind == "spare":  # warm before the workers start, so before the incident
        assignment = tmp_path / "assignment.json"
        gang.extra_env.update(worker_env, DDPJOB_SPARE="1", DDPJOB_ASSIGNMENT_FILE=str(assignment),
                              DDPJOB_SPARE_READY_FILE=str(tmp_path / "spare.ready"))
        spare = agent(-1, 1)
        wait_for((tmp_path / "spare.ready").exists, "the spare ready", 60, explain=gang.logs)
        assert "spare: trainer ready, waiting for its place" in gang.text(-1, 1)  # Ready: its model is built
        spare_trainer = descendants(spare.pid)
        assert spare_trainer, gang.logs()
    gang.extra_env = dict(worker_env)
    agents = {replica: agent(replica, 1, fault(0)) for replica in range(3)}
    trainers = {replica: wait_for(lambda: descendants(agents[replica].pid), f"worker {replica}'s trainer", 60,
                                  explain=gang.logs) for replica in (1, 2)}
    assert gang.wait(agents.pop(0)) == 139, gang.logs()  # the crashed trainer's own code
    for replica in agents:
        gang.saw(replica, 1, f"at step {KILL_AT}: a peer failed in generation 1")
    if replacement_kind == "spare":  # what the local runner writes for a promoted spare (by rename)
        wait_for(lambda: (steps_dir(gang.ckpt) / f"step-{KILL_AT:08d}.committed").exists(), "the rescue checkpoint",
                 30, explain=gang.logs)
        corrupt_checkpoints(gang)  # the spare must not need the volume
        (tmp_path / "assignment.tmp").write_text(json.dumps({"index": 0, "generation": 2, "rdzvId": f"{UID}-g2",
                                                             "nnodes": "3:3"}))
        (tmp_path / "assignment.tmp").rename(assignment)
        replacement, log = spare, (-1, 1)
    else:
        replacement, log = agent(0, 2), (0, 2)
    for replica, proc in agents.items():
        gang.saw(replica, 1, "recovered in process: generation 1 -> 2")
        assert descendants(proc.pid) == trainers[replica]  # the same trainer process trains on
    if replacement_kind == "spare":
        gang.saw(-1, 1, "spare: took the place of rank 0 of 3 in generation 2")
        assert descendants(spare.pid) == spare_trainer  # started before the kill, trains on as rank 0
    for proc in (*agents.values(), replacement):
        assert gang.wait(proc) == 0, gang.logs()
    assert f"resumed from peer rank 1 by broadcast step={KILL_AT}" in gang.text(*log)
    assert "resumed from checkpoint" not in gang.text(*log) and "skipping unreadable" not in gang.text(*log)
    assert_recovery_reported(gang, "InProcess", 2)
    assert "joining rendezvous generation" not in gang.text(1, 1) + gang.text(2, 1)  # no torchrun run again


def test_a_silent_peer_ends_the_collective_at_the_steady_timeout_and_the_survivors_recover_in_process(
        gangs, undisturbed) -> None:
    """A frozen rank (SIGSTOP: sockets open, nothing resets them) fails the survivors' collective after
    --dist-steady-timeout; they take the in-process path as for a crash, and the replacement (the operator
    deletes the frozen pod) gets the state by broadcast."""
    gang = gangs("silent")
    gang.publish(1, 3)
    hang = ["--dist-steady-timeout", "3", "--fault-hang-at-step", str(KILL_AT), "--fault-rank", "2",
            "--fault-generation", "1"]
    trainers = {replica: gang.start(replica, 1, 3, hang) for replica in range(3)}
    gang.saw(2, 1, f"rank 2 at step {KILL_AT}: hanging (SIGSTOP)")
    for replica in (0, 1):
        gang.saw(replica, 1, f"at step {KILL_AT}: a peer failed in generation 1")
    kill_tree(trainers.pop(2), signal.SIGKILL)
    gang.publish(2, 3)
    replacement = gang.start(2, 2, 3, ["--dist-steady-timeout", "3"])
    for replica, proc in trainers.items():
        assert gang.wait(proc) == 0, gang.logs()
        assert "recovered in process: generation 1 -> 2" in gang.text(replica, 1)
    assert gang.wait(replacement) == 0, gang.logs()
    assert f"resumed from peer rank 0 by broadcast step={KILL_AT}" in gang.text(2, 2)
    assert_bit_identical(final_state(gang), undisturbed)
    assert_recovery_reported(gang, "InProcess", 2)  # rank 0 survived in process
