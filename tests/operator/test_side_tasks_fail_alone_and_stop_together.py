"""The controller's side tasks (side_tasks.py): a failing one is logged by what it was and harms nothing else;
stopping cancels every one still running, one not yet started included, and waits for them."""

from __future__ import annotations

import asyncio
import logging

from ddpjob_operator.side_tasks import SideTasks


def test_a_failure_is_logged_by_name_and_the_others_go_on(caplog):
    async def scenario() -> list[str]:
        tasks, done = SideTasks(), []

        async def fails() -> None:
            raise OSError("address already in use")

        async def works() -> None:
            await asyncio.sleep(0.01)
            done.append("works")

        tasks.spawn(fails(), "the progress endpoint")
        tasks.spawn(works(), "posting an event")
        assert len(tasks) == 2
        while len(tasks):
            await asyncio.sleep(0.005)
        return done

    with caplog.at_level(logging.ERROR, logger="ddpjob_operator"):
        assert asyncio.run(scenario()) == ["works"]
    failed = [r for r in caplog.records if r.getMessage() == "the progress endpoint failed"]
    assert len(failed) == 1 and "address already in use" in str(failed[0].exc_info[1])


def test_stop_cancels_what_runs_and_what_never_started(recwarn):
    async def scenario() -> tuple[bool, bool]:
        tasks, cancelled = SideTasks(), asyncio.Event()

        async def forever() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                cancelled.set()

        async def never_started() -> None:
            raise AssertionError("it ran")

        tasks.spawn(forever(), "a loop")
        await asyncio.sleep(0)  # the loop runs
        tasks.spawn(never_started(), "an event")  # stopped before its first step
        await tasks.stop()
        return cancelled.is_set(), len(tasks) == 0

    assert asyncio.run(scenario()) == (True, True)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]  # no coroutine left un-awaited
