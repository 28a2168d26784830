"""The state's layout in the job's store, so that a joiner prepares the memory it receives into before it arrives.

A replacement (or a spare) receives most of its state into memory it never touched: a fresh optimizer holds no
state, so a peer's AdamW moments land in new tensors, and each of their pages is faulted in while the survivors
wait in the hand-over (1 GB took 6 s on a loaded 2-core machine against 1 s into touched memory). Rank 0 of each
view therefore publishes, after the view's first step, what the state holds: each tensor's path, shape and dtype
(JSON, never a pickle: the store is reachable by anything on the job's network). A trainer started with
`build_first=True` reads it before it arrives, allocates and touches a tensor for every entry its own state
(`into`) does not hold in place, and `broadcast_state` receives into those where the slot still fits.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import torch

from .inprocess import fits
from .membership import PREFIX

log = logging.getLogger(__name__)

LAYOUT_KEY = PREFIX + "layout"
PREPARE_FACTOR = 4  # a layout asking for more than this many times the joiner's own state is not prepared for
Path = tuple[str | int, ...]


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


def describe(state: dict[str, Any]) -> str:
    """The layout of `state` as JSON: [path, shape, dtype] per tensor, in slot order."""
    return json.dumps([[list(path) if None not in path else None, list(t.shape), str(t.dtype).removeprefix("torch.")]
                       for path, t in tensors_by_path(state)])


def publish(store: Any, uid: str, state: dict[str, Any]) -> None:
    """Rank 0 of a view: the layout into the store, on a thread (a lost store must not hold a step up)."""
    text = describe(state)

    def write() -> None:
        try:
            store.set(LAYOUT_KEY.format(uid=uid), text)
        except RuntimeError as e:  # the store lost: a joiner then receives into fresh memory, as before
            log.info("could not publish the state's layout for joiners: %s", e)

    threading.Thread(target=write, name="ddpjob-publish-layout", daemon=True).start()


def prepare(store: Any, uid: str, into: dict[str, Any], device: torch.device) -> dict[int, torch.Tensor]:
    """A trainer about to arrive: for each slot of the published layout that `into` (its own state as built) does
    not hold with the same shape and dtype, a tensor allocated and touched now; {} when there is no layout (the
    first view, a store recreated empty) or it is not one (checked field by field, and bounded in size)."""
    key = LAYOUT_KEY.format(uid=uid)
    try:
        if not store.check([key]):
            return {}
        entries = json.loads(store.get(key))
        own = {path: t for path, t in tensors_by_path(into)}
        wanted = [(i, shape, dtype) for i, (path, shape, dtype) in enumerate(_checked(entries))
                  if not fits(own.get(tuple(path) if path is not None else None), shape, dtype, device)]
    except (RuntimeError, ValueError, TypeError) as e:
        log.info("not preparing memory for the state: its layout in the store cannot be used (%s)", str(e)[:200])
        return {}
    budget = PREPARE_FACTOR * sum(t.numel() * t.element_size() for t in own.values())
    asked = sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() for _, shape, dtype in wanted)
    if asked > budget:
        log.info("not preparing memory for the state: its layout asks for %d bytes, over %d x this trainer's own",
                 asked, PREPARE_FACTOR)
        return {}
    return {i: torch.zeros(shape, dtype=dtype, device=device) for i, shape, dtype in wanted}  # zeros: touched


def _checked(entries: Any) -> list[tuple[list[str | int] | None, tuple[int, ...], torch.dtype]]:
    if not isinstance(entries, list):
        raise ValueError("not a list")
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
    return out

