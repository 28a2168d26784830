"""One DDPJob under test, watched while it runs: its status after every poll, every pod it ever had
(with the pod's log, read through the API while the pod exists, so logs of pods that are replaced
later are kept) and the assertions of the failure-semantics contract (docs/operator.md, "What users
can rely on"): terminal phase and reason, restarts, disruptions, generation, the world size training
resumed at, and the resumed step at most one checkpoint interval behind.

Jobs train the bundled digits workload for a bounded number of steps (`--max-steps`), checkpointing
every INTERVAL steps, so each scenario runs a few minutes on kind. Faults are injected once training
is past FAULT_AT steps, never after a fixed time.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from ddp_trainer.config import STEADY_TIMEOUT_S
from ddpjob_operator.naming import (HOSTNAME_TOPOLOGY, LABEL_ATTEMPT, LABEL_GENERATION, LABEL_REPLICA_INDEX, ROLE_SPARE,
                                    TRAINER_CONTAINER, worker_name, worker_selector)

from . import cluster

INTERVAL = 10  # checkpoint.intervalSteps
FAULT_AT = 10 * INTERVAL  # inject a fault once training is past this step: ten checkpoints exist
MAX_STEPS = 4000  # a run of a few minutes at kind's speed, long enough to inject a fault mid-run
# Training back after a lost worker: issue 25's targets on a cluster are 5 s with a ready spare and 10 s
# without (measured by bench/recovery.py --setups cluster, docs/benchmarks.md). A test bounds it, not
# benchmarks it: scheduling, a container start and the trainer's 4-5 s of imports vary on a test cluster.
RECOVERED_WITHIN = 60
# A new generation's trainers log their start, then load the checkpoint and log the resume: the line comes
# after the pods run (0.8 s after the start line was seen on a v1.36 cluster), within this.
RESUME_WITHIN = 2 * RECOVERED_WITHIN

# A silent node (node-down; docs/operator.md, "When a node stops answering"). The survivors' collectives
# time out after the trainer's --dist-steady-timeout, or its stall watchdog fires at that + the longest
# recent step + 5 s; they wait in place. The node controller declares the node lost after its
# node-monitor-grace-period (noticed within its node-monitor-period), the taint manager evicts the lost
# pods failurePolicy.nodeLossTimeoutSeconds later, and the operator force-deletes them and starts the next
# generation, which trains once the survivors are out and the replacement has started.
DIST_STEADY_TIMEOUT = STEADY_TIMEOUT_S  # the trainer's default, the one digits_job runs with
STALL_MARGIN = 5
NODE_MONITOR_GRACE = 50  # 40 s before Kubernetes 1.32, 50 s since: the longer one
NODE_MONITOR_PERIOD = 5
NODE_LOSS_TIMEOUT = 5  # digits_job leaves failurePolicy.nodeLossTimeoutSeconds at its default
SURVIVORS_OUT_AFTER = DIST_STEADY_TIMEOUT + STALL_MARGIN  # 10 s (+ a step)
NODE_LOST_AFTER = NODE_MONITOR_GRACE + NODE_MONITOR_PERIOD + NODE_LOSS_TIMEOUT  # 60 s
# Deadlines from the fault, twice the path for a loaded test cluster: the disruption counted in a new
# generation (120 s), then training again (180 s).
NODE_LOSS_COUNTED_WITHIN = 2 * NODE_LOST_AFTER
NODE_LOSS_RECOVERED_WITHIN = 2 * max(SURVIVORS_OUT_AFTER, NODE_LOST_AFTER) + RECOVERED_WITHIN

DIGITS_ARGS = ["--workload", "digits", "--epochs", "100000", "--batch-size", "32", "--lr", "0.05", "--log-every", "10"]

# Lines of the bundled trainer (trainer-image/ddp_trainer): rank 0's progress, its start-up line with
# the world size, and its line after loading a checkpoint (ddpjob_operator/local/logs.py RESUME_LINE).
STEP_LINE = cluster.STEP_LINE
START_LINE = re.compile(r"\brank=0 world_size=(\d+) group_rank=")
# Every trainer's start-up line names its rendezvous generation: a survivor's pod (restartScope Pod) runs
# trainers of several generations, one after the other, in one log.
GENERATION_LINE = re.compile(r"\brank=\d+ world_size=\d+ group_rank=\d+ restart_count=\d+ generation=(\d+)")
RESUME_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) .*resumed from checkpoint step=(\d+) .*"
                         r"\(saved at world_size=(\d+), now (\d+)\)", re.MULTILINE)
TERMINAL = ("Succeeded", "Failed")


def digits_job(name: str, *, replicas: int = 2, min_replicas: int | None = 1, max_replicas: int | None = 0,
               max_steps: int = MAX_STEPS, trainer_args: list[str] | None = None,
               failure_policy: dict[str, Any] | None = None, run_policy: dict[str, Any] | None = None,
               template: dict[str, Any] | None = None, resources: dict[str, Any] | None = None,
               checkpoint: dict[str, Any] | None = None, rendezvous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The CPU example turned into a short, checkpointed run. min/max_replicas None: not set (a static
    job); max_replicas 0: replicas, so a re-formed rendezvous completes as soon as every worker joined.
    The 30 s last call lets a late replacement join the same round instead of a smaller world forming
    without it."""
    manifest = cluster.example("cpu-digits.yaml")
    manifest["metadata"]["name"] = name
    spec = manifest["spec"]
    spec["replicas"] = replicas
    for key, value in (("minReplicas", min_replicas), ("maxReplicas", replicas if max_replicas == 0 else max_replicas)):
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    spec["args"] = [*DIGITS_ARGS, "--max-steps", str(max_steps), *(trainer_args or [])]
    spec["rendezvous"] = {"joinTimeoutSeconds": 300, "lastCallTimeoutSeconds": 30, **(rendezvous or {})}
    claim = {"size": "1Gi", "accessModes": list(cluster.CHECKPOINT_ACCESS_MODES)}
    spec["checkpoint"] = checkpoint or {"claimTemplate": claim, "mountPath": "/checkpoints", "intervalSteps": INTERVAL,
                                        "keep": 3}
    # The restart path unless the policy names a recovery mode (in-process recovery is the default with restartScope
    # Pod): the scenarios built here read "resumed from checkpoint" lines; the in-process ones name InProcess.
    spec["failurePolicy"] = {"recovery": "Restart", **(failure_policy or {
        "maxRestarts": 3, "restartScope": "Pod", "backoff": {"initialSeconds": 1, "maxSeconds": 10}})}
    spec["runPolicy"] = run_policy or {"activeDeadlineSeconds": 1500, "cleanPodPolicy": "Running",
                                       "successPolicy": "AllWorkers"}
    if resources is not None:
        spec["resources"] = resources
    if template is not None:
        spec["template"] = template
    return manifest


