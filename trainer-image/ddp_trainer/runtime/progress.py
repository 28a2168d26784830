"""Progress reporting: one cheap, non-blocking, bounded client, a no-op when nothing is configured.

    from ddp_trainer.runtime import report
    report(step=120, total_steps=1000, loss=0.42, epoch=1, samples_per_second=812.0)

`report()` only stores the newest values and wakes a background thread (latest wins: the backlog is
never more than one report, whatever the rate), so it costs microseconds and never waits for a
disk or a network. Call it on every rank; each transport is used only where it applies, and a
process with none configured does nothing. Transports (docs/launch-contract.md, "Progress"):

- file (global rank 0): `progress.json` in the job's own directory on the volume,
  `<DDPJOB_CHECKPOINT_DIR>/<DDPJOB_NAMESPACE>.<DDPJOB_NAME>/` (contract.job_root: two jobs sharing a
  directory never share it), written atomically (what `ddpjob run --local` reads);
- HTTP (local rank 0 of every pod): a JSON POST to `$DDPJOB_PROGRESS_URL` when set, with
  `Authorization: Bearer <$DDPJOB_PROGRESS_TOKEN_FILE>` (read at each send: the kubelet rotates it),
  timeout 2 s, body at most 4 KiB; an https URL is verified against `$DDPJOB_PROGRESS_CA` (PEM) when set,
  else the system's CAs; the newest report is sent again every 5 s while nothing new comes
  (a heartbeat); a 503 is retried once at once; failures are dropped: progress is advisory and must
  never stop training. Transient ones (5xx, 429, the network) are logged at debug level only: they
  say nothing about the training, and a warning could become the launcher's last log line, which a
  killed worker's incident quotes. A refused token or report (another 4xx) is a misconfiguration:
  warned once.

`ProgressReporter.from_env` is the one way a trainer builds its reporter (`Job`, the framework callbacks,
`report()`): the directory, endpoint, token and CA all come from the environment there.

`flush()` (also called by `close()`) writes the newest report synchronously, for the end of a run: a
trainer's last report is taken before its process exits, so the operator's status write that says
Succeeded carries the final step.

Every report names the rendezvous generation its trainer runs in (`generation`, from torchrun's run id): a
survivor's trainer that reports once more as it stops, after the operator carried its pod into the next
generation, is then not taken for the new generation's.

A generation that came back from an incident (its trainers resumed: in process, or from a checkpoint) carries
its recovery timeline in every report of its rank 0 (`recovery`, `recovery_field()`; set by `Job`, or a
framework callback, as `ProgressReporter.recovery`): sticky, because reports are latest-wins. A report whose
`recovery` differs from the last one sent (the generation's first, the one after its first step) is sent at
once, past the pacing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .contract import (CHECKPOINT_DIR_ENV, GENERATION_ENV, JOB_NAME_ENV, JOB_NAMESPACE_ENV, PROGRESS_CA_ENV,
                       PROGRESS_FILE, PROGRESS_TOKEN_ENV, PROGRESS_URL_ENV, RESULT_FILE, env_int, job_root)

log = logging.getLogger(__name__)
MAX_BODY = 4096
FILE_INTERVAL_S = 0.1
# A loop with short steps need not build a report per step: most would be overwritten before a publish.
REPORT_PACE_S = FILE_INTERVAL_S / 4
CORE_KEYS = ("step", "total_steps", "epoch", "world_size", "last_checkpoint_step", "rank", "generation", "loss",
             "samples_per_second", "step_seconds", "time", "recovery")
RECOVERY_PATHS = ("InProcess", "Restart")
RECOVERY_KINDS = ("Shrink", "Join")  # an in-process recovery's view change (issue 36)
RECOVERY_REASON_LIMIT = 512  # characters of `recovery.reason` (the whole report stays under MAX_BODY)


def recovery_field(path: str, *, resumed_step: int, rendezvous_time: float, first_step_time: float | None = None,
                   reason: str = "", kind: str | None = None) -> dict[str, Any]:
    """The report's `recovery` object (docs/launch-contract.md, "Progress"): how this generation came back from
    the incident before it. `path` InProcess (this process survived, or its state came from a peer) or
    Restart; `reason`: why Restart where in-process recovery was asked for; `resumed_step`: the step the
    generation trains from; the times (time.time()): its process group complete, its first optimizer step done;
    `kind` (in process, issue 36): Shrink, the survivors formed a short view, or Join, ranks joined a view."""
    if path not in RECOVERY_PATHS:
        raise ValueError(f"recovery path {path!r} is not one of {', '.join(RECOVERY_PATHS)}")
    if kind is not None and kind not in RECOVERY_KINDS:
        raise ValueError(f"recovery kind {kind!r} is not one of {', '.join(RECOVERY_KINDS)}")
    # ASCII (escaped) before the cut: 512 characters outside the BMP would be 6 KiB of JSON, past the body limit.
    reason = reason.encode("ascii", "backslashreplace").decode("ascii")
    return {"path": path, "reason": reason[:RECOVERY_REASON_LIMIT], "resumed_step": int(resumed_step),
            "rendezvous_time": float(rendezvous_time),
            "first_step_time": None if first_step_time is None else float(first_step_time),
            **({"kind": kind} if kind is not None else {})}


class ProgressReporter:
    def __init__(self, directory: str | os.PathLike | None = None, url: str | None = None, *,
                 enabled: bool = True, http_enabled: bool | None = None, token_file: str | None = None,
                 rank: int | None = None, http_timeout_s: float = 2.0, heartbeat_s: float = 5.0,
                 min_interval_s: float = 1.0, ca_pem: str | None = None, generation: int | None = None) -> None:
        """`enabled` switches the file transport (global rank 0), `http_enabled` the HTTP one (local
        rank 0 of each pod; defaults to `enabled`). `generation`: the rendezvous generation reports name
        (None: this process's at each report, from its environment, which in-process recovery updates)."""
        self.path = Path(directory) / PROGRESS_FILE if directory and enabled else None
        http = enabled if http_enabled is None else http_enabled
        self.url = (url or None) if http else None
        self.token_file, self.rank = token_file, rank
        self.generation = generation
        self._warned: set[str] = set()
        self._ssl: ssl.SSLContext | None = None
        if self.url is not None and ca_pem:
            try:
                self._ssl = ssl.create_default_context(cadata=ca_pem)
            except (ssl.SSLError, ValueError) as e:  # progress is advisory: report nowhere, say why once
                self._warn_once("ca", f"cannot use ${PROGRESS_CA_ENV} to verify {self.url}: {e}; it takes the CA "
                                      f"certificate's PEM text (-----BEGIN CERTIFICATE-----...), not a file's path; "
                                      f"progress is not posted")
                self.url = None
        self.enabled = self.path is not None or self.url is not None
        self.http_timeout_s, self.heartbeat_s = http_timeout_s, heartbeat_s
        # HTTP pacing: at most one POST per min_interval_s (the endpoint allows 2 a second per pod); the
        # newest report wins meanwhile, so a fast loop costs nothing more than a slow one.
        self.min_interval_s, self._next_post = min_interval_s, 0.0
        # File pacing: progress.json at most every FILE_INTERVAL_S (its readers poll it: the local runner
        # every 0.2 s); a write per step of a fast loop costs the trainer's CPU for nothing.
        self._next_file = 0.0
        self._directory_made = False  # the job's own directory may not exist before its first checkpoint
        self._idle = False  # the thread waits for a report: only then does report() wake it (no GIL churn)
        self._last_sent: dict[str, Any] | None = None
        self._latest: dict[str, Any] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()
        # The generation's recovery timeline (recovery_field), added to every report while set; a report whose
        # recovery is not the last one sent skips the pacing (_prompt).
        self.recovery: dict[str, Any] | None = None
        self._recovery_sent: dict[str, Any] | None = None
        self._prompt = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, checkpoint_dir: str | os.PathLike | None = None,
                 rank: int | None = None, local_rank: int | None = None) -> "ProgressReporter":
        """The reporter of a trainer in this environment (`env`, default this process's), the one way to build
        one: progress.json in the job's own directory under `checkpoint_dir` (default $DDPJOB_CHECKPOINT_DIR;
        "": no file), the endpoint, its token and its CA from DDPJOB_PROGRESS_*. `rank`, `local_rank`: this
        process's (default torchrun's RANK, LOCAL_RANK; 0 outside torchrun): the file is global rank 0's, the
        POST local rank 0's. With `env` None the generation is read at each report (in-process recovery moves it)."""
        from .checkpoint import CheckpointDirError  # torch: imported by the trainer that reports anyway
        e = os.environ if env is None else env
        mount = e.get(CHECKPOINT_DIR_ENV) if checkpoint_dir is None else checkpoint_dir
        rank = env_int(e, "RANK", 0) if rank is None else rank  # a plain script is its own rank 0
        local_rank = env_int(e, "LOCAL_RANK", 0) if local_rank is None else local_rank
        directory, refused = None, None
        if mount:
            try:
                directory = job_directory(mount, e)
            except CheckpointDirError as error:
                refused = error
        reporter = cls(directory, e.get(PROGRESS_URL_ENV) or None, enabled=rank == 0,
                       http_enabled=local_rank == 0, token_file=e.get(PROGRESS_TOKEN_ENV) or None, rank=rank,
                       ca_pem=e.get(PROGRESS_CA_ENV) or None, generation=None if env is None else _generation(e))
        if refused is not None and rank == 0:  # progress is advisory: no file, said once
            reporter._warn_once("file", f"{refused}; {PROGRESS_FILE} is not written")
        return reporter

    def report(self, *, step: int, total_steps: int | None = None, loss: float | None = None,
               **fields: Any) -> None:
        """Record the newest progress; returns at once. Extra keyword fields are passed through
        (epoch, samples_per_second, world_size, last_checkpoint_step, eval_loss, ...)."""
        if not self.enabled:
            return
        values = {"step": int(step), "total_steps": total_steps, "loss": None if loss is None else float(loss),
                  "rank": self.rank, "generation": _generation(os.environ) if self.generation is None else self.generation,
                  **fields, "time": time.time()}
        # A diverged run's NaN or infinite loss (or any such figure) goes as null: JSON has no NaN, and the
        # endpoint refuses a report it cannot read, which would make a training run look stalled.
        values = {key: _finite_or_none(value) for key, value in values.items()}
        if self.recovery is not None:
            values["recovery"] = dict(self.recovery)
        with self._cond:
            self._latest = values
            self._prompt = values.get("recovery") != self._recovery_sent
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="ddpjob-progress", daemon=True)
                self._thread.start()
            if self._idle or self._prompt:  # a prompt report also ends a pacing wait
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._latest is None and not self._closed:
                    # With an endpoint, wake up for the heartbeat; otherwise sleep until a report.
                    self._idle = True
                    self._cond.wait(self.heartbeat_s if self.url is not None else None)
                    self._idle = False
                while self.url is not None and not self._closed and not self._prompt \
                        and time.monotonic() < self._next_post:
                    self._cond.wait(self._next_post - time.monotonic())
                while self.url is None and self.path is not None and not self._closed and not self._prompt \
                        and time.monotonic() < self._next_file:
                    self._cond.wait(self._next_file - time.monotonic())
                values, self._latest, self._prompt = self._latest, None, False
                if values is None and self._closed:
                    return
            if values is not None:
                self._send(values)
            elif self._last_sent is not None:  # nothing new for heartbeat_s: the newest again
                with self._write_lock:
                    self._post(self._last_sent)

    def _send(self, values: dict[str, Any]) -> None:
        with self._write_lock:
            self._recovery_sent = values.get("recovery")
            if self.path is not None:
                try:
                    if not self._directory_made:
                        self.path.parent.mkdir(parents=True, exist_ok=True)
                        self._directory_made = True
                    _replace_json(self.path, values)
                    self._next_file = time.monotonic() + FILE_INTERVAL_S
                except OSError as e:
                    self._warn_once("file", f"cannot write {self.path}: {e}")
            if self.url is not None:
                self._last_sent = values
                self._post(values)

    def _post(self, values: dict[str, Any]) -> None:
        self._next_post = time.monotonic() + self.min_interval_s
        body = json.dumps(values).encode()
        if len(body) > MAX_BODY:  # the endpoint refuses more: keep the fields it knows
            body = json.dumps({k: values.get(k) for k in CORE_KEYS}).encode()
        headers = {"Content-Type": "application/json"}
        if self.token_file:
            try:
                headers["Authorization"] = "Bearer " + Path(self.token_file).read_text().strip()
            except OSError as e:
                self._warn_once("token", f"cannot read the progress token {self.token_file}: {e}")
        for attempt in (1, 2):  # a 503 (a standby operator replica) once more, on a new connection
            try:
                req = urllib.request.Request(self.url, data=body, method="POST", headers=headers)
                with urllib.request.urlopen(req, timeout=self.http_timeout_s, context=self._ssl) as resp:
                    resp.read()
                return
            except urllib.error.HTTPError as e:
                if e.code == 503 and attempt == 1:
                    continue
                message = f"progress POST to {self.url} failed: HTTP {e.code} {e.reason}"
                if e.code >= 500 or e.code == 429:
                    log.debug("%s (transient; dropped)", message)
                else:
                    self._warn_once("http", message)
                return
            except Exception as e:  # noqa: BLE001 - any transport failure is dropped the same way
                log.debug("progress POST to %s failed: %s (transient; dropped)", self.url, e)
                return

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s (further failures are not logged)", msg)

    def flush(self) -> None:
        """Write the newest pending report now, in this thread."""
        with self._cond:
            values, self._latest = self._latest, None
        if values is not None:
            self._send(values)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _generation(environ: Mapping[str, str]) -> int | None:
    """This trainer's rendezvous generation (checkpoint.rendezvous_generation); None outside a DDPJob or when
    the environment cannot say (progress is advisory: never an error here)."""
    from .checkpoint import rendezvous_generation  # torch: imported by the trainer that reports anyway
    try:
        run, generation = rendezvous_generation(environ)
    except ValueError:
        return None
    return generation if run or environ.get(GENERATION_ENV) else None



