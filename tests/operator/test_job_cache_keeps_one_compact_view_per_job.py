"""The job cache alone (job_cache.py): what an event changed (the echo of the operator's own status write is
no reason for a pass), which job goes first, one parse per spec generation kept pickled with the raw spec
dropped, the metadata nobody reads dropped, and everything of a deleted job forgotten."""

from __future__ import annotations

from typing import Any

from ddpjob_operator import model
from ddpjob_operator.job_cache import JobCache

KEY = ("team-a", "cached")
SPEC = {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer"}


def body(generation: int = 1, status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": model.API_VERSION, "kind": model.KIND,
            "metadata": {"name": "cached", "namespace": "team-a", "uid": "u-1", "generation": generation, **meta},
            "spec": dict(SPEC), "status": status or {}}


def test_a_new_job_needs_a_pass_and_the_echo_of_its_own_write_does_not():
    cache = JobCache()
    seen = cache.saw(KEY, body())
    assert seen.needs_pass and not seen.new_spec
    written = model.DDPJobStatus(phase="Pending", observed_generation=1)
    cache.written["u-1"] = written
    echo = cache.saw(KEY, body(status=written.wire()))
    assert not echo.needs_pass and not echo.new_spec
    # Someone else's status (another replica, a user's patch): a pass.
    assert cache.saw(KEY, body(status={**written.wire(), "phase": "Running"})).needs_pass
    # A deletion begins: a pass.
    assert cache.saw(KEY, body(status=written.wire(), deletionTimestamp="2026-11-29T12:00:00Z")).needs_pass
    # The user changed the spec: a pass, as a new spec.
    changed = cache.saw(KEY, body(generation=2, status=written.wire()))
    assert changed.needs_pass and changed.new_spec


def test_a_job_not_reconciled_in_its_current_spec_goes_first():
    cache = JobCache()
    assert not cache.first_in_line(KEY)  # unknown
    cache.saw(KEY, body())
    assert cache.first_in_line(KEY)
    cache.written["u-1"] = model.DDPJobStatus(observed_generation=1)
    assert not cache.first_in_line(KEY)
    cache.saw(KEY, body(generation=2))
    assert cache.first_in_line(KEY)
    cache.forget_writes()  # a new leader: the stored status is what counts
    cache.saw(KEY, body(generation=2, status={"observedGeneration": 2}))
    assert not cache.first_in_line(KEY)


def test_the_spec_is_parsed_once_per_generation_and_not_kept_raw():
    cache = JobCache()
    cache.saw(KEY, body(managedFields=[{"manager": "kubectl"}],
                        annotations={"kubectl.kubernetes.io/last-applied-configuration": "{...}", "team": "x"}))
    held = cache.get(KEY)
    assert held is not None and "managedFields" not in held["metadata"]
    assert held["metadata"]["annotations"] == {"team": "x"}
    spec, errors = cache.parsed_spec("u-1", held)
    assert errors == () and spec is not None and spec.replicas == 2
    assert held["spec"] is None  # parsed: the snapshot drops its copy
    again = cache.get(KEY)
    assert again is not None
    assert cache.parsed_spec("u-1", again) == (spec, ())  # from the pickle, not the (dropped) raw spec
    cache.saw(KEY, body())  # the same generation again: its snapshot keeps no spec either
    assert cache.get(KEY)["spec"] is None  # type: ignore[index]
    cache.saw(KEY, body(generation=2) | {"spec": {**SPEC, "replicas": 3}})
    assert cache.parsed_spec("u-1", cache.get(KEY))[0].replicas == 3  # type: ignore[arg-type, union-attr]


def test_an_invalid_spec_is_its_field_errors():
    cache = JobCache()
    cache.saw(KEY, body() | {"spec": {**SPEC, "replicas": 0}})
    spec, errors = cache.parsed_spec("u-1", cache.get(KEY))  # type: ignore[arg-type]
    assert spec is None and errors and any("replicas" in str(e) for e in errors)


def test_a_deleted_job_is_forgotten_whole():
    cache = JobCache()
    cache.saw(KEY, body())
    cache.parsed_spec("u-1", cache.get(KEY))  # type: ignore[arg-type]
    cache.written["u-1"] = model.DDPJobStatus(phase="Running")
    assert cache.forget(KEY, body()) == "u-1"
    assert cache.get(KEY) is None and len(cache) == 0 and "u-1" not in cache.written
    # Its uid again (a recreated job of the same name): parsed afresh, nothing of the old one held.
    assert cache.saw(KEY, body()).needs_pass and cache.get(KEY)["spec"] == SPEC  # type: ignore[index]
    assert cache.forget(("team-a", "never-seen"), {"metadata": {"uid": "u-9"}}) == "u-9"
