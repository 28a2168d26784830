"""A rule the model judges in Python (model.OFFLINE_CHECKS: CEL over lists within lists cost seconds offline) keeps
its CEL text in the CRD for the API server: on every small input here, the Python check, the model's CEL runtime and
an independent one (celpy) give one verdict, so offline `validate` accepts exactly what the API server accepts."""

from __future__ import annotations

import itertools

import celpy
import pytest

from ddpjob_operator import crd, k8s_fields
from ddpjob_operator.model import base

from .schema_checks import independent_cel

# Names a mount or a volume may carry: the operator's two volumes, two of the user's, and none at all.
NAMES = ["dshm", "checkpoints", "data", "cache", None]


def _named(name: str | None, **extra) -> dict:
    return {**({"name": name} if name is not None else {}), **extra}


def _specs():
    """Every combination of: checkpoint or not; volumes absent, empty or named; mounts of the trainer and of init
    containers naming each name, or none."""
    volume_sets = [None, [], [_named("data")], [_named("data"), _named("cache")], [_named(None)], [_named("dshm")]]
    mount_sets = [None, []] + [[_named(n, mountPath="/m")] for n in NAMES] + [[_named("data"), _named("cache")]]
    for checkpoint, volumes, mounts in itertools.product([False, True], volume_sets, mount_sets):
        template = {}
        if volumes is not None:
            template["volumes"] = volumes
        if mounts is not None:
            template["volumeMounts"] = mounts
            template["podSpec"] = {"initContainers": [{"name": "a"}, {"name": "b", "volumeMounts": mounts}]}
        spec = {"replicas": 1, "template": template}
        if checkpoint:
            spec["checkpoint"] = {"mountPath": "/checkpoints"}
        yield spec
        yield {"replicas": 1, **({"checkpoint": {}} if checkpoint else {})}  # no template at all


# Label keys, gate names and toleration keys: qualified names, and each way of not being one (too long a name or
# prefix, two slashes, a bad first or last character, a trailing newline that Python's `$` would let through).
KEYS = ["a", "example.com/x", "A.b_c-d", "x" * 63, "x" * 64, "p" * 253 + "/n", "p" * 254 + "/n", "a.b/" + "x" * 64,
        "", "-a", "a-", "a/b/c", "/x", "x/", "Ex.com/x", "a\n", "ex_ample.com/x", "nvidia.com/gpu"]


def _templates():
    """Pod templates and pod specs whose maps and lists carry each key (one per object, and all at once)."""
    for key in KEYS + [None]:
        entries = [key] if key is not None else []
        yield {"labels": {k: "v" for k in entries}, "annotations": {k: "v" for k in entries},
               "nodeSelector": {k: "v" for k in entries}, "tolerations": [_named(None, key=k) for k in entries],
               "schedulingGates": [_named(k) for k in entries],
               "readinessGates": [{"conditionType": k} for k in entries]}
    yield {"tolerations": [{"operator": "Exists"}], "schedulingGates": [{}], "readinessGates": [{}]}
    good = [k for k in KEYS if k8s_fields.is_qualified_name(k)]
    yield {"labels": dict.fromkeys(good, "v"), "tolerations": [{"key": k} for k in good],
           "schedulingGates": [{"name": k} for k in good]}


def _duplicates():
    """Lists whose entries repeat, or leave out, the field that must be unique."""
    for names in [[], ["a"], ["a", "b"], ["a", "a"], ["a", None], [None, None], ["a", None, "a"], ["b", "a", "b"]]:
        yield {"env": [_named(n, value="v") for n in names]}
        yield {"volumes": [_named(n) for n in names], "schedulingGates": [_named(n) for n in names],
               "volumeMounts": [{"name": "v", **({"mountPath": f"/{n}"} if n else {})} for n in names]}


CASES = list(_specs()) + list(_templates()) + list(_duplicates())


def test_the_cases_reach_both_verdicts_of_every_offline_rule():
    for rule, offline in base.OFFLINE_CHECKS.items():
        assert {offline(case) for case in CASES} == {True, False}, rule


@pytest.mark.parametrize("rule", sorted(base.OFFLINE_CHECKS), ids=lambda r: r[:60])
def test_the_python_check_gives_the_verdict_of_its_cel_rule(rule):
    offline = base.OFFLINE_CHECKS[rule]
    judged = set()
    for case in CASES:
        verdict = offline(case)
        assert verdict == base.evaluate_cel(rule, case), (rule, case, verdict)
        try:
            independent = independent_cel(rule, case)
        except celpy.CELEvalError:  # where celpy fails on what cel-go absorbs, the model's runtime is the judge
            continue
        assert verdict == independent, (rule, case, verdict)
        judged.add(verdict)
    assert judged == {True, False}, f"celpy judged no case of the verdicts {({True, False} - judged)}"


def test_every_offline_rule_is_in_the_crd_for_the_api_server():
    in_crd = {r["rule"] for r in _rules(crd.build_crd())}
    assert base.OFFLINE_CHECKS and set(base.OFFLINE_CHECKS) <= in_crd


def _rules(node) -> list[dict]:
    if isinstance(node, dict):
        return list(node.get("x-kubernetes-validations", [])) + [r for v in node.values() for r in _rules(v)]
    return [r for v in node for r in _rules(v)] if isinstance(node, list) else []
