"""Who trains together (issue 36, elastic in place): the views of an in-process job, kept in the job's store.

A view (runtime/views.py) is closed once, by whoever gets there first, under `ddpjob/<uid>/inprocess/`:

    g<g>/r<k>/members    {"members": [...], "world": W, "kind": Shrink|Join|null}, the view's seats (its
                         process-group ranks in order) and what it is to their recovery timelines
    g<g>/r<k>/group/     the PrefixStore its process group forms through
    g<g>/r<k>/next       "g:k" of the view that succeeds it (compare_set: set once, the loser reads the winner's)
    g<g>/r<k>/left/<s>   a member of the view arrived at its successor (after a failure)
    g<g>/rounds          a generation's round counter (round 0: its first group, formed by every seat)
    g<g>/arrived/<s>     a fresh trainer (first start, replacement, placed spare, late survivor) waits for a place
    g<g>/placed/<s>      "g:k" of the view it was put in (compare_set)
    arrivals             every arrival counts here: rank 0's check at a step boundary is one read of this and
                         the newest generation

A survivor of a failure never waits for a replacement: it closes the failed view's successor from the members
that arrived there and the joiners waiting, once every member arrived or SETTLE_S after its own arrival, as long
as they are at least the newest generation's minimum; a joiner is put into a view by the live view's rank 0 at a
step boundary (or by the survivors closing one), and where no view lives, round 0 forms once every seat arrived.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from .views import View

log = logging.getLogger(__name__)

PREFIX = "ddpjob/{uid}/inprocess/"
GENERATION_KEY = "ddpjob/{uid}/generation"  # the launcher's: the newest generation and its node range
NNODES_KEY = "ddpjob/{uid}/nnodes/{generation}"
# The survivors of one failure reach the failed view's successor within about a second of each other (each one's
# collective fails as soon as the dead peer's connections close, or as soon as a survivor blocked on it leaves):
# waiting this long for the others lets one close take them all, where closing at once would leave the later ones
# to join a step later; and it is all a shrink waits.
SETTLE_S = 1.0
JOIN_TIMEOUT_S = 600.0  # a fresh trainer is given a place within this (every seat of a first group: pods' starts)
POLL_S = 0.05
FINISHED = "finished"  # under PREFIX: set by rank 0 once the job trained its last step (Job.result)


class CannotRecover(RuntimeError):
    """In-process recovery is not possible here; the message says why (the trainer exits as before)."""


class JobFinished(SystemExit):
    """The job trained its last step while this trainer waited for a place: nothing is left to join, and its
    pod completes like the others' (exit 0), so that a job waiting for every worker is not held by it."""

    def __init__(self) -> None:
        super().__init__(0)


def node_range(nnodes: str) -> tuple[int, int]:
    """(fewest, most) nodes of a generation's node range: "2:3" -> (2, 3), "3" -> (3, 3)."""
    low, colon, high = nnodes.partition(":")
    try:
        fewest, most = int(low), int(high if colon else low)
    except ValueError:
        fewest = most = 0
    if not 1 <= fewest <= most:
        raise ValueError(f"node range {nnodes!r} is not MIN:MAX or N with 1 <= MIN <= MAX")
    return fewest, most


def view_name(view: View) -> str:
    return f"{view.generation}:{view.round}"


@dataclass(frozen=True)
class Change:
    """What a step boundary's regroup does: the successor view, and the joiners it takes in."""

    successor: View
    joiners: tuple[int, ...]


