"""Run by test_inprocess_recovery: the bundled trainer (`python -m ddp_trainer` and its arguments), whose
survivors' rescue write (the data file, on the rescue thread) is held until the survivor is in a newer
generation than the one that failed ($DDPJOB_GENERATION, which `Job` rewrites when it enters one) and that
generation's rank 0 has raised its fence on the checkpoint directory (it does so before the state exchange,
which the survivor's `joined` follows; entering the generation alone can come first). A survivor that waited
for its rescue before joining would wait forever here: the test then fails on its timeout."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from ddp_trainer.__main__ import main
from ddp_trainer.runtime import exit_process
from ddp_trainer.runtime.checkpoint import store

HOLD_AT_MOST_S = 60.0
_write = store.atomic_write_bytes
_started_in = os.environ.get("DDPJOB_GENERATION", "")


def _newer_generation_started() -> bool:
    if os.environ.get("DDPJOB_GENERATION", "") == _started_in:
        return False
    fences = Path(os.environ["DDPJOB_CHECKPOINT_DIR"]).rglob("generation-*.fence")
    return any(int(f.name.split("-")[1]) > int(_started_in) for f in fences)


def held_write(path, data) -> None:
    if threading.current_thread().name == "ddpjob-rescue" and str(path).endswith(".pt"):
        deadline = time.monotonic() + HOLD_AT_MOST_S
        while not _newer_generation_started() and time.monotonic() < deadline:
            time.sleep(0.02)
        print(f"rescue write released in generation {os.environ.get('DDPJOB_GENERATION')}", file=sys.stderr,
              flush=True)
    _write(path, data)


store.atomic_write_bytes = held_write  # where a step's data file is written
sys.argv[0] = "ddp_trainer"
exit_process(main(sys.argv[1:]))
