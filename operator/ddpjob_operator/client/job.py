"""A DDPJob as read back from the API server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import model, validation

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Job:
    """A DDPJob as the API server holds it: typed spec and status (the CRD's model), and the raw object."""

    raw: dict[str, Any]

    @property
    def name(self) -> str:
        return self.raw["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.raw["metadata"].get("namespace", "")

    @property
    def uid(self) -> str:
        return self.raw["metadata"].get("uid", "")

    @property
    def spec(self) -> model.DDPJobSpec:
        return validation.parse_spec(self.raw.get("spec"))

    @property
    def status(self) -> model.DDPJobStatus:
        """Salvaged field by field: a status written by a newer operator never makes the client fail."""
        return model.salvage(model.DDPJobStatus, self.raw.get("status") or {}) or model.DDPJobStatus()

    @property
    def phase(self) -> str | None:
        return (self.raw.get("status") or {}).get("phase")

    @property
    def progress(self) -> model.Progress | None:
        return self.status.progress

    def condition(self, type_: str) -> model.Condition | None:
        return next((c for c in self.status.conditions if c.type == type_), None)

    def describe(self) -> str:
        """One line: phase, reason and message, workers, restarts, progress."""
        s = self.status
        parts = [f"phase {s.phase or 'none yet'}"]
        reason = next((c.reason for c in s.conditions if c.type == s.phase and c.reason), "")
        if reason:
            parts[0] += f" ({reason})"
        parts.append(f"{s.ready_replicas}/{(self.raw.get('spec') or {}).get('replicas', '?')} workers ready")
        parts.append(f"restarts {s.restarts}, disruptions {s.disruptions}")
        p = s.progress
        if p is not None and p.step is not None:
            parts.append(f"step {p.step}" + (f" of {p.total_steps}" if p.total_steps else ""))
        if s.message:
            parts.append(f"message: {s.message}")
        return ", ".join(parts)
