"""The controller's side tasks: work started beside the reconciles and never awaited by them (an Event
posted, the progress server started, the progress label kept on the leader's pod), all stopped together.

Pure asyncio: imports nothing of the operator.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Coroutine

logger = logging.getLogger("ddpjob_operator")


class SideTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Run `work` beside the caller; a failure is logged (naming `what`), never raised into anyone
        (e.g. the progress port is taken: say so, keep operating)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._done, what))

    def _done(self, what: str, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s failed", what, exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def stop(self) -> None:
        """Cancel every task still running and wait for them to end."""
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
