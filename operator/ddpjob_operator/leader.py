"""Leader election on a coordination.k8s.io/v1 Lease, with fencing: one replica acts, the others wait.

The rules are controller-runtime's (client-go `leaderelection`), in three parts:

- `decide(lease, observed_at, now, me, timing)` is pure: given the Lease as last read, when this
  replica first saw that version of it (its own monotonic clock), the time now and its identity,
  it says what to do: create the Lease, renew it, take it over, or wait. Expiry is judged by the
  *observer's* clock from the moment it saw the holder's last renewal (never by comparing the
  holder's `renewTime` with the local wall clock, so clock skew between nodes does not matter).
- `fenced(renewed_at, now, timing)` is pure too: the holder may act only until `renewDeadline`
  after the start of its last *successful* renewal. Another replica takes over no sooner than
  `leaseDurationSeconds` after it saw that renewal, which came after its start; with
  `renewDeadline < leaseDurationSeconds` the old holder has stopped acting (the difference is the
  margin) before anyone else may start. Every write to the Lease carries the resourceVersion it
  was decided on, so two replicas racing for it cannot both win (409 Conflict).
- `Elector` runs the loop (every `retryPeriod`), and `FencedKube` refuses every write of the
  operator (create, delete, status patch, Event) while this replica is not within its renew
  deadline, checked at the moment of each call: a paused or partitioned leader that wakes up
  finds itself fenced before it sends anything.

The loop runs in a thread of its own, on its own event loop with its own API client (client-go renews from a
goroutine of its own): the controller's work (listings, `decide()` over a thousand jobs, bursts of writes) shares
the operator's loop, and a renewal queued behind it missed its deadline under load (issue 38). The callbacks
(`on_start`, `on_stop`, `on_change`) are handed to the loop that called `start()`; `leading()` is a read of one
float, safe from any thread.

On SIGTERM the holder releases the Lease (empty holderIdentity, as client-go's ReleaseOnCancel),
so a standby takes over at its next poll instead of waiting for the Lease to expire.

At `helm uninstall` the chart's Role and RoleBinding go while the replicas are still stopping (Helm deletes
the Deployment first, but its pods stop within their grace period): the API server then answers 401/403
for the Lease, the progress label and the release. That is expected, and logged at info level
(`permission_withdrawn`); only a replica that keeps running that way for WITHDRAWN_WARN_SECONDS (its
Role or RoleBinding is missing) warns.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from . import kube

logger = logging.getLogger("ddpjob_operator.leader")

LEASES = kube.Kind("coordination.k8s.io/v1", "leases")
WITHDRAWN_WARN_SECONDS = 120.0  # longer than any replica takes to stop (the chart's grace period is 30 s)


def permission_withdrawn(exc: BaseException) -> bool:
    """The API server no longer lets this replica in (401/403): its RBAC or credentials were removed, as at
    `helm uninstall` while it stops."""
    return isinstance(exc, kube.ApiError) and exc.status in (401, 403)


class NotLeader(kube.ApiError):
    """A write refused locally: this replica does not hold the Lease (or can no longer be sure)."""

    def __init__(self, identity: str):
        super().__init__(0, "NotLeader", f"{identity} does not hold the operator Lease: not acting")


@dataclass(frozen=True)
class Timing:
    lease_duration: int = 15  # leaseDurationSeconds: a whole number, as the Lease stores it
    renew_deadline: float = 10.0  # the holder stops acting this long after its last successful renewal began
    retry_period: float = 2.0  # every replica reads (and the holder renews) the Lease this often


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease election reads."""

    holder: str  # spec.holderIdentity; "" when released
    duration: int  # spec.leaseDurationSeconds
    transitions: int  # spec.leaseTransitions
    acquire_time: str | None
    renew_time: str | None
    resource_version: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "LeaseRecord":
        spec = body.get("spec") or {}
        return cls(holder=spec.get("holderIdentity") or "", duration=int(spec.get("leaseDurationSeconds") or 0),
                   transitions=int(spec.get("leaseTransitions") or 0), acquire_time=spec.get("acquireTime"),
                   renew_time=spec.get("renewTime"),
                   resource_version=str((body.get("metadata") or {}).get("resourceVersion") or ""))


