"""What a local run shows: a live table on a terminal, timestamped lines in CI logs, a summary."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .. import model

PLAIN_PROGRESS_EVERY_S = 10.0  # CI logs: training progress at most this often (state changes always)

PHASE_STYLE = {"Succeeded": "bold green", "Failed": "bold red", "Restarting": "yellow",
               "Running": "cyan", "Pending": "dim", "Suspended": "magenta"}


@dataclass(frozen=True)
class WorkerRow:
    name: str
    state: str  # Pending, Running, Terminating, Succeeded, Failed
    restarts: int = 0
    exit_code: int | None = None  # of the current process once it ended, else of the rank's last failure
    step: int | None = None
    loss: float | None = None


@dataclass(frozen=True)
class Snapshot:
    job: str
    phase: str
    message: str = ""
    restarts: int = 0
    max_restarts: int = 0
    elapsed_s: float = 0.0
    step: int | None = None
    loss: float | None = None
    world_size: int | None = None
    last_checkpoint_step: int | None = None
    workers: tuple[WorkerRow, ...] = ()
    percent: int | None = None  # status.progress.percent / eta, as `kubectl get ddpj` shows them
    eta: str | None = None
    stalled: str | None = None  # the Stalled condition's message while it is True
    desired_world_size: int | None = None  # status.desiredWorldSize: world_size below it while training short
    degraded: str | None = None  # the Degraded condition's message while it is True


@dataclass(frozen=True)
class Summary:
    job: str
    phase: str
    message: str
    elapsed_s: float
    restarts: int
    disruptions: int
    worker_restarts: dict[str, int]
    result: dict | None  # the trainer's result.json, when it finished
    checkpoint_dir: str | None
    log_dir: str
    progress: model.Progress | None = None  # the last status.progress (kept after the end)
    stalls: int = 0  # hangs detected (runPolicy.progressDeadlineSeconds)
    newest_checkpoint: tuple[int, str] | None = None  # (step, path) of the newest committed one on disk
    notes: tuple[str, ...] = ()  # what did not happen as asked (a --kill-at-step that never fired)
    incidents: tuple[model.Incident, ...] = ()  # status.incidents: each recovery's path, time and steps lost


    def lines(self) -> list[str]:
        out = [f"job {self.job}: {self.phase} after {self.elapsed_s:.1f}s"
               + (f" ({self.message})" if self.message else ""),
               f"restarts charged to the budget: {self.restarts}, disruptions: {self.disruptions}"
               + "".join(f", {n}: {r}" for n, r in self.worker_restarts.items() if r)]
        p = self.progress
        if p is not None and p.step is not None:
            # One figure per fact: the final loss is the result's (the last report's lags behind it), and the
            # newest checkpoint is the one on disk (a final save follows the last report).
            total = f" of {p.total_steps} ({p.percent}%)" if p.total_steps else ""
            loss = "" if self.result and "loss" in self.result else f", loss {_num(p.loss)}"
            saved = "" if self.checkpoint_dir else f", last checkpoint step {_num(p.last_checkpoint_step, 'd')}"
            out.append(f"progress: step {p.step}{total}{loss}, samples/s {_num(p.samples_per_second, '.1f')}{saved}"
                       + (f", stalls detected: {self.stalls}" if self.stalls else ""))
        elif self.stalls:
            out.append(f"stalls detected: {self.stalls}")
        if self.result:  # what the trainer's job.result(...) wrote, whatever the script: no fields of our own
            order = ["step", "epoch", *sorted(set(self.result) - {"step", "epoch", "world_size", "status"}),
                     "world_size"]
            out.append("final metrics: " + ", ".join(f"{k} {_metric(k, self.result[k])}" for k in order
                                                     if k in self.result))
        if self.checkpoint_dir:
            out.append(f"checkpoints: {self.checkpoint_dir}")
            if self.newest_checkpoint is not None:  # on disk now, not the last progress report's
                out.append(f"newest checkpoint: step {self.newest_checkpoint[0]} ({self.newest_checkpoint[1]})")
            else:
                out.append("newest checkpoint: none")
        out.extend(_recovery_line(incident, incident.recovery) for incident in self.incidents
                   if incident.recovery is not None)
        out.append(f"worker logs: {self.log_dir}")
        return out + list(self.notes)


def _recovery_line(incident: model.Incident, r: model.IncidentRecovery) -> str:
    """One incident's recovery (status.incidents[].recovery), as `kubectl describe` shows it on a cluster."""
    what = f"recovery from {incident.reason or incident.cause} (generation {incident.generation}): "
    if not r.first_step_time:
        return what + "not complete"
    taken = f"{r.path or 'unreported path'}" + (f" ({r.fallback_reason})" if r.fallback_reason else "")
    spare = ", a spare took the place" if r.spare else ""
    lost = f", {r.steps_lost} steps lost" if r.steps_lost is not None else ""
    return what + f"{taken}{spare}, {_num(r.seconds, '.1f')} s to the first step{lost}"


def _metric(key: str, value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2%}" if key.endswith("accuracy") else f"{value:.4f}"
    return str(value)


def _num(value: float | int | None, fmt: str = ".4f") -> str:
    return "-" if value is None else format(value, fmt)


