"""A warm spare's life before it takes a lost worker's place: warm up, ask the operator (or in a local run the
runner's file) for an assignment, be Ready once the operator answers, then become the worker it was assigned
to be. Without in-process recovery the agent waits here before torchrun starts (wait_as_spare); with it the
spare's trainers start first and SparePlace hands them their place through the job's store. Part of the pod's
agent: the standard library, torch and the agent's modules only."""

import os
import sys
import threading
import time

from .contract import (ASSIGNMENT_FILE_ENV, ASSIGNMENT_PATH, SPARE_BUILT_KEY, SPARE_COMPLAINT_SECONDS,
                       SPARE_PLACE_ENV, SPARE_PLACE_KEY, SPARE_READY_FILE_ENV)
from .generations import Generations, flag, generation_of, with_flags
from .operator_endpoint import ask_operator


def assignment():
    # The operator's answer for this spare: (given, None), given being {"index", "generation", "rdzvId",
    # "nnodes"} or None for "nothing yet" (both valid answers); (None, why) when it could not be asked.
    import json
    path = os.environ.get(ASSIGNMENT_FILE_ENV)
    if path:
        try:
            with open(path) as file:
                return checked_assignment(json.load(file)), None
        except FileNotFoundError:
            return None, None  # not written yet (the runner writes it whole, by rename)
        except (OSError, ValueError) as error:
            return None, f"cannot read {path}: {type(error).__name__}: {error}"
    given, why = ask_operator(ASSIGNMENT_PATH, timeout=10)
    if given is None:
        return None, why
    try:
        return checked_assignment(given), None
    except ValueError as error:
        return None, f"the operator's {ASSIGNMENT_PATH} route answered 200 with no valid assignment: {error}"


def checked_assignment(given):
    ok = isinstance(given, dict) and all(isinstance(given.get(k), int) and not isinstance(given.get(k), bool)
                                         and given[k] >= 0 for k in ("index", "generation")) \
        and all(isinstance(given.get(k), str) and given[k] for k in ("rdzvId", "nnodes"))
    if not ok:
        raise ValueError(f"not {{index, generation, rdzvId, nnodes}}: {str(given)[:200]}")
    return given


def mark_ready():
    # What the pod's readiness probe tests for (written once; never removed: a promoted spare stays Ready).
    path = os.environ.get(SPARE_READY_FILE_ENV)
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as mark:
            mark.write("ready\n")
    except OSError as error:
        print(f"spare: cannot write its readiness mark {path}: {error}; this spare is never Ready",
              file=sys.stderr, flush=True)
        return
    print("spare: ready (the operator answers its assignment requests)", file=sys.stderr, flush=True)


def warm_up(args):
    # Warm: what every worker imports, and the entrypoint's package (never its __main__).
    import importlib
    import torch._dynamo, torch.optim  # noqa: F401 (warm: what every trainer imports)
    entry = args[args.index("-m") + 1] if "-m" in args else None
    if entry:
        try:
            importlib.import_module(entry.split(".")[0])
        except Exception as error:
            print(f"spare: could not preload {entry}: {error}", file=sys.stderr, flush=True)


def await_assignment(stop=None):
    # The operator's assignment for this spare, asked for until it gives one; None once `stop` is set.
    print("spare: warm, asking for an assignment", file=sys.stderr, flush=True)
    every = 0.1 if os.environ.get(ASSIGNMENT_FILE_ENV) else 0.5  # a file is cheap to read; a request is not
    # said: when the last failure was logged (at most every SPARE_COMPLAINT_SECONDS, with the count since)
    ready, failed, said = False, 0, None
    stop = stop or threading.Event()
    while not stop.is_set():
        given, why = assignment()
        if why is None:
            if not ready:
                ready = True
                mark_ready()
            if said is not None:
                print(f"spare: the operator answers again ({failed} failed request(s) since the last note)",
                      file=sys.stderr, flush=True)
                failed, said = 0, None
            if given is not None:
                break
        else:
            failed += 1
            if said is None or time.monotonic() - said >= SPARE_COMPLAINT_SECONDS:
                state = "still Ready; a place it is given but cannot take is released by the operator" if ready \
                    else "not Ready (never promoted) until the operator answers"
                print(f"spare: cannot get an assignment ({failed} failed request(s)): {why}; {state}",
                      file=sys.stderr, flush=True)
                failed, said = 0, time.monotonic()
        stop.wait(every)
    return given if not stop.is_set() else None