def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _replace_json(path: Path, values: dict[str, Any]) -> None:
    """progress.json atomically (a temp file renamed over it) but without fsync: it is advisory and
    rewritten within the second, where two fsyncs per step would cost a fast loop's CPU."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        tmp.write_text(json.dumps(values, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def job_directory(mount: str | os.PathLike, env: Mapping[str, str] | None = None) -> Path:
    """contract.job_root, after refusing a job name or namespace that is not one safe path component ("../x" would
    put progress.json and result.json outside it): CheckpointDirError naming the variable and the fix."""
    from .checkpoint import job_key  # torch: imported by the trainer that reports anyway
    e = os.environ if env is None else env
    job_key(e.get(JOB_NAME_ENV, ""), e.get(JOB_NAMESPACE_ENV, ""))
    return job_root(mount, e)


def write_result(checkpoint_dir: str | os.PathLike, result: Mapping[str, Any]) -> Path:
    """Rank 0's summary at a successful end, `result.json` in the job's own directory (beside progress.json, so two
    jobs sharing `checkpoint_dir` never share it), atomically and durably; returns its path."""
    from .checkpoint import atomic_write_json  # torch: imported by the trainer that finishes anyway
    directory = job_directory(checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_json(directory / RESULT_FILE, dict(result))
    return directory / RESULT_FILE


_default: ProgressReporter | None = None
_default_lock = threading.Lock()


def default_reporter() -> ProgressReporter:
    """The process's reporter, configured from the environment on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ProgressReporter.from_env()
        return _default


def report(*, step: int, total_steps: int | None = None, loss: float | None = None, **fields: Any) -> None:
    """`ProgressReporter.report` on the process's default reporter (see the module docstring)."""
    default_reporter().report(step=step, total_steps=total_steps, loss=loss, **fields)