class View(Protocol):
    def update(self, snap: Snapshot) -> None: ...
    def event(self, text: str) -> None: ...
    def log_line(self, pod: str, line: str) -> None: ...
    def close(self, summary: Summary) -> None: ...


def make_view(console: Console | None = None) -> View:
    console = console or Console()
    return LiveView(console) if console.is_terminal else PlainView(console)


class ConsoleOutput:
    """A console that may vanish mid-run (the terminal or ssh session closed: SIGHUP, then EIO or EPIPE on every
    write): showing stops at the first OSError, and the run and its cleanup go on."""

    def __init__(self, console: Console):
        self.console = console
        self.lost = False

    def _write(self, draw: Callable[[], None]) -> None:
        if self.lost:
            return
        try:
            draw()
        except OSError:
            self.lost = True


class PlainView(ConsoleOutput):
    """No terminal: one timestamped line per state change, progress now and then."""

    def __init__(self, console: Console):
        super().__init__(console)
        self._last: Snapshot | None = None
        self._last_progress_at = 0.0

    def _print(self, text: str) -> None:
        self._write(lambda: self.console.print(f"{time.strftime('%H:%M:%S')} {text}", markup=False, highlight=False,
                                               soft_wrap=True))

    def update(self, snap: Snapshot) -> None:
        last = self._last
        if last is None or (snap.phase, snap.message) != (last.phase, last.message):
            self._print(f"job {snap.job}: {snap.phase}" + (f" - {snap.message}" if snap.message else ""))
        before = {w.name: w for w in last.workers} if last else {}
        for w in snap.workers:
            old = before.get(w.name)
            if old is None or (old.state, old.restarts) != (w.state, w.restarts):
                exit_text = f" exit {w.exit_code}" if w.state in ("Failed", "Succeeded") else ""
                self._print(f"{w.name}: {w.state}{exit_text} (restarts {w.restarts})")
        now = time.monotonic()
        if snap.step is not None and (last is None or snap.step != last.step) \
                and now - self._last_progress_at >= PLAIN_PROGRESS_EVERY_S:
            self._last_progress_at = now
            self._print(_progress_text(snap))
        self._last = snap

    def event(self, text: str) -> None:
        self._print(text)

    def log_line(self, pod: str, line: str) -> None:
        self._write(lambda: self.console.print(f"[{pod}] {line}", markup=False, highlight=False, soft_wrap=True))

    def close(self, summary: Summary) -> None:
        for line in summary.lines():
            self._print(line)


def _progress_text(snap: Snapshot) -> str:
    done = f" ({snap.percent}%, ETA {snap.eta or '-'})" if snap.percent is not None else ""
    world = snap.world_size or "-"
    if snap.desired_world_size and snap.world_size is not None and snap.world_size < snap.desired_world_size:
        world = f"{snap.world_size} of {snap.desired_world_size}"  # training short, as kubectl's WORLD and DESIRED
    text = (f"progress: step {snap.step}{done} loss {_num(snap.loss)} world_size {world} "
            f"last checkpoint step {_num(snap.last_checkpoint_step, 'd')}")
    text += f"\nDEGRADED: {snap.degraded}" if snap.degraded else ""
    return text + (f"\nSTALLED: {snap.stalled}" if snap.stalled else "")


class LiveView(ConsoleOutput):
    """A terminal: a table redrawn in place; events and log lines scroll above it."""

    def __init__(self, console: Console):
        super().__init__(console)
        # Started at the first update: a run refused before it starts draws nothing and leaves the terminal as is.
        self.live = Live(console=console, auto_refresh=False, transient=False)

    def update(self, snap: Snapshot) -> None:
        self._write(lambda: self._draw(snap))

    def _draw(self, snap: Snapshot) -> None:
        if not self.live.is_started:
            self.live.start()
        self.live.update(self._table(snap), refresh=True)

    def _table(self, snap: Snapshot) -> Table:
        title = Text.assemble(f"DDPJob {snap.job}  ", (snap.phase, PHASE_STYLE.get(snap.phase, "")),
                              f"  {snap.elapsed_s:.0f}s  restarts {snap.restarts}/{snap.max_restarts}")
        table = Table(title=title, title_justify="left", expand=False)
        for column in ("worker", "state", "restarts", "last exit", "step", "loss"):
            table.add_column(column, justify="right" if column not in ("worker", "state") else "left")
        for w in snap.workers:
            table.add_row(w.name, Text(w.state, PHASE_STYLE.get(w.state, "")), str(w.restarts),
                          _num(w.exit_code, "d"), _num(w.step, "d"), _num(w.loss))
        if snap.message:
            table.caption = snap.message
        if snap.step is not None:
            table.caption = ((table.caption + "\n") if table.caption else "") + _progress_text(snap)
        return table

    def event(self, text: str) -> None:
        self._write(lambda: self.live.console.print(f"{time.strftime('%H:%M:%S')} {text}", markup=False,
                                                    highlight=False))

    def log_line(self, pod: str, line: str) -> None:
        self._write(lambda: self.live.console.print(f"[{pod}] {line}", markup=False, highlight=False))

    def close(self, summary: Summary) -> None:
        self._write(self.live.stop)
        style = PHASE_STYLE.get(summary.phase, "")
        for i, line in enumerate(summary.lines()):
            self._write(lambda: self.console.print(Text(line, style if i == 0 else "")))
