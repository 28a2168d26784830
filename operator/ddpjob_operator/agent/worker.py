"""The worker agent: what every worker container runs (`python AGENT_DIR/bootstrap.py worker <torchrun args...>`,
agent.command). torchrun's own entry point, run in-process, so that the container's exit code is the
failed trainer's (torchrun itself always exits 1), 128+N for a signal N, and the failure is written where
the kubelet reads termination messages; a survivor of a peer's failure joins the next rendezvous generation
in place; a warm spare waits for its assignment (spare.py).

The pod's image has torch and no operator package: this module's file reaches the pod in the job's agent
ConfigMap (job_manifests.agent_config_map) and imports only the standard library, torch and the agent's modules
beside it (bootstrap.py loads them as the package `ddpjob_agent`). Importing it changes nothing in torch:
`patch_torch` does, from `main`."""

import logging
import os
import re
import runpy
import signal
import sys
import threading

import torch
import torch.distributed.elastic.multiprocessing.api as elastic_processes
import torch.distributed.run as torchrun
from torch.distributed.elastic.agent.server import local_elastic_agent
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousError
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError

from .contract import (FORK_TRAINER_ENV, GENERATION_FILE_ENV, GENERATION_MARK, GENERATION_PATH, GENERATION_POLL_SECONDS,
                       GPU_DEVICE_FILES, INPROCESS_ENV, PEER_FAILURE_PATTERN, PRELOAD_ENV, PROGRESS_URL_ENV, REJOIN_ENV,
                       REJOIN_FAILED_PREFIX, REJOIN_TIMEOUT_ENV, REJOIN_TIMEOUT_SECONDS, RENDEZVOUS_CLOSED_MARK,
                       RENDEZVOUS_FAILED_PREFIX, SPARE_ENV, SPARE_PLACE_ENV, STOP_EXIT_CODES, TERMINATION_LOG_ENV,
                       TERMINATION_LOG_PATH, TERMINATION_MESSAGE_LIMIT)
from .generations import Generations, flag, generation_of, with_flags
from .operator_endpoint import ask_operator
from .spare import SparePlace, wait_as_spare, warm_up

PEER_FAILURE = re.compile(PEER_FAILURE_PATTERN, re.IGNORECASE)


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
    gpu = any(os.path.exists(path) for path in GPU_DEVICE_FILES)
    return os.environ.get(FORK_TRAINER_ENV, "0" if gpu else "1") != "0"


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
    if os.environ.get(PRELOAD_ENV):
        preload(json.loads(os.environ[PRELOAD_ENV]))


def entry_of(args):
    return next((args[i:] for i, a in enumerate(args) if not a.startswith("--")), [])


def forked_config(config_from_args):
    def config_forking_trainers(args):
        config, cmd, cmd_args = config_from_args(args)
        if args.no_python or args.run_path:
            return config, cmd, cmd_args
        entry = ["-m"] * bool(args.module) + [args.training_script, *args.training_script_args]
        if not forks_trainers():
            if os.environ.get(INPROCESS_ENV) != "1":
                return config, cmd, cmd_args
            # A fresh interpreter records its exception for the agent (own_group_fix), as a forked trainer does.
            return config, cmd, ["-u", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py"),
                                 "worker", SPAWNED_TRAINER, *entry]
        config.start_method = "fork"
        return config, run_trainer, [bool(args.module), args.training_script, *args.training_script_args]
    return config_forking_trainers


# The agent's argument that makes it a spawned trainer (forked_config, main): `python -u bootstrap.py worker
# SPAWNED_TRAINER [-m] ENTRY ARGS...` runs ENTRY as `python -u [-m] ENTRY ARGS...` would, its exception recorded.
SPAWNED_TRAINER = "--ddpjob-spawned-trainer"


def run_spawned_trainer(entry):
    from torch.distributed.elastic.multiprocessing.errors import record
    module = entry[0] == "-m"
    target, *args = entry[1:] if module else entry
    if not getattr(sys.flags, "safe_path", False):  # what `python [-m] ENTRY` puts first on the path
        sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(target))
    sys.argv = [target, *args]
    if module:
        record(lambda: runpy.run_module(target, run_name="__main__", alter_sys=True))()
    else:
        record(lambda: runpy.run_path(target, run_name="__main__"))()


