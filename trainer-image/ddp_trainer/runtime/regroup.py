"""`ViewKeeper`: one in-process trainer's part in its job's views (issue 36, elastic in place; the protocol is
runtime/membership.py): the view it trains in, since when the job is short, how many ranks it waits for below
the minimum, and the change rank 0 decided at a step boundary (written in the store before it is agreed on).

Rank 0's reports carry it (`fields`): `world_size` (ranks training), `desired_world_size` (the view's world),
`missing_ranks`, `short_since` (unix time, None while whole) and, while too few ranks are left to train,
`waiting_for_ranks`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .inprocess import CannotRecover, Rendezvous
from .membership import view_name
from .views import View

log = logging.getLogger(__name__)

# Rank 0 looks for joiners in the store this often, on a thread of its own: a store that is lost (its client then
# waits up to a minute for its successor, runtime/store_client.py) or slow never holds a training step up. A change
# it finds is taken at the next step boundary.
WATCH_S = 0.1
STORE_RETRY_S = 10.0  # after a failed look: the group trains on without the store


class ViewKeeper:
    def __init__(self, rendezvous: Rendezvous | None, waiting: Callable[[], None]) -> None:
        """`waiting()`: called while too few ranks are left to train (a report goes out although no group exists)."""
        self.rendezvous = rendezvous
        self.short_since: float | None = None
        self.waiting_for: int | None = None
        self._waiting = waiting
        self._change: View | None = None  # rank 0: the successor it closed, until the regroup is agreed
        self._watched: View | None = None  # rank 0: the view its watcher looks for a change of (None: none)
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._store_error_said = False
        self._failed_at: float | None = None

    @property
    def view(self) -> View | None:
        return None if self.rendezvous is None else self.rendezvous.view

    def went_short(self) -> None:
        """A peer failed just now: the failed view's successor is settled SETTLE_S from here (membership.py),
        what this survivor spends leaving included."""
        self._failed_at = time.monotonic()
        with self._lock:
            self._watched = None  # the failure path closes the successor now
        if self.short_since is None:
            self.short_since = time.time()

    def entered(self, view: View) -> None:
        self.short_since = None if not view.short else self.short_since or time.time()

    def fields(self, view: View) -> dict[str, Any]:
        """The view's part of rank 0's reports."""
        if self.waiting_for is not None:  # nobody trains: no group
            return {"world_size": 0, "desired_world_size": view.world, "missing_ranks": list(range(view.world)),
                    "short_since": self.short_since, "waiting_for_ranks": self.waiting_for}
        return {"world_size": view.size, "desired_world_size": view.world, "missing_ranks": list(view.missing),
                "short_since": self.short_since if view.short else None}

    # ---- a step boundary ------------------------------------------------------------------------

    def change_due(self, view: View) -> View | None:
        """Rank 0, at a step boundary: the successor of `view` its watcher closed in the store (a joiner waits, the
        world changed), or None; the watcher looks at `view` from now on."""
        with self._lock:
            self._watched = view
            change = self._change
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="ddpjob-view-watch", daemon=True)
            self._watcher.start()
        return change

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_S)
            with self._lock:
                view = self._watched if self._change is None else None
            if view is None:
                continue
            try:
                change = self.rendezvous.membership.change_due(view)
            except (RuntimeError, ValueError) as e:  # the store lost, a node range that is none
                if not self._store_error_said:
                    self._store_error_said = True
                    log.warning("the job's rendezvous store cannot be read (%s): training on in view %s; joiners "
                                "wait until it answers", str(e).splitlines()[0][:200], view_name(view))
                time.sleep(STORE_RETRY_S)
                continue
            with self._lock:
                if change is not None and self._watched == view:
                    self._change = change.successor

    def take_change(self, view: View) -> View:
        """Every member, once a regroup was agreed: the successor rank 0 closed."""
        with self._lock:
            successor, self._change, self._watched = self._change, None, None
        if successor is None:
            successor = self.rendezvous.membership.successor_of(view)
        if successor is None:
            raise CannotRecover(f"a regroup was agreed but view {view_name(view)} has no successor in the store")
        return successor

    # ---- after a failure -----------------------------------------------------------------------

    def after_failure(self, failed: View, timeout_s: float, stopped: Callable[[], bool]) -> View:
        """A survivor, out of `failed`'s group: the view it goes on in. The failed view's successor if it is a
        member (closed here or by another survivor, at once: nobody waits for a replacement); otherwise (it came
        late) the view it is placed in as a joiner, at a step boundary of the others."""
        membership, seat = self.rendezvous.membership, self.rendezvous.seat.rank
        since, self._failed_at = self._failed_at, None  # a failure on the way to the next view: from then
        successor = membership.successor_after_failure(failed, stopped, timeout_s, self._below_minimum, since)
        if seat in successor.members:
            return successor
        log.warning("seat %d came after view %s closed without it (%s): joining it at a step boundary", seat,
                    view_name(successor), successor.describe())
        return membership.wait_placed(successor.generation, stopped, timeout_s)

    def _below_minimum(self, more: int | None) -> None:
        self.waiting_for = more
        if more is not None:
            self._waiting()
