"""The model is the API's source of truth, read by the operator, the CLI, the Python API and the CRD
generator: it imports only the Kubernetes field rules it is written with and the agent's contract
constants, never the manifests, the controller or the worker program (a rule of tests/test_import_graph.py);
and its modules are layered (group and base under the pod's pass-through fields, under the spec, under the whole
manifest)."""

from __future__ import annotations

from tests.test_import_graph import graph

MODEL = "ddpjob_operator.model"
# Each model module and the model modules it may import.
LAYERS = {
    "group": set(),
    "base": set(),
    "kubernetes": {"base", "group"},
    "spec": {"base", "kubernetes"},
    "job": {"base", "spec"},
    "status": {"base"},
}


def test_the_model_modules_import_only_the_layers_below_them():
    edges = graph("ddpjob_operator")
    assert set(LAYERS) == {name.removeprefix(MODEL + ".") for name in edges if name.startswith(MODEL + ".")}
    wrong = {f"{module} imports {target} (line {line})" for module, allowed in LAYERS.items()
             for target, line in edges[f"{MODEL}.{module}"].items()
             if target.startswith(MODEL) and target.removeprefix(MODEL + ".") not in allowed}
    assert not wrong
