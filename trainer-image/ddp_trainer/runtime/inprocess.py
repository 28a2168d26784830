"""In-process recovery (issue 29, `DDPJOB_INPROCESS=1`): a survivor of a peer's failure keeps its process and
its state; a replacement gets the state from a peer, not from the volume.

The trainers form their process groups themselves through the job's rendezvous store (the standalone TCPStore
that outlives every worker, `PET_RDZV_ENDPOINT`), one per view (runtime/views.py: the seats that train together;
runtime/membership.py: how views are closed and joiners placed in the store, issue 36). A seat is a fixed function
of the trainer, replica index x processes per node + local rank, so a replaced rank keeps its seat and its shard
of the data; a process's group rank is its seat's index among the view's members. The world is the generation's
node count (the maximum of its `--nnodes`, which the launcher publishes as `ddpjob/<uid>/nnodes/<N>` next to the
newest generation `ddpjob/<uid>/generation`) x processes per node.

When a collective fails because a peer did, a survivor leaves the old group (NCCL: abort; Gloo: destroy it,
which torch 2.13 allows once the collective has raised; bounded by LEAVE_TIMEOUT_S, past which the group
cannot be left and the process takes today's exit path), forms the failed view's successor with the other
survivors at once (no wait for a replacement), and then every rank of the new group takes part in one exchange:
each says whether it holds the training state and at which step; the lowest rank holding the newest step
broadcasts its state (model, optimizer, scaler, progress) to the ranks that do not hold it (a joiner, a survivor
a step behind), over a group of just those ranks. Nobody holding state (the whole gang was replaced) means the
volume. A joiner (a replacement, a placed spare) comes in at a step boundary the same way.

A survivor that cannot take this path notes why in the store (`<prefix of its generation>fallback`), so that
rank 0 of the generation that resumes from the volume reports the reason (its `recovery` timeline).

A warm spare (the agent sets SPARE_PLACE_ENV in its trainers' environment, a store key of its own) starts its
trainer before it has a place: the trainer builds what does not depend on its rank, then waits for the agent
to write its assignment under that key (`Rendezvous.wait_place`) and joins the generation it was given.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .contract import INPROCESS_ENV, REPLICA_INDEX_ENV, SPARE_PLACE_ENV
from .distributed import abort_process_groups, is_peer_failure
from .store_client import ReconnectingStore
# The launcher's keys (operator/ddpjob_operator launcher), the newest generation and its node range, and the views.
from .membership import GENERATION_KEY as GENERATION_KEY, NNODES_KEY as NNODES_KEY
from .membership import CannotRecover, Membership, node_range, view_name
from .views import View

log = logging.getLogger(__name__)

ENDPOINT_ENV = "PET_RDZV_ENDPOINT"  # the job's rendezvous store, as torchrun's --rdzv-endpoint
REJOIN_TIMEOUT_S = 120.0  # without contract.REJOIN_TIMEOUT_ENV (the operator always sets it)
GROUP_PREFIX = "ddpjob/{uid}/inprocess/g{generation}/"
FALLBACK = "fallback"  # under a generation's GROUP_PREFIX: why its survivors took the exit path
FALLBACK_LOOKBACK = 32  # generations before this one whose fallback notes rank 0 reads (one store round trip each)
# A warm spare's trainer finds, under contract.SPARE_PLACE_ENV, the store key its agent writes the spare's assignment
# to ({"index", "generation", ...}: the operator's answer, once the agent published the generation).
SPARE_BUILT_KEY = "{place}/built/{local_rank}"  # set once built: the agent marks the spare ready after all of them
CONNECT_TIMEOUT_S = 60.0  # every rank has arrived: the group's own connections take this at most
# A view closed after a failure (or a first start) holds members that all arrived just before: its group forms within
# this, or one of them was lost meanwhile and every other member takes the failure path again. A joiner placed at
# a step boundary waits for the members' next step as well: CONNECT_TIMEOUT_S.
FORM_TIMEOUT_S = 15.0
LEAVE_TIMEOUT_S = 10.0
POLL_S = 0.05
# torch's NCCL watchdog, on a failed or timed-out collective: 2 (CleanUpOnly) aborts the communicator and raises
# the error in this process; 1 and 3 (torch's default) end the process, which leaves no survivor to recover.
NCCL_ERRORS_ENV, NCCL_ERRORS_RAISE = "TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"
BUCKET_BYTES = 64 << 20  # the state travels in buckets of this size: one extra bucket of memory, not a replica
_ALIGN = 64
_RUN_ID = re.compile(r"^(?P<uid>.+)-g(?P<generation>\d+)$")


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(INPROCESS_ENV, "") == "1"


def max_nodes(nnodes: str) -> int:
    """The generation's size from its node range: "2:3" -> 3, "3" -> 3."""
    return node_range(nnodes)[1]


