"""The committed CRD is generated from the model, structural, and accepted as a v1 CRD."""

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

from ddpjob_operator import crd, model

from .schema_checks import api_server_errors, structural_problems

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "ddpjobs.elastic.ddp.dev.yaml"


def _schema() -> dict:
    return crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_is_up_to_date():
    assert CRD_FILE.read_text() == crd.render_crd_yaml(), "run `make crds` and commit the result"


def test_make_crds_output_is_stable():
    first = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "crd"], capture_output=True,
                           text=True, check=True).stdout
    second = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "crd"], capture_output=True,
                            text=True, check=True).stdout
    assert first == second == CRD_FILE.read_text()


def test_crd_is_a_valid_apiextensions_v1_object():
    document = yaml.safe_load(CRD_FILE.read_text())
    kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_schema_is_structural():
    assert structural_problems(_schema()) == []


def test_every_field_has_a_description():
    missing = []

    def walk(node, path):
        if path.count(".") >= 2 and "description" not in node:  # below spec/status
            missing.append(path)
        for key, prop in node.get("properties", {}).items():
            walk(prop, f"{path}.{key}")
        if isinstance(node.get("items"), dict) and "properties" in node["items"]:
            for key, prop in node["items"]["properties"].items():
                walk(prop, f"{path}[].{key}")

    schema = _schema()
    for top in ("spec", "status"):
        for key, prop in schema["properties"][top]["properties"].items():
            walk(prop, f".{top}.{key}")
    assert missing == []


def test_api_identity_and_subresources():
    spec = crd.build_crd()["spec"]
    assert spec["group"] == "elastic.ddp.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == "ddpjobs" and spec["names"]["shortNames"] == ["ddpj"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {"Phase": ".status.phase", "Ready": ".status.readyReplicas",
                       "Desired": ".spec.replicas", "World": ".status.worldSize",
                       "Restarts": ".status.restarts", "Reconciled": ".status.lastReconcileTime",
                       "Age": ".metadata.creationTimestamp",
                       # issue 12: progress and ETA by default, step, loss and throughput with -o wide
                       "Progress%": ".status.progress.percent", "ETA": ".status.progress.eta",
                       "Step": ".status.progress.step", "Loss": ".status.progress.loss",
                       "Samples/s": ".status.progress.samplesPerSecond",
                       # issue 22: the slowest rank and its ratio to its peers, with -o wide
                       "Slowest": ".status.stepTimes.slowest",
                       # issue 25: idle warm spares, with -o wide
                       "Spares": ".status.readySpares"}
    wide = {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1}
    assert wide == {"Step", "Loss", "Samples/s", "Slowest", "Spares"}


def test_server_side_defaults_match_the_model():
    """What the API server stores after defaulting is what the model would parse."""
    from .schema_checks import apply_defaults

    minimal = {"replicas": 2, "image": "img", "entrypoint": "ddp_trainer"}
    defaulted = apply_defaults(_schema()["properties"]["spec"], dict(minimal))
    assert defaulted == model.DDPJobSpec.model_validate(minimal).wire()


def test_status_written_by_operator_fits_the_schema():
    status = model.DDPJobStatus(
        phase="Running", replicas=2, ready_replicas=2, world_size=2, restarts=1, selector="a=b",
        conditions=[model.Condition(type="Running", status="True", reason="AllReady",
                                    last_transition_time="2026-11-22T00:00:00Z")],
        ranks=[model.RankStatus(index=0, pod="j-worker-0", phase="Running", last_exit_code=137)],
    ).wire()
    job = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": "j"},
           "spec": {"replicas": 2, "image": "i", "entrypoint": "m"}, "status": status}
    assert api_server_errors(_schema(), job) == []
