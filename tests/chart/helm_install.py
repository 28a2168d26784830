"""`helm install --dry-run=client` through Helm's own library (helm-python-sdk): no cluster needed.

This is the real install path: values are merged with the chart's defaults and checked against
values.schema.json, templates rendered, NOTES.txt rendered, exactly as `helm install` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "ddpjob-operator"
RELEASE = "ddpjob-operator"
RELEASE_NAMESPACE = "ddpjob-system"

# Client-side dry runs never contact a cluster; an empty kubeconfig proves it.
_NO_CLUSTER = "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n"


@dataclass
class Release:
    manifests: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, got {len(found)}"
        return found[0]


def install_dry_run(values: dict[str, Any] | None = None) -> Release:
    """Render the chart as `helm install RELEASE charts/ddpjob-operator --dry-run=client` would."""
    with helm.Config(kubeconfig_content=_NO_CLUSTER, namespace=RELEASE_NAMESPACE,
                     storage_driver="memory") as config:
        release = config.install(str(CHART_DIR), RELEASE, values or {}, dry_run="client",
                                 namespace=RELEASE_NAMESPACE)
    manifests = [doc for doc in yaml.safe_load_all(release["manifest"]) if doc]
    return Release(manifests=manifests, notes=release["notes"])
