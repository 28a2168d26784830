"""Generate the DDPJob CustomResourceDefinition from the pydantic model (`make crds`).

The API server needs a *structural* schema: no $ref, every node typed (or explicitly
x-kubernetes-preserve-unknown-fields), no `additionalProperties` next to `properties`,
no nullable unions. Pydantic's JSON schema is close; this module closes the gap.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from . import model

_DROP_KEYS = {"title", "const"}  # const becomes a one-value enum below


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs and collapse Optional[...] (anyOf with null) into the inner schema."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        node = {**target, **node}
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express union {branches} in a structural schema")
        inner = branches[0]
        if "$ref" in inner:
            inner = copy.deepcopy(defs[inner["$ref"].split("/")[-1]])
        node = {**inner, **node}
        if node.get("default", "missing") is None:
            node.pop("default")
    if "const" in node and "enum" not in node:
        node["enum"] = [node["const"]]
    node = {k: _resolve(v, defs) for k, v in node.items() if k not in _DROP_KEYS}
    if node.get("default", "missing") is None:
        node.pop("default")
    if node.get("additionalProperties") is False or (
        node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" in node
    ):
        node.pop("additionalProperties")
    if node.get("additionalProperties") is True:
        node.pop("additionalProperties")
        node["x-kubernetes-preserve-unknown-fields"] = True
    if "properties" in node:
        node["properties"] = {k: _resolve(v, defs) for k, v in node["properties"].items()}
    return node


def _factory_defaults(schema: dict[str, Any], model_cls: type[BaseModel]) -> None:
    """Emit server-side defaults for fields whose default comes from a factory.

    The API server then fills nested defaults too, so `kubectl get -o yaml` shows the
    effective spec and CEL rules can rely on e.g. `self.backoff` being present.
    """
    for name, field in model_cls.model_fields.items():
        key = field.alias or name
        prop = schema.get("properties", {}).get(key)
        if prop is None:
            continue
        if field.default_factory is not None and "default" not in prop:
            value = field.default_factory()
            prop["default"] = value.wire() if isinstance(value, model.APIModel) else value
        sub = model.model_in(field.annotation)
        if sub is not None:
            _factory_defaults(prop if "properties" in prop else prop.get("items", {}), sub)


def _strip_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_strip_defaults(v) for v in node]
    return node


def structural_schema(model_cls: type[BaseModel], *, with_defaults: bool = True) -> dict[str, Any]:
    raw = model_cls.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema = _resolve(raw, defs)
    if with_defaults:
        _factory_defaults(schema, model_cls)
        return schema
    return _strip_defaults(schema)


def build_crd() -> dict[str, Any]:
    metadata_schema = structural_schema(model.JobMetadata)
    spec_schema = structural_schema(model.DDPJobSpec)
    status_schema = structural_schema(model.DDPJobStatus, with_defaults=False)
    spec_schema["description"] = "Desired state of an elastic PyTorch DDP training job."
    status_schema["description"] = "Observed state, written by the operator."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{model.PLURAL}.{model.GROUP}"},
        "spec": {
            "group": model.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": model.KIND,
                "listKind": f"{model.KIND}List",
                "plural": model.PLURAL,
                "singular": model.SINGULAR,
                "shortNames": list(model.SHORT_NAMES),
                "categories": ["ddp"],
            },
            "versions": [{
                "name": model.VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "DDPJob runs elastic PyTorch DistributedDataParallel training "
                                   "with torchrun rendezvous, restarts and checkpoints.",
                    "required": ["spec"],
                    # Rules across metadata.name and spec (the API server lets root rules read metadata.name).
                    "x-kubernetes-validations": [dict(r) for r in model.DDPJob.cel_rules],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object",
                                     "properties": {"name": metadata_schema["properties"]["name"]}},
                        "spec": spec_schema,
                        "status": status_schema,
                    },
                }},
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector",
                    },
                },
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
                    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
                    {"name": "World", "type": "integer", "jsonPath": ".status.worldSize",
                     "description": "Ranks training now (status.worldSize): below a whole world's (DESIRED x "
                                    "nprocPerNode, status.desiredWorldSize) while the job trains short (condition "
                                    "Degraded)."},
                    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
                    {"name": "Progress%", "type": "integer", "jsonPath": ".status.progress.percent",
                     "description": "Percent of the planned steps done (status.progress.percent)."},
                    {"name": "ETA", "type": "string", "jsonPath": ".status.progress.eta",
                     "description": "Estimated training time left at the recent step rate."},
                    {"name": "Reconciled", "type": "date", "jsonPath": ".status.lastReconcileTime",
                     "description": "Since an operator last reconciled the job (refreshed about once a minute "
                                    "while it runs): minutes old means no operator is acting."},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step", "priority": 1,
                     "description": "Last optimizer step reported."},
                    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss", "priority": 1,
                     "description": "Training loss at that step, averaged over ranks."},
                    {"name": "Samples/s", "type": "number", "jsonPath": ".status.progress.samplesPerSecond",
                     "priority": 1, "description": "Training throughput over all ranks."},
                    {"name": "Slowest", "type": "string", "jsonPath": ".status.stepTimes.slowest", "priority": 1,
                     "description": "The worker with the longest own time per step and its ratio to its peers' "
                                    "median (straggler detection)."},
                    {"name": "Spares", "type": "integer", "jsonPath": ".status.readySpares", "priority": 1,
                     "description": "Warm spares ready to take a lost worker's place (failurePolicy.spares)."},
                ],
            }],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated from operator/ddpjob_operator/model/ by `make crds`. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
