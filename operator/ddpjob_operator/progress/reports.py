"""A progress report's body -> `Report`, or `BadReport` (400 or 422) naming the field and what it must be.

Bodies are hostile: a body is strict UTF-8 (no byte order mark, no UTF-16/32: json.loads would guess those,
past the nesting check), nesting is measured on the decoded text before parsing (json.loads recurses), every
field is type- and bound-checked, unknown keys are ignored, and nothing but BadReport leaves the parser. The same parser reads the local runner's progress.json, so a
report means the same locally and on a cluster."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

MAX_STEP = 10**12  # beyond any real run; a larger step would freeze the stall clock (refused, 422)
MAX_JSON_DEPTH = 8  # a report is a flat object; deeper nesting is refused before parsing (400)
RECOVERY_PATHS = ("InProcess", "Restart")
RECOVERY_KINDS = ("Shrink", "Join")  # a regroup within a generation: the survivors train short, or a rank joins
MAX_RANKS = 4096  # missing_ranks: a list of global ranks, never longer than any real world (bounds the work)
MAX_REASON_CHARS = 512
MAX_UNIX_TIME = 1e10  # the year 2286: a later time is wrong, not late


class BadReport(ValueError):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


@dataclass(frozen=True)
class Recovery:
    """How the generation a report belongs to came back from the incident before it (rank 0's; issue 29's
    recovery timeline). Times are the trainer's clock (time.time()); whoever uses them bounds them against the
    incident's own times."""

    path: str  # RECOVERY_PATHS: InProcess (the process survived, or its state came from a peer) or Restart
    resumed_step: int  # the step the generation trains from
    rendezvous_time: float  # its process group was complete
    first_step_time: float | None = None  # its first optimizer step finished; None until then
    reason: str = ""  # why Restart where InProcess was asked for
    kind: str | None = None  # RECOVERY_KINDS: the survivors regrouped short (Shrink) or a rank joined them (Join)


@dataclass(frozen=True)
class Report:
    step: int
    total_steps: int | None = None
    epoch: int | None = None
    loss: float | None = None
    samples_per_second: float | None = None
    world_size: int | None = None
    last_checkpoint_step: int | None = None
    rank: int | None = None  # the global rank that sent it; rank 0's values are the job's
    step_seconds: float | None = None  # this pod's own time per step, apart from waiting in collectives
    # The rendezvous generation the sending trainer runs in: a survivor's old trainer may report after its pod
    # was carried into the next generation (its last report at exit, a heartbeat): it only ever lowers the
    # generation the report is attributed to (attributed_generation), never raises it.
    generation: int | None = None
    recovery: Recovery | None = None  # sticky on every report of a generation that resumed after an incident
    # The live view (issue 36, elastic in place): a whole world's ranks, the ranks missing from it (global
    # ranks, ascending), since when it has trained short (unix time), and, while below minReplicas and not
    # training, how many more ranks it waits for.
    desired_world_size: int | None = None
    missing_ranks: tuple[int, ...] | None = None
    short_since: float | None = None
    waiting_for_ranks: int | None = None

    @property
    def in_place(self) -> bool:
        """Its trainer trains on in a live view (short, or joined after a shrink): its generation is the one
        it started in, older than the operator's once a lost rank's replacement was asked for."""
        return bool(self.missing_ranks) or (self.recovery is not None and self.recovery.kind is not None)

    def attributed_to(self, served: int) -> int:
        """The generation this report counts for, given the one its sender serves by the operator's (or the
        local runner's) own records: the body can only lower it (a survivor's trainer of the generation before,
        reporting once more as it stops), never make a pod speak for a generation it was not given."""
        return served if self.generation is None else min(served, self.generation)


_INTS = ("total_steps", "epoch", "world_size", "last_checkpoint_step", "rank", "generation", "desired_world_size",
         "waiting_for_ranks")
