"""Recovery from a lost worker: seconds from a SIGKILL to the next optimizer step, and steps lost.

Two setups of the same job (examples/cpu-digits.yaml: the bundled digits trainer, 2 workers, elastic
1:2, a checkpoint every `intervalSteps`), measured in one run, on this machine, no cluster:

- ours: `ddpjob run --local` semantics (LocalRunner: real torchrun agents, the operator's decision
  layer, a dedicated rendezvous store, `--max-restarts=0`, a new generation per incident, every
  worker forked from the run's zygote; the surviving trainer saves a rescue checkpoint).
- cold, cold-gpu: the same with `ddpjob run --local --cold-start` (cpu-node, gpu-node): pod-like, every
  worker and spare a new interpreter started with its pod's argv and env, nothing preloaded; with cold-gpu
  each trainer is a new interpreter too, as the agent starts it on a GPU node (docs/local.md, "Cold start").
- stock: what Kubeflow's PyTorchJob sets up for an elastic job: `torchrun --nnodes=1:2
  --rdzv-backend=c10d` with torch's rendezvous defaults (keep-alive 5 s x 3, last call 30 s), the
  store hosted by worker 0's agent (`is_host`), `--max-restarts=3`, one rendezvous id for the job's
  life, and each pod restarted in place when its container exits (restartPolicy OnFailure; the
  kubelet's restart is taken as immediate, which favours the baseline). The trainer resumes from
  the last periodic checkpoint (`--no-rescue-checkpoint`: a user's script without our runtime).

Workers 1, 0, 1, 0, ... have their whole process tree SIGKILLed at spread-out steps (7 past a
multiple of --every, between two periodic checkpoints) (worker 0 hosts
rank 0 and, in the stock setup, the rendezvous store). Per kill: the last step rank 0 logged
before it, the step training resumed from, steps lost, and seconds from the kill to the first step
after the resume, with the two marks of issue 29's table: rank 0's trainer of the generation that resumed
logs its start ("trainers start") and logs the resume ("training resumed"), all from the trainers' own log
lines. `--state-mb N` makes the model plus its AdamW state about N MiB (a parameter block, the bundled
workloads' `state_mb` option), `--fault delete` (local setups) stops the worker gracefully (SIGTERM, as
an eviction) instead, `--fault stop` freezes it (SIGSTOP, a silent peer) until a survivor's collective gives
up on it (`--steady-timeout`), then kills it as its node's loss would, `--fault kill-store` SIGKILLs the job's
rendezvous store instead (the runner recreates it, as the operator does; its own table: from rank 0's step lines,
the seconds to the next step, the longest gap between two steps around it and steps lost; from the store's and the
reconnecting agents' and trainers' lines, when the store was back and each reconnected; whether every worker kept
its pod and trainer PIDs; with `--recovery Restart` a lost store moves every worker). `--recovery InProcess` sets
`failurePolicy.recovery: InProcess`: the survivors keep their trainer processes; the resume is then rank 0's
`recovered in process` line (it survived) or its `resumed from peer rank X by broadcast` line (it is new). Per
kill the local setups also show the path taken and whether every survivor kept its trainer processes (their
PIDs, read from /proc at every pass of the runner). Ours also gets a phase breakdown from the logs.
`--replacement S|never` (local setups) holds each killed worker's replacement pod Pending S seconds before its
cold start (a slow image pull or a full pool), or until the survivors trained 10 steps short (never: they cannot
tell); each kill then waits for the whole world again, and the table's "join pause" is the survivors' longest
pause beyond one step between the resume and the next kill (where the replacement joins them; checkpoint and
evaluation steps left out). `--loss-check S K` compares an undisturbed run's per-step losses and per-epoch
samples (the trainer's --record-samples) with a run where worker 1 is killed at step S and its replacement is
released K steps after the resume; `--chaos SEED N` does the same through N faults drawn from SEED (kill, delete,
stop or kill-store of a random worker). Prints Markdown tables (docs/benchmarks.md, "Recovery from a lost worker",
"Pod-like recovery").

    .venv/bin/python bench/recovery.py [--kills 5] [--every 120] [--setups ours,stock]
    .venv/bin/python bench/recovery.py --setups cold [--spares 1] [--state-mb 1024] [--fault delete]
    .venv/bin/python bench/recovery.py --setups cold --recovery InProcess [--fault stop|kill-store] [--replacement 60|never]
    .venv/bin/python bench/recovery.py --setups cold --recovery InProcess --loss-check 30 20
    .venv/bin/python bench/recovery.py --setups cold --recovery InProcess --chaos SEED N [--every 25]
    .venv/bin/python bench/recovery.py --setups cluster [--scope Pod|All] [--spares N] [--fault kill|node-down]

The cluster setup runs the job through the operator on the cluster KUBECONFIG names, with the fault
command of the e2e tests (DDPJOB_E2E_FAULTS); docs/benchmarks.md has the invocation.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from ddpjob_operator import naming, validation
from ddpjob_operator.local.logs import RESUME_LINE, STEP_LINE, LogTail
from ddpjob_operator.local.processes import MARKER_ENV, LocalProcess, kill_marked, marked_pids, marker_for
from ddpjob_operator.local.runner import LocalRunner
from ddpjob_operator.local.options import (COLD_CPU_NODE, COLD_GPU_NODE, DELETE, KILL, KILL_STORE, FaultInjection,
                                           RunOptions, Unschedulable)
from ddpjob_operator.local.view import Snapshot, Summary

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cpu-digits.yaml"
STEPS_PER_EPOCH = 23  # digits: 1,437 training samples / (32 x 2 workers), rounded up
TRAINER_START = re.compile(r"rank=0 world_size=\d+ ")
# In-process recovery (failurePolicy.recovery InProcess, docs/trainer.md): a survivor's step raised a peer's failure
# (any rank: the first one marks "failure seen"), rank 0 survived and trains on ("recovered in process", at the step
# its failure line named), or rank 0 is new and got the state from a peer (the bundled trainer's line, or the
# runtime's announce line for other scripts; every receiving rank logs the trainer's: rank 0's is the mark).
PEER_FAILED = re.compile(r"rank (\d+) at step (\d+): a peer (?:failed|stopped) in generation")
RANK0_RECOVERED = re.compile(r"recovered in process: generation \d+ -> \d+, rank 0 of ")
PEER_RESUME = re.compile(r"resumed from peer rank \d+ (?:by broadcast )?step=(\d+)")
OTHER_RANK = re.compile(r"^\S+ \S+ rank[1-9]\d* [A-Z]+ ")  # the trainer's logging format: time, rank, level
# A view that grew (a replacement, a spare or a scale-up joined the survivors): the pause rank 0 reports for it.
REGROUPED = re.compile(r"regrouped at step \d+: .* a pause of ([\d.]+) s")
RESCUE = re.compile(r"rescue checkpoint: rank \d+ saved step (\d+)")
ASCTIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
STOP = "stop"  # --fault stop: the bench freezes a worker's pod (SIGSTOP), a silent peer
FROZEN_FOR_AT_MOST_S = 300.0  # a frozen pod no survivor's step failed on within this is killed anyway
KUBECTL_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?)\d*Z ")
# --fault kill-store: the store's first line once it listens (agent/store.py), and the line of each agent
# (ReconnectingStore's twin in agent/generations.py) and trainer (runtime/store_client.py) that met the new one.
STORE_UP = re.compile(r"ddpjob rendezvous store listening on port \d+")
STORE_RECONNECTED = re.compile(r"rendezvous store \S+ was lost \(.*\); reconnected after [\d.]+ s")


@dataclass
class Timeline:
    """(time.time(), kind, value) for kills, trainer starts, rescues, resumes and steps, by log time
    where the line has one (the trainer's logging lines), else by the time it was read."""

    log_dir: Path
    entries: list[tuple[float, str, int]] = field(default_factory=list)
    tails: dict[str, LogTail] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    failed_at: int = 0  # the step of the last "a peer failed" line (any survivor): where rank 0 trains on in process
    epochs: dict[int, int] = field(default_factory=dict)  # rank 0's step lines: step -> its epoch
    # (time.time(), {(pod, its root's pid): its trainers' pids}) of the pods serving a rank, at each local pass
    trainers: list[tuple[float, dict[tuple[str, int], frozenset[int]]]] = field(default_factory=list)

    def poll(self) -> None:
        with self.lock:
            for path in sorted(self.log_dir.glob("*.log")):
                tail = self.tails.setdefault(path.name, LogTail(path))
                for line in tail.read_new_lines():
                    if kubelet := KUBECTL_TIME.match(line):  # `kubectl logs --timestamps` (cluster setup): UTC,
                        # where the trainer's own stamp is in the container's time zone
                        at, line = datetime.fromisoformat(kubelet.group(1) + "+00:00").timestamp(), line[kubelet.end():]
                    elif stamp := ASCTIME.match(line):
                        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    else:
                        at = time.time()
                    if failed := PEER_FAILED.search(line):
                        self.failed_at = int(failed.group(2))  # rank 0 of the next view may be another survivor
                        self.entries.append((at, "failed", int(failed.group(2))))
                        continue
                    if RANK0_RECOVERED.search(line):
                        self.entries.append((at, "in process", self.failed_at))
                        continue
                    if STORE_RECONNECTED.search(line):  # any rank's trainer or agent
                        self.entries.append((at, "reconnected", 0))
                        continue
                    if OTHER_RANK.match(line):
                        continue
                    if regrouped := REGROUPED.search(line):
                        self.entries.append((at, "pause", round(float(regrouped.group(1)) * 1000)))
                        continue
                    for kind, pattern in (("resume", RESUME_LINE), ("in process", PEER_RESUME), ("rescue", RESCUE),
                                          ("start", TRAINER_START), ("step", STEP_LINE), ("store up", STORE_UP)):
                        if match := pattern.search(line):
                            value = int(match.group(1)) if pattern.groups else 0
                            self.entries.append((at, kind, value))
                            if kind == "step":
                                self.epochs[value] = int(match.group(2))
                            break

    def add(self, kind: str, value: int) -> None:
        self.poll()  # lines written before the event belong before it
        with self.lock:
            self.entries.append((time.time(), kind, value))

    def last_step(self) -> int:
        with self.lock:
            return max((v for _, kind, v in self.entries if kind == "step"), default=0)

    def sorted(self) -> list[tuple[float, str, int]]:
        with self.lock:
            return sorted(self.entries)

    def last_resume_step(self) -> int:
        with self.lock:
            return max((v for _, kind, v in self.entries if kind in ("resume", "in process")), default=0)

    def seen_since(self, kind: str, at: float) -> bool:
        with self.lock:
            return any(k == kind and t >= at for t, k, _ in self.entries)

    def pods_around(self, before: float, after: float) -> tuple[dict | None, dict | None]:
        """The pods serving a rank and their trainers at the runner's last pass before `before` and its first
        after `after` (None where no pass was seen)."""
        return (next((pods for t, pods in reversed(self.trainers) if t < before), None),
                next((pods for t, pods in self.trainers if t > after), None))

    def survivors_kept_trainers(self, killed_at: float, trained_at: float) -> bool | None:
        """Whether every pod that served a rank before the kill and still runs after the first step of the
        recovery (same pod, same root process) has the same trainer processes; None: not observed."""
        before, after = self.pods_around(killed_at, trained_at)
        if before is None or after is None:
            return None
        survivors = [key for key, pids in before.items() if pids and key in after]
        return all(before[key] == after[key] for key in survivors) if survivors else None

    def every_worker_kept(self, faulted_at: float, over_at: float) -> bool | None:
        """Whether the same pods (same root process) serve every rank with the same trainer processes before
        the fault and after `over_at`: no worker restarted at all; None: not observed."""
        before, after = self.pods_around(faulted_at, over_at)
        return None if before is None or after is None else before == after


@dataclass(frozen=True)
class Recovery:
    worker: int
    last_step: int
    resumed_from: int
    seconds: float  # kill -> the first optimizer step after the resume
    phases: dict[str, float]
    trainers_start: float | None = None  # kill -> rank 0's trainer of the generation that resumed logs its start
    resumed: float | None = None  # kill -> rank 0 logs the resume
    trainers_kept: bool | None = None  # the survivors' trainer processes are the same after it (None: not seen)
    resumed_in_process: bool = False  # rank 0 logged an in-process recovery (kept or by a peer's broadcast)
    kill: int = 0  # which kill of the run (1, 2, ...): a kill after which training never resumed has no Recovery
    # After the first step, until the next kill: the survivors' longest pause beyond one step (the replacement's
    # join, where it joins the running survivors), and whether the world was whole again (None: not observed).
    join_pause: float | None = None
    rejoined: bool | None = None
    reported_pause: float | None = None  # the longest pause rank 0 reported for a view that grew in that window

    @property
    def steps_lost(self) -> int:
        return max(self.last_step - self.resumed_from, 0)


def recoveries(entries: list[tuple[float, str, int]],
               kept: Callable[[float, float], bool | None] = lambda killed, trained: None) -> list[Recovery]:
    """`kept(kill, first step)`: whether the survivors kept their trainer processes across that recovery."""
    out = []
    kills = 0
    for i, (killed_at, kind, worker) in enumerate(entries):
        if kind != "kill":
            continue
        kills += 1
        last_step = max((v for _, k, v in entries[:i] if k == "step"), default=0)
        nxt = next((j for j, e in enumerate(entries[i + 1:], i + 1) if e[1] == "kill"), len(entries))
        after = entries[i + 1:nxt]
        resume = next(((t, v, k) for t, k, v in after if k in ("resume", "in process")), None)
        if resume is None:
            continue
        first_step = next((t for t, k, _ in after if k == "step" and t >= resume[0]), None)
        if first_step is None:
            continue
        marks = {"kill": killed_at}
        failed = next((t for t, k, _ in after if k == "failed" and t <= resume[0]), None)
        if failed is not None:  # in process: a survivor's step raised the peer's failure
            marks["failure seen"] = failed
        restarted = next((t for t, k, _ in after if k == "restart" and t <= resume[0]), None)
        if restarted is not None:  # ours: the runner's decision to start a new generation
            marks["new generation"] = restarted
        starts = [t for t, k, _ in after if k == "start" and t <= resume[0]]
        if starts:  # the trainer that resumed: its start line is the last one before the resume
            marks["trainer up"] = max(starts)
        marks["resumed"], marks["first step"] = resume[0], first_step
        names = sorted(marks, key=marks.get)
        phases = {f"{a} -> {b}": marks[b] - marks[a] for a, b in zip(names, names[1:])}
        up = marks.get("trainer up")
        out.append(Recovery(worker, last_step, resume[1], first_step - killed_at, phases,
                            trainers_start=None if up is None else up - killed_at, resumed=resume[0] - killed_at,
                            trainers_kept=kept(killed_at, first_step), resumed_in_process=resume[2] == "in process", kill=kills))
    return out


def step_seconds(entries: list[tuple[float, str, int]]) -> float | None:
    """Mean time of one optimizer step between the kills, over rank 0's runs of consecutive step lines with no
    kill, restart or resume inside (each kill's "seconds to next step" includes one such step). Lines read in
    one poll share a time: a run's span over its steps averages that out."""
    seconds = steps = 0.0
    first = previous = None
    for at, kind, value in [*entries, (float("inf"), "end", 0)]:
        if kind == "step" and previous is not None and value == previous[1] + 1:
            previous = (at, value)
            continue
        if first is not None and previous[1] > first[1]:
            seconds, steps = seconds + previous[0] - first[0], steps + previous[1] - first[1]
        first = previous = (at, value) if kind == "step" else None
    return seconds / steps if steps else None


def join_pauses(entries: list[tuple[float, str, int]], epochs: dict[int, int], interval: int,
                recovered: list[Recovery]) -> list[Recovery]:
    """Each recovery with its `join_pause` and `rejoined`: between its first step and the next kill (or the end),
    the longest gap between two of rank 0's consecutive step lines beyond the window's median one (a gap across
    a periodic checkpoint or an epoch's evaluation left out: they pause every rank anyway), and whether the
    runner saw the whole world training again ("world" entries: the status's world size, 1 when whole)."""
    kills = [t for t, kind, _ in entries if kind == "kill"]
    out = []
    for r in recovered:
        killed_at = kills[r.kill - 1]
        first = killed_at + r.seconds
        end = kills[r.kill] if r.kill < len(kills) else float("inf")
        gaps = step_gaps(entries, epochs, interval, first, end)
        worlds = [v for t, kind, v in entries if kind == "world" and killed_at <= t < end]
        reported = [v / 1000 for t, kind, v in entries if kind == "pause" and first <= t < end]
        out.append(dataclasses.replace(r, join_pause=max(gaps) - statistics.median(gaps) if len(gaps) > 2 else None,
                                       rejoined=bool(worlds) and worlds[-1] == 1 if worlds else None,
                                       reported_pause=max(reported, default=None)))
    return out


def step_gaps(entries: list[tuple[float, str, int]], epochs: dict[int, int], interval: int, start: float,
              end: float) -> list[float]:
    """Seconds between rank 0's consecutive step lines within [start, end), a gap across a periodic checkpoint
    or an epoch's evaluation left out (they pause every rank anyway)."""
    steps = [(t, v) for t, kind, v in entries if kind == "step" and start <= t < end]
    return [t1 - t0 for (t0, s0), (t1, s1) in zip(steps, steps[1:])
            if s1 == s0 + 1 and s0 % interval and epochs.get(s0) == epochs.get(s1)]


@dataclass(frozen=True)
class StoreFault:
    """One SIGKILL of the rendezvous store (`--fault kill-store`), from the trainers' and the store's own lines;
    times in seconds after the kill."""

    fault: int  # which store kill of the run (1, 2, ...)
    last_step: int  # rank 0's last step line before the kill
    next_step: float | None  # rank 0's first step line after the kill (after a resume line, where one came)
    longest_gap: float | None  # the longest gap between rank 0's consecutive step lines from the last step before
    # the kill until it is over (the first step after the store is back and met), checkpoint and evaluation steps
    # left out: did training pause at all?
    median_gap: float | None  # the median gap from the kill to the next fault: one step
    steps_lost: int  # steps rank 0 logged again (a step line at or below the one before it)
    store_back: float | None  # the new store's "listening" line
    reconnects: tuple[float, ...]  # each agent's and trainer's "reconnected" line (agents: when read, 50 ms polls)
    resumed: float | None  # a resume line (the restart path moves every worker; none in process)
    workers_kept: bool | None  # every rank's pod and trainer processes the same after it all (None: not seen)


def store_faults(entries: list[tuple[float, str, int]], epochs: dict[int, int], interval: int,
                 kept: Callable[[float, float], bool | None] = lambda faulted, over: None) -> list[StoreFault]:
    """`kept(kill, over)`: whether every worker kept its pod and trainer processes from the kill until `over`
    (the store back, every reconnect seen and a step after them)."""
    kills = [t for t, kind, _ in entries if kind == "store kill"]
    out = []
    for n, killed_at in enumerate(kills, 1):
        end = kills[n] if n < len(kills) else float("inf")
        before = [(t, v) for t, kind, v in entries if kind == "step" and t < killed_at]
        window = [(t - killed_at, kind, v) for t, kind, v in entries if killed_at <= t < end]
        resumed = next((t for t, kind, _ in window if kind in ("resume", "in process")), None)
        next_step = next((t for t, kind, _ in window if kind == "step" and t >= (resumed or 0)), None)
        store_back = next((t for t, kind, _ in window if kind == "store up"), None)
        reconnects = tuple(t for t, kind, _ in window if kind == "reconnected")
        start = before[-1][0] if before else killed_at
        steps = [v for t, kind, v in entries if kind == "step" and start <= t < end]
        marks = [t for t in (next_step, store_back, *reconnects) if t is not None]
        over = next((t for t, kind, _ in window if kind == "step" and t > max(marks)), None) if marks else None
        around = step_gaps(entries, epochs, interval, start, end if over is None else killed_at + over + 1e-9)
        gaps = step_gaps(entries, epochs, interval, start, end)
        out.append(StoreFault(n, before[-1][1] if before else 0, next_step, max(around, default=None),
                              statistics.median(gaps) if gaps else None,
                              sum(s0 - s1 + 1 for s0, s1 in zip(steps, steps[1:]) if s1 <= s0), store_back,
                              reconnects, resumed, None if over is None else kept(killed_at, killed_at + over)))
    return out


def kill_step(k: int, every: int) -> int:
    """The step of the k-th kill (0-based): 7 past a multiple of `every`, so that it lands between two
    periodic checkpoints (the example's interval is 20) rather than right after one."""
    return every * (k + 1) + 7


def load_example(kills: int, every: int, scope: str = "Pod", spares: int = 0, state_mb: float = 0,
                 recovery: str = "Restart", steady_timeout: float | None = None, rescue: bool = True):
    job = validation.load_jobs(EXAMPLE)[0]
    spec = job.spec
    epochs = 2 + (every * (kills + 1)) // STEPS_PER_EPOCH
    # state_mb: a parameter block that makes model + AdamW state this size (ddp_trainer/workloads/state.py)
    state = ["--workload-option", f"state_mb={state_mb:g}"] if state_mb else []
    steady = [] if steady_timeout is None else ["--dist-steady-timeout", f"{steady_timeout:g}"]
    steady += [] if rescue else ["--no-rescue-checkpoint"]
    spec = spec.model_copy(update={
        "args": [*spec.args, *state, *steady, "--epochs", str(epochs), "--log-every", "1"],  # a later --epochs wins
        "failure_policy": spec.failure_policy.model_copy(update={"max_restarts": kills + 2, "restart_scope": scope,
                                                                 "spares": spares, "recovery": recovery}),
    })
    return job.model_copy(update={"spec": spec})


# ---- ours: the local runner -------------------------------------------------------------------------

class RecordingView:
    def __init__(self, timeline: Timeline, store: str | None = None):
        self.timeline, self.store = timeline, store  # the store pod's name: its kill is a store fault
        self.kills = 0

    def update(self, snap: Snapshot) -> None:
        self.timeline.poll()

    def event(self, text: str) -> None:
        with open(self.timeline.log_dir.parent / "events.log", "a") as out:  # the run's events, kept by --keep-logs
            out.write(f"{datetime.now().isoformat(timespec='milliseconds')} {text}\n")
        if self.store is not None and text.startswith(f"fault injection: killed {self.store} "):
            self.timeline.add("store kill", 0)
        elif text.startswith(("fault injection: killed", "fault injection: deleted")):
            # The pod serving the worker: its own, or a spare that took its place (`--spares`), which the
            # fault's index names as well: kills alternate 1, 0, 1, ...
            killed = re.search(r"-(worker|spare)-(\d+) ", text)
            index = int(killed.group(2)) if killed and killed.group(1) == "worker" else (self.kills + 1) % 2
            self.kills += 1
            self.timeline.add("kill", index)
        elif "GangRestart" in text or "Replace:" in text:
            self.timeline.add("restart", 0)

    def log_line(self, pod: str, line: str) -> None:
        pass

    def close(self, summary: Summary) -> None:
        pass


def poll_in_background(timeline: Timeline, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(0.05):
            timeline.poll()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def descendants(pid: int) -> frozenset[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                todo += [int(child) for child in children.read_text().split()]
            except OSError:
                continue  # the thread or the process ended meanwhile
        found.update(todo)
    return frozenset(found)


class RecordingRunner(LocalRunner):
    """The local runner that also notes, at every pass, the trainer processes of each pod serving a rank (the
    survivors must keep theirs), and hands it the faults one at a time: `faults` (rank index, step, kind), each
    once rank 0 logged the step, training resumed after the previous one (steps take milliseconds: faults given
    to the runner at once would strike together, or during a recovery; after a store's kill: the new store is up and met)
    and every spare is ready again. KILL, DELETE and KILL_STORE are the runner's faults; STOP is the bench's
    silent peer: every process of the rank's pod is frozen (SIGSTOP), as a node that went silent, and once a
    survivor's step failed on it (its steady timeout) the pod is SIGKILLed, as the node's loss would end it, and
    the runner replaces it. A fault also waits for the whole world to train again
    (the status's world size): a replacement held Pending (`--replacement`) joins before the next fault.
    `release_after`: replacements held for ever are released once the survivors trained this many steps after
    the recovery (they cannot tell this from never), so that the next fault finds the world whole. `end`: once
    the last fault's recovery is over and the world whole again for END_STEPS steps, the run is stopped (SIGTERM
    to itself, as a Ctrl-C): survivors that train on at once would otherwise need an epoch count that lasts
    through any replacement's delay."""

    def __init__(self, *args, timeline: Timeline, faults: tuple[tuple[int, int, str], ...] = (),
                 release_after: int | None = None, end: bool = False, scales: tuple[int, ...] = (),
                 scale_every: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.timeline, self.faults, self.release_after, self.end = timeline, list(faults), release_after, end
        # `kubectl scale` to each of `scales` in turn, `scale_every` steps after the world was whole again
        self.scales, self.scale_every = list(scales), scale_every
        self.faulted_at: float | None = None
        self.faulted_step, self.faulted_kind = 0, KILL  # rank 0's last step when the last fault was given, its kind
        self.frozen: tuple[LocalProcess, float] | None = None
        self.whole: bool | None = None
        self.whole_from_step = 0

    def reconcile(self):
        decision = super().reconcile()
        serving = {r.pod: r.index for r in self.status.ranks}
        pods = {(name, w.process.pid): descendants(w.process.pid) for name, w in list(self.workers.items())
                if name in serving and w.process.started and w.process.poll(self.clock()) is None}
        self.timeline.trainers.append((time.time(), pods))
        whole = self.status.world_size == self.status.desired_world_size  # neither short nor shrinking
        if whole != self.whole:
            self.whole, self.whole_from_step = whole, self.timeline.last_step()
            self.timeline.add("world", int(whole))
        if self.scales and whole and self.status.phase == "Running" \
                and self.timeline.last_step() >= self.whole_from_step + self.scale_every:
            replicas = self.scales.pop(0)
            self.timeline.add("scale", replicas)
            self.faulted_at = time.time()
            self.scale(replicas)
        if self.end and not self.faults and not self.scales and self.frozen is None and self.faulted_at is not None \
                and whole and (self.scale_every or self._fault_over()) \
                and self.timeline.last_step() >= max(self.whole_from_step, self.faulted_step) + END_STEPS:
            self.end = False  # (after a resize: the whole world is enough, a shrink logs no resume)
            os.kill(os.getpid(), signal.SIGTERM)  # the run's own stop: every worker stops gracefully
        if self.release_after is not None and self.faulted_at is not None \
                and trained_since(self.timeline, self.faulted_at) \
                and self.timeline.last_step() >= self.timeline.last_resume_step() + self.release_after:
            for w in self.workers.values():
                if w.held and w.held_until is None:
                    w.held_until = self.clock()  # the observer starts it at its next pass
        if self.frozen is not None:
            process, at = self.frozen
            # a survivor's step failed on it: in process ("a peer failed") or on the restart path (its rescue)
            if self.timeline.seen_since("failed", at) or self.timeline.seen_since("rescue", at) \
                    or time.time() > at + FROZEN_FOR_AT_MOST_S:
                kill_marked(process.marker, sessions=(process.pid,))
                self.frozen = None
        elif self.faults and self.timeline.last_step() >= self.faults[0][1] and self.status.phase == "Running" \
                and (self.faults[0][2] != STOP or self._steady()) \
                and self.status.ready_spares >= self.spec.failure_policy.spares and self._whole_again(whole) \
                and (self.faulted_at is None or self._fault_over()):
            index, step, kind = self.faults.pop(0)
            self.faulted_at, self.faulted_step, self.faulted_kind = time.time(), self.timeline.last_step(), kind
            if kind != STOP:
                self.pending_faults.append(FaultInjection(index=index, at_step=step, kind=kind))  # due now
                return decision
            w = self.workers[next(pod for pod, i in serving.items() if i == index)]
            pids = marked_pids(w.process.marker, sessions=(w.process.pid,))
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            self.timeline.add("kill", index)
            self.frozen = (w.process, time.time())
            self.view.event(f"bench: froze {w.process.name} (SIGSTOP to its {len(pids)} processes) at step "
                            f"{self.timeline.last_step()}")
        return decision

    def _fault_over(self) -> bool:
        """Training resumed since the last fault and took a step; after a store's kill, where training goes on: the
        new store is up and a trainer or agent met it there (or none did within STORE_MET_WITHIN_S: each meets it
        at its next store call), and a step came after."""
        if self.faulted_kind != KILL_STORE:
            return trained_since(self.timeline, self.faulted_at)
        entries = self.timeline.sorted()
        up = next((t for t, kind, _ in entries if kind == "store up" and t > self.faulted_at), None)
        if up is None:
            return False
        met = next((t for t, kind, _ in entries if kind == "reconnected" and t > self.faulted_at), None)
        since = met if met is not None else up + STORE_MET_WITHIN_S
        return any(kind == "step" and t > since for t, kind, _ in entries)

    def _whole_again(self, whole: bool) -> bool:
        """The whole world trains again since the last fault: the status says so, from reports newer than the
        fault (rank 0 reports the world it trains in, a second or so late), and no replacement is held Pending."""
        return whole and (self.faulted_at is None or time.time() > self.faulted_at + REPORT_LAG_S) \
            and not any(w.held for w in self.workers.values())

    def _steady(self) -> bool:
        """A silent peer is met by the survivors' steady timeout only where their collectives have it (the
        trainer's CollectiveTimeout): not within 10 steps of a start, recovery or join, 2 of a checkpoint, nor in the
        epoch's evaluation. A freeze waits for such a step, with a margin for a pass or two of training."""
        step, interval = self.timeline.last_step(), self.spec.checkpoint.interval_steps
        since = max(self.timeline.last_resume_step(), self.whole_from_step)  # a join restarts the count too
        return step >= since + 13 and step % interval >= 4 \
            and 2 <= step % STEPS_PER_EPOCH <= STEPS_PER_EPOCH - 6


AT_ONCE, NEVER = "at-once", "never"  # --replacement
SHORT_STEPS = 10  # --replacement never: the steps the survivors train short before the bench releases it
END_STEPS = 20  # after the last fault: steps at the whole world again before the bench ends the run
REPORT_LAG_S = 5.0  # the status's world size, from rank 0's reports, is this late at most under load
# After a store's kill, the bench waits this long for a reconnect line once the new store is up: rank 0's trainer
# looks for joiners in the store every 0.1 s, or 10 s after a failed look (runtime/regroup.py STORE_RETRY_S).
STORE_MET_WITHIN_S = 20.0


def held_replacements(replacement: str, replicas: int) -> tuple[Unschedulable, ...]:
    """RunOptions.unschedulable for `--replacement`: every worker's replacements (its second pod on) stay Pending
    for that many seconds before their cold start, or for ever (never: until RecordingRunner releases them)."""
    if replacement == AT_ONCE:
        return ()
    seconds = None if replacement == NEVER else float(replacement)
    return tuple(Unschedulable(index=i, from_creation=2, seconds=seconds) for i in range(replicas))


def replacement_option(value: str) -> str:
    """argparse type of --replacement: at-once, never or seconds (>= 0)."""
    if value in (AT_ONCE, NEVER):
        return value
    try:
        if float(value) >= 0:
            return value
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"must be {AT_ONCE}, {NEVER} or seconds >= 0, got {value!r}")


def run_local(job, state: Path, cold_start: str | None, faults: tuple[tuple[int, int, str], ...],
              replacement: str = AT_ONCE, release_after: int = SHORT_STEPS, end: bool = False) -> tuple[str, Timeline]:
    """One local run of `job` with the bench's faults; its phase and the timeline read from its logs. `end`: the
    bench ends the run after the last fault (RecordingRunner), not the job's epochs."""
    timeline = Timeline(state / job.metadata.name / "logs")
    stop = threading.Event()
    poller = poll_in_background(timeline, stop)
    options = RunOptions(state_dir=state, cold_start=cold_start,
                         unschedulable=held_replacements(replacement, job.spec.replicas))
    try:
        runner = RecordingRunner(job, options, RecordingView(timeline, naming.store_pod_name(job.metadata.name)),
                                 timeline=timeline, faults=faults,
                                 release_after=release_after if replacement == NEVER else None, end=end)
        phase = runner.run()
        if runner.stopped_by is not None:
            phase = f"ended by the bench after the last fault ({phase})"
    finally:
        stop.set()
        poller.join()
    timeline.poll()
    return phase, timeline


def run_ours(job, kills: int, every: int, state: Path, cold_start: str | None = None,
             kind: str = KILL, replacement: str = AT_ONCE) -> tuple[str, list[Recovery] | list[StoreFault]]:
    """`kind`: KILL, DELETE, KILL_STORE (the runner's faults; the store's: StoreFaults) or STOP (the bench's: a
    silent peer); `replacement`: at-once, never, or the seconds its pod stays Pending."""
    endless = job.spec.model_copy(update={"args": [*job.spec.args, "--epochs", "100000"]})  # run_local ends it
    phase, timeline = run_local(job.model_copy(update={"spec": endless}), state, cold_start,
                                tuple(((k + 1) % 2, kill_step(k, every), kind) for k in range(kills)), replacement,
                                end=True)
    entries, interval = timeline.sorted(), job.spec.checkpoint.interval_steps
    step = step_seconds(entries)
    phase += "" if step is None else f", one step {step:.3f} s (mean between kills)"
    if kind == KILL_STORE:
        return phase, store_faults(entries, timeline.epochs, interval, timeline.every_worker_kept)
    return phase, join_pauses(entries, timeline.epochs, interval, recoveries(entries, timeline.survivors_kept_trainers))


@dataclass(frozen=True)
class Resize:
    replicas: int  # the scale's target
    seconds: float | None  # the scale -> the whole world of the new size training (the status's world size)
    reported_pause: float | None  # the pause rank 0 reported for the regroup (None: none logged)
    trainers_kept: bool | None  # every pod serving a rank before and after kept its trainer processes
    checkpoint_reads: int  # trainers that resumed from a checkpoint meanwhile


def resizes(timeline: Timeline) -> list[Resize]:
    entries = timeline.sorted()
    changes = [(t, v) for t, kind, v in entries if kind == "scale"]
    out = []
    for i, (at, replicas) in enumerate(changes):
        end = changes[i + 1][0] if i + 1 < len(changes) else float("inf")
        window = [(t, kind, v) for t, kind, v in entries if at <= t < end]
        whole_at = next((t for t, kind, v in window if kind == "world" and v == 1), None)
        pauses = [v / 1000 for _, kind, v in window if kind == "pause"]
        out.append(Resize(replicas, None if whole_at is None else whole_at - at, max(pauses, default=None),
                          timeline.survivors_kept_trainers(at, whole_at) if whole_at is not None else None,
                          sum(kind == "resume" for _, kind, _ in window)))
    return out


def run_scale(job, state: Path, cold_start: str | None, cycles: int, every: int) -> None:
    """`kubectl scale` 2 -> 3 -> 2 ... (`cycles` times each way), each `every` steps after the world was whole
    again; per change: seconds to the whole new world, the pause rank 0 reported, whether the pods serving a
    rank before and after kept their trainer processes, and checkpoint reads."""
    endless = job.spec.model_copy(update={"args": [*job.spec.args, "--epochs", "100000"], "replicas": 2})
    timeline = Timeline(state / job.metadata.name / "logs")
    stop = threading.Event()
    poller = poll_in_background(timeline, stop)
    try:
        runner = RecordingRunner(job.model_copy(update={"spec": endless}), RunOptions(state_dir=state,
                                 cold_start=cold_start), RecordingView(timeline), timeline=timeline, end=True,
                                 scales=(3, 2) * cycles, scale_every=every)
        phase = runner.run()
    finally:
        stop.set()
        poller.join()
    timeline.poll()
    print(f"\nscale in place ({phase}):")
    print("| change | seconds to the whole new world | pause rank 0 reported | survivors' trainers kept | checkpoint reads |")
    print("| --- | --- | --- | --- | --- |")
    done = resizes(timeline)
    for r in done:
        print(f"| {5 - r.replicas} -> {r.replicas} | {'-' if r.seconds is None else f'{r.seconds:.1f}'} "
              f"| {'-' if r.reported_pause is None else f'{r.reported_pause:.2f}'} "
              f"| {({None: '-', True: 'yes', False: 'no'})[r.trainers_kept]} | {r.checkpoint_reads} |")
    for replicas in (3, 2):
        mine = [r for r in done if r.replicas == replicas]
        seconds = [r.seconds for r in mine if r.seconds is not None]
        pauses = [r.reported_pause for r in mine if r.reported_pause is not None]
        print(f"| **median {5 - replicas} -> {replicas}** | {statistics.median(seconds) if seconds else float('nan'):.1f} "
              f"| {statistics.median(pauses) if pauses else float('nan'):.2f} "
              f"| {sum(r.trainers_kept is True for r in mine)}/{len(mine)} | {sum(r.checkpoint_reads for r in mine)} |")


LOSS_RELATIVE = 1e-5  # issue 36: every step's loss equals an undisturbed run's within this, relative


def recorded_losses(records: Path) -> list[tuple[int, float]]:
    """(step, loss) as rank 0 recorded each step's mean loss over every seat (`<records>.loss`), in order."""
    path = Path(f"{records}.loss")
    if not path.exists():
        return []
    return [(int(step), float(loss)) for step, loss in (line.split() for line in path.read_text().splitlines() if line)]


def recorded_samples(records: Path) -> dict[int, Counter]:
    """Per epoch, how often each sample index was trained, over every seat's record (`<records>.rank<seat>`)."""
    epochs: dict[int, Counter] = {}
    for path in sorted(records.parent.glob(records.name + ".rank*")):
        for line in path.read_text().splitlines():
            if line:
                epoch, index = map(int, line.split())
                epochs.setdefault(epoch, Counter())[index] += 1
    return epochs


def chaos_faults(seed: int, count: int, every: int, replicas: int) -> tuple[tuple[int, int, str], ...]:
    """`count` faults drawn from `seed`: each a random worker, 1 to `every` steps after the previous one (the
    runner gives each only once the last one's recovery is over and the world whole again), and a random kind:
    SIGKILL, a graceful deletion, a silent peer (frozen) or the rendezvous store's SIGKILL."""
    draw, step, faults = random.Random(seed), 0, []
    for _ in range(count):
        step += draw.randint(1, every)
        faults.append((draw.randrange(replicas), step, draw.choice((KILL, DELETE, STOP, KILL_STORE))))
    return tuple(faults)


def loss_check(job, state: Path, cold_start: str | None, faults: tuple[tuple[int, int, str], ...],
               join_after: int) -> bool:
    """A run with `faults` (--loss-check: worker 1 killed once; --chaos: seeded), each lost worker's replacement
    held Pending until the survivors trained `join_after` steps short (the bench ends the run once the world is
    whole again after the last), then an undisturbed run to the same last step, both with sample records. Prints
    how every step's loss compares (relative to the undisturbed run's) and whether each epoch trained the same
    samples as often (once each). True when both hold over a run that saw the joins."""
    runs = {}
    for name in ("disturbed", "undisturbed"):
        records = state / name / "samples"
        records.parent.mkdir(parents=True)
        # The same epochs and a constant learning rate in both: the schedule follows the planned steps, not the run.
        until = [] if name == "disturbed" else ["--max-steps", str(max(runs["disturbed"][0]))]
        spec = job.spec.model_copy(update={"args": [*job.spec.args, "--epochs", "100000", "--schedule", "constant",
                                                    *until, "--record-samples", str(records)]})
        given = faults if name == "disturbed" else ()
        phase, timeline = run_local(job.model_copy(update={"spec": spec}), state / name, cold_start, given,
                                    NEVER if given else AT_ONCE, release_after=join_after, end=bool(given))
        losses = recorded_losses(records)
        runs[name] = (dict(losses), len(losses), recorded_samples(records))
        if given:
            entries = timeline.sorted()
            last_fault = max((t for t, kind, _ in entries if kind in ("kill", "store kill")), default=0.0)
            whole_at = next((t for t, kind, v in entries if kind == "world" and v == 1 and t > last_fault), None)
            joined = max((v for t, kind, v in entries if kind == "step" and whole_at and t <= whole_at), default=None)
            whole = f"whole again after the last by step {joined}" if joined is not None else \
                "the world whole after the last"
            print(f"{name}: {phase}; faults {', '.join(f'{kind} of worker {i}' for i, _, kind in given)}; "
                  f"{len(recoveries(entries))} recoveries; {whole}; {len(losses)} step losses recorded")
        else:
            print(f"{name}: {phase}; {len(losses)} step losses recorded")
    (disturbed, lines, samples), (base, _, base_samples) = runs["disturbed"], runs["undisturbed"]
    steps = sorted(base.keys() & disturbed.keys())
    relative = {s: abs(disturbed[s] - base[s]) / max(abs(base[s]), 1e-12) for s in steps}
    over = [s for s in steps if relative[s] > LOSS_RELATIVE]
    epochs_differing = [e for e in sorted(base_samples.keys() | samples.keys()) if base_samples.get(e) != samples.get(e)]
    repeated = sum(c - 1 for counts in samples.values() for c in counts.values() if c > 1)
    print(f"loss check: {len(steps)} steps compared, {lines - len(disturbed)} recorded twice, max relative "
          f"difference {max(relative.values(), default=float('nan')):.2e}, {len(over)} over {LOSS_RELATIVE:g}"
          + (f" (first: step {over[0]}: {disturbed[over[0]]!r} against {base[over[0]]!r})" if over else "")
          + f"; samples: {len(epochs_differing)} of {len(base_samples)} epochs differ from the undisturbed run's, "
          f"{repeated} trained twice in an epoch")
    return bool(steps) and not over and not epochs_differing and lines == len(disturbed) \
        and len(steps) == len(base) == len(disturbed)


# ---- stock: torchrun elastic as Kubeflow's PyTorchJob runs it ---------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StockPod:
    """One worker pod: torchrun and its trainer (torchrun starts it in a session of its own), marked
    so that a kill reaches the whole tree, restarted when it exits non-zero."""

    def __init__(self, index: int, argv: list[str], env: dict[str, str], log: Path, restart_limit: int):
        self.marker = marker_for(f"bench-{os.getpid()}", "stock", index)
        self.index, self.argv, self.env, self.log = index, argv, {**env, MARKER_ENV: self.marker}, log
        self.restart_limit, self.restarts = restart_limit, 0
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._kubelet, daemon=True)

    def _kubelet(self) -> None:
        while True:
            with self.lock, open(self.log, "a") as out:
                self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True, cwd=ROOT)
            code = self.proc.wait()
            if code == 0 or self.restarts >= self.restart_limit:
                self.exit_code = code
                return
            self.restarts += 1  # restartPolicy OnFailure: the kubelet starts the container again

    def kill(self) -> None:
        with self.lock:
            kill_marked(self.marker)


def run_stock(job, kills: int, every: int, state: Path, timeout: float) -> tuple[str, list[Recovery]]:
    spec = job.spec
    logs, ckpt = state / "stock-logs", state / "stock-ckpt"
    logs.mkdir(parents=True)
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    trainer = ["-m", "ddp_trainer", *spec.args, "--checkpoint-dir", str(ckpt),
               "--checkpoint-every", str(spec.checkpoint.interval_steps), "--checkpoint-keep",
               str(spec.checkpoint.keep), "--no-rescue-checkpoint"]
    pods = []
    for i in range(spec.replicas):
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={spec.min_replicas}:{spec.replicas}",
                "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={job.metadata.name}", f"--rdzv-conf=is_host={'true' if i == 0 else 'false'}",
                "--max-restarts=3", *trainer]
        pods.append(StockPod(i, argv, env, logs / f"worker-{i}.log", restart_limit=kills + 2))
    timeline = Timeline(logs)
    stop = threading.Event()
    poller = poll_in_background(timeline, stop)
    deadline = time.monotonic() + timeout
    try:
        pods[0].thread.start()
        time.sleep(0.5)  # worker 0 hosts the store: as in a cluster, it usually starts first
        pods[1].thread.start()
        for k in range(kills):
            victim, target = (k + 1) % 2, kill_step(k, every)
            while timeline.last_step() < target:
                if time.monotonic() > deadline or all(p.exit_code is not None for p in pods):
                    raise TimeoutError(f"stock: step {target} never came (last {timeline.last_step()})")
                time.sleep(0.02)
            timeline.add("kill", victim)
            pods[victim].kill()
        for p in pods:
            p.thread.join(max(deadline - time.monotonic(), 1))
        phase = "Succeeded" if all(p.exit_code == 0 for p in pods) else \
            f"Failed (exit codes {[p.exit_code for p in pods]})"
    finally:
        for p in pods:
            p.restart_limit = 0
            p.kill()
        stop.set()
        poller.join()
    timeline.poll()
    return phase, recoveries(timeline.sorted())


