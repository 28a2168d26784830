"""The controller's memory of its jobs: what it last saw of each DDPJob, the pod informer's index of their
pods, the status it last wrote of each, and each job's spec parsed once per generation.

Thousands of jobs are held for the operator's lifetime, so every copy is kept small
(bench/operator_memory.py): snapshots drop the metadata nobody reads and intern short strings, a parsed
spec is kept pickled (and the snapshot then drops its raw spec), a written status as its wire JSON.

Imports the model and observations (pod summaries, spec parsing); no kopf, no API calls.
"""

from __future__ import annotations

import json
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from . import model, observations

JobKey = tuple[str, str]  # (namespace, name)

# Never read, and most of a stored job's metadata: `kubectl apply` copies the whole manifest into
# this annotation, the API server adds managedFields. Not kept for every job (bench/operator_memory.py).
_UNREAD_METADATA = ("managedFields",)
_UNREAD_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def _compact(value: Any) -> Any:
    """A deep copy of a JSON value with its keys and short strings interned: thousands of job
    snapshots share one "lastTransitionTime", "True", "Running"... instead of one each."""
    if isinstance(value, Mapping):
        return {sys.intern(k): _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    if isinstance(value, str) and len(value) <= 32:
        return sys.intern(value)
    return value


def _snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    snapshot = {key: _compact(body.get(key) or {}) for key in ("metadata", "spec", "status")}
    meta = snapshot["metadata"]
    for key in _UNREAD_METADATA:
        meta.pop(key, None)
    for key in _UNREAD_ANNOTATIONS:
        (meta.get("annotations") or {}).pop(key, None)
    return snapshot


class WrittenStatuses:
    """job uid -> the status this process last wrote, kept as its compact wire JSON (about 1 KiB,
    against about 9 KiB for the model) and read back with pydantic's JSON parser (exact: the wire
    form round-trips; about 15 us)."""

    def __init__(self) -> None:
        self._wire: dict[str, bytes] = {}

    def __contains__(self, uid: object) -> bool:
        return uid in self._wire

    def __len__(self) -> int:
        return len(self._wire)

    def __getitem__(self, uid: str) -> model.DDPJobStatus:
        return model.DDPJobStatus.model_validate_json(self._wire[uid])

    def __setitem__(self, uid: str, status: model.DDPJobStatus) -> None:
        self._wire[uid] = json.dumps(status.wire(), separators=(",", ":")).encode()

    def get(self, uid: str) -> model.DDPJobStatus | None:
        return self[uid] if uid in self._wire else None

    def pop(self, uid: str, default: None = None) -> model.DDPJobStatus | None:
        raw = self._wire.pop(uid, None)
        return default if raw is None else model.DDPJobStatus.model_validate_json(raw)

    def clear(self) -> None:
        self._wire.clear()


@dataclass(frozen=True)
class Seen:
    """What a DDPJob event changed."""

    new_spec: bool  # a known job's spec changed (metadata.generation moved)
    needs_pass: bool  # new, or changed by someone else: not just the echo of this process's own status write


class JobCache:
    def __init__(self) -> None:
        self.jobs: dict[JobKey, dict[str, Any]] = {}  # the snapshot of each job's last event
        self.pods: Mapping[tuple[str, str], Any] = {}  # the informer's index: (namespace, job uid) -> PodSummaries
        self.written = WrittenStatuses()  # job uid -> the status this process last wrote
        self._specs: dict[str, tuple[tuple[str, Any], bytes]] = {}  # uid -> ((uid, generation), pickled spec)

    def __len__(self) -> int:
        return len(self.jobs)

    def keys(self) -> list[JobKey]:
        return list(self.jobs)

    def get(self, key: JobKey) -> dict[str, Any] | None:
        return self.jobs.get(key)

    def uid(self, key: JobKey) -> str | None:
        body = self.jobs.get(key)
        return None if body is None else body["metadata"].get("uid", "")

    def pods_of(self, namespace: str, uid: str) -> tuple[observations.PodSummary, ...]:
        return tuple(self.pods.get((namespace, uid), ()))

    # ------------------------------------------------------------ events

    def saw(self, key: JobKey, body: Mapping[str, Any]) -> Seen:
        """Keep the job as this event shows it."""
        snapshot, previous = self._without_parsed_spec(_snapshot(body)), self.jobs.get(key)
        self.jobs[key] = snapshot
        new_spec = previous is not None and \
            previous["metadata"].get("generation") != snapshot["metadata"].get("generation")
        return Seen(new_spec, previous is None or self._changed_by_others(previous, snapshot))

    def forget(self, key: JobKey, body: Mapping[str, Any]) -> str:
        """The job was deleted: drop all that is kept of it. Returns its uid."""
        old = self.jobs.pop(key, None)
        uid: str = ((old or body).get("metadata") or {}).get("uid", "")
        self.written.pop(uid, None)
        self._specs.pop(uid, None)
        return uid

    def forget_writes(self) -> None:
        """Another replica may have written every status since this one did (a new leader)."""
        self.written.clear()

    def _changed_by_others(self, previous: dict[str, Any], current: dict[str, Any]) -> bool:
        """False for the echo of our own status write (same spec generation, our status)."""
        old_meta, meta = previous["metadata"], current["metadata"]
        written = self.written.get(meta.get("uid", ""))
        return (old_meta.get("generation") != meta.get("generation")
                or old_meta.get("deletionTimestamp") != meta.get("deletionTimestamp")
                or written is None or written.wire() != current["status"])

    # ------------------------------------------------------------ what a pass reads

    def first_in_line(self, key: JobKey) -> bool:
        """Not yet reconciled in its current spec (a new job, a changed spec): ahead of the resyncs."""
        body = self.jobs.get(key)
        if body is None:
            return False
        generation = body["metadata"].get("generation")
        if (body.get("status") or {}).get("observedGeneration") == generation:
            return False
        written = self.written.get(body["metadata"].get("uid", ""))
        return written is None or written.observed_generation != generation

    def stored_status(self, body: Mapping[str, Any]) -> model.DDPJobStatus:
        """The job's status as the server holds it: our last write, or what the event carried (after a restart)."""
        return self.written.get(body["metadata"].get("uid", "")) or observations.parse_status(body.get("status"))

    def parsed_spec(self, uid: str, body: dict[str, Any]) -> observations.ParsedSpec:
        """The spec only changes with metadata.generation; parse it once per generation (the CEL
        rules cost milliseconds). Kept pickled, a sixth of the model's memory, and unpickling runs no
        validators (tens of microseconds); the job's snapshot then drops its spec (spec None)."""
        key = (uid, body["metadata"].get("generation"))
        cached = self._specs.get(uid)
        if cached is None or cached[0] != key:
            parsed = observations.parse_body_spec(body)
            self._specs[uid] = (key, pickle.dumps(parsed, pickle.HIGHEST_PROTOCOL))
            body["spec"] = None
            return parsed
        return pickle.loads(cached[1])  # type: ignore[no-any-return]

    def _without_parsed_spec(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """A snapshot of a generation whose spec is parsed already keeps no copy of it."""
        uid, generation = snapshot["metadata"].get("uid", ""), snapshot["metadata"].get("generation")
        cached = self._specs.get(uid)
        if cached is not None and cached[0] == (uid, generation):
            snapshot["spec"] = None
        return snapshot
