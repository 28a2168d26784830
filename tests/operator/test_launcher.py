"""The worker launcher for real: the agent (agent.command("worker")) running torchrun (--standalone, one Gloo/CPU
process) around tiny scripts, then the decision layer on what it reported."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ddpjob_operator import decisions, launch, model
from ddpjob_operator import agent
from ddpjob_operator.agent import contract
from ddpjob_operator.local.pods import free_port

pytestmark = pytest.mark.slow  # a torchrun agent per test (a few seconds)

RECORDED_ERROR = """
from torch.distributed.elastic.multiprocessing.errors import record
@record
def main():
    raise ValueError("learning rate must be positive")
main()
"""
SLEEP_UNTIL_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
print("ready", flush=True)
time.sleep(120)
"""


STANDALONE = ("--standalone",)


class Launched:
    def __init__(self, tmp_path: Path, body: str, *, rendezvous: tuple[str, ...] = STANDALONE, **env: str):
        script = tmp_path / "entry.py"
        script.write_text(body)
        self.termination_log = tmp_path / "termination-log"
        argv = [*agent.command("worker", python=sys.executable), *rendezvous, "--nnodes=1",
                "--nproc-per-node=1", "--shutdown-timeout=5", str(script)]
        env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
               contract.TERMINATION_LOG_ENV: str(self.termination_log), **env}
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait_for_line(self, text: str) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        while text not in self.proc.stdout.readline():
            assert time.monotonic() < deadline and self.proc.poll() is None, f"never printed {text!r}"

    def wait(self) -> tuple[int, str]:
        try:
            out, _ = self.proc.communicate(timeout=120)
        finally:
            self.proc.kill()
        return self.proc.returncode, out

    def message(self) -> str:
        return self.termination_log.read_text()


CLOSED = f" {contract.RENDEZVOUS_CLOSED_MARK}"  # torch's launch_agent closes the rendezvous on a failed agent


@pytest.mark.parametrize("body, code, message", [
    ("import sys\nsys.exit(3)\n", 3, "rank 0 (local rank 0) exited with code 3" + CLOSED),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 137,
     "rank 0 (local rank 0) exited with code 137: killed by SIGKILL" + CLOSED),
    (RECORDED_ERROR, 1,
     "rank 0 (local rank 0) exited with code 1: ValueError: learning rate must be positive" + CLOSED),
])
def test_launcher_exits_with_the_trainers_code_and_writes_the_termination_message(tmp_path, body, code, message):
    launched = Launched(tmp_path, body)
    got, out = launched.wait()
    assert got == code, out
    assert launched.message() == message
    assert "Root Cause (first observed failure)" in out, "torchrun's failure summary still reaches the log"


@pytest.mark.parametrize("fork, preloaded", [("1", True), ("0", False)], ids=["forked", "new-interpreter"])
def test_the_trainer_is_forked_from_the_agent_with_torch_already_imported(tmp_path, fork, preloaded):
    body = "import sys\nprint('torch preloaded:', 'torch' in sys.modules, flush=True)\nsys.exit(5)\n"
    code, out = Launched(tmp_path, body, **{contract.FORK_TRAINER_ENV: fork}).wait()
    assert code == 5 and f"torch preloaded: {preloaded}" in out, out


@pytest.mark.parametrize("exit_code", [0, 3])
def test_os_exit_in_a_forked_trainer_ends_it_with_that_code(tmp_path, exit_code):
    """torchrun waits for a forked trainer's return value: os._exit must not skip handing it over."""
    launched = Launched(tmp_path, f"import os\nos._exit({exit_code})\n")
    code, out = launched.wait()
    assert code == exit_code, out


EXITS_INSIDE_A_CLEANUP = """
import os
try:
    os._exit(3)  # how the trainer's fault injection fails: nothing cleaned up
finally:
    print("cleanup ran", flush=True)
"""


def test_a_failing_os_exit_in_the_forked_trainer_runs_no_cleanup(tmp_path):
    """Cleanup on the way out of a failed trainer can block on its peers (a collective, a join)."""
    code, out = Launched(tmp_path, EXITS_INSIDE_A_CLEANUP, **{contract.FORK_TRAINER_ENV: "1"}).wait()
    assert code == 3 and "cleanup ran" not in out, out


FORKS_LIKE_A_DATALOADER = """
import os
class Frame:
    def __del__(self):
        print("the trainer's frames unwound in", "its child" if os.getpid() != trainer else "the trainer", flush=True)
def train():
    frame = Frame()
    child = os.fork()
    if child == 0:
        os._exit(7)  # how a DataLoader worker (multiprocessing) ends
    print("child exit", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
trainer = os.getpid()
train()
"""


def test_a_process_the_forked_trainer_forks_ends_with_the_real_os_exit(tmp_path):
    """Not the trainer's exit: a SystemExit in a DataLoader worker would unwind the trainer's frames it
    was forked inside, and freeing its copy of the process group there aborts it (std::system_error)."""
    code, out = Launched(tmp_path, FORKS_LIKE_A_DATALOADER, **{contract.FORK_TRAINER_ENV: "1"}).wait()
    assert code == 0 and "child exit 7" in out, out
    assert "unwound in its child" not in out, out


