"""The state's layout in the job's store, so that a joiner prepares the memory it receives into before it arrives.

A replacement (or a spare) receives most of its state into memory it never touched: a fresh optimizer holds no
state, so a peer's AdamW moments land in new tensors, and each of their pages is faulted in while the survivors
wait in the hand-over (1 GB took 6 s on a loaded 2-core machine against 1 s into touched memory). Rank 0 of each
view therefore publishes, after the view's first step, what the state holds: each tensor's path, shape and dtype
(JSON, never a pickle: the store is reachable by anything on the job's network). A trainer started with
`build_first=True` reads it before it arrives, allocates and touches a tensor for every entry its own state
(`into`) does not hold in place, and `broadcast_state` receives into those where the slot still fits.

A step needs memory beyond the state, too (gradients, DDP's buckets, the optimizer's temporaries: about the state's
size again at 1 GB), and the joiner's first step is its first touch of it, while the survivors wait at the
all-reduce. Where freed memory goes back to the host (a VM's free page reporting, as on the bench machine) that
first touch is slow. So the layout also carries the publisher's peak resident memory, and a joiner on the CPU holds
a touched scratch block up to that peak through its arrival and hand-over, freed just before its first step
(`Prepared.release`), whose memory then comes from pages this process touched moments ago. At 1 GB the join's pause
measured from the survivors' step lines went from 2.1-2.7 s to 1.1 s (docs/benchmarks.md, bench/recovery.py).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .inprocess import fits
from .membership import PREFIX

log = logging.getLogger(__name__)

LAYOUT_KEY = PREFIX + "layout"
PREPARE_FACTOR = 4  # a layout asking for more than this many times the joiner's own state is not prepared for
SCRATCH_MIN_BYTES = 16 * 2**20  # less than this is not worth holding
Path = tuple[str | int, ...]


@dataclass
class Prepared:
    """What a joiner touched before arriving: tensors to receive into, by slot, and the scratch held for its first
    step (released right after the hand-over)."""
    slots: dict[int, torch.Tensor] = field(default_factory=dict)
    scratch: torch.Tensor | None = None

    def release(self) -> None:
        self.slots, self.scratch = {}, None


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_resident_bytes() -> int | None:
    """This process's largest resident memory so far (Linux reports KiB; None elsewhere)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 if sys.platform.startswith("linux") else None


def tensors_by_path(state: Any, path: Path = ()) -> list[tuple[Path, torch.Tensor]]:
    """Every tensor of `state` with its path of dict keys (str or int) and list positions, in `flatten`'s order
    (runtime/inprocess.py: the slot order); under a key of another type the path holds None (never prepared)."""
    if isinstance(state, torch.Tensor):
        return [(path, state)]
    if isinstance(state, dict):
        return [found for k, v in state.items()
                for found in tensors_by_path(v, (*path, k) if isinstance(k, (str, int)) else (*path, None))]
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return [found for i, v in enumerate(state) for found in tensors_by_path(v, (*path, i))]
    return []


def describe(state: dict[str, Any], peak_resident: int | None = None) -> str:
    """The layout of `state` as JSON: [path, shape, dtype] per tensor, in slot order, and the publisher's peak
    resident memory in bytes (null: unknown)."""
    return json.dumps({"tensors": [[list(path) if None not in path else None, list(t.shape),
                                    str(t.dtype).removeprefix("torch.")] for path, t in tensors_by_path(state)],
                       "peak_resident_bytes": peak_resident})


