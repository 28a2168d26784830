"""The job's rendezvous store as a client that outlives the store's pod (issue 36: a lost store is not a lost gang).

The store is one pod; when it is lost the operator recreates it under the same Service (in a pod; the same port
in a local run), empty. A formed Gloo or NCCL group no longer uses it, so training goes on; what breaks is the
next store call: a c10d TCPStore client never reconnects. `ReconnectingStore` is a `dist.Store`, so process
groups and `PrefixStore`s can be built on it: on a connection error it connects to the same endpoint again
(waiting with backoff, at most `reconnect_within_s`, one log line), lets its owner publish again what the old
store held (`on_reconnect`), and retries the call. Past the bound, the call raises the connection error as before.
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

log = logging.getLogger(__name__)

# The operator recreates a lost store's pod (a removal, a creation, the scheduler, the container's start):
# seconds on a cluster. Beyond this the store is taken for gone and the call fails as it would have.
RECONNECT_WITHIN_S = 60.0
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.05, 1.0
PROBE_TIMEOUT_S = 1.0
# A TCPStore client sends these without waiting for an answer: to a store that died, the first one is lost
# without an error (a Gloo group's address, written and then waited for, would be waited for in vain).
UNANSWERED = ("set", "append", "multi_set")


class ReconnectingStore(dist.Store):
    """A TCPStore client of `host:port` that reconnects on a connection error (`dist.DistNetworkError`);
    a timeout or a missing key is the caller's as before."""

    def __init__(self, host: str, port: int, *, timeout: datetime.timedelta,
                 reconnect_within_s: float = RECONNECT_WITHIN_S) -> None:
        super().__init__()
        self.host, self.port, self.reconnect_within_s = host, port, reconnect_within_s
        self.set_timeout(timeout)
        self._lock = threading.RLock()  # one reconnect at a time; a republishing callback may reconnect again
        self._callbacks: list[Callable[[], Any]] = []
        self._epoch = 0  # connections made so far, past the first: a caller that failed on an older one retries
        self._client = self._tcp_store()  # the first connection waits for the store as a TCPStore would

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def on_reconnect(self, callback: Callable[[], Any]) -> None:
        """`callback()` runs after each reconnect, before the failed call is retried: it publishes again what
        its owner keeps in the store (the old store's keys are lost with it). Its own failure is logged."""
        self._callbacks.append(callback)

    # ---- dist.Store: every call through `_call` ----------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        self._call("set", key, value)

    def get(self, key: str) -> bytes:
        return self._call("get", key)

    def add(self, key: str, amount: int) -> int:
        return self._call("add", key, amount)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call("compare_set", key, expected, desired)

    def check(self, keys: list[str]) -> bool:
        return self._call("check", keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._call("wait", keys, *([] if timeout is None else [timeout]))

    def delete_key(self, key: str) -> bool:
        return self._call("delete_key", key)

    def num_keys(self) -> int:
        return self._call("num_keys")

    def append(self, key: str, value: Any) -> None:
        self._call("append", key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._call("multi_get", keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._call("multi_set", keys, values)

    # ---- the connection ----------------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Any:
        # A retried call may be lost too (a read waiting on the empty new store for a key only an agent writes
        # again): each loss reconnects, each bounded by `reconnect_within_s`.
        while True:
            client, epoch = self._client, self._epoch
            try:
                result = getattr(client, name)(*args)
                if name in UNANSWERED:
                    client.num_keys()  # its answer proves the write reached a live store; a lost one is written again
                return result
            except dist.DistNetworkError as lost:
                self._reconnect(epoch, lost)

    def _reconnect(self, failed_epoch: int, lost: dist.DistNetworkError) -> None:
        with self._lock:
            if self._epoch != failed_epoch:
                return  # another caller reconnected meanwhile
            began = time.monotonic()
            deadline, backoff = began + self.reconnect_within_s, FIRST_BACKOFF_S
            while not self._accepts():
                if time.monotonic() + backoff > deadline:
                    log.warning("the job's rendezvous store %s was lost (%s) and did not come back within %g s",
                                self.endpoint, _first_line(lost), self.reconnect_within_s)
                    raise lost
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            self._client, self._epoch = self._tcp_store(), self._epoch + 1
            failed = [error for error in map(self._republish, self._callbacks) if error]
            log.warning("the job's rendezvous store %s was lost (%s); reconnected after %.1f s%s", self.endpoint,
                        _first_line(lost), time.monotonic() - began,
                        f", but could not publish again: {'; '.join(failed)}" if failed else "")

    def _republish(self, callback: Callable[[], Any]) -> str | None:
        try:
            callback()
        except Exception as error:  # noqa: BLE001 - named in the one reconnect line
            return f"{type(error).__name__}: {_first_line(error)}"
        return None

    def _accepts(self) -> bool:
        # A plain connect first: a TCPStore built against a closed port retries for its whole timeout and logs
        # a C++ stack at each try.
        try:
            with socket.create_connection((self.host, self.port), timeout=PROBE_TIMEOUT_S):
                return True
        except OSError:
            return False

    def _tcp_store(self) -> dist.TCPStore:
        return dist.TCPStore(self.host, self.port, is_master=False, timeout=self.timeout)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
