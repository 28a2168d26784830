"""The DDPJob's own metadata.labels and metadata.annotations (issue 38, item 13): `ddpjob validate` refuses what the
API server's ValidateObjectMeta refuses, naming `metadata.labels["<key>"]`, and accepts every legal neighbour. The
independent rules of tests/api/apiserver_rules.py judge each case too, so the cases are real refusals."""

from __future__ import annotations

import copy

import pytest
import yaml

from ddpjob_operator import cli, validation

from .apiserver_rules import label_value, qualified_name

BASE = {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "victim"},
        "spec": {"replicas": 1, "image": "trainer:1", "entrypoint": "ddp_trainer"}}

# (labels, annotations, the field named, a word of the message)
REFUSED = {
    "label-key-with-space": ({"bad key": "v"}, None, 'metadata.labels["bad key"]', "label key"),
    "label-key-starts-with-dash": ({"-team": "a"}, None, 'metadata.labels["-team"]', "label key"),
    "label-name-64": ({"a" * 64: "v"}, None, f'metadata.labels["{"a" * 64}"]', "label key"),
    "label-prefix-uppercase": ({"Example.com/team": "a"}, None, 'metadata.labels["Example.com/team"]', "label key"),
    "label-prefix-only": ({"example.com/": "a"}, None, 'metadata.labels["example.com/"]', "label key"),
    "label-prefix-over-253": ({"a" * 254 + "/x": "a"}, None, f'metadata.labels["{"a" * 254}/x"]', "label key"),
    "label-non-ascii-name": ({"entraînement": "a"}, None, 'metadata.labels["entraînement"]', "label key"),
    "label-value-with-space": ({"team": "a b"}, None, 'metadata.labels["team"]', "label value"),
    "label-value-64": ({"team": "v" * 64}, None, 'metadata.labels["team"]', "label value"),
    "label-value-ends-with-dot": ({"team": "a."}, None, 'metadata.labels["team"]', "label value"),
    "label-value-newline": ({"team": "a\n"}, None, 'metadata.labels["team"]', "label value"),
    "annotation-key-with-space": (None, {"my note": "x"}, 'metadata.annotations["my note"]', "annotation key"),
    "annotation-key-two-slashes": (None, {"a/b/c": "x"}, 'metadata.annotations["a/b/c"]', "annotation key"),
    "annotations-over-256k": (None, {f"k{i}": "v" * 60_000 for i in range(5)}, "metadata.annotations", "256 KiB"),
}


def _validate(tmp_path, capsys, labels, annotations) -> tuple[int, str]:
    doc = copy.deepcopy(BASE)
    if labels is not None:
        doc["metadata"]["labels"] = labels
    if annotations is not None:
        doc["metadata"]["annotations"] = annotations
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    code = cli.main(["validate", str(path)])
    return code, capsys.readouterr().err


def _server_refuses(labels, annotations) -> bool:
    """ValidateObjectMeta, by the independent rules (annotation keys are checked lowercased)."""
    labels, annotations = labels or {}, annotations or {}
    return (any(not qualified_name(k) or not label_value(v) for k, v in labels.items())
            or any(not qualified_name(k.lower()) for k in annotations)
            or sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) > 256 * 1024)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_labels_and_annotations_the_api_server_refuses_are_refused_naming_the_key(tmp_path, capsys, case):
    labels, annotations, field, text = REFUSED[case]
    assert _server_refuses(labels, annotations), case
    code, err = _validate(tmp_path, capsys, labels, annotations)
    assert code == validation.EXIT_INVALID, case
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if f": {field}: " in line]
    assert lines and text in lines[0] and ": " in lines[0].split(f"{field}: ", 1)[1], err


ACCEPTED = {
    "empty-value": ({"team": ""}, None),
    "prefixed-key": ({"app.kubernetes.io/name": "trainer", "kueue.x-k8s.io/queue-name": "team-a"}, None),
    "name-of-63": ({"a" * 63: "v" * 63}, None),
    "prefix-of-253": ({".".join(["a" * 63] * 3) + "." + "b" * 61 + "/x": "A_b-c.9"}, None),
    "uppercase-name-part": ({"example.com/Team": "Blue"}, None),
    "annotation-key-uppercase-prefix": (None, {"Example.com/Owner": "anyone, with spaces"}),  # lowercased first
    "annotation-value-free-text": (None, {"note": "línea\nanother line: {\"json\": true}"}),
    "annotations-just-under-256k": (None, {"k": "v" * (256 * 1024 - 1)}),
    "null-maps": (None, None),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_the_legal_neighbours_are_accepted(tmp_path, capsys, case):
    labels, annotations = ACCEPTED[case]
    assert not _server_refuses(labels, annotations), case
    code, err = _validate(tmp_path, capsys, labels, annotations)
    assert code == 0, err