# ---- cluster: the operator on a real control plane (the tests/e2e tier) ------------------------------

def e2e_cluster():
    """The cluster tier's helpers (tests/e2e/cluster.py): kubectl, the fault command, why none is there."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.e2e import cluster
    return cluster


def why_no_cluster(fault: str) -> str | None:
    cluster = e2e_cluster()
    if fault == "kill":
        return cluster.why_no_cluster() or cluster.why_fault_unsupported("kill")
    reason = cluster.why_no_cluster() or cluster.why_fault_unsupported("node-down", "node-up")
    if reason is None and not cluster.SHARED_CHECKPOINTS:
        reason = ("--fault node-down spreads the workers over nodes, whose one checkpoint claim must then be "
                  "ReadWriteMany: set DDPJOB_E2E_CHECKPOINT_ACCESS_MODES=ReadWriteMany (a storage class that has it)")
    return reason


def follow_logs(namespace: str, job_name: str, log_dir: Path, stop: threading.Event) -> threading.Thread:
    """`kubectl logs -f --timestamps` of every worker and spare pod the job ever had (a new generation reuses
    worker names; a spare serves a rank under its own), one file per pod uid, until `stop`."""
    cluster = e2e_cluster()
    from ddpjob_operator.naming import LABEL_JOB_NAME, LABEL_ROLE, ROLE_SPARE, ROLE_WORKER, TRAINER_CONTAINER
    selector = f"{LABEL_JOB_NAME}={job_name},{LABEL_ROLE} in ({ROLE_WORKER},{ROLE_SPARE})"
    fields = "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.status.phase}{'\\n'}{end}"

    def loop() -> None:
        followed: dict[str, subprocess.Popen] = {}
        while not stop.wait(0.2):
            got = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", fields, check=False)
            for line in got.stdout.splitlines():
                name, uid, phase = (line.split() + ["", ""])[:3]
                if uid and uid not in followed and phase in ("Running", "Succeeded", "Failed"):
                    with open(log_dir / f"{name}-{uid}.log", "wb") as out:
                        followed[uid] = subprocess.Popen(["kubectl", "logs", "-f", "--timestamps", "-n", namespace,
                                                          f"pod/{name}", "-c", TRAINER_CONTAINER],
                                                         stdout=out, stderr=subprocess.DEVNULL)
        for process in followed.values():
            process.terminate()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def trained_since(timeline: Timeline, at: float) -> bool:
    """Training resumed after `at` and took a step."""
    entries = timeline.sorted()
    resumed = next((t for t, kind, _ in entries if kind in ("resume", "in process") and t > at), None)
    return resumed is not None and any(kind == "step" and t >= resumed for t, kind, _ in entries)


def node_to_lose(cluster, status: dict, first: int, namespace: str, job_name: str) -> tuple[int, str]:
    """(rank index, node) for node-down: the node of rank `first`, else of the next ranks, preferring one
    without the acting operator and the job's rendezvous store (their loss would be measured as well),
    never a control-plane node (the fault command refuses it)."""
    acting = cluster.acting_operator_pod()
    protected = {p["spec"].get("nodeName") for p in cluster.operator_pods() if p["metadata"]["name"] == acting}
    if (store := cluster.store_pod(namespace, job_name)) is not None:
        protected.add(store["spec"].get("nodeName"))
    control = {n["metadata"]["name"] for n in cluster.nodes() if cluster.is_control_plane(n)}
    ranks = status.get("ranks") or []
    ranks = sorted(ranks, key=lambda r: (r["index"] - first) % len(ranks))
    choices = [(r["index"], r["node"]) for r in ranks if r.get("node") and r["node"] not in control]
    if not choices:
        raise RuntimeError(f"no worker on a node the fault command may take down: {ranks}")
    index, node = next((c for c in choices if c[1] not in protected), choices[0])
    if node in protected:
        print(f"cluster: every worker's node hosts the acting operator or the store; losing {node} loses them too",
              file=sys.stderr)
    return index, node


def run_cluster(kills: int, every: int, state: Path, timeout: float, scope: str = "Pod", spares: int = 0,
                fault: str = "kill", recovery: str = "Restart") -> tuple[str, list[Recovery]]:
    """The same job and faults through the operator on the cluster KUBECONFIG names (installed by the
    chart, trainer image loaded: `make kind-up kind-load helm-install`), each fault by the fault command
    on rank 1, 0, 1, ...: `kill NAMESPACE/POD` of the pod that holds the rank now (its own, or the spare
    that took its place: status.ranks[i].pod), SIGKILL of its processes as on the local runner; or
    `node-down` of its node (silent: the survivors wait for the node controller's verdict), brought
    back up and Ready before the next round. With spares, each fault waits for the pool to be ready."""
    cluster = e2e_cluster()
    from tests.e2e.scenario import TERMINAL, digits_job, spread_over_nodes

    namespace = f"ddpjob-bench-{os.getpid()}"
    name = "recovery"
    epochs = 2 + (every * (kills + 1)) // STEPS_PER_EPOCH
    manifest = digits_job(name, max_steps=every * (kills + 2), trainer_args=["--log-every", "1", "--epochs", str(epochs)],
                          failure_policy={"maxRestarts": kills + 2, "restartScope": scope, "spares": spares,
                                          "recovery": recovery,
                                          "backoff": {"initialSeconds": 1, "maxSeconds": 30}},
                          # node-down: a survivor on another node, and a replacement that can start while it is down
                          template={"podSpec": spread_over_nodes(name)} if fault == "node-down" else None)
    replicas = manifest["spec"]["replicas"]
    timeline = Timeline(state)
    stop = threading.Event()
    deadline, generation = time.monotonic() + timeout, 0

    def until(ready, what: str) -> dict:
        """Poll the job until `ready(status)` or its end; each new generation is marked on the timeline."""
        nonlocal generation
        while True:
            status = cluster.job(namespace, name).get("status") or {}
            if status.get("generation", 0) > generation:
                generation = status["generation"]
                timeline.add("restart", generation)
            if status.get("phase") in TERMINAL or ready(status):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within --timeout {timeout:.0f} s (last step {timeline.last_step()})")
            time.sleep(0.2)  # a benchmark's polling cadence, not a test's wait

    cluster.kubectl("create", "namespace", namespace)
    poller = poll_in_background(timeline, stop)
    follower = follow_logs(namespace, name, state, stop)
    try:
        cluster.apply(manifest, namespace)
        faulted_at = 0.0
        for k in range(kills):
            what = f"fault {k + 1}: step {kill_step(k, every)}" + (f" with {spares} ready spares" if spares else "")
            status = until(lambda s, k=k: timeline.last_step() >= kill_step(k, every)
                           and (k == 0 or trained_since(timeline, faulted_at)) and s.get("readySpares", 0) >= spares,
                           what)
            if status.get("phase") in TERMINAL:
                break
            # Each fault is marked once the fault command returns: its own work (kubectl, docker exec) comes
            # before the fault, which is its last act.
            index = (k + 1) % replicas
            if fault == "kill":
                pod = next(r["pod"] for r in status.get("ranks") or [] if r["index"] == index)
                cluster.fault("kill", f"{namespace}/{pod}")
                timeline.add("kill", index)
                faulted_at = time.time()
                continue
            index, node = node_to_lose(cluster, status, index, namespace, name)
            with cluster.node_down(node) as up:
                timeline.add("kill", index)
                faulted_at = time.time()
                until(lambda s: trained_since(timeline, faulted_at), f"fault {k + 1}: a step after {node} went silent")
                up()
        phase = until(lambda s: False, "the job's end")["phase"]
    except TimeoutError as exc:
        phase = f"Timeout: {exc}"
    finally:
        stop.set()
        poller.join()
        follower.join()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    timeline.poll()
    return phase, recoveries(timeline.sorted())


# ---- report ------------------------------------------------------------------------------------------

YES_NO = {None: "-", True: "yes", False: "no"}


def shown(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def median(values: list[float | None], digits: int = 1, with_max: bool = False) -> str:
    """The median of the known values, in bold (and their max), or "-"."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"**{statistics.median(known):.{digits}f}**" + (f" (max {max(known):.{digits}f})" if with_max else "")


def table(name: str, phase: str, results: list[Recovery], interval: int, kills: int) -> None:
    print(f"\n{name}: {phase}")
    print("| kill | worker | last step | resumed from | steps lost | path | survivors' trainers kept | trainers start "
          "| training resumed | seconds to next step | join pause | reported pause | whole again |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        kept, whole = (YES_NO[v] for v in (r.trainers_kept, r.rejoined))
        print(f"| {r.kill} | {r.worker} | {r.last_step} | {r.resumed_from} | {r.steps_lost} "
              f"| {'in process' if r.resumed_in_process else 'checkpoint'} | {kept} | {shown(r.trainers_start)} "
              f"| {shown(r.resumed)} | {r.seconds:.1f} | {shown(r.join_pause, 2)} | {shown(r.reported_pause, 2)} "
              f"| {whole} |")
    if results:
        in_process = sum(r.resumed_in_process for r in results)
        kept = sum(r.trainers_kept is True for r in results)
        print(f"| **median** | | | | **{statistics.median(r.steps_lost for r in results):g}** "
              f"| {in_process}/{len(results)} in process | {kept}/{len(results)} "
              f"| {median([r.trainers_start for r in results])} | {median([r.resumed for r in results])} "
              f"| **{statistics.median(r.seconds for r in results):.1f}** | {median([r.join_pause for r in results], 2)} "
              f"| {median([r.reported_pause for r in results], 2)} | {sum(r.rejoined is True for r in results)}/{len(results)} |")
        print(f"max: {max(r.steps_lost for r in results)} steps lost (interval {interval}), "
              f"{max(r.seconds for r in results):.1f} s")
    if len(results) < kills:
        print(f"{kills - len(results)} of {kills} kills: no resume and next step seen before the next kill or the end")
    phases = list(dict.fromkeys(p for r in results for p in r.phases))
    if phases and any(len(r.phases) > 2 for r in results):
        print("\n| phase | " + " | ".join(f"kill {r.kill}" for r in results) + " | median |")
        print("| --- |" + " --- |" * (len(results) + 1))
        for p in phases:
            values = [r.phases.get(p) for r in results]
            known = [v for v in values if v is not None]
            print(f"| {p} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in values)
                  + f" | {statistics.median(known):.1f} |")


def store_table(name: str, phase: str, results: list[StoreFault], kills: int) -> None:
    print(f"\n{name}: {phase}")
    print("| store kill | last step | seconds to next step | longest step gap | median step | steps lost | store back "
          "| reconnected (lines: first, last) | resume line | every worker's PIDs kept |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for f in results:
        reconnected = f"{len(f.reconnects)}: {f.reconnects[0]:.2f}, {f.reconnects[-1]:.2f}" if f.reconnects else "0"
        print(f"| {f.fault} | {f.last_step} | {shown(f.next_step, 2)} | {shown(f.longest_gap, 2)} "
              f"| {shown(f.median_gap, 3)} | {f.steps_lost} | {shown(f.store_back, 2)} | {reconnected} "
              f"| {shown(f.resumed, 2)} | {YES_NO[f.workers_kept]} |")
    if results:
        print(f"| **median** | | {median([f.next_step for f in results], 2, True)} "
              f"| {median([f.longest_gap for f in results], 2, True)} | {median([f.median_gap for f in results], 2, True)} "
              f"| {sum(f.steps_lost for f in results)} in all | {median([f.store_back for f in results], 2, True)} "
              f"| last {median([max(f.reconnects, default=None) for f in results], 2, True)} "
              f"| {sum(f.resumed is not None for f in results)}/{len(results)} "
              f"| {sum(f.workers_kept is True for f in results)}/{len(results)} |")
    if len(results) < kills:
        print(f"{kills - len(results)} of {kills} store kills did not happen (the run ended first)")


# The local setups and their RunOptions.cold_start.
LOCAL_SETUPS = {"ours": None, "cold": COLD_CPU_NODE, "cold-gpu": COLD_GPU_NODE}


def load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5, help="workers to kill, alternating 1, 0, 1, ...")
    parser.add_argument("--every", type=int, default=120, help="training steps between kills")
    parser.add_argument("--setups", default="ours,stock",
                        help="comma-separated: ours (workers forked from the local runner's zygote), cold (pod-like: "
                             "every worker and spare a new interpreter started as its pod's container, trainers forked "
                             "by their agent as on a node without GPUs: `ddpjob run --local --cold-start`), cold-gpu "
                             "(the same, each trainer a new interpreter as on a GPU node: --cold-start gpu-node), "
                             "stock, cluster (the operator on the cluster KUBECONFIG names)")
    parser.add_argument("--state-mb", type=float, default=0, metavar="MB",
                        help="give the trainer's model a parameter block so that model + AdamW state is about MB MiB "
                             "(--workload-option state_mb; 0: the digits MLP alone, ~0.3 MB)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per setup")
    parser.add_argument("--keep-logs", metavar="DIR", help="keep each setup's logs and checkpoints under DIR")
    parser.add_argument("--scope", choices=("Pod", "All"), default="Pod",
                        help="failurePolicy.restartScope of ours and cluster (Pod: survivors stay in place)")
    parser.add_argument("--spares", type=int, default=0, help="failurePolicy.spares of ours and cluster (warm spares)")
    parser.add_argument("--fault", choices=("kill", "delete", STOP, KILL_STORE, "node-down"), default="kill",
                        help="kill: SIGKILL of a worker's processes; delete (local setups): a graceful pod deletion "
                             "(SIGTERM, as an eviction; the trainers save at the step they agree on); stop (local "
                             "setups): a silent peer, its pod frozen (SIGSTOP) until a survivor's step fails on it "
                             "(--steady-timeout), then killed as its node's loss would; kill-store (local setups): "
                             "SIGKILL of the rendezvous store, which the runner recreates as the operator does; "
                             "node-down (cluster only): its node goes silent")
    parser.add_argument("--recovery", choices=("Restart", "InProcess"), default="Restart",
                        help="failurePolicy.recovery of the local setups and cluster: Restart (today's path: trainers "
                             "restart and read the rescue checkpoint) or InProcess (survivors keep their processes "
                             "and state, a replacement gets it by broadcast; needs --scope Pod)")
    parser.add_argument("--steady-timeout", type=float, metavar="S",
                        help="the trainer's --dist-steady-timeout (default: the trainer's, 5 s): how long a survivor "
                             "waits on a silent peer in a collective")
    parser.add_argument("--replacement", type=replacement_option, default=AT_ONCE, metavar="at-once|S|never",
                        help="local setups: each killed worker's replacement pod starts at once (its cold start), "
                             "stays Pending S seconds first (a slow image pull or scheduling, then its cold start), "
                             f"or never (Pending until the survivors trained {SHORT_STEPS} steps short: they cannot "
                             "tell it from never; then released, so that the next kill finds the world whole)")
    parser.add_argument("--loss-check", nargs=2, type=int, metavar=("S", "K"),
                        help="instead of the kills: a run where worker 1 is killed at step S and its replacement is "
                             "released K steps after the resume (ended once the world is whole again), then an "
                             "undisturbed run to the same step, both with sample records (--record-samples); "
                             "compares every step's loss and each epoch's samples")
    parser.add_argument("--chaos", nargs=2, type=int, metavar=("SEED", "N"),
                        help="the loss check through N faults drawn from SEED (a random worker, kind: kill, delete, "
                             "stop, kill-store; 1 to --every steps apart), each replacement released "
                             f"{SHORT_STEPS} steps after the resume")
    parser.add_argument("--scale", type=int, metavar="N",
                        help="instead of the kills: `kubectl scale` 2 -> 3 -> 2, N times each way, --every steps after "
                             "the world was whole again (local setups)")
    parser.add_argument("--no-rescue", action="store_true",
                        help="the trainer's --no-rescue-checkpoint: survivors write no rescue checkpoint (what the "
                             "in-process path costs without that durability write, which it waits for)")
    args = parser.parse_args(argv)
    if args.recovery == "InProcess" and args.scope != "Pod":
        parser.error("--recovery InProcess needs --scope Pod")
    if args.spares and args.scope != "Pod":
        parser.error("--spares needs --scope Pod")
    if args.fault == "node-down" and args.setups != "cluster":
        parser.error("--fault node-down needs --setups cluster (a node to lose)")
    if (args.fault in ("delete", STOP, KILL_STORE) or args.replacement != AT_ONCE or args.loss_check or args.chaos
            or args.scale) \
            and not set(args.setups.split(",")) <= set(LOCAL_SETUPS):
        parser.error(f"--fault {args.fault}, --replacement, --loss-check and --chaos need local setups only "
                     f"({', '.join(LOCAL_SETUPS)})")
    job = load_example(args.kills, args.every, args.scope, args.spares, args.state_mb, args.recovery,
                       args.steady_timeout, not args.no_rescue)
    interval = job.spec.checkpoint.interval_steps
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"{datetime.now().isoformat(timespec='minutes')}; job {EXAMPLE.name}, checkpoint every {interval} steps, "
          f"kills every {args.every} steps, restartScope {args.scope}, recovery {args.recovery}, spares {args.spares}, "
          f"fault {args.fault}, steady timeout {args.steady_timeout or 'default'}, "
          f"rescue checkpoint {'off' if args.no_rescue else 'on'}, replacement {args.replacement}, "
          f"state {args.state_mb:g} MiB; load average {load()}")
    medians, checked = {}, True
    for setup in args.setups.split(","):
        with tempfile.TemporaryDirectory(prefix=f"ddpjob-recovery-{setup}-") as tmp:
            if args.keep_logs:
                tmp = str(Path(args.keep_logs) / setup)
                Path(tmp).mkdir(parents=True)
            started = time.monotonic()
            if args.loss_check or args.chaos:
                faults = ((1, args.loss_check[0], KILL),) if args.loss_check else \
                    chaos_faults(*args.chaos, args.every, job.spec.replicas)
                join_after = args.loss_check[1] if args.loss_check else SHORT_STEPS
                checked = loss_check(job, Path(tmp), LOCAL_SETUPS[setup], faults, join_after) and checked
                continue
            if args.scale:
                run_scale(job, Path(tmp), LOCAL_SETUPS[setup], args.scale, args.every)
                continue
            if setup in LOCAL_SETUPS:
                phase, results = run_ours(job, args.kills, args.every, Path(tmp), LOCAL_SETUPS[setup],
                                          {"delete": DELETE, STOP: STOP, KILL_STORE: KILL_STORE}.get(args.fault, KILL),
                                          args.replacement)
            elif setup == "stock":
                phase, results = run_stock(job, args.kills, args.every, Path(tmp), args.timeout)
            elif setup == "cluster":
                if (reason := why_no_cluster(args.fault)) is not None:
                    print(f"\ncluster: skipped: {reason}")
                    continue
                phase, results = run_cluster(args.kills, args.every, Path(tmp), args.timeout, args.scope, args.spares,
                                             args.fault, args.recovery)
            else:
                parser.error(f"unknown setup {setup!r}")
            title = f"{setup} ({time.monotonic() - started:.0f} s wall, load average {load()} at its end)"
            if args.fault == KILL_STORE:
                store_table(title, phase, results, args.kills)
                if next_steps := [f.next_step for f in results if f.next_step is not None]:
                    medians[setup] = statistics.median(next_steps)
                continue
            table(title, phase, results, interval, args.kills)
            if results:
                medians[setup] = statistics.median(r.seconds for r in results)
    if {"ours", "stock"} <= medians.keys():
        print(f"\nmedian seconds to the next step: ours {medians['ours']:.1f}, stock {medians['stock']:.1f}: "
              f"{medians['stock'] / medians['ours']:.1f}x faster")
    if args.loss_check or args.chaos or args.scale:
        return 0 if checked else 1
    return 0 if medians else 1


if __name__ == "__main__":
    sys.exit(main())