def test_sigterm_to_the_launcher_stops_the_trainer_and_exits_143(tmp_path):
    launched = Launched(tmp_path, SLEEP_UNTIL_SIGTERM)
    launched.wait_for_line("ready")
    launched.proc.send_signal(signal.SIGTERM)
    got, out = launched.wait()
    assert got == 143, out
    assert launched.message() == "torchrun stopped by SIGTERM; exit code 143"  # a signal leaves it open


@pytest.fixture
def rendezvous_store():
    """The job's rendezvous store (the survivors' channel to the next generation): its endpoint."""
    port = free_port()
    store = subprocess.Popen(launch.store_command(port, python=sys.executable, agent_dir=agent.DIRECTORY), env={"PATH": "/usr/bin:/bin"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield f"127.0.0.1:{port}"
    store.terminate()
    store.wait(timeout=30)


# A rank whose pod got no signal, after its peers agreed to stop because another pod's did: it saved the
# final checkpoint with them and exits as they do (the runtime's StopRequest.exit_code).
STOPS_WITH_ITS_PEERS = "import sys\nsys.exit(143)\n"


@pytest.mark.parametrize("signalled", [False, True], ids=["a-peer-was-stopped", "this-pod-was-stopped"])
def test_an_agreed_stop_keeps_the_pod_in_place_unless_its_own_agent_was_signalled(tmp_path, rendezvous_store,
                                                                                signalled):
    """restartScope Pod: a trainer that exits 143 although its agent got no signal stopped for a peer's
    pod (deleted, evicted): the launcher keeps the pod and waits for the next generation, as after a
    peer's failure. The pod's own SIGTERM still ends it with 143, whether it came during the generation
    or while it waits."""
    rendezvous = ("--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous_store}", "--rdzv-id=job-g0",
                  "--rdzv-conf=is_host=false,join_timeout=30")
    launched = Launched(tmp_path, SLEEP_UNTIL_SIGTERM if signalled else STOPS_WITH_ITS_PEERS,
                        rendezvous=rendezvous, **{contract.REJOIN_ENV: "1"})
    if signalled:
        launched.wait_for_line("ready")
        launched.proc.send_signal(signal.SIGTERM)
        got, out = launched.wait()
        assert (got, launched.message()) == (143, "torchrun stopped by SIGTERM; exit code 143 [generation 0]"), out
        return
    launched.wait_for_line("waiting up to 120 s for rendezvous generation 1 or newer: rank 0 (local rank 0) "
                           "exited with code 143: it stopped with its peers")
    assert launched.proc.poll() is None and not launched.termination_log.exists()
    launched.proc.send_signal(signal.SIGTERM)  # its pod is deleted while it waits
    got, out = launched.wait()
    assert got == 143, out
    assert launched.message() == "stopped by SIGTERM between rendezvous generations; exit code 143 [generation 0]"


def test_unwritable_termination_log_is_skipped(tmp_path):
    launched = Launched(tmp_path, "import sys\nsys.exit(4)\n")
    launched.termination_log.mkdir()  # a directory cannot be opened for writing
    got, out = launched.wait()
    assert got == 4, out


@pytest.mark.parametrize("retryable, phase, reason", [
    ([], "Failed", decisions.REASON_PERMANENT_ERROR),
    ([3], "Restarting", decisions.REASON_REPLACE),
])
def test_the_real_exit_code_reaches_the_exit_code_rules(tmp_path, retryable, phase, reason):
    launched = Launched(tmp_path, "import sys\nsys.exit(3)\n")
    code, out = launched.wait()
    now = datetime(2026, 11, 22, tzinfo=timezone.utc)
    spec = model.DDPJobSpec.model_validate({
        "replicas": 1, "image": "i", "entrypoint": "entry.py",
        "failurePolicy": {"retryableExitCodes": retryable, "backoff": {"initialSeconds": 0}}})
    status = model.DDPJobStatus.model_validate({"phase": "Running", "startTime": decisions.rfc3339(now)})
    job = decisions.JobView(name="j", namespace="ns", uid="u", metadata_generation=1, created_at=now,
                            spec=spec, status=status)
    worker = decisions.WorkerObservation(index=0, name="j-worker-0", generation=0, phase="Failed",
                                         exit_code=code, reason="Error", message=launched.message(),
                                         finished_at=now)
    decided = decisions.decide(job, decisions.Observed((worker,), decisions.StoreObservation("Running", True), now))
    assert decided.status.phase == phase, out
    condition = next(c for c in decided.status.conditions if c.type == phase)
    assert condition.reason == reason
    assert decided.status.ranks[0].last_exit_code == 3
    assert decided.status.ranks[0].last_message == "rank 0 (local rank 0) exited with code 3" + CLOSED
    told = [condition.message] + [a.message for a in decided.actions if isinstance(a, decisions.Event)]
    assert any("exit code 3, reason Error (rank 0 (local rank 0) exited with code 3" in m for m in told), told


def test_a_rendezvous_that_never_forms_is_reported_as_such_and_retried_in_a_new_generation(tmp_path):
    """2 nodes wanted, 1 comes: torchrun's join timeout is an infrastructure failure, not the user's."""
    port = free_port()
    store = subprocess.Popen(launch.store_command(port, python=sys.executable, agent_dir=agent.DIRECTORY), env={"PATH": "/usr/bin:/bin"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        script = tmp_path / "entry.py"
        script.write_text("print('never runs')\n")
        log = tmp_path / "termination-log"
        argv = [*agent.command("worker", python=sys.executable), "--nnodes=2", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=test-g0",
                "--rdzv-conf=is_host=false,join_timeout=3,read_timeout=10", str(script)]
        done = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                                         contract.TERMINATION_LOG_ENV: str(log)},
                              capture_output=True, text=True, timeout=120)
    finally:
        store.terminate()
        store.wait(timeout=30)
    message = log.read_text()
    assert done.returncode == 1, done.stderr
    assert message.startswith(f"{contract.RENDEZVOUS_FAILED_PREFIX}: RendezvousTimeoutError"), message
    assert decisions.classify_exit(1, "Error", False, model.FailurePolicy(), message) == decisions.RETRYABLE


# ---------------------------------------------------------------- a warm spare (failurePolicy.spares)

class AssignmentRoute:
    """The operator's assignment route as a spare's launcher reaches it: the test sets the answer, and
    waits on the requests it got (a launcher asks again only once it has handled the last answer)."""

    def __init__(self):
        self.answer: tuple[int, bytes] = (401, b"no valid token")
        self.paths: list[str] = []
        self.tokens: list[str | None] = []
        self.changed = threading.Condition()
        route = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                with route.changed:
                    status, body = route.answer
                    route.paths.append(self.path)
                    route.tokens.append(self.headers.get("Authorization"))
                    route.changed.notify_all()
                self.send_response(status)
                if status != 204:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if status != 204:
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.progress_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/namespaces/team-a/ddpjobs/j/progress"

    def answer_with(self, status: int, body: bytes = b"") -> int:
        """From now on; returns how many requests came before."""
        with self.changed:
            self.answer = (status, body)
            return len(self.paths)

    def wait_for(self, count: int, launched: Launched) -> None:
        deadline = time.monotonic() + 120  # the spare imports torch._dynamo first
        with self.changed:
            while len(self.paths) < count:
                assert launched.proc.poll() is None and time.monotonic() < deadline, f"{len(self.paths)} requests"
                self.changed.wait(timeout=1)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def assignment_route():
    route = AssignmentRoute()
    yield route
    route.close()


def test_a_spare_marks_itself_ready_only_once_the_operator_answers(tmp_path, assignment_route):
    """Issue 25: the readiness mark (its pod's readiness probe) is written once the spare is warm and its
    assignment request got a valid answer (204 nothing yet, or 200): never while the endpoint refuses it
    (here 401: a token it does not accept; as a NetworkPolicy or a CA it cannot verify would keep it from
    ever taking a place). Why it fails is logged at a bounded rate, not at every request. Given its place,
    it runs as that worker."""
    route = assignment_route
    token = tmp_path / "token"
    token.write_text("the-pods-token\n")
    mark = tmp_path / "spare" / "j-spare-0.ready"  # its directory is created (an emptyDir's would be there)
    launched = Launched(tmp_path, "import sys\nsys.exit(3)\n", **{
        contract.SPARE_ENV: "1", contract.PROGRESS_URL_ENV: route.progress_url,
        contract.PROGRESS_TOKEN_ENV: str(token), contract.SPARE_READY_FILE_ENV: str(mark)})
    try:
        route.wait_for(4, launched)  # the third 401 handled
        assert not mark.exists()
        before = route.answer_with(204)
        route.wait_for(before + 2, launched)  # a 204 handled: ready
        assert mark.exists()
        route.answer_with(200, json.dumps({"index": 0, "generation": 0, "rdzvId": "j-uid-g0",
                                           "nnodes": "1:1"}).encode())
        code, out = launched.wait()
    finally:
        launched.proc.kill()
    assert code == 3, out
    assert set(route.paths) == {"/v1/namespaces/team-a/ddpjobs/j/assignment"}
    assert set(route.tokens) == {"Bearer the-pods-token"}
    complaints = [line for line in out.splitlines() if "spare: cannot get an assignment" in line]
    assert len(complaints) == 1, out  # at least 4 failed requests, one line (at most every 30 s)
    assert "answered 401" in complaints[0] and "no valid token" in complaints[0] and "not Ready" in complaints[0]
    lines = out.splitlines()
    order = [next(i for i, line in enumerate(lines) if text in line) for text in (
        "spare: warm, asking for an assignment", "spare: cannot get an assignment", "spare: ready",
        "spare: the operator answers again", "spare: taking the place of worker 0 in rendezvous generation 0")]
    assert order == sorted(order), out
    assert "rank 0 (local rank 0) exited with code 3" in launched.message()
