"""The worker launcher: the program every worker container runs (`python -c LAUNCHER_PROGRAM
<torchrun args>`), and the words it leaves in the termination message. Standard library only, so the
trainer image's tests can run it without the operator's dependencies."""

from __future__ import annotations

TERMINATION_LOG_ENV = "DDPJOB_TERMINATION_LOG"
TERMINATION_LOG_PATH = "/dev/termination-log"  # the container's default terminationMessagePath
# Kubernetes keeps at most 4096 bytes of a container's termination message.
TERMINATION_MESSAGE_LIMIT = 4000
# The launcher starts its message with this when torchrun could not form the group (join timeout,
# a closed or unreachable rendezvous): an infrastructure failure, retried in a fresh generation.
RENDEZVOUS_FAILED_PREFIX = "rendezvous failed"
# ...and ends it with this when its exit closed the generation's rendezvous for every agent (torch's
# launch_agent closes it on any exit but a signal): no replacement may join that generation again.
RENDEZVOUS_CLOSED_MARK = "[rendezvous closed]"

# What Gloo and NCCL say when a collective failed because another rank did (died, vanished, froze
# until the collective timed out), as it reaches a termination message. The trainer runtime's
# is_peer_failure uses the same pattern (a test keeps the two equal).
PEER_FAILURE_PATTERN = (r"Connection (closed|reset) by peer|Broken pipe|Connection refused|Timed out|timed out|"
                        r"timeout caused pair closure|NCCL (communicator was aborted|error)|remote process exited|"
                        r"ncclRemoteError|ProcessGroupNCCL.*(Watchdog|abort)|Socket Timeout|Read error")

# Survivors rejoin in place (restartScope Pod): when a peer's failure ends a generation, a surviving
# agent keeps its pod and joins the next generation once the operator has started a pod for it. The
# channel is the job's rendezvous store, which outlives every worker: every agent publishes its
# generation there when it starts (GENERATION_KEY holds the newest, NNODES_KEY its node range), and
# the operator starts a generation's pods only after it has charged the incident that ended the last
# one, so a survivor never moves without the status having moved first.
REJOIN_ENV = "DDPJOB_REJOIN"  # "1": wait for the next generation in place instead of exiting
REJOIN_TIMEOUT_ENV = "DDPJOB_REJOIN_TIMEOUT_SECONDS"
REJOIN_TIMEOUT_SECONDS = 120  # longer than a node controller's verdict on a silent node plus a pod start
GENERATION_KEY = "ddpjob/{uid}/generation"
NNODES_KEY = "ddpjob/{uid}/nnodes/{generation}"
# A survivor that waited REJOIN_TIMEOUT_SECONDS for a newer generation and saw none starts its message
# with this; every message ends with the generation its failure happened in (GENERATION_MARK).
REJOIN_FAILED_PREFIX = "rejoin failed"
# A trainer's exit after a stop its ranks agreed on (the runtime's StopRequest.exit_code, 128 + SIGTERM or
# SIGINT). The ranks of a pod that got no signal exit so too when a peer's pod is stopped (deleted,
# evicted, preempted): their launcher, whose agent got no signal either, takes it for a peer's failure.
STOP_EXIT_CODES = (143, 130)
GENERATION_MARK = "[generation {generation}]"
GENERATION_MARK_PATTERN = r"\[generation (\d+)\]"

# A warm spare (failurePolicy.spares) runs the same launcher with SPARE_ENV=1: it imports what a worker
# imports, joins no rendezvous, and asks for its assignment (the replica index and generation whose place
# it takes) until the operator gives one: from the operator's progress endpoint in a pod (the URL and token
# the pod has for progress reports, path ASSIGNMENT_PATH), from ASSIGNMENT_FILE_ENV in a local run.
SPARE_ENV = "DDPJOB_SPARE"
ASSIGNMENT_FILE_ENV = "DDPJOB_ASSIGNMENT_FILE"
ASSIGNMENT_PATH = "assignment"  # replaces the last segment ("progress") of the progress URL
PROGRESS_URL_ENV = "DDPJOB_PROGRESS_URL"
PROGRESS_TOKEN_ENV = "DDPJOB_PROGRESS_TOKEN_FILE"
PROGRESS_CA_ENV = "DDPJOB_PROGRESS_CA"  # PEM: the CA the client verifies an https endpoint with
# A spare is ready (its pod's readiness probe, builders.spare_pod; locally the runner) once this file exists:
# the launcher writes it once its imports are done and the operator gave a valid answer to its first
# assignment request (204 nothing yet, or 200; locally the assignment file's directory read). A spare that
# can never take a place (a NetworkPolicy, a CA it cannot verify, no token) is never Ready, never promoted.
SPARE_READY_FILE_ENV = "DDPJOB_SPARE_READY_FILE"
SPARE_COMPLAINT_SECONDS = 30  # a spare whose requests keep failing says why at most this often