class Publisher:
    """Rank 0's layout in the store: once per view, after its first step (the optimizer's state exists from then
    on), and again after the store came back empty (`ReconnectingStore.on_reconnect`: the old store's keys are
    gone with it, and a joiner would receive into fresh memory until the next view)."""

    def __init__(self, store: Any, uid: str) -> None:
        self.store, self.uid = store, uid
        self._published_for: Any = None  # the view of the layout in the store now
        if hasattr(store, "on_reconnect"):
            store.on_reconnect(self._forget)

    def _forget(self) -> None:
        self._published_for = None

    def stepped(self, view: Any, state: Callable[[], dict[str, Any]]) -> None:
        """After an optimizer step of `view`: its layout published, unless the store holds it already. The write is
        on a thread: a lost store must not hold a step up."""
        if view == self._published_for:
            return
        self._published_for = view
        text = describe(state(), peak_resident_bytes())

        def write() -> None:
            try:
                self.store.set(LAYOUT_KEY.format(uid=self.uid), text)
            except RuntimeError as e:  # the store lost: a joiner then receives into fresh memory, as before
                log.info("could not publish the state's layout for joiners: %s", e)

        threading.Thread(target=write, name="ddpjob-publish-layout", daemon=True).start()


def prepare(store: Any, uid: str, into: dict[str, Any], device: torch.device) -> Prepared:
    """A trainer about to arrive: for each slot of the published layout that `into` (its own state as built) does
    not hold with the same shape and dtype, a tensor allocated and touched now, and on the CPU a touched scratch
    block that brings this process up to the publisher's peak; nothing when there is no layout (the first view, a
    store recreated empty) or it is not one (checked field by field). Everything together stays within
    PREPARE_FACTOR times the joiner's own state."""
    key = LAYOUT_KEY.format(uid=uid)
    try:
        if not store.check([key]):
            return Prepared()
        entries, peak = _checked(json.loads(store.get(key)))
        own = {path: t for path, t in tensors_by_path(into)}
        wanted = [(i, shape, dtype) for i, (path, shape, dtype) in enumerate(entries)
                  if not fits(own.get(tuple(path) if path is not None else None), shape, dtype, device)]
    except (RuntimeError, ValueError, TypeError) as e:
        log.info("not preparing memory for the state: its layout in the store cannot be used (%s)", str(e)[:200])
        return Prepared()
    budget = PREPARE_FACTOR * sum(t.numel() * t.element_size() for t in own.values())
    asked = sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() for _, shape, dtype in wanted)
    if asked > budget:
        log.info("not preparing memory for the state: its layout asks for %d bytes, over %d x this trainer's own",
                 asked, PREPARE_FACTOR)
        return Prepared()
    slots = {i: torch.zeros(shape, dtype=dtype, device=device) for i, shape, dtype in wanted}  # zeros: touched
    return Prepared(slots, _scratch(peak, device, budget - asked))


def _scratch(peak: int | None, device: torch.device, budget: int) -> torch.Tensor | None:
    """Touched host memory up to the publisher's peak (its step's transients), within `budget`; None on a GPU (a
    step's transients are the device's) or where the numbers are unknown."""
    now = resident_bytes()
    if device.type != "cpu" or peak is None or now is None:
        return None
    size = min(peak - now, budget)
    return torch.zeros(size, dtype=torch.uint8) if size >= SCRATCH_MIN_BYTES else None


def _checked(layout: Any) -> tuple[list[tuple[list[str | int] | None, tuple[int, ...], torch.dtype]], int | None]:
    """The layout's tensor entries and peak (None where it is no size), or ValueError."""
    if not (isinstance(layout, dict) and isinstance(layout.get("tensors"), list)):
        raise ValueError("not an object with a list of tensors")
    peak = layout.get("peak_resident_bytes")
    entries = layout["tensors"]
    out = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ValueError("an entry is not [path, shape, dtype]")
        path, shape, dtype = entry
        if path is not None and not (isinstance(path, list) and all(type(k) in (str, int) for k in path)):
            raise ValueError("a path is not a list of keys")
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            raise ValueError("a shape is not a list of sizes")
        found = getattr(torch, dtype, None) if isinstance(dtype, str) and dtype.isidentifier() else None
        if not isinstance(found, torch.dtype):
            raise ValueError(f"{str(dtype)[:40]!r} is no dtype")
        out.append((path, tuple(shape), found))
    return out, peak if type(peak) is int and peak >= 0 else None

