"""The real-server half of CRD validation: the API server rejects every invalid manifest in
tests/api/invalid/ and its error names the field from the file's `# expect:` line."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import cluster

pytestmark = pytest.mark.e2e

INVALID = sorted((cluster.ROOT / "tests" / "api" / "invalid").glob("*.yaml"))


def _expected_field(path: Path) -> str:
    header = path.read_text().splitlines()[0]
    assert header.startswith("# expect: "), f"{path.name} lacks its '# expect: FIELD | TEXT' line"
    return header[len("# expect: "):].partition(" | ")[0].strip()


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_api_server_rejects_invalid_manifest_naming_the_field(path, namespace):
    field = _expected_field(path)
    result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode != 0, f"the API server accepted {path.name}"
    assert field in result.stderr, f"{field} not named in: {result.stderr}"


@pytest.mark.parametrize("name", ["cpu-digits.yaml", "gpu-synthetic.yaml"])
def test_api_server_accepts_the_examples(name, namespace):
    result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace,
                             "-f", str(cluster.EXAMPLES / name), check=False)
    assert result.returncode == 0, result.stderr
