"""The real-server half of CRD validation: the API server rejects every invalid manifest in
tests/api/invalid/ and its error names the field from the file's `# expect:` line."""

from __future__ import annotations

import pytest

from ..api.test_validation import INVALID, _expectation
from . import cluster

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_api_server_rejects_invalid_manifest_naming_the_field(path, namespace):
    field, _ = _expectation(path)
    result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode != 0, f"the API server accepted {path.name}"
    assert field in result.stderr, f"{field} not named in: {result.stderr}"


@pytest.mark.parametrize("name", ["cpu-digits.yaml", "gpu-synthetic.yaml"])
def test_api_server_accepts_the_examples(name, namespace):
    result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace,
                             "-f", str(cluster.EXAMPLES / name), check=False)
    assert result.returncode == 0, result.stderr
