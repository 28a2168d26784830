"""The model is the API's source of truth, read by the operator, the CLI, the Python API and the CRD
generator: it imports only the Kubernetes field rules it is written with and the agent's contract
constants, never the builders, the controller or the worker program; and its modules are layered
(group and base under the pod's pass-through fields, under the spec, under the whole manifest)."""

from __future__ import annotations

from tests.test_import_graph import graph

MODEL = "ddpjob_operator.model"
# What the model may import from the rest of the operator package.
OUTSIDE = {"ddpjob_operator.k8s_fields", "ddpjob_operator.pod_rules", "ddpjob_operator.agent.contract"}
# Each model module and the model modules it may import.
LAYERS = {
    "group": set(),
    "base": set(),
    "kubernetes": {"base", "group"},
    "spec": {"base", "kubernetes"},
    "job": {"base", "spec"},
    "status": {"base"},
}


def test_the_model_imports_only_the_field_rules_and_the_agents_contract():
    edges = graph("ddpjob_operator")
    model = {name: targets for name, targets in edges.items() if name == MODEL or name.startswith(MODEL + ".")}
    outside = {f"{name} imports {target} (line {line})" for name, targets in model.items()
               for target, line in targets.items() if not target.startswith(MODEL) and target not in OUTSIDE}
    assert not outside


def test_the_model_modules_import_only_the_layers_below_them():
    edges = graph("ddpjob_operator")
    assert set(LAYERS) == {name.removeprefix(MODEL + ".") for name in edges if name.startswith(MODEL + ".")}
    wrong = {f"{module} imports {target} (line {line})" for module, allowed in LAYERS.items()
             for target, line in edges[f"{MODEL}.{module}"].items()
             if target.startswith(MODEL) and target.removeprefix(MODEL + ".") not in allowed}
    assert not wrong