class Verb(enum.Enum):
    CREATE = "create"  # no Lease yet: create it holding it
    RENEW = "renew"  # ours: move renewTime
    TAKE_OVER = "take-over"  # released, or expired by our clock: hold it (leaseTransitions + 1)
    WAIT = "wait"  # another replica holds it


@dataclass(frozen=True)
class Action:
    verb: Verb
    expires_at: float | None = None  # WAIT: when, by our clock, the holder's Lease runs out


def decide(lease: LeaseRecord | None, observed_at: float, now: float, me: str, timing: Timing) -> Action:
    """What this replica does with the Lease it last read (None: there is none).

    `observed_at`: when (this replica's monotonic clock) it first read this version of the Lease;
    `now`: the same clock."""
    if lease is None:
        return Action(Verb.CREATE)
    if lease.holder == me:
        return Action(Verb.RENEW)
    if not lease.holder:
        return Action(Verb.TAKE_OVER)
    expires_at = observed_at + (lease.duration if lease.duration > 0 else timing.lease_duration)
    if now >= expires_at:
        return Action(Verb.TAKE_OVER)
    return Action(Verb.WAIT, expires_at)


def fenced(renewed_at: float | None, now: float, timing: Timing) -> bool:
    """True when the replica must not act: it never held the Lease, or its last successful renewal
    (begun at `renewed_at`) is `renewDeadline` old."""
    return renewed_at is None or now >= renewed_at + timing.renew_deadline