_FLOATS = ("loss", "samples_per_second", "step_seconds")
MAX_STEP_SECONDS = 86400.0  # one step of a day: beyond it a report is wrong, not slow
MAX_INT = 2**53


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text (strings skipped), without parsing it:
    json.loads recurses, so a few KiB of brackets would raise RecursionError."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def decode_body(raw: bytes) -> str:
    """A body's bytes -> its text, strict UTF-8 (RFC 8259: JSON between systems is UTF-8); BadReport(400)."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise BadReport(400, "the body starts with a UTF-8 byte order mark: send the JSON as UTF-8 without one")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadReport(400, f"the body is not UTF-8 (byte {exc.start}): send the JSON as UTF-8") from None
    if "\x00" in text:  # never in JSON text; every other byte of UTF-16, and most of UTF-32
        raise BadReport(400, "the body holds NUL bytes, as UTF-16 or UTF-32 would: send the JSON as UTF-8")
    return text


def parse_report(raw: bytes) -> Report:
    """A report body -> Report; BadReport(400 or 422) naming the field. Unknown keys are ignored."""
    text = decode_body(raw)
    if json_depth(text) > MAX_JSON_DEPTH:
        raise BadReport(400, f"the body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels; a report is "
                             "a flat JSON object such as {\"step\": 120}")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: only if the depth check above were wrong
        raise BadReport(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadReport(400, "the body must be a JSON object such as {\"step\": 120}")
    return report_from(body)


def report_from(body: dict[str, Any]) -> Report:
    """A report's parsed JSON object -> Report; BadReport(422) naming the field (parse_report's second half,
    for readers that parsed the JSON themselves: the local runner's progress.json)."""
    values: dict[str, Any] = {}
    step = body.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise BadReport(422, f"step must be a whole number from 0 to {MAX_STEP}, got {step!r}")
    values["step"] = step
    for key in _INTS:
        value = body.get(key)
        if value is None:
            continue
        limit = MAX_STEP if key in ("total_steps", "last_checkpoint_step") else MAX_INT - 1
        least = 1 if key == "desired_world_size" else 0  # a whole world has a rank
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= limit:
            raise BadReport(422, f"{key} must be a whole number from {least} to {limit} or null, got {_shown(value)}")
        values[key] = value
    for key in _FLOATS:
        value = body.get(key)
        if value is None:
            continue
        if not _finite(value):
            raise BadReport(422, f"{key} must be a finite number or null, got {_shown(value)}")
        if key == "samples_per_second" and value < 0:
            raise BadReport(422, f"{key} must be >= 0, got {value!r}")
        if key == "step_seconds" and not 0 <= value <= MAX_STEP_SECONDS:
            raise BadReport(422, f"{key} must be from 0 to {MAX_STEP_SECONDS:g} seconds or null, got {value!r}")
        values[key] = float(value)
    if body.get("missing_ranks") is not None:
        values["missing_ranks"] = parse_ranks("missing_ranks", body["missing_ranks"])
        desired = values.get("desired_world_size")
        if desired is not None and values["missing_ranks"] and values["missing_ranks"][-1] >= desired:
            raise BadReport(422, f"missing_ranks holds rank {values['missing_ranks'][-1]}, but desired_world_size is "
                                 f"{desired}: a missing rank is one of 0..desired_world_size-1")
    if body.get("short_since") is not None:
        values["short_since"] = parse_time("short_since", body["short_since"])
    if body.get("recovery") is not None:
        values["recovery"] = parse_recovery(body["recovery"])
    return Report(**values)


def parse_ranks(key: str, value: Any) -> tuple[int, ...]:
    """A list of distinct global ranks -> ascending tuple; BadReport(422) naming the field."""
    example = f"{key} must be a list of at most {MAX_RANKS} distinct whole numbers from 0 to {MAX_INT - 1}, " \
              "such as [2], or null"
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        raise BadReport(422, f"{example}, got {_shown(value)}")
    for rank in value:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_INT:
            raise BadReport(422, f"{example}, got {_shown(rank)} in it")
    if len(set(value)) != len(value):
        raise BadReport(422, f"{example}, got a rank twice in {_shown(value)}")
    return tuple(sorted(value))


def parse_time(key: str, value: Any, optional: bool = True) -> float:
    """A unix time in seconds (time.time()); BadReport(422) naming the field (`optional`: it may be null)."""
    if not _finite(value) or not 0 <= value <= MAX_UNIX_TIME:
        raise BadReport(422, f"{key} must be a unix time in seconds (time.time()){' or null' if optional else ''}, "
                             f"got {_shown(value)}")
    return float(value)


def parse_recovery(value: Any) -> Recovery:
    """A report's `recovery` object -> Recovery; BadReport(422) naming the field. Unknown keys are ignored."""
    if not isinstance(value, dict):
        raise BadReport(422, f"recovery must be an object such as {{\"path\": \"InProcess\", \"resumed_step\": 120, "
                             f"\"rendezvous_time\": 1764000000.0}} or null, got {_shown(value)}")
    path = value.get("path")
    if path not in RECOVERY_PATHS:
        raise BadReport(422, f"recovery.path must be one of {', '.join(RECOVERY_PATHS)}, got {_shown(path)}")
    reason = value.get("reason")
    if reason is None:
        reason = ""
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise BadReport(422, f"recovery.reason must be a string of at most {MAX_REASON_CHARS} characters or null, "
                             f"got {_shown(reason)}")
    step = value.get("resumed_step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise BadReport(422, f"recovery.resumed_step must be a whole number from 0 to {MAX_STEP}, got {_shown(step)}")
    kind = value.get("kind")
    if kind is not None and kind not in RECOVERY_KINDS:
        raise BadReport(422, f"recovery.kind must be one of {', '.join(RECOVERY_KINDS)} or absent, got {_shown(kind)}")
    first_step = value.get("first_step_time")
    return Recovery(path=path, resumed_step=step, reason=reason, kind=kind,
                    rendezvous_time=parse_time("recovery.rendezvous_time", value.get("rendezvous_time"), optional=False),
                    first_step_time=None if first_step is None else parse_time("recovery.first_step_time", first_step))


def _finite(value: Any) -> bool:
    """A JSON number that is a finite float: not a bool, not NaN or infinite, not an int past any float
    (math.isfinite and float() raise OverflowError on those)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _shown(value: Any) -> str:
    """A hostile value in an error message, cut short (a reason may be kilobytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