class PlainTraceback(logging.Filter):
    # torch's log formatter imports torch._dynamo (2 s) to format any record with a traceback, such as
    # the agent's report of a failed trainer: that would delay every restart. Format it plainly here.
    def filter(self, record):
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return True


def finish(code):
    # Skip interpreter teardown: unloading torch takes most of a second, on the path from a failure to
    # the operator seeing it, and its C++ threads can abort there.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def report(text, closed=True, generation=None):
    path = os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG_PATH)
    mark = " " + GENERATION_MARK.format(generation=generation) if generation is not None else ""
    mark += " " + RENDEZVOUS_CLOSED_MARK if closed else ""
    data = fit_message(text, TERMINATION_MESSAGE_LIMIT - len(mark.encode())).encode() + mark.encode()
    try:
        with open(path, "wb") as log:
            log.write(data)
    except OSError:
        pass  # no termination log here (not in a container): the log has the same story


def fit_message(text, limit):
    # At most `limit` bytes of UTF-8: the trainer's message ends with its fix ("Fix: ..."), which the
    # operator keeps whole (decisions.common.short_message), so the middle gives way, never the end, and a
    # character is never split.
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    cut = " ... "
    tail = max(limit - len(cut), 0) // 2
    head = max(limit - len(cut) - tail, 0)
    start = data[:head].decode("utf-8", "ignore")
    end = data[len(data) - tail:].decode("utf-8", "ignore") if tail else ""
    return start + cut + end if limit >= len(cut) else start


STOPPED = threading.Event()  # this agent got a death signal: its own pod is being stopped


def noting_the_stop(handler):
    # torchrun's handler of the agent's death signals (SIGTERM, SIGINT, ...; installed when it starts the
    # trainers), which stops them and raises SignalException. Noted here because the trainers' exit
    # cannot tell it: every rank exits alike after a stop the ranks agreed on, whichever pod was asked.
    def handle(signum, frame):
        STOPPED.set()
        handler(signum, frame)
    return handle


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
        print(f"generation watch stopped: {error}", file=sys.stderr, flush=True)


WATCHING = []  # the watcher of the rendezvous in progress: (thread, stop event)


def stop_watching():
    # Before the agent forks its trainers: a fork must not copy a thread that may be inside the store
    # client (its locks would stay held in the child), so the watcher only covers the rendezvous.
    while WATCHING:
        thread, stop = WATCHING.pop()
        stop.set()
        thread.join()


AFTER_START = []  # what runs once the trainers are started (a thread must not be copied into a forked trainer)


def checked_generation(given, uid):
    # The operator's answer to GENERATION_PATH: (generation, nnodes) of this job, or ValueError naming what is wrong.
    generation, nnodes = given.get("generation") if isinstance(given, dict) else None, None
    if isinstance(generation, int) and not isinstance(generation, bool) and generation >= 0:
        nnodes = given.get("nnodes")
        ok = isinstance(nnodes, str) and re.fullmatch(r"[1-9][0-9]{0,3}:[1-9][0-9]{0,3}", nnodes) is not None \
            and given.get("rdzvId") == f"{uid}-g{generation}"
        if ok:
            return generation, nnodes
    raise ValueError(f"not {{generation, nnodes MIN:MAX, rdzvId {uid}-g<generation>}}: {str(given)[:200]}")


