"""What faults.py and display.py read of a running local job: the runner gives itself as a `RunView`, so they
depend on these few names, not on runner.py."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Protocol

from .. import model
from .logs import JobFiles, LogTail
from .pods import WorkerProcess
from .processes import LocalProcess


class RunView(Protocol):
    name: str
    created_at: datetime
    interrupted: bool
    checkpoint_dir: Path | None
    log_dir: Path
    files: JobFiles  # the trainer's own files (progress.json, result.json, checkpoints)

    @property
    def spec(self) -> model.DDPJobSpec: ...

    @property
    def metadata_generation(self) -> int: ...

    @property
    def status(self) -> model.DDPJobStatus: ...

    @property
    def workers(self) -> dict[str, WorkerProcess]: ...

    @property
    def tails(self) -> dict[str, LogTail]: ...

    @property
    def store(self) -> LocalProcess | None: ...

    @property
    def stopped_by(self) -> str | None: ...

    def clock(self) -> datetime: ...

    def pod_of(self, index: int) -> str: ...

    def reported_step(self, progress: dict) -> int | None: ...

    def waiting_on_steps(self) -> list[str]: ...

    def scale(self, replicas: int) -> None: ...

    def set_suspend(self, suspend: bool) -> None: ...
