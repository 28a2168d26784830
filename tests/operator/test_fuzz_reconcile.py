"""Fuzz, the last leg (issue 23): every generated manifest `validate` accepts is reconciled by the real
operator against the API double without raising: each gets a phase, workers and a store, and never the
ReconcileError condition an exception in a reconcile becomes. The manifests come from the same derandomized
generator as tests/api/test_fuzz.py (bounded, deterministic, no example database)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings

from ddpjob_operator import naming, validation

from ..api.test_fuzz import manifests
from .conftest import NAMESPACE, eventually

pytestmark = pytest.mark.timeout(240)
EXAMPLES = 60


def accepted_manifests() -> list[dict]:
    found: list[dict] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(manifests)
    def collect(doc):
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = f"fuzz-{len(found)}"  # one job each; a short name keeps it valid
        try:
            validation.parse_job(doc)
        except validation.InvalidJob:
            return
        found.append(doc)

    collect()
    return found


async def test_every_accepted_manifest_is_reconciled_without_an_exception(harness, operator):
    docs = accepted_manifests()
    assert len(docs) >= 5, "the generator must reach accepted manifests for this test to mean anything"
    for doc in docs:
        code, body = await harness.request("POST", f"/apis/{doc['apiVersion']}/namespaces/{NAMESPACE}/ddpjobs",
                                           doc, "application/json")
        assert code < 300, body

    def reconciled(name: str) -> bool:
        status = harness.status(name)
        return bool(status.get("phase")) and bool(harness.pods(name, naming.ROLE_STORE) or
                                                   status.get("phase") == "Failed")

    for doc in docs:
        name = doc["metadata"]["name"]
        await eventually(lambda: reconciled(name), timeout=60, what=f"{name} reconciled")
        errors = [c for c in harness.status(name).get("conditions", [])
                  if c["type"] == "ReconcileError" and c["status"] == "True"]
        assert not errors, f"{name}: {errors[0]['message']}\n{doc['spec']}"