def follow_operator(generations, generation, stop):
    # DDPJOB_INPROCESS=1: the generation the operator carried this pod into, published in the job's store, where the
    # trainers look for a newer one at every step boundary. Why the survivors' agents ask the operator: an in-place
    # scale down starts no pod whose agent would publish the smaller generation, and a departing pod's agent is no
    # channel (it leaves, and would have to ask just the same). Every survivor asks and publishes (the newest wins in
    # the store), so one survivor slow or gone delays nobody. A failure is said once, until an answer comes again.
    known, trouble = generation, None
    while not stop.wait(GENERATION_POLL_SECONDS):
        given, why = carried_into()
        try:
            if given is not None:
                newer, nnodes = checked_generation(given, generations.uid)
                if newer > known:
                    generations.publish(newer, nnodes)
                    print(f"the operator carried this pod into rendezvous generation {newer} ({nnodes} nodes): "
                          "published in the job's store", file=sys.stderr, flush=True)
                    known = newer
        except Exception as error:  # a bad answer, or the store being replaced: the next answer is published
            why = f"{type(error).__name__}: {error}"
        if why is not None and trouble is None:
            print(f"cannot follow the operator's rendezvous generation: {why}", file=sys.stderr, flush=True)
        elif why is None and trouble is not None:
            print("following the operator's rendezvous generation again", file=sys.stderr, flush=True)
        trouble = why


def carried_into():
    # The operator's answer to GENERATION_PATH, or in a local run the runner's file (written whole, by rename):
    # (the JSON answer, None), (None, None) while there is nothing to tell, (None, why) when it could not be asked.
    import json
    path = os.environ.get(GENERATION_FILE_ENV)
    if not path:
        return ask_operator(GENERATION_PATH, timeout=GENERATION_POLL_SECONDS)
    try:
        with open(path) as file:
            return json.load(file), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as error:
        return None, f"cannot read {path}: {type(error).__name__}: {error}"


def start_following(generations, generation):
    # After the trainers are started (a forked trainer must not copy this thread): stopped with the generation's
    # watchers (stop_watching), before the next fork. Its requests time out within GENERATION_POLL_SECONDS, so
    # stopping it costs at most that.
    stop = threading.Event()
    thread = threading.Thread(target=follow_operator, args=(generations, generation, stop),
                              name="ddpjob-follow-operator", daemon=True)
    WATCHING.append((thread, stop))
    thread.start()


def unwatched_start(start_workers):
    def start(self, worker_group):
        stop_watching()
        started = start_workers(self, worker_group)
        while AFTER_START:
            AFTER_START.pop()()
        return started
    return start