def split_run_id(run_id: str) -> tuple[str, int]:
    """(job uid, generation) of the operator's rendezvous id `<uid>-g<N>`."""
    m = _RUN_ID.match(run_id)
    if not m:
        raise ValueError(f"rendezvous id {run_id!r} is not <job uid>-g<generation>")
    return m["uid"], int(m["generation"])


@dataclass(frozen=True)
class Seat:
    """Where a trainer sits in every generation: its pod's replica index and its local rank."""

    replica_index: int
    local_rank: int
    nproc: int

    @property
    def rank(self) -> int:
        return self.replica_index * self.nproc + self.local_rank


def nccl_errors_raise() -> None:
    """NCCL groups made from here on raise a failed collective's error in this process (read by torch when it
    builds a group; the operator sets it so for in-process jobs, this covers a trainer started otherwise)."""
    was = os.environ.get(NCCL_ERRORS_ENV)
    if was != NCCL_ERRORS_RAISE:
        os.environ[NCCL_ERRORS_ENV] = NCCL_ERRORS_RAISE
        if was is not None:
            log.warning("%s=%s would end this process on a failed NCCL collective; in-process recovery sets it to %s",
                        NCCL_ERRORS_ENV, was, NCCL_ERRORS_RAISE)


def choose_source(table: list[tuple[bool, int]]) -> tuple[int, list[int]] | None:
    """From each rank's (holds the state, its step): the rank that sends (the lowest holding the newest
    step) and the ranks that receive (all others but those holding that same step); None: nobody holds it."""
    held = [(step, rank) for rank, (has, step) in enumerate(table) if has]
    if not held:
        return None
    newest = max(step for step, _ in held)
    source = min(rank for step, rank in held if step == newest)
    receivers = [rank for rank, (has, step) in enumerate(table) if not (has and step == newest)]
    return source, receivers


# ---- the state as a skeleton (pickled) plus its tensors (sent as bytes, in buckets) ---------------------

@dataclass(frozen=True)
class _Slot:
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    on_cpu: bool = True  # where the sender keeps it (an optimizer's step counter stays on the CPU next to CUDA)


def flatten(state: Any, tensors: list[torch.Tensor] | None = None) -> tuple[Any, list[torch.Tensor]]:
    """`state` with every tensor replaced by a `_Slot`, and the tensors in slot order."""
    tensors = [] if tensors is None else tensors
    if isinstance(state, torch.Tensor):
        tensors.append(state.detach())
        return _Slot(len(tensors) - 1, tuple(state.shape), state.dtype, state.device.type == "cpu"), tensors
    if isinstance(state, dict):
        return {k: flatten(v, tensors)[0] for k, v in state.items()}, tensors
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return type(state)(flatten(v, tensors)[0] for v in state), tensors
    return state, tensors


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return {k: unflatten(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)) and not hasattr(skeleton, "_fields"):
        return type(skeleton)(unflatten(v, tensors) for v in skeleton)
    return skeleton


def slots_of(skeleton: Any) -> list[_Slot]:
    if isinstance(skeleton, _Slot):
        return [skeleton]
    values = skeleton.values() if isinstance(skeleton, dict) else \
        skeleton if isinstance(skeleton, (list, tuple)) and not hasattr(skeleton, "_fields") else ()
    return sorted((s for v in values for s in slots_of(v)), key=lambda s: s.index)


def nbytes(slot: _Slot) -> int:
    return int(torch.Size(slot.shape).numel()) * torch.empty((), dtype=slot.dtype).element_size()


