"""The controller's work queue (workqueue.WorkQueue): a job not yet reconciled in its spec goes ahead of
resyncs, the triggers of a waiting job fold into one pass, a job runs one pass at a time (once more after
a trigger during its pass), at most `concurrency` passes run at once, and timers keep the earliest due.
Also: kopf's per-event "Handler ... succeeded." lines are shown at DEBUG, not INFO."""

from __future__ import annotations

import asyncio


from ddpjob_operator.workqueue import WorkQueue


class Work:
    """Records the passes; a pass of a key in `held` waits until the test releases it."""

    def __init__(self) -> None:
        self.passes: list[str] = []
        self.active: set[str] = set()
        self.most_at_once = 0
        self.held: dict[str, asyncio.Event] = {}

    async def __call__(self, key: str) -> None:
        assert key not in self.active, f"two passes of {key} at once"
        self.active.add(key)
        self.most_at_once = max(self.most_at_once, len(self.active))
        self.passes.append(key)
        try:
            if key in self.held:
                await self.held[key].wait()
            await asyncio.sleep(0)
        finally:
            self.active.discard(key)

    def hold(self, key: str) -> asyncio.Event:
        self.held[key] = asyncio.Event()
        return self.held[key]


async def drained(queue: WorkQueue, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not queue.idle():
        assert asyncio.get_running_loop().time() < deadline, "the queue never drained"
        await asyncio.sleep(0.001)


async def test_a_job_not_yet_reconciled_in_its_spec_goes_ahead_of_the_resyncs():
    work, new = Work(), set()
    queue = WorkQueue(work, concurrency=1, settle_seconds=0.001, urgent=lambda key: key in new)
    release = work.hold("resync-0")
    for i in range(5):
        queue.add(f"resync-{i}")
    await asyncio.sleep(0.01)
    new.add("new")
    queue.add("new")
    release.set()
    await drained(queue)
    assert work.passes == ["resync-0", "new", "resync-1", "resync-2", "resync-3", "resync-4"]


async def test_a_waiting_job_that_becomes_urgent_moves_ahead_once():
    work, new = Work(), set()
    queue = WorkQueue(work, concurrency=1, settle_seconds=0.001, urgent=lambda key: key in new)
    release = work.hold("a")
    for key in ("a", "b", "c", "d"):
        queue.add(key)
    new.add("d")  # its spec changed while it waited
    queue.add("d")
    release.set()
    await drained(queue)
    assert work.passes == ["a", "d", "b", "c"]


async def test_a_held_queue_starts_nothing_and_on_release_runs_the_new_job_first():
    """The controller holds its queue until every job and pod is listed: the triggers meanwhile are kept
    and folded, and the job not yet reconciled goes first whatever order the listing gave."""
    work, new = Work(), {"new"}
    queue = WorkQueue(work, concurrency=1, settle_seconds=0.001, urgent=lambda key: key in new)
    queue.hold()
    for key in ("resync-0", "resync-1", "new", "resync-0"):
        queue.add(key)
    await asyncio.sleep(0.01)
    assert work.passes == [] and len(queue) == 3 and not queue.idle()
    queue.release()
    await drained(queue)
    assert work.passes == ["new", "resync-0", "resync-1"]


async def test_no_resync_starts_beside_an_urgent_pass_until_it_is_done():
    work, new = Work(), {"new"}
    queue = WorkQueue(work, concurrency=4, settle_seconds=0.001, urgent=lambda key: key in new)
    release = work.hold("new")
    queue.add("new")
    for i in range(3):
        queue.add(f"resync-{i}")
    await asyncio.sleep(0.01)
    assert work.passes == ["new"]  # three slots free, and still alone
    queue.add("new-2")
    new.add("new-2")
    queue.add("new-2")
    await asyncio.sleep(0.01)
    assert work.passes == ["new", "new-2"]  # another urgent pass may run beside it
    release.set()
    await drained(queue)
    assert work.passes == ["new", "new-2", "resync-0", "resync-1", "resync-2"]


async def test_an_urgent_pass_that_takes_too_long_holds_the_resyncs_back_only_for_its_time_alone():
    work, new = Work(), {"stuck"}
    queue = WorkQueue(work, concurrency=2, settle_seconds=0.001, urgent=lambda key: key in new,
                      urgent_alone_seconds=0.05)
    release = work.hold("stuck")  # e.g. an API server that does not answer
    queue.add("stuck")
    queue.add("resync")
    await asyncio.sleep(0.01)
    assert work.passes == ["stuck"]
    await asyncio.sleep(0.1)
    assert work.passes == ["stuck", "resync"]
    release.set()
    await drained(queue)


async def test_the_triggers_of_a_waiting_job_fold_into_one_pass():
    work = Work()
    queue = WorkQueue(work, concurrency=1, settle_seconds=0.001)
    release = work.hold("busy")
    queue.add("busy")
    for _ in range(50):  # a burst of pod events for a job whose pass has not started
        queue.add("job")
    assert len(queue) == 2
    release.set()
    await drained(queue)
    assert work.passes == ["busy", "job"]


async def test_triggers_asked_to_settle_gather_a_burst_into_one_pass_and_keep_the_queue_busy():
    """Pod changes come in bursts (a gang fails together): they wait `settle` seconds, folding in the rest."""
    work = Work()
    queue = WorkQueue(work, concurrency=1, settle_seconds=0.001)
    for _ in range(5):
        queue.add("gang", settle=0.05)
    await asyncio.sleep(0.01)
    assert work.passes == [] and not queue.idle() and len(queue) == 1
    queue.add("gang", settle=0.05)
    await drained(queue)
    assert work.passes == ["gang"]


async def test_a_trigger_during_a_pass_runs_it_once_more_after_it_settled_never_two_at_once():
    work = Work()
    queue = WorkQueue(work, concurrency=8, settle_seconds=0.5)
    release = work.hold("job")
    queue.add("job")
    await asyncio.sleep(0.01)
    for _ in range(10):  # the events its own pass caused
        queue.add("job")
    del work.held["job"]
    release.set()
    await asyncio.sleep(0.02)
    assert work.passes == ["job"] and not queue.idle()  # settling: more triggers still fold in
    queue.add("job")
    await drained(queue)
    assert work.passes == ["job", "job"]


async def test_at_most_concurrency_passes_run_at_once():
    work = Work()
    queue = WorkQueue(work, concurrency=3, settle_seconds=0.001)
    gates = [work.hold(f"job-{i}") for i in range(10)]
    for i in range(10):
        queue.add(f"job-{i}")
    await asyncio.sleep(0.01)
    assert len(work.active) == 3 and len(queue) == 10
    for gate in gates:
        gate.set()
    await drained(queue)
    assert work.most_at_once == 3 and sorted(work.passes) == sorted(f"job-{i}" for i in range(10))


async def test_the_earliest_timer_wins_and_a_forgotten_job_keeps_none():
    work = Work()
    queue = WorkQueue(work, concurrency=2, settle_seconds=0.001)
    queue.add_after("soon", 0.02)
    queue.add_after("soon", 5.0)  # later: the earlier one stays
    queue.add_after("later", 5.0)
    queue.add_after("later", 0.03)  # earlier: replaces it
    queue.add_after("gone", 0.01)
    queue.forget("gone")
    await asyncio.sleep(0.15)
    await drained(queue)
    assert sorted(work.passes) == ["later", "soon"]


async def test_clear_drops_queued_work_timers_and_cancels_passes_under_way():
    work = Work()
    queue = WorkQueue(work, concurrency=1, settle_seconds=0.001)
    work.hold("running")
    queue.add("running")
    queue.add("queued")
    queue.add_after("timed", 0.01)
    await asyncio.sleep(0)
    queue.clear()
    await asyncio.sleep(0.05)
    assert work.passes == ["running"] and queue.idle() and len(queue) == 0
    queue.add("after")  # a leader again: the queue works as before
    await drained(queue)
    assert work.passes == ["running", "after"]
    await queue.stop()


async def test_a_pass_cancelled_before_it_started_leaves_its_job_free():
    """A leader fenced in the instant a pass was dispatched: the pass never ran, its job is not stuck."""
    work = Work()
    queue = WorkQueue(work, concurrency=4, settle_seconds=0.001)
    queue.add("job")  # dispatched: a task that has not run yet
    queue.clear()
    await asyncio.sleep(0.01)
    assert work.passes == [] and queue.idle()
    queue.add("job")  # leading again
    await drained(queue)
    assert work.passes == ["job"]