def closed_is_an_error(run):
    # torch's agent swallows a rendezvous closed under it (RendezvousGracefulExitError) and returns None,
    # on which torchrun's launch_agent then fails with an AttributeError: say what happened instead.
    def checked(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        if result is None:
            raise RendezvousClosedError("the rendezvous was closed while this agent was in it")
        return result
    return checked


# DDPJOB_INPROCESS=1: the trainers form their process group themselves, per generation, through the job's
# store, and a survivor's trainer outlives a peer's failure in process (the trainer runtime's inprocess.py).
# torchrun then only starts and watches this pod's trainers, in a rendezvous of the pod's own: no agent
# waits for another pod's, so the survivors' agents go on running their trainers while a replacement's
# agent starts one that joins their next generation. The generation published in the store keeps the
# job's node range (the trainers read their world size there).


def torchrun_args(args):
    if os.environ.get(INPROCESS_ENV) != "1":
        return args
    return with_flags(args, nnodes="1", rdzv_endpoint="127.0.0.1:0", rdzv_conf="is_host=true")


# DDPJOB_INPROCESS=1: torchrun's RANK and WORLD_SIZE are the pod's own rendezvous's, so a trainer that forms its
# group from torchrun's variables (init_process_group's env://) would train alone, one model per pod. Its trainers
# get no group address (the runtime forms the job's group through PET_RDZV_ENDPOINT): that fails at once, and the
# agent reports the fix instead of torch's words.
TORCHRUN_GROUP_ADDRESS = ("MASTER_ADDR", "MASTER_PORT")
OWN_GROUP_FAILURE = re.compile(r"env:// rendezvous: environment variable MASTER_(ADDR|PORT) expected")
OWN_GROUP_FIX = ("this trainer forms its own process group (torch.distributed.init_process_group); in-process "
                 "recovery, the default with restartScope Pod, needs ddp_trainer.runtime.Job (or the HF/Lightning "
                 "callbacks). Fix: set failurePolicy.recovery: Restart in the DDPJob")


def without_group_address(start_processes):
    def start(*args, envs, **kwargs):
        if os.environ.get(INPROCESS_ENV) == "1":
            envs = {rank: {**{k: v for k, v in env.items() if k not in TORCHRUN_GROUP_ADDRESS},
                           "TORCHELASTIC_USE_AGENT_STORE": "False"} for rank, env in envs.items()}
        return start_processes(*args, envs=envs, **kwargs)
    return start


def own_group_fix(detail):
    # A failed trainer's recorded exception, or the fix when it is torch's env:// missing the group address.
    return OWN_GROUP_FIX if os.environ.get(INPROCESS_ENV) == "1" and OWN_GROUP_FAILURE.search(detail) else detail


def run_generation(args, generation, generations):
    # One generation under torchrun: (code, message, closed, by_a_peer) for a failure, None when superseded.
    # by_a_peer: a peer's failure or stop ended it (this pod can take part in the next generation).
    stop, superseded = threading.Event(), threading.Event()
    if generations is not None:
        thread = threading.Thread(target=watch, args=(generations, generation, stop, superseded), daemon=True)
        WATCHING.append((thread, stop))
        thread.start()
    follow = None
    if generations is not None and os.environ.get(INPROCESS_ENV) == "1" \
            and (os.environ.get(PROGRESS_URL_ENV) or os.environ.get(GENERATION_FILE_ENV)):
        follow = lambda: start_following(generations, generation)  # noqa: E731
        AFTER_START.append(follow)
    try:
        torchrun.main(torchrun_args(args))
        finish(0)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        code = 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode
        if isinstance(failure.message, dict):  # the exception recorded by @record in the trainer
            detail = own_group_fix(failure.message.get("message", ""))
        elif failure.exitcode < 0:
            detail = "killed by " + failure.signal_name()
        else:
            detail = ""  # exited without a recorded exception: its log says why
        # A trainer that exits as after an agreed stop although this agent got no signal stopped because a
        # peer's pod was asked to (deleted, evicted, preempted): for this pod that is a peer's failure.
        peer_stopped = failure.exitcode in STOP_EXIT_CODES and not STOPPED.is_set()
        if peer_stopped and not detail:
            detail = "it stopped with its peers at the step they agreed on: a peer's pod was stopped, not this one"
        print(failed, file=sys.stderr, flush=True)
        text = f"rank {rank} (local rank {failure.local_rank}) exited with code {code}" \
            + (f": {detail}" if detail else "")
        if detail == OWN_GROUP_FIX:  # the fix, last in the log, below torch's words
            print(text, file=sys.stderr, flush=True)
        return code, text, True, peer_stopped or (code < 128 and bool(PEER_FAILURE.search(text)))
    except RendezvousError as error:
        if superseded.is_set():
            return None
        text = f"{RENDEZVOUS_FAILED_PREFIX}: {type(error).__name__}: {error}"
        print(text, file=sys.stderr, flush=True)
        # A round closed under this agent: someone left a generation the operator has moved past.
        return 1, text, True, isinstance(error, RendezvousClosedError)
    except SignalException as stopped:
        if superseded.is_set():
            return None
        return 128 + stopped.sigval, f"torchrun stopped by {stopped.sigval.name}; exit code {128 + stopped.sigval}", \
            False, False
    except Exception as error:
        report(f"torchrun failed: {type(error).__name__}: {error}", generation=generation)
        raise
    finally:
        if follow in AFTER_START:  # the trainers never started
            AFTER_START.remove(follow)
        stop_watching()


def drop_foreign_torchrun_settings(args):
    # torchrun reads a PET_<FLAG> variable for every flag not on the command line, and TORCHELASTIC_*
    # for its agent: only the operator's own mirrors of the flags it passes may reach it (an envFrom
    # without a prefix could bring PET_STANDALONE from a ConfigMap the manifest never shows).
    ours = {"PET_" + a[2:].split("=", 1)[0].upper().replace("-", "_") for a in args if a.startswith("--")}
    for name in [n for n in os.environ if n.startswith(("PET_", "TORCHELASTIC_")) and n not in ours]:
        print(f"ignoring {name}: torchrun's settings are the operator's", file=sys.stderr, flush=True)
        del os.environ[name]


def next_generation(failure, generation, generations, timeout):
    # After a generation: (generation, nnodes) of the one to join in place, or the pod's exit.
    if failure is None:  # superseded: the newest is published
        try:
            return generations.newest()
        except SignalException:
            raise
        except Exception as error:  # the store is gone: so is this job's rendezvous, a disruption
            report(f"{RENDEZVOUS_FAILED_PREFIX}: RendezvousConnectionError: the store is unreachable: {error}",
                   generation=generation)
            finish(1)
    code, text, closed, by_a_peer = failure
    if generations is None or not by_a_peer:
        report(text, closed=closed, generation=generation)
        finish(code)
    # A peer's failure or stop ended this generation: wait here for the operator's next one.
    print(f"waiting up to {timeout:g} s for rendezvous generation {generation + 1} or newer: {text}",
          file=sys.stderr, flush=True)
    try:
        newest = generations.wait_newer(generation, timeout)
    except SignalException:
        raise
    except Exception as error:  # the store is gone too: exit with the failure that ended the generation
        print(f"the rendezvous store is unreachable: {error}", file=sys.stderr, flush=True)
        newest = None
    if newest is None:
        report(f"{REJOIN_FAILED_PREFIX}: no rendezvous generation newer than {generation} started within "
               f"{timeout:g} s; {text}", closed=closed, generation=generation)
        finish(code)
    return newest


def seated(nnodes):
    # Whether this pod has a seat in a generation of `nnodes` (MIN:MAX): its replica index below the maximum. An
    # index or range it cannot read is no verdict (the trainers' own join says what is wrong).
    try:
        return int(os.environ.get("DDPJOB_REPLICA_INDEX", "")) < int(nnodes.rsplit(":", 1)[-1])
    except ValueError:
        return True


def publishing(args, generation):
    # The job's store as the survivors' channel (REJOIN_ENV), this agent's generation published in it; None
    # where the pod does not rejoin or the store cannot be reached (torchrun's own join reports that).
    if os.environ.get(REJOIN_ENV) != "1" or generation is None:
        return None
    uid = flag(args, "rdzv-id")[:-len(f"-g{generation}")]
    try:
        generations = Generations(flag(args, "rdzv-endpoint"), uid)
        generations.publish(generation, flag(args, "nnodes"))
        return generations
    except Exception as error:
        print(f"cannot publish generation {generation}: {error}", file=sys.stderr, flush=True)
        return None


def run_as_spare(args):
    # DDPJOB_INPROCESS=1: the trainers run from now on (SparePlace); (args, generation, generations, its
    # outcome) once they end after taking a place. Ended without one: the pod's exit, nothing to rejoin.
    warm_up(args)
    place = SparePlace(args)
    AFTER_START.append(place.start)
    signal.signal(signal.SIGUSR1, on_superseded)
    outcome = run_generation(args, None, None)
    with place.lock:
        place.stop.set()
    if not place.taken.is_set():
        code, text, closed, _ = outcome if outcome is not None else (1, "torchrun ended without a place", True, False)
        report(text, closed=closed)
        finish(code)
    return place.args, place.generation, place.generations, outcome


def launch(args):
    flags = next((args[:i] for i, a in enumerate(args) if not a.startswith("--")), args)  # torchrun's own
    drop_foreign_torchrun_settings(flags)
    if os.environ.get(INPROCESS_ENV) == "1":  # a static gang's pod has them: no trainer may inherit them either
        for name in TORCHRUN_GROUP_ADDRESS:
            os.environ.pop(name, None)
    if forks_trainers():
        preload(entry_of(args))
    os.environ.pop(SPARE_PLACE_ENV, None)  # this agent's own to set (SparePlace), never the pod's
    first = None  # the outcome of a generation already run (an in-process spare's)
    if os.environ.get(SPARE_ENV) == "1" and os.environ.get(INPROCESS_ENV) == "1":
        args, generation, generations, outcome = run_as_spare(args)
        first = [outcome]
    else:
        if os.environ.get(SPARE_ENV) == "1":
            args = wait_as_spare(args)
        generation = generation_of(flag(args, "rdzv-id"))
        generations = publishing(args, generation)
    signal.signal(signal.SIGUSR1, on_superseded)
    timeout = float(os.environ.get(REJOIN_TIMEOUT_ENV, str(REJOIN_TIMEOUT_SECONDS)))
    while True:
        try:
            outcome = first.pop() if first else run_generation(args, generation, generations)
            newest = next_generation(outcome, generation, generations, timeout)
        except SignalException as stopped:
            # torchrun's handler stays installed between generations: the pod's own stop, while it waits.
            text = f"stopped by {stopped.sigval.name} between rendezvous generations; exit code {128 + stopped.sigval}"
            print(text, file=sys.stderr, flush=True)
            report(text, closed=False, generation=generation)
            finish(128 + stopped.sigval)
        generation, nnodes = newest
        if not seated(nnodes):
            # Scaled down past this pod: its trainers left the smaller generation (whatever their exit code), and
            # there is nothing to rejoin. Exit 0, so that the operator removes the pod at once.
            text = f"no place in rendezvous generation {generation} ({nnodes} nodes) for replica index " \
                   f"{os.environ.get('DDPJOB_REPLICA_INDEX')}: scaled down, leaving"
            print(text, file=sys.stderr, flush=True)
            report(text, closed=False, generation=generation)
            finish(0)
        rdzv_id = f"{generations.uid}-g{generation}"
        args = with_flags(args, rdzv_id=rdzv_id, nnodes=nnodes)
        os.environ.update(DDPJOB_GENERATION=str(generation), PET_RDZV_ID=rdzv_id, PET_NNODES=nnodes)
        print(f"joining rendezvous generation {generation} in place ({nnodes} nodes)", file=sys.stderr, flush=True)


# Where the agent changes torch's behaviour: each target with the torch versions its patch was checked
# against. tests/operator/test_agent_torch_patches.py fails on a torch whose target differs from the one
# checked (its source hash), so an upgrade re-reads each patch before it ships.
TORCH_PATCHES = {
    "torch.distributed.run.config_from_args": ("2.13.0",),
    "torch.distributed.elastic.multiprocessing.api._terminate_process_handler": ("2.13.0",),
    "torch.distributed.elastic.agent.server.local_elastic_agent.LocalElasticAgent._start_workers": ("2.13.0",),
    "torch.distributed.elastic.agent.server.local_elastic_agent.start_processes": ("2.13.0",),
    "torch.distributed.elastic.agent.server.api.SimpleElasticAgent.run": ("2.13.0",),
    "torch._logging._internal.TorchLogsFormatter.format": ("2.13.0",),
}
PATCHED = []  # torch's version once patch_torch ran: it patches once per process


def patch_torch():
    if PATCHED:
        return
    PATCHED.append(torch.__version__)
    # Trainers start as forks of this agent where it can (forks_trainers).
    torchrun.config_from_args = forked_config(torchrun.config_from_args)
    # By name: PContext.start looks the handler up in its module each time.
    elastic_processes._terminate_process_handler = noting_the_stop(elastic_processes._terminate_process_handler)
    # The generation watcher stops before the agent forks its trainers.
    LocalElasticAgent._start_workers = unwatched_start(LocalElasticAgent._start_workers)
    # By name, as _start_workers calls it: in-process trainers get no group address (TORCHRUN_GROUP_ADDRESS).
    local_elastic_agent.start_processes = without_group_address(local_elastic_agent.start_processes)
    # A rendezvous closed under the agent is an error, not None (SimpleElasticAgent.run, inherited).
    LocalElasticAgent.run = closed_is_an_error(LocalElasticAgent.run)
    # TorchLogsFormatter.format imports torch._dynamo for a record with a traceback: format it plainly first.
    for name in [n for n in logging.root.manager.loggerDict if n == "torch" or n.startswith("torch.")]:
        for handler in getattr(logging.getLogger(name), "handlers", ()):
            handler.addFilter(PlainTraceback())


def main(args):
    if args[:1] == [SPAWNED_TRAINER]:
        run_spawned_trainer(args[1:])
        return
    patch_torch()
    launch(args)