def buckets(sizes: list[int], limit: int = BUCKET_BYTES) -> list[list[tuple[int, int]]]:
    """Consecutive tensors grouped into buckets of at most `limit` bytes (a larger tensor alone in its
    own): each bucket a list of (tensor index, byte offset), offsets aligned for any dtype's view."""
    out: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    offset = 0
    for i, size in enumerate(sizes):
        if current and offset + size > limit:
            out.append(current)
            current, offset = [], 0
        current.append((i, offset))
        offset += -(-size // _ALIGN) * _ALIGN
    if current:
        out.append(current)
    return out


def destinations(skeleton: Any, into: Any, device: torch.device) -> dict[int, torch.Tensor]:
    """The tensors of `into` (the receiver's own state, as built) that a slot of `skeleton` lands in as it is:
    the same place in the structure, shape, dtype and device, and contiguous."""
    if isinstance(skeleton, _Slot):
        return {skeleton.index: into.detach()} if fits(into, skeleton.shape, skeleton.dtype, device) else {}
    if isinstance(skeleton, dict) and isinstance(into, dict):
        return {i: t for k, v in skeleton.items() if k in into for i, t in destinations(v, into[k], device).items()}
    if isinstance(skeleton, (list, tuple)) and isinstance(into, (list, tuple)) and len(skeleton) == len(into):
        return {i: t for v, w in zip(skeleton, into) for i, t in destinations(v, w, device).items()}
    return {}


def fits(tensor: Any, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> bool:
    """`tensor` can receive a slot of this shape and dtype on `device` as it is (contiguous)."""
    return isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == shape and tensor.dtype == dtype \
        and tensor.device == device and tensor.is_contiguous()


def broadcast_state(state: dict[str, Any] | None, source: int, group: dist.ProcessGroup | None,
                    device: torch.device, into: dict[str, Any] | None = None,
                    prepared: Mapping[int, torch.Tensor] | None = None) -> dict[str, Any]:
    """Every member of `group`: `state` of global rank `source` (its own elsewhere ignored). `into`: a receiver's
    own state as built (its model's parameters): tensors that match are received in place (no second copy of
    them in memory, no pages to fault in, nothing for `load_state_dict` to copy); `prepared`: memory it touched
    before it arrived, by slot (runtime/layout.py), used where the slot still fits; the rest into new tensors."""
    mine = dist.get_rank() == source
    skeleton, tensors = flatten(state) if mine else (None, [])
    box = [skeleton]
    dist.broadcast_object_list(box, src=source, group=group, device=device if device.type == "cuda" else None)
    skeleton = box[0]
    slots = slots_of(skeleton)
    sizes = [nbytes(s) for s in slots]
    own = destinations(skeleton, into, device) if into is not None and not mine else {}
    if not mine:
        own.update({i: t for i, t in (prepared or {}).items()
                    if i not in own and i < len(slots) and fits(t, slots[i].shape, slots[i].dtype, device)})
    received: list[torch.Tensor] = [torch.empty(0)] * len(slots)
    for bucket in buckets(sizes):
        last, last_offset = bucket[-1]
        if len(bucket) == 1 and sizes[last] >= BUCKET_BYTES // 2:  # a large tensor travels as itself: no copy
            slot = slots[last]
            tensor = tensors[last].to(device).contiguous() if mine else \
                own[last] if last in own else torch.empty(slot.shape, dtype=slot.dtype, device=device)
            dist.broadcast(tensor.reshape(-1).view(torch.uint8), src=source, group=group)
            received[last] = tensor
            continue
        total = last_offset + sizes[last]
        buf = torch.empty(total, dtype=torch.uint8, device=device)
        if mine:
            for i, offset in bucket:
                if sizes[i]:
                    buf[offset:offset + sizes[i]].copy_(tensors[i].contiguous().reshape(-1).view(torch.uint8))
        dist.broadcast(buf, src=source, group=group)
        if not mine:
            for i, offset in bucket:
                view = buf[offset:offset + sizes[i]].view(slots[i].dtype).reshape(slots[i].shape)
                received[i] = own[i].copy_(view) if i in own else view
    if mine:
        return state
    if device.type != "cpu":
        received = [t.cpu() if slot.on_cpu else t for t, slot in zip(received, slots)]
    return unflatten(skeleton, received)


# ---- the job's store: generations and the group of each ------------------------------------------------

class Rendezvous:
    """This trainer's seat and the job's store: publishes nothing (the launchers do), reads the newest
    generation, forms and leaves the default process group of one generation."""

    def __init__(self, store: dist.Store, uid: str, seat: Seat, *, backend: str) -> None:
        self.store, self.uid, self.seat, self.backend = store, uid, seat, backend
        self.view: View | None = None  # the one whose group this process is in
        self.membership = Membership(store, uid, seat.nproc, lambda: self.seat.rank)
        self.place_key: str | None = None  # a warm spare's, until it has its place (wait_place)
        self.started_for = 0  # the generation this process was started for (a spare: the one it is placed in)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], backend: str) -> "Rendezvous":
        """This process's rendezvous (its seat, the job's store, `started_for`) from the launch contract's
        variables."""
        endpoint = environ.get(ENDPOINT_ENV, "")
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise CannotRecover(f"{INPROCESS_ENV}=1 needs {ENDPOINT_ENV}=<host>:<port> (the job's rendezvous store), "
                                f"got {endpoint!r}")
        run_id = environ.get("TORCHELASTIC_RUN_ID") or environ.get("PET_RDZV_ID", "")
        try:
            uid, generation = split_run_id(run_id)
            replica = int(environ.get(REPLICA_INDEX_ENV, ""))
            seat = Seat(replica, int(environ.get("LOCAL_RANK", "0")), int(environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError as e:
            raise CannotRecover(f"{INPROCESS_ENV}=1 needs TORCHELASTIC_RUN_ID (or PET_RDZV_ID) <uid>-g<N>, "
                                f"{REPLICA_INDEX_ENV}, LOCAL_RANK and LOCAL_WORLD_SIZE: {e}") from None
        place_key = environ.get(SPARE_PLACE_ENV, "")
        if (replica < 0 and not place_key) or not 0 <= seat.local_rank < seat.nproc:
            raise CannotRecover(f"no seat for replica index {replica}, local rank {seat.local_rank} of {seat.nproc}")
        # Reconnects to a lost store's successor (same endpoint): the operator keeps the gang (issue 36).
        store = ReconnectingStore(host, int(port), timeout=datetime.timedelta(seconds=CONNECT_TIMEOUT_S))
        rdzv = cls(store, uid, seat, backend=backend)
        store.on_reconnect(lambda: rdzv.membership.republish(rdzv.view))  # a lost store comes back empty
        rdzv.place_key, rdzv.started_for = place_key or None, generation
        return rdzv

    def wait_place(self, stopped: Callable[[], bool]) -> int | None:
        """A warm spare: wait for its assignment (written by its agent under `place_key` once the generation it
        takes a place in is published); this trainer's seat is then that place. The generation; None: stopped."""
        key = self.place_key
        self.store.set(SPARE_BUILT_KEY.format(place=key, local_rank=self.seat.local_rank), str(os.getpid()))
        while not self.store.check([key]):
            if stopped():
                return None
            time.sleep(POLL_S)
        given = json.loads(self.store.get(key))
        index, generation = given.get("index"), given.get("generation")
        if not (isinstance(index, int) and isinstance(generation, int) and index >= 0 and generation >= 0):
            raise CannotRecover(f"the spare's assignment under {key} is not {{index, generation}}: {str(given)[:200]}")
        self.seat = Seat(index, self.seat.local_rank, self.seat.nproc)
        self.place_key = None
        return generation

    def note_fallback(self, generation: int, reason: str) -> None:
        """Why the survivors of `generation` take the exit path, for the next generation's rank 0 (the first
        note stays). Best effort: a lost store loses only the reason."""
        try:
            self.store.compare_set(GROUP_PREFIX.format(uid=self.uid, generation=generation) + FALLBACK, "", reason)
        except RuntimeError:
            pass

    def fallback_reason(self, generation: int, since: int | None = None) -> str | None:
        """The newest fallback note of a generation before `generation` (back to `since`, the one the state
        resumed from the volume was saved in, at most FALLBACK_LOOKBACK), None where there is none."""
        oldest = max(0, generation - FALLBACK_LOOKBACK, since if since is not None else 0)
        for g in range(generation - 1, oldest - 1, -1):
            key = GROUP_PREFIX.format(uid=self.uid, generation=g) + FALLBACK
            if self.store.check([key]):
                return self.store.get(key).decode("utf-8", "replace")
        return None

    def form(self, view: View, device: torch.device, timeout_s: float) -> None:
        """The default process group of `view`, this trainer's seat at its rank (every member calls this)."""
        backend = self.backend if self.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        if backend == "nccl":
            nccl_errors_raise()
        self.view = view  # from here on a failure is this view's (its successor is the next one)
        within = CONNECT_TIMEOUT_S if self.membership.kind(view) == "Join" else FORM_TIMEOUT_S
        try:
            dist.init_process_group(backend=backend,
                                    store=dist.PrefixStore(self.membership.key(view, "group/"), self.store),
                                    rank=view.rank_of(self.seat.rank), world_size=view.size,
                                    timeout=datetime.timedelta(seconds=min(timeout_s, within)),
                                    device_id=device if device.type == "cuda" else None)
        except BaseException:
            # torch counted the group it could not form, and names the next default group's store keys by that
            # count: 1 here, 0 in every member that formed none before (torch 2.13 resets it only on a destroy).
            dist.distributed_c10d._world.group_count = 0
            raise
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s), None)

    def join(self, generation: int, device: torch.device, timeout_s: float, stopped: Callable[[], bool]) -> View:
        """A fresh trainer (first start, replacement, placed spare): its place in a view of `generation` or a newer
        one (`Membership.wait_placed`), then that view's group; a view that does not form (a member lost meanwhile):
        a place again."""
        while True:
            view = self.membership.wait_placed(generation, stopped)
            self.membership.start_boundary_checks()
            try:
                self.form(view, device, timeout_s)
                return view
            except Exception as e:  # noqa: BLE001 - a peer's failure is told apart below, the rest re-raised
                if not is_peer_failure(e):
                    raise
                log.warning("view %s did not form (%s): waiting for a place again", view_name(view),
                            str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
                generation = view.generation

    def leave(self, groups: list[dist.ProcessGroup | None]) -> None:
        """Out of the failed generation's groups (`groups`: side groups, None the default group). NCCL: abort
        first, which fails whatever is still queued on them; then destroy. A destroy that does not return
        within LEAVE_TIMEOUT_S (a Gloo wait nothing can cut short) raises CannotRecover."""
        if not dist.is_initialized():
            return
        done = threading.Event()
        errors: list[BaseException] = []

        def destroy() -> None:
            try:
                abort_process_groups(groups)
                dist.destroy_process_group()
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                errors.append(e)
            finally:
                done.set()

        threading.Thread(target=destroy, name="ddpjob-leave-group", daemon=True).start()
        if not done.wait(LEAVE_TIMEOUT_S):
            raise CannotRecover(f"the process group of generation {self._name()} could not be left within "
                                f"{LEAVE_TIMEOUT_S:g} s (a wait inside it cannot be cut short)")
        if errors:
            raise CannotRecover(f"leaving the process group of generation {self._name()} failed: "
                                f"{type(errors[0]).__name__}: {errors[0]}")

    def _name(self) -> str:
        return "?" if self.view is None else str(self.view.generation)

    def exchange(self, held: Callable[[], dict[str, Any]] | None, step: int, device: torch.device,
                 into: Callable[[], dict[str, Any]] | None = None, prepared: Mapping[int, torch.Tensor] | None = None
                 ) -> tuple[dict[str, Any] | None, int | None, int | None, bool]:
        """Every rank of the new group: (the state received, or None where this rank holds the newest one
        or nobody holds any; the rank it came from, None: nobody holds it, the volume; its step; whether rank 0
        held a state: the previous generation's checkpoint writer lives on in this one, a rank's seat being its
        rank). `into`: a process that holds no state yet, its own as built, to receive in place, and `prepared`
        the memory it touched for the rest (`broadcast_state`)."""
        world, rank = dist.get_world_size(), dist.get_rank()
        mine = torch.tensor([1 if held is not None else 0, step if held is not None else -1], dtype=torch.int64,
                            device=device)
        rows = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(rows, mine)
        table = [(bool(r[0]), int(r[1])) for r in torch.stack(rows).tolist()]
        writer_kept = table[0][0]
        choice = choose_source(table)
        if choice is None:
            return None, None, None, writer_kept
        source, receivers = choice
        newest = table[source][1]
        if not receivers:
            return None, source, newest, writer_kept
        members = sorted([source, *receivers])
        group = dist.new_group(members) if len(members) < world else None  # every rank calls new_group
        if rank not in members:
            return None, source, newest, writer_kept
        try:
            state = broadcast_state(held() if rank == source else None, source, group, device,
                                    into=into() if into is not None and rank in receivers else None,
                                    prepared=prepared if rank in receivers else None)
        finally:
            if group is not None:
                dist.destroy_process_group(group)
        return (state if rank in receivers else None), source, newest, writer_kept