def micro_time(moment: datetime | None = None) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds."""
    return (moment or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(namespace: str, name: str, me: str, timing: Timing, previous: LeaseRecord | None,
               verb: Verb, now: datetime) -> dict[str, Any]:
    """The Lease to write for CREATE, RENEW, TAKE_OVER (and release: verb WAIT with me == "")."""
    stamp = micro_time(now)
    transitions = previous.transitions if previous else 0
    acquire = previous.acquire_time if previous else None
    if verb in (Verb.CREATE, Verb.TAKE_OVER):
        acquire = stamp
        transitions += 1 if previous is not None else 0
    spec: dict[str, Any] = {"holderIdentity": me, "leaseDurationSeconds": timing.lease_duration,
                            "leaseTransitions": transitions, "renewTime": stamp}
    if acquire:
        spec["acquireTime"] = acquire
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if previous is not None:
        metadata["resourceVersion"] = previous.resource_version
    if not me:  # release (client-go ReleaseOnCancel): nobody holds it, it expires in a second
        spec["leaseDurationSeconds"] = 1
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


class Elector:
    """The election loop of one replica. `leading()` is what every write of the operator checks."""

    def __init__(self, api: kube.Kube, namespace: str, name: str, identity: str, timing: Timing,
                 clock: Callable[[], float] = time.monotonic):
        self.api, self.namespace, self.name, self.identity, self.timing = api, namespace, name, identity, timing
        self.clock = clock
        self._lease: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # start of our last successful write of the Lease
        self._seen_holder: str | None = None  # the last non-empty holder this replica saw
        self._is_leader = False  # what the callbacks were last told
        self._expiry: asyncio.TimerHandle | None = None
        self._wake = asyncio.Event()
        self._thread: threading.Thread | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None  # the thread's: every Lease call runs there
        self._caller: asyncio.AbstractEventLoop | None = None  # start()'s: the callbacks run there
        self._stopping = asyncio.Event()
        self._release_on_stop = False
        self._halted = False  # stop() began: a renewal that lands after it does not make us act again
        self.on_start: Callable[[], None] = lambda: None
        self.on_stop: Callable[[], None] = lambda: None
        self.on_change: Callable[[str], None] = lambda holder: None  # the holder changed (we may be it)
        self.withdrawn_since: float | None = None  # rounds refused 401/403 since then (an uninstall, or no RBAC)
        self._warned_withdrawn = False

    # ------------------------------------------------------------ what the operator asks

    def leading(self) -> bool:
        return not self._halted and not fenced(self._renewed_at, self.clock(), self.timing)

    @property
    def holder(self) -> str:
        return self._lease.holder if self._lease else ""

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Run the election in its own thread; the callbacks come to the calling loop."""
        self._caller = asyncio.get_running_loop()
        self._own_loop = asyncio.new_event_loop()
        # Made before the thread runs (an Event binds to the loop that first waits on it): stop() may come first.
        self._wake, self._stopping = asyncio.Event(), asyncio.Event()
        self._thread = threading.Thread(target=self._own_loop.run_until_complete, args=(self._run(),),
                                        name=f"leader election {self.identity}", daemon=True)
        self._thread.start()

    async def stop(self, release: bool = True) -> None:
        """Stop acting at once, stop the loop, and hand the Lease over if we hold it."""
        self._release_on_stop = release and self.leading()
        self._halted, self._renewed_at = True, None
        thread, loop = self._thread, self._own_loop
        if thread is not None and loop is not None:
            loop.call_soon_threadsafe(self._stop_rounds)
            await asyncio.to_thread(thread.join)
            loop.close()
            self._thread = self._own_loop = None
        else:  # never started (tests drive rounds themselves): the Lease calls are this loop's
            await self._finish()
        self._set_leader(False)

    def _stop_rounds(self) -> None:
        self._stopping.set()
        self._wake.set()  # out of the wait between rounds

    async def _run(self) -> None:
        """The thread's whole life: rounds until stop() asks, then the release and the client's close. A round
        in flight is let finish (its deadlines bound it): a renewal cut off after the server took it would leave
        the release a version behind (409), and the standby waiting out the Lease."""
        await self._loop()
        await self._finish()

    async def _finish(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._release_on_stop and self._lease is not None and self._lease.holder == self.identity:
            body = lease_body(self.namespace, self.name, "", self.timing, self._lease, Verb.WAIT,
                              datetime.now(timezone.utc))
            try:
                await asyncio.wait_for(self._write(body, create=False), self.timing.retry_period * 2)
                logger.info("released Lease %s/%s", self.namespace, self.name)
            except (kube.ApiError, OSError, asyncio.TimeoutError) as exc:
                log = logger.info if permission_withdrawn(exc) else logger.warning
                log("could not release Lease %s/%s (it expires on its own): %s", self.namespace, self.name, exc)
        await self.api.close()

    # ------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.run_round()
                self.withdrawn_since, self._warned_withdrawn = None, False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an API error: try again next period; fencing holds meanwhile
                self.round_failed(exc)
            if self._stopping.is_set():
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.timing.retry_period)
            except asyncio.TimeoutError:
                pass

    def round_failed(self, exc: Exception) -> None:
        """What the loop does with a round's error (public: a test drives rounds without the thread)."""
        if not permission_withdrawn(exc):
            self.withdrawn_since = None
            logger.warning("leader election round failed: %s", exc)
            return
        now = self.clock()
        if self.withdrawn_since is None:
            self.withdrawn_since = now
            logger.info("leader election: the API server refuses Lease %s/%s (%s): expected while the chart is "
                        "uninstalled; standing by", self.namespace, self.name, exc)
        elif now - self.withdrawn_since >= WITHDRAWN_WARN_SECONDS and not self._warned_withdrawn:
            self._warned_withdrawn = True
            logger.warning("leader election: the API server has refused Lease %s/%s for %.0fs (%s): this "
                           "replica's Role or RoleBinding is missing", self.namespace, self.name,
                           now - self.withdrawn_since, exc)

    async def run_round(self) -> None:
        """One round of the loop: read the Lease unless we hold it, then create, renew or take it over
        when `decide` says so. Raises the API client's errors (the loop hands them to `round_failed`)."""
        if not (self._lease is not None and self.leading() and self._lease.holder == self.identity):
            await self._read()  # the holder renews on what it last wrote; a 409 sends it back here
        now = self.clock()
        action = decide(self._lease, self._observed_at, now, self.identity, self.timing)
        if action.verb is Verb.WAIT:
            self._set_leader(False)
            return
        body = lease_body(self.namespace, self.name, self.identity, self.timing, self._lease, action.verb,
                          datetime.now(timezone.utc))
        started = self.clock()
        remaining = (self._renewed_at + self.timing.renew_deadline - started
                     if self._renewed_at is not None else self.timing.renew_deadline)
        try:
            written = await asyncio.wait_for(self._write(body, create=action.verb is Verb.CREATE),
                                             max(remaining, 0.05))
        except kube.ApiError as exc:
            if exc.status == 409:  # someone else wrote it first (or took it over): not ours
                self._lease = None
                self._renewed_at = None
                self._set_leader(False)
                self._wake.set()  # read it again at once
                return
            raise
        except asyncio.TimeoutError:
            return  # the deadline check in leading() fences us if this goes on
        self._lease, self._observed_at, self._renewed_at = LeaseRecord.from_body(written), started, started
        self._saw_holder(self.identity)
        self._set_leader(True)
        self._arm_expiry()

    async def _read(self) -> None:
        try:
            body: dict[str, Any] | None = await asyncio.wait_for(
                self.api.get(LEASES, self.namespace, self.name), self.timing.renew_deadline)
        except kube.ApiError as exc:
            if exc.status != 404:
                raise
            body = None
        lease = LeaseRecord.from_body(body) if body else None
        if lease != self._lease:
            self._lease, self._observed_at = lease, self.clock()
        if lease is not None:
            self._saw_holder(lease.holder)
        if lease is None or lease.holder != self.identity:
            self._renewed_at = None

    def _saw_holder(self, holder: str) -> None:
        if not holder or holder == self._seen_holder:
            return
        first = self._seen_holder is None
        self._seen_holder = holder
        if not first or holder == self.identity:
            self._tell(self.on_change, holder)

    async def _write(self, body: dict[str, Any], *, create: bool) -> dict[str, Any]:
        return await self.api.write(LEASES, body, create=create)

    def _arm_expiry(self) -> None:
        """Tell the operator the moment the renew deadline passes without a renewal."""
        if self._expiry is not None:
            self._expiry.cancel()
        loop, renewed_at = asyncio.get_running_loop(), self._renewed_at
        if renewed_at is None:  # stop() began meanwhile (from the controller's thread)
            return
        delay = renewed_at + self.timing.renew_deadline - self.clock()
        self._expiry = loop.call_later(max(delay, 0), self._check_expiry)

    def _check_expiry(self) -> None:
        if not self.leading():
            log = logger.info if self.withdrawn_since is not None else logger.warning  # an uninstall: expected
            log("could not renew Lease %s/%s within %ss: stopped acting", self.namespace, self.name,
                self.timing.renew_deadline)
            self._set_leader(False)

    def _set_leader(self, leading: bool) -> None:
        if leading == self._is_leader or (leading and self._halted):
            return
        self._is_leader = leading
        if leading:
            logger.info("%s holds Lease %s/%s: acting", self.identity, self.namespace, self.name)
            self._tell(self.on_start)
        else:
            if self._expiry is not None:
                self._expiry.cancel()
                self._expiry = None
            logger.info("%s does not hold Lease %s/%s: standing by", self.identity, self.namespace, self.name)
            self._tell(self.on_stop)

    def _tell(self, callback: Callable[..., None], *args: Any) -> None:
        """Run a callback in the loop that started the elector (the controller's), in order."""
        caller = self._caller
        if caller is None or threading.current_thread() is not self._thread:
            callback(*args)
        elif not caller.is_closed():
            caller.call_soon_threadsafe(callback, *args)


class NamedKube(kube.Kube):
    """The API client with a User-Agent that names the replica: `ddpjob-operator/<identity>`."""

    def __init__(self, connection: kube.Connection, identity: str, *, timeout_seconds: float = 30.0,
                 before_write: Callable[[], None] | None = None):
        super().__init__(connection, timeout_seconds=timeout_seconds, user_agent=f"{kube.USER_AGENT}/{identity}",
                         before_write=before_write)
        self.identity = identity


class FencedKube(NamedKube):
    """The operator's API client, refusing every write while its replica is not the leader.

    The check is made when each call starts, so a replica that was paused, or cut off from the API
    server, past its renew deadline sends nothing once it runs again."""

    def __init__(self, connection: kube.Connection, elector: Elector, *, timeout_seconds: float = 30.0):
        super().__init__(connection, elector.identity, timeout_seconds=timeout_seconds, before_write=self._fence)
        self.elector = elector

    def _fence(self) -> None:
        if not self.elector.leading():
            raise NotLeader(self.elector.identity)
