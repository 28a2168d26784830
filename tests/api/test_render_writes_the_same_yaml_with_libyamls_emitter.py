"""`ddpjob render` writes its YAML with libyaml's emitter where that gives the same text (issue 38, item 15: writing
the 98,000-node affinity's 4 MB took 2.4 s of CPU with PyYAML's pure-Python emitter): byte for byte what the
pure-Python writer wrote, on every example, every worst case and strings of every kind at every depth."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ddpjob_operator import job_manifests, kubeyaml, naming, validation

from .worst_cases import SHAPES, legal_manifest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


class PurePythonDumper(kubeyaml.Dumper):
    """The writer render used before: PyYAML's emitter, kubeyaml's choice of quoting, each text analysed anew."""

    analyze_scalar = yaml.emitter.Emitter.analyze_scalar


def assert_written_as_before(documents: list) -> None:
    before = yaml.dump_all(documents, Dumper=PurePythonDumper, sort_keys=False, width=120)
    assert kubeyaml.dump_all(documents, sort_keys=False, width=120) == before


def _rendered(jobs) -> list:
    return [m for job in jobs
            for m in job_manifests.all_manifests(naming.JobRef.preview(job.metadata.name, "default"), job.spec)]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_renders_byte_for_byte_as_before(path):
    assert_written_as_before(_rendered(validation.load_jobs(path)))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_worst_case_renders_byte_for_byte_as_before(shape):
    assert_written_as_before(_rendered([validation.parse_job(legal_manifest(shape))]))


def test_a_wide_affinity_renders_byte_for_byte_as_before():
    doc = legal_manifest("env")
    doc["spec"]["template"] = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                     "values": [f"n{i:x}" for i in range(5000)]}]}]}}}}
    assert_written_as_before(_rendered([validation.parse_job(doc)]))


# Each way a string may be quoted or folded: what kubectl reads otherwise, indicators, spaces at either end, long ones,
# line breaks, tabs, characters outside ASCII and outside the printable.
STRINGS = ["y", "n", "1e1", "0o17", ".5_0", "0x" + "f" * 17, "<<", "1:00", "2001-01-01", "", " lead", "trail ",
           "a: b", "#x", "- x", "null", "~", "True", "off", ".inf", "-0", "+1", "1_000", "key: [a]", "{a}", "@x",
           "`x`", "%x", "!x", "&x", "*x", "|", ">", "? x", "-", "--- x", "...", "'q'", '"dq"', "x" * 300,
           "word " * 60, "é", "word é " * 40, "\u2028", "tab\there", "multi\nline", "long line\n" * 30,
           " \nx" * 40, "\x85", "\ufeff", "😀 " * 50, "\x00", "\x7f", "a\\b" * 50]


@pytest.mark.parametrize("depth", [0, 1, 5, 20])
def test_strings_of_every_kind_at_any_depth_are_written_as_before(depth):
    documents = []
    for text in STRINGS:
        node = {"k": text, text or "e": [text, {"n": text}]}
        for level in range(depth):
            node = {f"level{level}": [node]}
        documents.append(node)
    documents.append({"f": 1.5, "i": 10**20, "b": True, "z": None, "neg": -1, "big": 1e300, "small": 1e-7})
    assert_written_as_before(documents)


def test_a_multi_line_value_is_a_literal_block_that_reads_back_as_written():
    """The agent ConfigMap's files, as go-yaml v2 (kubectl -o yaml) writes a multi-line string: a `|` block that a
    user reads as the file, and kubectl reads back as the same string; a line with spaces at its end stays quoted."""
    job = validation.load_jobs(EXAMPLES[0])[0]
    documents = _rendered([job]) + [{"k": text, "multi\nkey": text} for text in STRINGS]
    text = kubeyaml.dump_all(documents, sort_keys=False, width=120)
    assert list(kubeyaml.load_all(text, max_values=10**7, max_depth=64)) == documents
    config_map = kubeyaml.dump_all([m for m in documents if m.get("kind") == "ConfigMap"], sort_keys=False, width=120)
    assert "  worker.py: |\n" in config_map
    assert '"trail \\nx"' in kubeyaml.dump_all([{"k": "trail \nx"}])