def take_place(args, given):
    # This agent is the worker it was assigned to be from now on: its environment and torchrun's flags say so.
    generation = int(given["generation"])
    print(f"spare: taking the place of worker {given['index']} in rendezvous generation {generation}",
          file=sys.stderr, flush=True)
    os.environ.update(DDPJOB_REPLICA_INDEX=str(given["index"]), DDPJOB_GENERATION=str(generation),
                      PET_RDZV_ID=given["rdzvId"], PET_NNODES=given["nnodes"])
    return with_flags(args, rdzv_id=given["rdzvId"], nnodes=given["nnodes"])


def wait_as_spare(args):
    warm_up(args)
    return take_place(args, await_assignment())


class SparePlace:
    # DDPJOB_INPROCESS=1: this spare's trainers start before it has a place (they build what does not depend
    # on the rank, then wait in their runtime); once the trainers run, a thread waits for all of them to be
    # built (SPARE_BUILT_KEY), asks for the assignment (the spare is ready at the first answer), publishes the
    # generation and writes the assignment under the store key named in the trainers' environment
    # (SPARE_PLACE_ENV): a place then costs the trainers a rendezvous and a broadcast.
    def __init__(self, args):
        import secrets
        rdzv_id = flag(args, "rdzv-id") or ""
        self.uid = rdzv_id[:-len(f"-g{generation_of(rdzv_id)}")] if generation_of(rdzv_id) is not None else rdzv_id
        self.key = SPARE_PLACE_KEY.format(uid=self.uid, token=secrets.token_hex(8))
        os.environ[SPARE_PLACE_ENV] = self.key
        self.args, self.stop, self.taken, self.lock = args, threading.Event(), threading.Event(), threading.Lock()
        self.generation, self.generations = None, None

    def start(self):
        threading.Thread(target=self.run, name="ddpjob-spare-place", daemon=True).start()

    def run(self):
        import json
        try:  # ready (the readiness file, at the first answer) once every trainer is built and waits for its place
            generations = Generations(flag(self.args, "rdzv-endpoint"), self.uid)
            nproc = flag(self.args, "nproc-per-node") or "1"
            nproc = int(nproc) if nproc.isdigit() else 1  # the operator's is a number
            built = [SPARE_BUILT_KEY.format(place=self.key, local_rank=r) for r in range(nproc)]
            while not generations.call("check", built):
                if self.stop.wait(0.1):
                    return
        except Exception as error:  # the trainers cannot reach the store either: they fail, and so does the pod
            print(f"spare: cannot reach the job's store: {error}", file=sys.stderr, flush=True)
            return
        print("spare: trainers built, waiting for their place", file=sys.stderr, flush=True)
        given = await_assignment(self.stop)
        with self.lock:  # the trainers' end (stop) and the place taken never cross
            if given is None or self.stop.is_set():
                return
            args = take_place(self.args, given)
            try:
                generations.publish(int(given["generation"]), given["nnodes"])
                generations.call("set", self.key, json.dumps(given))
            except Exception as error:  # the trainers cannot reach the store either: they fail, so does the pod
                print(f"spare: cannot take the place in the job's store: {error}", file=sys.stderr, flush=True)
                return
            os.environ.pop(SPARE_PLACE_ENV, None)  # a later generation's trainers are this worker's, not a spare's
            self.args, self.generation, self.generations = args, int(given["generation"]), generations
            self.taken.set()
