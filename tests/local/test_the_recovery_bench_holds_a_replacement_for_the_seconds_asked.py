"""bench/recovery.py's slow-start knob (issue 36's targets: kill to the next step with a replacement that starts
60 s late, or never): `--replacement S` holds every killed worker's replacement pod Pending for S seconds before
it starts (the local runner's Unschedulable hold), and the bench's next fault waits for the whole world again.

A real local run (the runner's zygote, two workers of the bundled trainer), worker 1 killed at a step, its
replacement held HOLD_S seconds: the pod is Pending that long, then starts and the world is whole again, and the
bench ends the run there."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
HOLD_S = 4.0
KILL_AT = 22


def _bench():
    """bench/recovery.py, imported by path (bench/ is not a package); sys.path as it was once it is loaded."""
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("recovery_bench", ROOT / "bench" / "recovery.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = saved


recovery = _bench()


def test_a_replacement_held_for_seconds_starts_then_and_the_world_is_whole_again(tmp_path: Path) -> None:
    job = recovery.load_example(kills=1, every=15, recovery="InProcess")
    # Survivors train on at once: the bench, not the epochs, ends the run once the world is whole again.
    spec = job.spec.model_copy(update={"args": [*job.spec.args, "--epochs", "100000"]})
    phase, timeline = recovery.run_local(job.model_copy(update={"spec": spec}), tmp_path, None,
                                         ((1, KILL_AT, recovery.KILL),), replacement=f"{HOLD_S:g}", end=True)
    entries = timeline.sorted()
    events = (tmp_path / job.metadata.name / "events.log").read_text()
    assert phase.startswith("ended by the bench after the last fault"), (phase, events)
    killed_at = next(t for t, kind, _ in entries if kind == "kill")
    # The replacement was created Pending with the hold, and nothing else was held.
    assert events.count(f"is not scheduled: Pending for {HOLD_S:g}s (Unschedulable)") == 1, events
    # Short from the kill, whole again only once the hold ended (the replacement's start comes on top).
    worlds = [(t, whole) for t, kind, whole in entries if kind == "world" and t > killed_at]
    assert worlds and worlds[0][1] == 0 and any(whole for _, whole in worlds), (worlds, events)
    whole_at = next(t for t, whole in worlds if whole == 1)
    assert whole_at - killed_at >= HOLD_S, (whole_at - killed_at, events)


def test_the_knob_refuses_what_is_not_at_once_never_or_seconds() -> None:
    assert recovery.replacement_option("never") == "never" and recovery.replacement_option("60") == "60"
    for bad in ("-1", "soon", "", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="at-once, never or seconds"):
            recovery.replacement_option(bad)