# The trainer runtime's exit for a checkpoint volume that is full or keeps failing reads (its
# CHECKPOINT_VOLUME_* constants; a test keeps the two equal): infrastructure, never the user's bug.
CHECKPOINT_VOLUME_EXIT_CODE = 75
CHECKPOINT_VOLUME_PREFIXES = ("checkpoint volume full:", "checkpoint volume unreadable:")

# The local runner's zygote preloads the entrypoint's imports too; it gets the entrypoint here (the
# worker's argv after torchrun's flags, as JSON).
PRELOAD_ENV = "DDPJOB_ZYGOTE_PRELOAD"

# On a node without GPUs the trainer starts as a fork of the agent, which has imported torch already,
# instead of a new interpreter importing it again: seconds off every start and restart
# (bench/recovery.py). Where a GPU is visible it starts as a new interpreter, as torchrun does: CUDA
# cannot be used in a child forked after the agent touched it. 0 or 1 in the pod's env forces either.
FORK_TRAINER_ENV = "DDPJOB_FORK_TRAINER"
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's and AMD's driver nodes

# Started as `python -c LAUNCHER_PROGRAM <torchrun args...>`: torchrun's own entry point, run
# in-process, so that the container's exit code is the failed trainer's (torchrun itself always exits
# 1), 128+N for a signal N, and the failure is written where the kubelet reads termination messages.
# A constant, never built from user input.
LAUNCHER_SETUP = f"""\
import logging, os, re, runpy, signal, sys, threading, time
from datetime import timedelta
import torch.distributed.run as torchrun
import torch.distributed.elastic.multiprocessing.api as elastic_processes
from torch.distributed import TCPStore
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousError
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError
from torch.distributed.run import main
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

def run_trainer(module, target, *args):
    # In the forked child: the agent's signal handlers are not the trainer's, and the trainer's own
    # os._exit(0) (which would skip handing torchrun the return value it waits for) becomes a normal
    # exit. Any other os._exit stays one: a failing trainer must not run cleanup that can block on its
    # peers, and a process the trainer forks (a DataLoader worker) must not unwind the trainer's frames
    # it was forked inside (freeing its copy of the process group aborts it).
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    real_exit, trainer = os._exit, os.getpid()
    os._exit = lambda code: sys.exit(0) if code == 0 and os.getpid() == trainer else real_exit(code)
    sys.argv = [target, *args]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    finally:
        os._exit = real_exit

def forks_trainers():
    gpu = any(os.path.exists(path) for path in {GPU_DEVICE_FILES!r})
    return os.environ.get("{FORK_TRAINER_ENV}", "0" if gpu else "1") != "0"

def preload(entry_args):
    # A trainer forked from here starts with what this process imported: import the entrypoint's own
    # top-level imports (read, never run) once, so that every generation's trainer skips them (transformers
    # alone is seconds). Best effort: what does not import here is imported by the trainer as before.
    import ast, importlib, importlib.util
    if not entry_args:
        return
    module = entry_args[0] == "-m"
    entry = entry_args[1] if module and len(entry_args) > 1 else entry_args[0]
    try:
        if module:
            spec = importlib.util.find_spec(entry)
            if spec is not None and spec.submodule_search_locations:
                spec = importlib.util.find_spec(entry + ".__main__")
            path = spec.origin if spec is not None else None
        else:
            path = entry
        with open(path) as source:
            tree = ast.parse(source.read())
    except Exception:
        return
    for node in tree.body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException:
                pass

def preload_from_env():
    # The zygote: the entrypoint of the workers it will start, from the runner.
    import json
    if os.environ.get("{PRELOAD_ENV}"):
        preload(json.loads(os.environ["{PRELOAD_ENV}"]))

def entry_of(args):
    return next((args[i:] for i, a in enumerate(args) if not a.startswith("--")), [])

def forked_config(args, config_from_args=torchrun.config_from_args):
    config, cmd, cmd_args = config_from_args(args)
    if not forks_trainers() or args.no_python or args.run_path:
        return config, cmd, cmd_args
    config.start_method = "fork"
    return config, run_trainer, [bool(args.module), args.training_script, *args.training_script_args]

torchrun.config_from_args = forked_config

class PlainTraceback(logging.Filter):
    # torch's log formatter imports torch._dynamo (2 s) to format any record with a traceback, such as
    # the agent's report of a failed trainer: that would delay every restart. Format it plainly here.
    def filter(self, record):
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return True

for name in [n for n in logging.root.manager.loggerDict if n == "torch" or n.startswith("torch.")]:
    for handler in getattr(logging.getLogger(name), "handlers", ()):
        handler.addFilter(PlainTraceback())

def finish(code):
    # Skip interpreter teardown: unloading torch takes most of a second, on the path from a failure to
    # the operator seeing it, and its C++ threads can abort there.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

def report(text, closed=True, generation=None):
    path = os.environ.get("{TERMINATION_LOG_ENV}", "{TERMINATION_LOG_PATH}")
    mark = " " + "{GENERATION_MARK}".format(generation=generation) if generation is not None else ""
    mark += " {RENDEZVOUS_CLOSED_MARK}" if closed else ""
    data = text.encode("utf-8", "replace")[:{TERMINATION_MESSAGE_LIMIT} - len(mark)] + mark.encode()
    try:
        with open(path, "wb") as log:
            log.write(data)
    except OSError:
        pass  # no termination log here (not in a container): the log has the same story

def flag(args, name):
    prefix = f"--{{name}}="
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)

def with_flags(args, **values):
    # Only torchrun's own flags, which come before the entrypoint: the user's args are never touched.
    out, ours = [], True
    for a in args:
        name = a[2:].split("=", 1)[0] if ours and a.startswith("--") and "=" in a else None
        if name is None:
            ours = False
        key = name.replace("-", "_") if name else None
        out.append(f"--{{name}}={{values[key]}}" if key in values else a)
    return out

class Generations:
    # The job's rendezvous store as the survivors' channel (see REJOIN_ENV in launcher.py).
    def __init__(self, endpoint, uid):
        host, _, port = endpoint.rpartition(":")
        self.uid = uid
        self.store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))

    def publish(self, generation, nnodes):
        self.store.set("{NNODES_KEY}".format(uid=self.uid, generation=generation), nnodes)
        key, seen = "{GENERATION_KEY}".format(uid=self.uid), ""
        while True:  # the newest generation wins: compare-and-set until ours is no longer newer
            current = self.store.compare_set(key, seen, str(generation)).decode()
            if int(current) >= generation:
                return
            seen = current

    def newest(self):
        key = "{GENERATION_KEY}".format(uid=self.uid)
        if not self.store.check([key]):
            return None
        generation = int(self.store.get(key))
        return generation, self.store.get("{NNODES_KEY}".format(uid=self.uid, generation=generation)).decode()

    def wait_newer(self, generation, timeout, stop=None, every=0.2):
        deadline, stop = time.monotonic() + timeout, stop or threading.Event()
        while time.monotonic() < deadline and not stop.is_set():
            newest = self.newest()
            if newest is not None and newest[0] > generation:
                return newest
            stop.wait(every)
        return None

STOPPED = threading.Event()  # this agent got a death signal: its own pod is being stopped

def noting_the_stop(handler):
    # torchrun's handler of the agent's death signals (SIGTERM, SIGINT, ...; installed when it starts the
    # trainers), which stops them and raises SignalException. Noted here because the trainers' exit
    # cannot tell it: every rank exits alike after a stop the ranks agreed on, whichever pod was asked.
    def handle(signum, frame):
        STOPPED.set()
        handler(signum, frame)
    return handle

# By name: PContext.start looks the handler up in its module each time (an AttributeError here, at
# import, if torch ever renames it).
elastic_processes._terminate_process_handler = noting_the_stop(elastic_processes._terminate_process_handler)

def on_superseded(signum, frame):
    # Raised in the agent's main thread, wherever it waits: torchrun stops its trainers with SIGTERM
    # (they checkpoint) and leaves this generation.
    raise SignalException("a newer rendezvous generation started", sigval=signal.SIGTERM)

def watch(generations, generation, stop, superseded):
    # A round the operator has moved past can never complete (a failure during the hand-over): leave it
    # as soon as a newer generation is published. Twice a second: a store serves every agent of the job.
    try:
        if generations.wait_newer(generation, float("inf"), stop, every=0.5) is not None and not stop.is_set():
            superseded.set()
            os.kill(os.getpid(), signal.SIGUSR1)
    except Exception as error:  # the agent's own store calls will report a lost store
        print(f"generation watch stopped: {{error}}", file=sys.stderr, flush=True)

WATCHING = []  # the watcher of the rendezvous in progress: (thread, stop event)

def stop_watching():
    # Before the agent forks its trainers: a fork must not copy a thread that may be inside the store
    # client (its locks would stay held in the child), so the watcher only covers the rendezvous.
    while WATCHING:
        thread, stop = WATCHING.pop()
        stop.set()
        thread.join()

def unwatched_start(start_workers):
    def start(self, worker_group):
        stop_watching()
        return start_workers(self, worker_group)
    return start

LocalElasticAgent._start_workers = unwatched_start(LocalElasticAgent._start_workers)

def closed_is_an_error(run):
    # torch's agent swallows a rendezvous closed under it (RendezvousGracefulExitError) and returns None,
    # on which torchrun's launch_agent then fails with an AttributeError: say what happened instead.
    def checked(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        if result is None:
            raise RendezvousClosedError("the rendezvous was closed while this agent was in it")
        return result
    return checked

LocalElasticAgent.run = closed_is_an_error(LocalElasticAgent.run)

def generation_of(rdzv_id):
    match = re.search(r"-g(\\d+)$", rdzv_id or "")
    return int(match.group(1)) if match else None

def run_generation(args, generation, generations):
    # One generation under torchrun: (code, message, closed, by_a_peer) for a failure, None when superseded.
    # by_a_peer: a peer's failure or stop ended it (this pod can take part in the next generation).
    stop, superseded = threading.Event(), threading.Event()
    if generations is not None:
        thread = threading.Thread(target=watch, args=(generations, generation, stop, superseded), daemon=True)
        WATCHING.append((thread, stop))
        thread.start()
    try:
        main(args)
        finish(0)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        code = 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode
        if isinstance(failure.message, dict):  # the exception recorded by @record in the trainer
            detail = failure.message.get("message", "")
        elif failure.exitcode < 0:
            detail = "killed by " + failure.signal_name()
        else:
            detail = ""  # exited without a recorded exception: its log says why
        # A trainer that exits as after an agreed stop although this agent got no signal stopped because a
        # peer's pod was asked to (deleted, evicted, preempted): for this pod that is a peer's failure.
        peer_stopped = failure.exitcode in {STOP_EXIT_CODES!r} and not STOPPED.is_set()
        if peer_stopped and not detail:
            detail = "it stopped with its peers at the step they agreed on: a peer's pod was stopped, not this one"
        print(failed, file=sys.stderr, flush=True)
        text = f"rank {{rank}} (local rank {{failure.local_rank}}) exited with code {{code}}" \
            + (f": {{detail}}" if detail else "")
        return code, text, True, peer_stopped or (code < 128 and bool(PEER_FAILURE.search(text)))
    except RendezvousError as error:
        if superseded.is_set():
            return None
        text = f"{RENDEZVOUS_FAILED_PREFIX}: {{type(error).__name__}}: {{error}}"
        print(text, file=sys.stderr, flush=True)
        # A round closed under this agent: someone left a generation the operator has moved past.
        return 1, text, True, isinstance(error, RendezvousClosedError)
    except SignalException as stopped:
        if superseded.is_set():
            return None
        return 128 + stopped.sigval, f"torchrun stopped by {{stopped.sigval.name}}; exit code {{128 + stopped.sigval}}", \
            False, False
    except Exception as error:
        report(f"torchrun failed: {{type(error).__name__}}: {{error}}", generation=generation)
        raise
    finally:
        stop_watching()

def assignment():
    # The operator's answer for this spare: (given, None), given being {{"index", "generation", "rdzvId",
    # "nnodes"}} or None for "nothing yet" (both valid answers); (None, why) when it could not be asked.
    import json
    path = os.environ.get("{ASSIGNMENT_FILE_ENV}")
    if path:
        try:
            with open(path) as file:
                return checked_assignment(json.load(file)), None
        except FileNotFoundError:
            return None, None  # not written yet (the runner writes it whole, by rename)
        except (OSError, ValueError) as error:
            return None, f"cannot read {{path}}: {{type(error).__name__}}: {{error}}"
    import ssl, urllib.error, urllib.request
    url = os.environ.get("{PROGRESS_URL_ENV}", "")
    if not url:
        return None, "{PROGRESS_URL_ENV} is empty: the operator has no progress endpoint to answer a spare"
    target = url.rsplit("/", 1)[0] + "/{ASSIGNMENT_PATH}"
    try:
        with open(os.environ.get("{PROGRESS_TOKEN_ENV}", "")) as file:
            token = file.read().strip()
    except OSError as error:
        return None, f"cannot read the pod's progress token: {{error}}"
    try:
        context = ssl.create_default_context(cadata=os.environ["{PROGRESS_CA_ENV}"]) \
            if os.environ.get("{PROGRESS_CA_ENV}") else None
        request = urllib.request.Request(target, headers={{"Authorization": f"Bearer {{token}}"}})
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            if response.status == 204:
                return None, None
            if response.status != 200:
                return None, f"{{target}} answered {{response.status}}"
            body = response.read(65536)
        try:
            return checked_assignment(json.loads(body)), None
        except ValueError as error:
            return None, f"{{target}} answered 200 with no valid assignment: {{error}}"
    except urllib.error.HTTPError as error:  # 401 no valid token, 503 a standby replica, ...
        detail = error.read(200).decode("utf-8", "replace").strip() if error.fp is not None else ""
        return None, f"{{target}} answered {{error.code}} {{error.reason}}" + (f": {{detail}}" if detail else "")
    except Exception as error:  # unreachable (a NetworkPolicy), a CA it cannot verify, a timeout
        return None, f"cannot reach {{target}}: {{type(error).__name__}}: {{error}}"

def checked_assignment(given):
    ok = isinstance(given, dict) and all(isinstance(given.get(k), int) and not isinstance(given.get(k), bool)
                                         and given[k] >= 0 for k in ("index", "generation")) \
        and all(isinstance(given.get(k), str) and given[k] for k in ("rdzvId", "nnodes"))
    if not ok:
        raise ValueError(f"not {{{{index, generation, rdzvId, nnodes}}}}: {{str(given)[:200]}}")
    return given

def mark_ready():
    # What the pod's readiness probe tests for (written once; never removed: a promoted spare stays Ready).
    path = os.environ.get("{SPARE_READY_FILE_ENV}")
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as mark:
            mark.write("ready\\n")
    except OSError as error:
        print(f"spare: cannot write its readiness mark {{path}}: {{error}}; this spare is never Ready",
              file=sys.stderr, flush=True)
        return
    print("spare: ready (the operator answers its assignment requests)", file=sys.stderr, flush=True)

def wait_as_spare(args):
    # Warm: what every worker imports, and the entrypoint's package (never its __main__).
    import importlib
    import torch._dynamo, torch.optim
    entry = args[args.index("-m") + 1] if "-m" in args else None
    if entry:
        try:
            importlib.import_module(entry.split(".")[0])
        except Exception as error:
            print(f"spare: could not preload {{entry}}: {{error}}", file=sys.stderr, flush=True)
    print("spare: warm, asking for an assignment", file=sys.stderr, flush=True)
    every = 0.1 if os.environ.get("{ASSIGNMENT_FILE_ENV}") else 0.5  # a file is cheap to read; a request is not
    # said: when the last failure was logged (at most every SPARE_COMPLAINT_SECONDS, with the count since)
    ready, failed, said = False, 0, None
    while True:
        given, why = assignment()
        if why is None:
            if not ready:
                ready = True
                mark_ready()
            if said is not None:
                print(f"spare: the operator answers again ({{failed}} failed request(s) since the last note)",
                      file=sys.stderr, flush=True)
                failed, said = 0, None
            if given is not None:
                break
        else:
            failed += 1
            if said is None or time.monotonic() - said >= {SPARE_COMPLAINT_SECONDS}:
                state = "still Ready; a place it is given but cannot take is released by the operator" if ready \
                    else "not Ready (never promoted) until the operator answers"
                print(f"spare: cannot get an assignment ({{failed}} failed request(s)): {{why}}; {{state}}",
                      file=sys.stderr, flush=True)
                failed, said = 0, time.monotonic()
        time.sleep(every)
    generation = int(given["generation"])
    print(f"spare: taking the place of worker {{given['index']}} in rendezvous generation {{generation}}",
          file=sys.stderr, flush=True)
    os.environ.update(DDPJOB_REPLICA_INDEX=str(given["index"]), DDPJOB_GENERATION=str(generation),
                      PET_RDZV_ID=given["rdzvId"], PET_NNODES=given["nnodes"])
    return with_flags(args, rdzv_id=given["rdzvId"], nnodes=given["nnodes"])

def drop_foreign_torchrun_settings(args):
    # torchrun reads a PET_<FLAG> variable for every flag not on the command line, and TORCHELASTIC_*
    # for its agent: only the operator's own mirrors of the flags it passes may reach it (an envFrom
    # without a prefix could bring PET_STANDALONE from a ConfigMap the manifest never shows).
    ours = {{"PET_" + a[2:].split("=", 1)[0].upper().replace("-", "_") for a in args if a.startswith("--")}}
    for name in [n for n in os.environ if n.startswith(("PET_", "TORCHELASTIC_")) and n not in ours]:
        print(f"ignoring {{name}}: torchrun's settings are the operator's", file=sys.stderr, flush=True)
        del os.environ[name]

def next_generation(failure, generation, generations, timeout):
    # After a generation: (generation, nnodes) of the one to join in place, or the pod's exit.
    if failure is None:  # superseded: the newest is published
        try:
            return generations.newest()
        except SignalException:
            raise
        except Exception as error:  # the store is gone: so is this job's rendezvous, a disruption
            report(f"{RENDEZVOUS_FAILED_PREFIX}: RendezvousConnectionError: the store is unreachable: {{error}}",
                   generation=generation)
            finish(1)
    code, text, closed, by_a_peer = failure
    if generations is None or not by_a_peer:
        report(text, closed=closed, generation=generation)
        finish(code)
    # A peer's failure or stop ended this generation: wait here for the operator's next one.
    print(f"waiting up to {{timeout:g}} s for rendezvous generation {{generation + 1}} or newer: {{text}}",
          file=sys.stderr, flush=True)
    try:
        newest = generations.wait_newer(generation, timeout)
    except SignalException:
        raise
    except Exception as error:  # the store is gone too: exit with the failure that ended the generation
        print(f"the rendezvous store is unreachable: {{error}}", file=sys.stderr, flush=True)
        newest = None
    if newest is None:
        report(f"{REJOIN_FAILED_PREFIX}: no rendezvous generation newer than {{generation}} started within "
               f"{{timeout:g}} s; {{text}}", closed=closed, generation=generation)
        finish(code)
    return newest

def launch(args):
    flags = next((args[:i] for i, a in enumerate(args) if not a.startswith("--")), args)  # torchrun's own
    drop_foreign_torchrun_settings(flags)
    if forks_trainers():
        preload(entry_of(args))
    if os.environ.get("{SPARE_ENV}") == "1":
        args = wait_as_spare(args)
    generation = generation_of(flag(args, "rdzv-id"))
    generations = None
    if os.environ.get("{REJOIN_ENV}") == "1" and generation is not None:
        uid = flag(args, "rdzv-id")[:-len(f"-g{{generation}}")]
        try:
            generations = Generations(flag(args, "rdzv-endpoint"), uid)
            generations.publish(generation, flag(args, "nnodes"))
        except Exception as error:  # no store: torchrun's own join reports it
            print(f"cannot publish generation {{generation}}: {{error}}", file=sys.stderr, flush=True)
            generations = None
    signal.signal(signal.SIGUSR1, on_superseded)
    timeout = float(os.environ.get("{REJOIN_TIMEOUT_ENV}", "{REJOIN_TIMEOUT_SECONDS}"))
    while True:
        try:
            newest = next_generation(run_generation(args, generation, generations), generation, generations, timeout)
        except SignalException as stopped:
            # torchrun's handler stays installed between generations: the pod's own stop, while it waits.
            text = f"stopped by {{stopped.sigval.name}} between rendezvous generations; exit code {{128 + stopped.sigval}}"
            print(text, file=sys.stderr, flush=True)
            report(text, closed=False, generation=generation)
            finish(128 + stopped.sigval)
        generation, nnodes = newest
        rdzv_id = f"{{generations.uid}}-g{{generation}}"
        args = with_flags(args, rdzv_id=rdzv_id, nnodes=nnodes)
        os.environ.update(DDPJOB_GENERATION=str(generation), PET_RDZV_ID=rdzv_id, PET_NNODES=nnodes)
        print(f"joining rendezvous generation {{generation}} in place ({{nnodes}} nodes)", file=sys.stderr, flush=True)

PEER_FAILURE = re.compile({PEER_FAILURE_PATTERN!r}, re.IGNORECASE)
"""