class Membership:
    """One trainer's side of the protocol: `seat` is its logical rank (replica index x nproc + local rank)."""

    def __init__(self, store: dist.Store, uid: str, nproc: int, seat: Callable[[], int]) -> None:
        self.store, self.uid, self.nproc, self._seat = store, uid, nproc, seat
        self.prefix = PREFIX.format(uid=uid)
        self.seen: tuple[bytes, bytes] | None = None  # (newest generation, arrivals) at the last boundary check
        self.said_below_minimum = False
        self.recreated = False  # the store was lost and this trainer reconnected to its empty successor
        # The newest generation whose node range this trainer read: its launcher published both, and publishes them
        # again only at its own next store call after the store's loss (rarely, in process), which the next
        # recovery or joiner cannot wait for.
        self.launched: tuple[int, str] | None = None

    @property
    def seat(self) -> int:
        return self._seat()

    # ---- reading ------------------------------------------------------------------------------

    def newest(self) -> int | None:
        key = GENERATION_KEY.format(uid=self.uid)
        return int(self.store.get(key)) if self.store.check([key]) else None

    def ranks(self, generation: int) -> tuple[int, int]:
        """(fewest ranks, world) of `generation`: its node range x processes per node."""
        key = NNODES_KEY.format(uid=self.uid, generation=generation)
        if not self.store.check([key]):
            raise CannotRecover(f"generation {generation} has no node range in the store ({key})")
        nnodes = self.store.get(key).decode()
        fewest, most = node_range(nnodes)
        if self.launched is None or generation >= self.launched[0]:
            self.launched = (generation, nnodes)
        return fewest * self.nproc, most * self.nproc

    def key(self, view_or_generation: View | int, name: str) -> str:
        if isinstance(view_or_generation, View):
            return f"{self.prefix}g{view_or_generation.generation}/r{view_or_generation.round}/{name}"
        return f"{self.prefix}g{view_or_generation}/{name}"

    def view(self, name: str) -> View:
        """The view named "g:k" (its members key is written before any key names it). CannotRecover where the store
        holds something else (written by no trainer of this version): nothing to join."""
        body = b""
        try:
            generation, _, round_ = name.partition(":")
            g, k = int(generation), int(round_)
            body = self.store.get(f"{self.prefix}g{g}/r{k}/members")
            found = json.loads(body)
            return View(g, k, tuple(found["members"]), int(found["world"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CannotRecover(f"view {name[:40]!r} in the job's store is not a generation:round with "
                                f"{{members, world}} ({type(e).__name__}: {e}; {body[:200]!r})") from None

    def successor_of(self, view: View) -> View | None:
        key = self.key(view, "next")
        return self.view(self.store.get(key).decode()) if self.store.check([key]) else None

    def joiners(self, generation: int, world: int, besides: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Seats of `generation` whose fresh trainers arrived and were not placed (a seat of `besides`, one that
        trains already, is not a joiner)."""
        return tuple(s for s in range(world) if s not in besides and self.store.check([self.key(generation, f"arrived/{s}")])
                     and not self.store.check([self.key(generation, f"placed/{s}")]))

    # ---- closing a view -----------------------------------------------------------------------

    def close(self, before: View | None, generation: int, members: list[int], world: int,
              kind: str | None = None) -> View:
        """A new round of `generation` with `members`, as `before`'s successor (None: round 0, every seat); the
        view that won (another process may have closed it first), its joiners placed. `kind`: what it is to its
        members' recovery timelines (Shrink, Join; None: whole again after a failure, or a first start)."""
        if before is None:
            candidate = View(generation, 0, tuple(members), world)
            self.store.compare_set(self.key(candidate, "members"), "", self._members_json(candidate, kind))
            closed = self.view(view_name(candidate))
        else:
            candidate = View(generation, int(self.store.add(self.key(generation, "rounds"), 1)), tuple(members), world)
            self.store.set(self.key(candidate, "members"), self._members_json(candidate, kind))  # a round of its own
            closed = self.view(self.store.compare_set(self.key(before, "next"), "", view_name(candidate)).decode())
        for seat in closed.members:  # the joiners among them wait for this (a member's own place is never read)
            self.store.compare_set(self.key(closed.generation, f"placed/{seat}"), "", view_name(closed))
        return closed

    @staticmethod
    def _members_json(view: View, kind: str | None) -> str:
        return json.dumps({"members": list(view.members), "world": view.world, "kind": kind})

    def kind(self, view: View) -> str | None:
        """What `view` is to its members' recovery timelines, as its closer wrote it (every member reads the same)."""
        try:
            kind = json.loads(self.store.get(self.key(view, "members"))).get("kind")
        except (RuntimeError, ValueError, AttributeError):  # the store lost, or not a trainer's: only a timeline's kind
            return None
        return kind if kind in ("Shrink", "Join") else None

    # ---- a fresh trainer: arrive, wait for a place ---------------------------------------------

    def arrive(self, generation: int) -> None:
        """This trainer waits for a place in `generation`; a place it had there before (a survivor left out of its
        view's successor) is forgotten first."""
        self.store.delete_key(self.key(generation, f"placed/{self.seat}"))
        self.store.set(self.key(generation, f"arrived/{self.seat}"), str(os.getpid()))
        self.store.add(f"{self.prefix}arrivals", 1)

    def wait_placed(self, generation: int, stopped: Callable[[], bool], timeout_s: float = JOIN_TIMEOUT_S) -> View:
        """Arrive in `generation` (or the newest one, published meanwhile) and wait to be placed in a view: by the
        live view's rank 0 at a step boundary, by survivors closing a view, or in round 0 once every seat of the
        generation arrived (nobody trains). CannotRecover: no seat for this trainer, stopped, or past `timeout_s`."""
        generation = max(generation, self.newest() or 0)
        self.arrive(generation)
        deadline = time.monotonic() + timeout_s
        while True:
            placed = self.key(generation, f"placed/{self.seat}")
            if self.store.check([placed]):
                return self.view(self.store.get(placed).decode())
            if self.store.check([self.prefix + FINISHED]):
                log.warning("the job trained its last step while rank %d waited for a place: nothing left to join, "
                            "exiting 0", self.seat)
                raise JobFinished()
            newest = self.newest()
            if newest is not None and newest > generation:
                generation = newest
                self.arrive(generation)
                continue
            _, world = self.ranks(generation)
            if self.seat >= world:
                raise CannotRecover(f"rank {self.seat} has no place in generation {generation} of {world} ranks")
            first = View(generation, 0, (0,), world)
            if not self.store.check([self.key(first, "members")]) and \
                    self.store.check([self.key(generation, f"arrived/{s}") for s in range(world)]):
                self.close(None, generation, list(range(world)), world)  # nobody trains: every seat starts
                continue
            if stopped():
                raise CannotRecover(f"stopped while waiting for a place in generation {generation}")
            if time.monotonic() > deadline:
                raise CannotRecover(f"no place in generation {generation} within {timeout_s:g} s (not every rank "
                                    f"arrived, and no training view took this one in)")
            time.sleep(POLL_S)

    def finish(self) -> None:
        """The job trained its last step: a trainer still waiting for a place exits 0 (JobFinished)."""
        self.store.set(self.prefix + FINISHED, "1")

    # ---- a survivor: the failed view's successor -----------------------------------------------

    def successor_after_failure(self, failed: View, stopped: Callable[[], bool], timeout_s: float,
                                waiting: Callable[[int | None], None], since: float | None = None) -> View:
        """This member of `failed` arrived at its successor (it left the failed group): the successor, closed here
        or by another member. `waiting(k)`: k more ranks are needed to reach the minimum (None: not, or no longer).
        `since`: the time.monotonic() the failure was seen (SETTLE_S counts from it; None: from now)."""
        self.store.set(self.key(failed, f"left/{self.seat}"), str(os.getpid()))
        arrived = time.monotonic() if since is None else since
        deadline = time.monotonic() + timeout_s
        self.said_below_minimum = False
        try:
            while True:
                successor = self.successor_of(failed)
                if successor is not None:
                    return successor
                left = tuple(s for s in failed.members if self.store.check([self.key(failed, f"left/{s}")]))
                if len(left) == failed.size or time.monotonic() - arrived >= SETTLE_S:
                    generation = max(self.newest() or 0, failed.generation)
                    fewest, world = self.ranks(generation)
                    candidates = sorted({s for s in left if s < world} | set(self.joiners(generation, world, left)))
                    if len(candidates) >= fewest:
                        return self.close(failed, generation, candidates, world,
                                          "Shrink" if len(candidates) < world else None)
                    self._below_minimum(len(candidates), world, fewest, waiting)
                if stopped():
                    raise CannotRecover("stopped by a signal while waiting for the next view")
                if time.monotonic() > deadline:
                    raise CannotRecover(f"fewer ranks than the minimum arrived within {timeout_s:g} s"
                                        if self.said_below_minimum else f"no next view within {timeout_s:g} s")
                time.sleep(POLL_S)
        finally:
            if self.said_below_minimum:
                waiting(None)

    def _below_minimum(self, have: int, world: int, fewest: int, waiting: Callable[[int | None], None]) -> None:
        if not self.said_below_minimum:
            self.said_below_minimum = True
            log.warning("below minReplicas: %d of %d ranks, waiting for %d more", have, world, fewest - have)
        waiting(fewest - have)

    # ---- a step boundary: rank 0 of a training view --------------------------------------------

    def change_due(self, view: View) -> Change | None:
        """Rank 0 of `view`, at a step boundary: its successor when a joiner waits in the newest generation, or
        the newest generation's world differs (members past it have no place). One store round trip while
        nothing changed; the successor is closed (written) before this returns it."""
        if self.seen is None:
            return None  # no launcher publishes generations here: nobody joins
        keys = [GENERATION_KEY.format(uid=self.uid), f"{self.prefix}arrivals"]
        if self.recreated and not self.store.check(keys):
            return None  # a new store its agent has not published the generation in yet: a read would wait for it
        self.recreated = False
        seen = tuple(self.store.multi_get(keys))
        if seen == self.seen:
            return None
        generation = max(int(seen[0]), view.generation)
        _, world = self.ranks(generation)
        joiners = self.joiners(generation, world, view.members)
        members = sorted({s for s in view.members if s < world} | set(joiners))
        self.seen = seen
        if not joiners and world == view.world:
            return None
        if not members:
            return None
        kind = "Join" if joiners else "Shrink" if len(members) < view.size else None  # None: a larger world
        return Change(self.close(view, generation, members, world, kind), joiners)

    def republish(self, view: View | None) -> None:
        """The store was lost and came back empty (runtime/store_client.py): what the protocol needs of this
        trainer's view there again, as every member writes it (the same values): the arrivals counter, the view's
        members (a failure in it closes its successor from them) and its round (the next round is a new one); and
        the launchers' newest generation with its node range, as the launchers publish them (the newest wins)."""
        self.recreated = True
        self.store.add(f"{self.prefix}arrivals", 0)
        if self.launched is not None:
            generation, nnodes = self.launched
            self.store.compare_set(NNODES_KEY.format(uid=self.uid, generation=generation), "", nnodes)
            key, seen = GENERATION_KEY.format(uid=self.uid), ""
            while int(current := self.store.compare_set(key, seen, str(generation)).decode()) < generation:
                seen = current
        if view is None:
            return
        self.store.compare_set(self.key(view, "members"), "", self._members_json(view, None))
        rounds = self.key(view.generation, "rounds")
        if int(self.store.add(rounds, 0)) < view.round:
            self.store.add(rounds, view.round)
        self.store.compare_set(self.key(view.generation, f"placed/{self.seat}"), "", view_name(view))

    def start_boundary_checks(self) -> None:
        """Rank 0's one-read check needs both keys: the counter exists from now on; without a published generation
        (no launcher) there is nothing to check."""
        self.store.add(f"{self.prefix}arrivals", 0)
        if self.seen is None and self.store.check([GENERATION_KEY.format(uid=self.uid)]):
            self.seen = (b"", b"")
