"""A function that cannot be shipped, or options the model refuses, make `Client.submit_function` (and
`ddpjob.submit`) raise the client's own InvalidManifest, a DDPJobError, with function_job's words (the field and
the fix) kept: it raised validation.InvalidJob, which a caller catching the client's errors missed. An option
`submit` does not have (a typo) is the client's InvalidArgument naming it, not a TypeError. Nothing is sent (no
ConfigMap left behind)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from ddpjob_operator import client, function_job, validation
from ddpjob_operator.kube import Connection

from .conftest import NAMESPACE
from .test_empty_or_invalid_names_are_refused_before_any_request import both_jobs_stay, cluster  # noqa: F401

GLOBAL_STEPS = 3


def train() -> None:
    pass


def reads_a_global() -> None:
    print(GLOBAL_STEPS)


def nested() -> Callable[[], None]:
    def inner() -> None:
        pass
    return inner


async def is_async() -> None:
    pass


# (function, options): each refused by function_job.build, with the field it names.
UNSHIPPABLE: dict[str, tuple[Any, dict[str, Any], str]] = {
    "a lambda": (lambda: None, {}, "train_fn"),
    "a closure": (nested(), {}, "train_fn"),
    "an async def": (is_async, {}, "train_fn"),
    "a global read": (reads_a_global, {}, "train_fn"),
    "not a function": (3, {}, "train_fn"),
    "kwargs not JSON": (train, {"kwargs": {"x": object()}}, "kwargs"),
    "replicas 0": (train, {"replicas": 0}, "spec.replicas"),
    "a name no job can have": (train, {"name": "Bad_Name"}, "metadata.name"),
    "min above replicas": (train, {"replicas": 1, "min_replicas": 2}, "spec"),
}


@pytest.mark.parametrize("case", UNSHIPPABLE)
async def test_submit_raises_the_clients_invalid_manifest_with_the_field_and_fix(cluster, case):  # noqa: F811
    emulator, url = cluster
    fn, options, field = UNSHIPPABLE[case]
    api = client.Client(namespace=NAMESPACE, connection=Connection(server=url, insecure=True))
    with pytest.raises(validation.InvalidJob) as built:
        function_job.build(fn, namespace=NAMESPACE, **options)
    for submit in (api.submit_function, lambda f, **o: client.submit(f, client=api, **o)):
        with pytest.raises(client.DDPJobError) as refused:
            await asyncio.to_thread(submit, fn, **options)
        assert isinstance(refused.value, client.InvalidManifest)
        assert str(refused.value) == str(built.value)  # function_job's words: the field and its fix
        assert refused.value.errors == built.value.errors
        assert any(error.path.startswith(field) for error in refused.value.errors)
    both_jobs_stay(emulator)


async def test_an_option_submit_does_not_have_is_refused_naming_it(cluster):  # noqa: F811
    emulator, url = cluster
    api = client.Client(namespace=NAMESPACE, connection=Connection(server=url, insecure=True))
    for submit in (api.submit_function, lambda f, **o: client.submit(f, client=api, **o)):
        with pytest.raises(client.InvalidArgument, match=r"^submit: .*'replica'.*Fix: its options are name, replicas, "):
            await asyncio.to_thread(submit, train, replica=2)
    both_jobs_stay(emulator)
