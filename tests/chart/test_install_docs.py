"""Issue 23 (item 13): docs/install.md's RBAC table lists exactly the permissions the chart grants
(permissions.py), by scope, and the threat model section is there."""

from __future__ import annotations

import re

from ddpjob_operator import permissions

from .helm_install import ROOT

DOC = ROOT / "docs" / "install.md"
SCOPES = {"jobs": permissions.PERMISSIONS, "release namespace": permissions.LEADER_ELECTION_PERMISSIONS,
          "cluster": permissions.PROGRESS_PERMISSIONS}


def _documented() -> set[tuple[str, str, str, str]]:
    text = DOC.read_text()
    table = text[text.index("### RBAC"):text.index("### Threat model")]
    rows = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("API group", "---"):
            continue
        groups, resource, verbs, scope = cells[:4]
        for group in groups.split(","):
            group = group.strip().strip("`")
            for verb in verbs.split(","):
                rows.add(("" if group == "core" else group, resource.strip("`"), verb.strip(), scope))
    return rows


def test_the_rbac_table_lists_exactly_the_granted_permissions():
    granted = {(p.api_group, p.resource, verb, scope) for scope, perms in SCOPES.items()
               for p in perms for verb in p.verbs}
    assert _documented() == granted


def test_the_threat_model_is_documented():
    text = DOC.read_text()
    section = text[text.index("### Threat model"):]
    assert re.search(r"creating the Pods directly", section) and "Pod Security" in section