def spread_over_nodes(job_name: str) -> dict[str, Any]:
    """A template.podSpec that puts the job's workers on different nodes, at most one more on any node than
    on another. Nodes with a taint the workers do not tolerate do not count (nodeTaintsPolicy Honor,
    Kubernetes 1.26+): a lost node, tainted unreachable, leaves the spread, so its replacement may join the
    survivors' nodes. Their checkpoint claim must then be ReadWriteMany (cluster.SHARED_CHECKPOINTS)."""
    return {"topologySpreadConstraints": [{
        "maxSkew": 1, "topologyKey": HOSTNAME_TOPOLOGY, "whenUnsatisfiable": "DoNotSchedule",
        "nodeTaintsPolicy": "Honor", "labelSelector": {"matchLabels": worker_selector(job_name)}}]}


@dataclass(frozen=True)
class Resume:
    time: str
    step: int
    saved_world: int
    world: int
    pod: str


@dataclass
class PodRecord:
    name: str
    uid: str
    index: int
    generation: int
    attempt: int
    states: list[tuple[str, str | None, bool]] = field(default_factory=list)  # (phase, node, terminating)
    log: str = ""
    log_final: bool = False
    # Generations it served: the one it was created for, and any the operator carried it into in place.
    generations: set[int] = field(default_factory=set)

    def log_of(self, generation: int) -> str:
        """The part of its log written by trainers of `generation` (each trainer's start-up line opens
        its part; what comes before the first one belongs to the pod's own generation)."""
        parts, current, start = [], self.generation, 0
        for match in GENERATION_LINE.finditer(self.log):
            if current == generation:
                parts.append(self.log[start:match.start()])
            current, start = int(match.group(1)), match.start()
        if current == generation:
            parts.append(self.log[start:])
        return "".join(parts)

    def log_served(self, generation: int) -> str:
        """`log_of(generation)` where its trainers log start-up lines; a pod whose trainer logs none (the HF
        and Lightning examples) cannot be split, so all of its log if it served `generation` at all (a
        survivor carried in place keeps the pod, and the label, of the generation it was created for)."""
        if generation not in self.generations:
            return ""
        return self.log_of(generation) if GENERATION_LINE.search(self.log) else self.log

    @property
    def ever_scheduled(self) -> bool:
        return any(node for _, node, _ in self.states)

    @property
    def ever_running(self) -> bool:
        return any(phase == "Running" for phase, _, _ in self.states)


