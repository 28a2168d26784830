"""The local actuator, beside the operator's actuator.py: carries out a Decision's actions on local processes
(the store, worker pods and warm spares started and stopped, Events shown), tells each spare the place the
status gave it, and stops every process of the run at its end. It decides nothing: what to start or stop
comes from `decisions.decide()`, every command line and environment from launch.py."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

from .. import agent, decisions, launch, model, naming
from ..agent import contract
from .logs import LogTail
from .options import Unschedulable
from .paths import replace_file
from .pods import LOCALHOST, NAMESPACE, LocalPods, WorkerProcess, free_port
from .processes import LocalProcess, Zygote, kill_marked, marker_for

POLL_SECONDS = 0.2
STORE_STOP_SECONDS = 5


class LocalActuator:
    def __init__(self, pods: LocalPods, *, job_name: str, job_uid: str, run_id: str, base_env: dict[str, str],
                 log_dir: Path, checkpoint_dir: Path | None, zygote: Zygote | None,
                 unschedulable: tuple[Unschedulable, ...], event: Callable[[str], None],
                 clock: Callable[[], datetime]):
        self.pods, self.job_name, self.job_uid, self.run_id = pods, job_name, job_uid, run_id
        self.base_env, self.log_dir, self.checkpoint_dir, self.zygote = base_env, log_dir, checkpoint_dir, zygote
        self.unschedulable, self.event, self.clock = unschedulable, event, clock

    def execute(self, action: decisions.Action, spec: model.DDPJobSpec, now: datetime) -> None:
        if isinstance(action, decisions.CreateStore):
            self._create_store(now)
        elif isinstance(action, decisions.DeleteStore):
            self._delete_store(action, now)
        elif isinstance(action, decisions.CreateSpare):
            self._create_spare(action, spec, now)
        elif isinstance(action, decisions.CreateWorker):
            self._create_worker(action, spec, now)
        elif isinstance(action, decisions.DeleteWorker):
            self._delete_worker(action, now)
        elif isinstance(action, decisions.Event):
            self.event(f"{action.type} {action.reason}: {action.message}")
        # DeleteJob (TTL) has nothing to do here: a local run ends when the job finishes.

    def assign_spares(self, status: model.DDPJobStatus, spec: model.DDPJobSpec) -> None:
        """Tell each spare the status gave a rank's place which one (written whole: the launcher polls)."""
        ranks = {r.uid: r for r in status.ranks if r.uid is not None}
        for name, w in self.pods.workers.items():
            rank = ranks.get(w.uid)
            if w.assignment_file is None or rank is None or rank.pod != name or rank.generation is None \
                    or w.assignment_file.exists():
                continue
            given = {"index": rank.index, "generation": rank.generation, "nnodes": naming.nnodes(spec),
                     "rdzvId": naming.rendezvous_id(self.job_uid, rank.generation)}
            replace_file(w.assignment_file, json.dumps(given).encode())
            self.event(f"{name} takes the place of worker {rank.index} in generation {rank.generation}")

    def tell_generations(self, status: model.DDPJobStatus, spec: model.DDPJobSpec) -> None:
        """Tell each pod carried into the generation in use which one it is (in a cluster its agent asks the
        progress endpoint: progress.pods.generation_in): an in-place scale down starts no pod whose agent would
        publish it. Written whole, once per generation: the launcher polls."""
        carried = {r.uid: r for r in status.ranks if r.uid is not None and r.generation == status.generation}
        for name, w in self.pods.workers.items():
            rank = carried.get(w.uid)
            if rank is None or rank.pod != name or w.told_generation == status.generation:
                continue
            given = {"generation": status.generation, "nnodes": naming.nnodes(spec),
                     "rdzvId": naming.rendezvous_id(self.job_uid, status.generation)}
            replace_file(self.generation_file(name), json.dumps(given).encode())
            w.told_generation = status.generation

    def generation_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.generation.json"

    # ---- the end of the run ------------------------------------------------------------------

    def stop_gracefully(self, grace: timedelta, stop_waiting: Callable[[], bool], show: Callable[[], None]) -> None:
        """SIGTERM every worker (they checkpoint) and wait out the grace period, or until `stop_waiting` (a
        second Ctrl-C); then the store."""
        now = self.clock()
        for w in self.pods.workers.values():
            if w.process.started and w.process.poll(now) is None:
                w.process.terminate(now)
        deadline = time.monotonic() + grace.total_seconds()
        while any(w.process.started and w.process.poll(self.clock()) is None for w in self.pods.workers.values()):
            if time.monotonic() >= deadline or stop_waiting():
                break
            show()
            time.sleep(POLL_SECONDS)
        store = self.pods.store
        if store is not None and store.poll(self.clock()) is None:
            store.terminate(self.clock())
            wait_until = time.monotonic() + STORE_STOP_SECONDS
            while store.poll(self.clock()) is None and time.monotonic() < wait_until:
                time.sleep(0.05)

    def kill_all(self, run_marker: str) -> None:
        """Nothing of the run survives: every process it marked, its pods' roots (reaped), the store, the zygote."""
        kill_marked(run_marker)
        for w in self.pods.workers.values():
            w.process.kill()
        if self.pods.store is not None:
            self.pods.store.kill()
        if self.zygote is not None:
            self.zygote.close()

    # ---- the actions -------------------------------------------------------------------------

    def _create_store(self, now: datetime) -> None:
        pods = self.pods
        # A successor keeps its predecessor's port, as a pod's keeps its Service: the workers' endpoint stays.
        pods.store_port = pods.store_port or free_port()
        pods.store_ready = False
        name = naming.store_pod_name(self.job_name)
        pods.store = LocalProcess(
            name=name, marker=marker_for(self.run_id, "store"),
            argv=launch.store_command(pods.store_port, python=sys.executable, agent_dir=agent.DIRECTORY),
            env=self.base_env,
            log_path=self.log_dir / f"{name}.log")
        pods.store.start(now)

    def _create_worker(self, action: decisions.CreateWorker, spec: model.DDPJobSpec, now: datetime) -> None:
        name = naming.worker_name(self.job_name, action.index)
        if name in self.pods.workers:
            return  # the old pod is still terminating: created once it is gone (next passes)
        termination_log = self.log_dir / f"{name}.termination-log"
        process = self._process(name, spec, index=action.index, generation=action.generation,
                                attempt=action.attempt, termination_log=termination_log, extra_env={})
        worker = WorkerProcess(action.index, action.generation, action.attempt, process, termination_log,
                               node_range=naming.node_range(spec), created_at=now)
        self.pods.workers[name] = worker
        created = self.pods.creations[action.index] = self.pods.creations.get(action.index, 0) + 1
        hold = next((u for u in self.unschedulable if u.index == action.index and created >= u.from_creation), None)
        if hold is None:
            worker.start(now)
            return
        worker.held = True
        worker.held_until = None if hold.seconds is None else now + timedelta(seconds=hold.seconds)
        self.event(f"{name} (generation {action.generation}) is not scheduled: Pending "
                   + ("for ever" if hold.seconds is None else f"for {hold.seconds:g}s") + " (Unschedulable)")

    def _create_spare(self, action: decisions.CreateSpare, spec: model.DDPJobSpec, now: datetime) -> None:
        """A warm spare: a worker's launcher that waits for an assignment file (contract.SPARE_ENV)."""
        name = naming.spare_name(self.job_name, action.slot)
        if name in self.pods.workers:
            return
        termination_log = self.log_dir / f"{name}.termination-log"
        assignment = self.log_dir / f"{name}.assignment.json"
        assignment.unlink(missing_ok=True)
        ready_file = self.log_dir / f"{name}.ready"  # the pod's own: a new spare of the name starts not Ready
        ready_file.unlink(missing_ok=True)
        process = self._process(name, spec, index=-1, generation=action.generation, attempt=0,
                                termination_log=termination_log,
                                extra_env={contract.SPARE_ENV: "1", contract.ASSIGNMENT_FILE_ENV: str(assignment),
                                           contract.SPARE_READY_FILE_ENV: str(ready_file)})
        spare = WorkerProcess(-1, action.generation, 0, process, termination_log,
                              node_range=naming.node_range(spec), created_at=now, assignment_file=assignment,
                              ready_file=ready_file)
        self.pods.workers[name] = spare
        spare.start(now)

    def _process(self, name: str, spec: model.DDPJobSpec, *, index: int, generation: int, attempt: int,
                 termination_log: Path, extra_env: dict[str, str]) -> LocalProcess:
        """A pod's agent process (not started), as launch.py has the pod's command and environment; its log
        followed from its current end (logs are appended across runs: only this run's part is read)."""
        endpoint = f"{LOCALHOST}:{self.pods.store_port}"
        rdzv_id = naming.rendezvous_id(self.job_uid, generation)
        termination_log.unlink(missing_ok=True)  # a message is this attempt's or none
        self.generation_file(name).unlink(missing_ok=True)  # and a generation it was told, this pod's or none
        env = {**self.base_env, **launch.worker_env(
            spec, job_name=self.job_name, namespace=NAMESPACE, index=index, generation=generation,
            endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST, master_addr=LOCALHOST,
            checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else None),
            contract.TERMINATION_LOG_ENV: str(termination_log),
            contract.GENERATION_FILE_ENV: str(self.generation_file(name)), **extra_env}
        process = LocalProcess(
            name=name, marker=marker_for(self.run_id, name, attempt), env=env,
            argv=launch.worker_command(spec, endpoint=endpoint, rdzv_id=rdzv_id, local_addr=LOCALHOST,
                                       python=sys.executable, agent_dir=agent.DIRECTORY),
            log_path=self.log_dir / f"{name}.log", zygote=self.zygote)
        if name not in self.pods.tails:
            self.pods.tails[name] = LogTail(process.log_path, offset=_size(process.log_path))
        return process

    def _delete_worker(self, action: decisions.DeleteWorker, now: datetime) -> None:
        """Force kills at once; otherwise SIGTERM, and the observer drops the pod once it has exited.
        An exited pod is gone at once, so a replacement in the same pass can take its name."""
        w = self.pods.workers.get(action.name)
        if w is None:
            return
        w.deleted = True
        if w.held:
            del self.pods.workers[action.name]  # never ran: nothing to stop
            return
        if action.force:
            w.process.kill()
        if w.process.poll(now) is None:
            w.process.terminate(now)
        else:
            del self.pods.workers[action.name]

    def _delete_store(self, action: decisions.DeleteStore, now: datetime) -> None:
        store = self.pods.store
        if store is None:
            return
        if action.force:
            store.kill()
        if store.poll(now) is None:
            store.terminate(now)
        else:
            self.pods.store = None


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0
