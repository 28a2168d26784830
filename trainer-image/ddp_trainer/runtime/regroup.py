"""`ViewKeeper`: one in-process trainer's part in its job's views (issue 36, elastic in place; the protocol is
runtime/membership.py): the view it trains in, since when the job is short, how many ranks it waits for below
the minimum, and the change rank 0 decided at a step boundary (written in the store before it is agreed on).

Rank 0's reports carry it (`fields`): `world_size` (ranks training), `desired_world_size` (the view's world),
`missing_ranks`, `short_since` (unix time, None while whole) and, while too few ranks are left to train,
`waiting_for_ranks`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .inprocess import CannotRecover, Rendezvous
from .membership import view_name
from .views import View

log = logging.getLogger(__name__)

# After a failed store read at a step boundary, the next one waits this long: the group trains on without the
# store, and a store that does not answer must not cost every step a connection timeout.
STORE_RETRY_S = 10.0


class ViewKeeper:
    def __init__(self, rendezvous: Rendezvous | None, waiting: Callable[[], None]) -> None:
        """`waiting()`: called while too few ranks are left to train (a report goes out although no group exists)."""
        self.rendezvous = rendezvous
        self.short_since: float | None = None
        self.waiting_for: int | None = None
        self._waiting = waiting
        self._change: View | None = None  # rank 0: the successor it closed, until the regroup is agreed
        self._store_quiet_until = 0.0
        self._store_error_said = False
        self._failed_at: float | None = None

    @property
    def view(self) -> View | None:
        return None if self.rendezvous is None else self.rendezvous.view

    def went_short(self) -> None:
        """A peer failed just now: the failed view's successor is settled SETTLE_S from here (membership.py),
        what this survivor spends leaving included."""
        self._failed_at = time.monotonic()
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
        """Rank 0: the successor of `view` where it changes at this boundary (closed in the store already). A store
        error is logged once and the check waits STORE_RETRY_S: the group does not need the store between
        regroups."""
        if self._change is None and time.monotonic() >= self._store_quiet_until:
            try:
                change = self.rendezvous.membership.change_due(view)
            except (RuntimeError, ValueError) as e:  # DistStoreError, a node range that is none
                self._store_quiet_until = time.monotonic() + STORE_RETRY_S
                if not self._store_error_said:
                    self._store_error_said = True
                    log.warning("the job's rendezvous store cannot be read at a step boundary (%s): training on "
                                "in view %s; joiners wait until it answers", str(e).splitlines()[0][:200],
                                view_name(view))
                return None
            self._change = None if change is None else change.successor
        return self._change

    def take_change(self, view: View) -> View:
        """Every member, once a regroup was agreed: the successor rank 0 closed."""
        successor, self._change = self._change, None
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