@dataclass(frozen=True)
class Snapshot:
    generation: int
    phase: str | None
    world: int
    restarts: int
    disruptions: int


class Training:
    """A DDPJob in a test namespace, observed at every poll of `wait`."""

    def __init__(self, namespace: str, manifest: dict[str, Any]):
        self.namespace = namespace
        self.manifest = manifest
        self.name: str = manifest["metadata"]["name"]
        spec = manifest["spec"]
        self.interval: int = (spec.get("checkpoint") or {}).get("intervalSteps", INTERVAL)
        self.max_steps = next((int(spec["args"][i + 1]) for i, a in enumerate(spec["args"][:-1])
                               if a == "--max-steps"), None)
        self.job: dict[str, Any] = {}
        self.pods: list[dict[str, Any]] = []
        self.records: dict[str, PodRecord] = {}
        self.history: list[Snapshot] = []
        self.overlaps: list[str] = []  # two pods of one index seen at one time

    # ---- observing

    def start(self) -> "Training":
        cluster.apply(self.manifest, self.namespace)
        self.refresh()
        return self

    def refresh(self) -> None:
        self.job = cluster.job(self.namespace, self.name)
        status = self.status
        self.history.append(Snapshot(status.get("generation", 0), status.get("phase"), status.get("worldSize", 0),
                                     status.get("restarts", 0), status.get("disruptions", 0)))
        self.pods = cluster.job_pods(self.namespace, self.name)
        by_index: dict[int, list[str]] = defaultdict(list)
        ranks = {r["uid"]: r for r in status.get("ranks") or () if r.get("uid")}
        carried = {uid: r.get("generation") for uid, r in ranks.items()}
        if (self.manifest["spec"].get("failurePolicy") or {}).get("spares"):
            # A spare that took a rank serves it under its own name and labels (role spare, no index): its
            # log has that rank's lines (rank 0's progress, maybe).
            self.pods += [p for p in cluster.job_pods(self.namespace, self.name, ROLE_SPARE)
                          if p["metadata"]["uid"] in ranks]
        for pod in self.pods:
            record = self._record(pod, ranks.get(pod["metadata"]["uid"], {}).get("index", -1))
            record.generations.add(record.generation)
            if isinstance(carried.get(record.uid), int):
                record.generations.add(carried[record.uid])
            by_index[record.index].append(record.name)
            self._read_log(pod, record)
        for index, names in by_index.items():
            if len(names) > 1:
                self.overlaps.append(f"index {index}: {names}")

    def _record(self, pod: dict[str, Any], rank_index: int) -> PodRecord:
        meta = pod["metadata"]
        labels = meta.get("labels", {})
        record = self.records.get(meta["uid"])
        if record is None:
            record = PodRecord(meta["name"], meta["uid"], int(labels.get(LABEL_REPLICA_INDEX, rank_index)),
                               int(labels[LABEL_GENERATION]), int(labels.get(LABEL_ATTEMPT, "0")))
            self.records[meta["uid"]] = record
        record.states.append((pod.get("status", {}).get("phase", "Pending"), pod["spec"].get("nodeName"),
                              bool(meta.get("deletionTimestamp"))))
        return record

    def _read_log(self, pod: dict[str, Any], record: PodRecord) -> None:
        if record.log_final:
            return
        statuses = pod.get("status", {}).get("containerStatuses") or []
        state = statuses[0].get("state", {}) if statuses else {}
        if not ("running" in state or "terminated" in state):
            return
        asked = time.monotonic()
        text = cluster.pod_log(self.namespace, record.name, TRAINER_CONTAINER)
        if text is None and time.monotonic() - asked > 10:
            record.log_final = True  # its kubelet does not answer (a lost node): keep what was read
        if text is not None and len(text) >= len(record.log):
            record.log = text
            record.log_final = "terminated" in state

    @property
    def status(self) -> dict[str, Any]:
        return self.job.get("status", {})

    @property
    def generation(self) -> int:
        return self.status.get("generation", 0)

    def describe(self) -> str:
        s = self.status
        pods = ", ".join(f"{p['metadata']['name']}(g{p['metadata']['labels'].get(LABEL_GENERATION)} "
                         f"{p.get('status', {}).get('phase')}{' terminating' if p['metadata'].get('deletionTimestamp') else ''})"
                         for p in self.pods)
        return (f"job {self.namespace}/{self.name}: phase={s.get('phase')} generation={s.get('generation')} "
                f"restarts={s.get('restarts')} disruptions={s.get('disruptions')} worldSize={s.get('worldSize')} "
                f"message={s.get('message')!r}; pods: [{pods}]; latest step {self.latest_step()}")

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float, *, interval: float = 3.0,
             until_terminal: bool = False) -> Any:
        """Refresh and test `predicate` until it holds. A job that ends first fails the wait at once
        (unless the wait is for the end), naming what was awaited and the job's state."""

        def check() -> Any:
            self.refresh()
            result = predicate()
            if not result and not until_terminal and self.status.get("phase") in TERMINAL:
                raise AssertionError(f"the job ended while waiting for {what}: {self.describe()}")
            return result

        return cluster.wait_for(check, what, timeout, interval=interval, explain=self.describe)

    # ---- logs

    def current(self, generation: int | None = None) -> list[PodRecord]:
        """Records of the pods that exist now (optionally of one generation), by index."""
        uids = {p["metadata"]["uid"] for p in self.pods}
        found = [r for r in self.records.values() if r.uid in uids
                 and (generation is None or generation in r.generations)]
        return sorted(found, key=lambda r: r.index)

    def latest_step(self, generation: int | None = None) -> int:
        return max((int(s) for r in self.records.values() if generation is None or generation in r.generations
                    for s in STEP_LINE.findall(r.log if generation is None else r.log_of(generation))), default=0)

    def rank0_pod(self) -> PodRecord:
        """The live worker that hosts global rank 0 now: the one whose log has the newest progress line
        (only rank 0 prints them; in an elastic job rank 0 is on whichever pod the rendezvous made it)."""
        live = [r for r in self.current(self.generation) if r.states[-1][0] == "Running" and not r.states[-1][2]]
        steps = {r.uid: max((int(s) for s in STEP_LINE.findall(r.log)), default=-1) for r in live}
        assert live and max(steps.values()) >= 0, f"no live worker logs progress lines: {self.describe()}"
        return max(live, key=lambda r: steps[r.uid])

    def world(self) -> int | None:
        """The world size rank 0's trainer started with last (its start-up log line)."""
        try:
            host = self.rank0_pod()
        except AssertionError:
            return None
        sizes = START_LINE.findall(host.log)
        return int(sizes[-1]) if sizes else None

    def resumes(self, generation: int) -> list[Resume]:
        """Every "resumed from checkpoint" line of that generation's workers, oldest first."""
        found = [Resume(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), r.name)
                 for r in self.records.values() if generation in r.generations
                 for m in RESUME_LINE.finditer(r.log_of(generation))]
        return sorted(found, key=lambda x: x.time)

    # ---- waiting for the phases of a scenario

    def wait_training(self, past_step: int = FAULT_AT, world: int | None = None, timeout: float = 900) -> int:
        """Wait until every worker runs, training runs at the full world size and rank 0 is past
        `past_step` in the current generation; returns the newest step seen (the fault comes next)."""
        spec = self.manifest["spec"]
        want = world if world is not None else spec["replicas"] * spec.get("nprocPerNode", 1)

        def ready() -> bool:
            return (self.status.get("phase") == "Running" and self.world() == want
                    and self.latest_step(self.generation) >= past_step)

        self.wait(ready, f"training at world size {want} past step {past_step}", timeout)
        step = self.latest_step(self.generation)
        if self.max_steps:
            assert step < self.max_steps // 2, (
                f"training reached step {step} of {self.max_steps} before the fault could be injected: "
                f"the cluster trains faster than this test assumes, raise max_steps")
        return step

    def wait_terminal(self, timeout: float = 1200) -> tuple[str, str, str]:
        self.wait(lambda: cluster.terminal(self.job), "the job to succeed or fail", timeout, until_terminal=True)
        result = cluster.terminal(self.job)
        assert result is not None
        return result

    def wait_running_world(self, generation: int, world: int, timeout: float = 600) -> None:
        """status.worldSize == world while the job is Running again in `generation`."""

        def seen() -> bool:
            return any(h.generation == generation and h.phase == "Running" and h.world == world for h in self.history)

        self.wait(lambda: seen() or self.status.get("phase") in TERMINAL,
                  f"phase Running with status.worldSize {world} in generation {generation}", timeout,
                  until_terminal=True)
        observed = sorted({(h.generation, h.phase, h.world) for h in self.history if h.generation == generation})
        assert seen(), (f"status.worldSize {world} while Running in generation {generation} was never observed; "
                        f"observed (generation, phase, worldSize): {observed}")

    def wait_progress_past(self, step: int, timeout: float = RESUME_WITHIN) -> None:
        """status.progress follows the training past `step` (a step the trainers' logs showed in the
        generation in use): whichever pod holds rank 0 now, a promoted spare included, and whichever
        operator replica acts."""
        self.wait(lambda: ((self.status.get("progress") or {}).get("step") or 0) > step,
                  f"status.progress past step {step} in generation {self.generation}", timeout)

    # ---- the contract's assertions

    def assert_final_progress(self) -> None:
        """A Succeeded job shows its last step at 100 %: the trainers' final report comes before they exit,
        and the operator publishes it with the status that says Succeeded."""
        progress = self.status.get("progress") or {}
        last = self.max_steps or self.latest_step()
        assert (progress.get("step"), progress.get("percent")) == (last, 100), (
            f"the job ended {self.status.get('phase')} at step {last}, its status.progress shows {progress}")

    def assert_outcome(self, *, phase: str, reason: str, restarts: int, disruptions: int,
                       generation: int | None = None) -> None:
        end = cluster.terminal(self.job)
        got: dict[str, Any] = {"phase": self.status.get("phase"), "reason": end[1] if end else None,
                               "restarts": self.status.get("restarts", 0),
                               "disruptions": self.status.get("disruptions", 0)}
        want: dict[str, Any] = {"phase": phase, "reason": reason, "restarts": restarts, "disruptions": disruptions}
        if generation is not None:
            got["generation"], want["generation"] = self.generation, generation
        assert got == want, f"expected {want}, got {got}; message: {end[2] if end else self.status.get('message')!r}"

    def assert_resumed(self, generation: int, *, world: int, not_before: int, not_after: int | None = None,
                       skip: int = 0, lost: int | None = None, timeout: float = RESUME_WITHIN) -> Resume:
        """Training resumed in `generation` at `world` from a checkpoint at most `lost` steps (default:
        one checkpoint interval) behind not_before, the newest step seen before the fault, and <=
        not_after when the fault's step is known. `skip`: resume lines of that generation that came
        before the fault. While the job runs, its trainers may have started without having resumed yet
        (loading the checkpoint takes a while after the pods run): the line is awaited, within `timeout`."""
        self.wait(lambda: self.resumes(generation)[skip:] or self.status.get("phase") in TERMINAL,
                  f"a 'resumed from checkpoint' line in generation {generation}", timeout, until_terminal=True)
        resumes = self.resumes(generation)[skip:]
        assert resumes, (f"no 'resumed from checkpoint' line in the logs of generation {generation}'s workers "
                         f"(training restarted from scratch, or never resumed): {self.describe()}")
        first = resumes[0]
        assert [r.world for r in resumes] == [world] * len(resumes), (
            f"training resumed in generation {generation} at world sizes {[r.world for r in resumes]}, expected {world}")
        behind = self.interval if lost is None else lost
        assert first.step >= not_before - behind, (
            f"resumed from step {first.step}, more than {behind} steps behind step {not_before} reached before "
            f"the fault (checkpoint interval {self.interval})")
        if not_after is not None:
            assert first.step <= not_after, f"resumed from step {first.step}, after the fault's step {not_after}"
        return first

    def assert_no_duplicates(self, *, replacements: bool = False) -> None:
        """At most one pod per index at any observation, one pod per (index, generation) ever, and (unless
        `replacements`: something failed) none a replacement (attempt > 0)."""
        per_slot: dict[tuple[int, int], list[str]] = defaultdict(list)
        for r in self.records.values():
            per_slot[(r.index, r.generation)].append(r.uid)
        twice = {slot: uids for slot, uids in per_slot.items() if len(uids) > 1}
        assert not self.overlaps, f"two pods of one index at the same time: {self.overlaps}"
        assert not twice, f"more than one pod for (index, generation): {twice}"
        if replacements:
            return
        replacements = sorted(r.name for r in self.records.values() if r.attempt > 0)
        assert not replacements, f"pods created as replacements although nothing failed: {replacements}"

    # ---- pods

    def pod(self, index: int) -> dict[str, Any]:
        """The live worker pod of `index` in the current generation."""
        name = worker_name(self.name, index)
        for pod in self.pods:
            if pod["metadata"]["name"] == name and not pod["metadata"].get("deletionTimestamp"):
                return pod
        raise AssertionError(f"no live pod {name}: {self.describe()}")

    def containers(self) -> dict[str, tuple[str, int]]:
        """Worker pod name -> (uid, restartCount of its trainer container), as of the last refresh: a
        survivor kept in place keeps both."""
        found = {}
        for pod in self.pods:
            statuses = pod.get("status", {}).get("containerStatuses") or []
            trainer = next((c for c in statuses if c.get("name") == TRAINER_CONTAINER), {})
            found[pod["metadata"]["name"]] = (pod["metadata"]["uid"], trainer.get("restartCount", 0))
        return found

    def nodes_of_workers(self) -> dict[str, str]:
        """Live worker pod name -> node."""
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.pods
                if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")}