LAUNCHER_PROGRAM = LAUNCHER_SETUP + "launch(sys.argv[1:])\n"

# The local runner's worker starter (a zygote): one process per local run imports what every worker
# imports once (torch for the agent; torch._dynamo, which the trainer's first optimizer imports), then
# forks a worker launcher per request in milliseconds: a new generation costs no imports, where each
# worker took 4-5 s of CPU (2.3 s for torch, 2 s for torch._dynamo) on a 2-core machine
# (bench/recovery.py).
# Protocol, one line each way: stdin gets {"args", "env", "log"} as JSON; stdout answers "started PID"
# per request and "exit PID CODE" (CODE as Popen's returncode) when a worker ends. Its own
# diagnostics go to stderr. It exits when stdin closes; its workers live on.
ZYGOTE_PROGRAM = LAUNCHER_SETUP + """\
import io, json, select, traceback
import torch._dynamo, torch.optim

def become_worker(request, sibling_fds):
    # Like a new container: a session of its own (the runner signals its process group and finds its
    # processes by session), the request's environment, output to its log, and never back here.
    try:
        os.setsid()
        for fd in sibling_fds:
            os.close(fd)
        if "numpy.random" in sys.modules:  # forked processes share the RNG state a new one seeds afresh
            sys.modules["numpy.random"].seed()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for target, source in ((0, null), (1, log), (2, log)):
            os.dup2(source, target)
        os.close(null)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        if os.environ.get("PYTHONUNBUFFERED"):  # read when an interpreter starts: as if this one had
            sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(open(2, "wb", 0, closefd=False), write_through=True,
                                          errors="backslashreplace")
        sys.argv = ["-c", *request["args"]]
        launch(request["args"])
    except SystemExit as stop:
        finish(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:
        traceback.print_exc()
    finish(1)

def serve():
    preload_from_env()
    pending, children = b"", {}  # pidfd -> pid of every worker still running
    while True:
        readable, _, _ = select.select([0, *children], [], [])
        for fd in readable:
            if fd != 0:
                pid = children.pop(fd)
                os.close(fd)
                code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                os.write(1, f"exit {pid} {code}\\n".encode())
                continue
            data = os.read(0, 1 << 16)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\\n")
            for line in lines:
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    become_worker(request, list(children))
                children[os.pidfd_open(pid)] = pid
                os.write(1, f"started {pid}\\n".encode())

serve()
"""
