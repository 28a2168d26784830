"""`Client.logs` and `Client.worker_pod` take a worker's replica index: a rank that is no whole number ("1" from a
command line read by hand, 1.0, None, True, a list) is refused before anything is sent, with one line naming the
argument and the fix, as a bad name is. It raised a bare TypeError from comparing it, after the job was read.
`tail_lines` likewise (it went into the query, and the server's 400 read as "no log yet")."""

from __future__ import annotations

import asyncio
import re

import pytest

from ddpjob_operator import client
from ddpjob_operator.kube import Connection

from .conftest import NAMESPACE
from .test_empty_or_invalid_names_are_refused_before_any_request import both_jobs_stay, cluster  # noqa: F401

NOT_RANKS = ("1", "0/../two", 1.0, None, True, False, [0], b"0")


def api_of(url: str) -> client.Client:
    return client.Client(namespace=NAMESPACE, connection=Connection(server=url, insecure=True))


@pytest.mark.parametrize("verb", ["worker_pod", "logs"])
async def test_a_rank_that_is_not_a_whole_number_is_refused_and_nothing_is_sent(cluster, verb):  # noqa: F811
    emulator, url = cluster
    api = api_of(url)
    calls = {"worker_pod": lambda rank: api.worker_pod("one", rank),
             "logs": lambda rank: list(api.logs("one", rank))}
    for rank in NOT_RANKS:
        with pytest.raises(client.InvalidArgument) as refused:
            await asyncio.to_thread(calls[verb], rank)
        message = str(refused.value)
        assert isinstance(refused.value, client.DDPJobError) and isinstance(refused.value, ValueError)
        assert message.startswith(f"rank {rank!r} ") and "Fix: " in message and "\n" not in message
    both_jobs_stay(emulator)


@pytest.mark.parametrize("tail_lines", ["10", 1.5, -1, True, [3]])
async def test_a_tail_that_is_not_a_whole_number_is_refused_and_nothing_is_sent(cluster, tail_lines):  # noqa: F811
    emulator, url = cluster
    with pytest.raises(client.InvalidArgument, match=rf"^tail_lines {re.escape(repr(tail_lines))} .*Fix: "):
        await asyncio.to_thread(lambda: list(api_of(url).logs("one", 0, tail_lines=tail_lines)))
    both_jobs_stay(emulator)


async def test_a_whole_rank_still_names_its_worker(cluster):  # noqa: F811
    _, url = cluster
    api = api_of(url)
    assert await asyncio.to_thread(api.worker_pod, "one", 1) == "one-worker-1"
    with pytest.raises(client.LogsUnavailable, match=r"has no rank 3\. Fix: pick a rank in 0\.\.2"):
        await asyncio.to_thread(api.worker_pod, "one", 3)
