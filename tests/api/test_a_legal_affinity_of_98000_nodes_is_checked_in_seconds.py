"""A legal manifest of about half a megabyte (issue 38, item 15): an affinity naming 98,000 nodes. The model's rules
used to convert the whole object to CEL values once per rule (26 s of CPU to validate it); they now read only the
fields they name, so checking it costs a fraction of a second and `ddpjob validate` stays within seconds."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from ddpjob_operator import job_manifests, naming, validation
from ddpjob_operator.model import base

from .worst_cases import BLOW_UP_CPU_S, child_cpu_seconds

NODES = 98_000


def _wide_affinity_manifest(path: Path) -> Path:
    # Flow style, as a generator would write it: `n1f` and the like are plain strings to kubectl and to YAML.
    names = ",".join(f"n{i:x}" for i in range(NODES))
    path.write_text(
        "apiVersion: elastic.ddp.dev/v1alpha1\nkind: DDPJob\nmetadata: {name: wide}\n"
        "spec:\n  replicas: 2\n  image: trainer:1\n  entrypoint: ddp_trainer\n  template:\n    affinity:\n"
        "      nodeAffinity:\n        requiredDuringSchedulingIgnoredDuringExecution:\n          nodeSelectorTerms:\n"
        f"          - matchExpressions:\n            - {{key: kubernetes.io/hostname, operator: In, values: [{names}]}}\n")
    return path


def test_the_models_checks_of_a_98000_node_affinity_take_a_fraction_of_a_second(tmp_path):
    [document] = validation.load_documents(_wide_affinity_manifest(tmp_path / "wide.yaml"))
    started = time.process_time()
    job = validation.parse_job(document.body)
    checked = time.process_time() - started
    manifests = job_manifests.all_manifests(naming.JobRef.preview("wide", "default"), job.spec)
    built = time.process_time() - started - checked
    values = job.spec.template.affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    assert len(values) == NODES and values[-1] == f"n{NODES - 1:x}"
    assert sum(m["kind"] == "Pod" for m in manifests) == 3  # the store and two workers, each with the affinity
    # 4.7 s of CPU before (at load 1), 0.35 s after: the bound leaves room for a busy 2-core machine.
    assert checked < 2, f"parse_job took {checked:.2f} s of CPU"
    assert built < 1, f"the manifests took {built:.2f} s of CPU"


@pytest.mark.timeout(120)
def test_ddpjob_validate_of_a_98000_node_affinity_takes_seconds_of_cpu(tmp_path):
    path = _wide_affinity_manifest(tmp_path / "wide.yaml")
    assert 0.5e6 < path.stat().st_size < 1e6
    code, cpu = child_cpu_seconds([sys.executable, "-m", "ddpjob_operator.cli", "validate", str(path)],
                                   tmp_path / "out.txt")
    said = (tmp_path / "out.txt").read_text()
    assert code == 0 and "valid DDPJob wide" in said, said
    # All of the command: interpreter and imports (0.4 s), reading the YAML, the model. 26 s before; 1.3 s now.
    assert cpu < BLOW_UP_CPU_S, f"ddpjob validate took {cpu:.1f} s of CPU"


@pytest.mark.timeout(120)
def test_ddpjob_render_of_a_98000_node_affinity_takes_seconds_of_cpu(tmp_path):
    path = _wide_affinity_manifest(tmp_path / "wide.yaml")
    code, cpu = child_cpu_seconds([sys.executable, "-m", "ddpjob_operator.cli", "render", str(path)],
                                   tmp_path / "pods.yaml")
    assert code == 0 and (tmp_path / "pods.yaml").read_text().count(f"n{NODES - 1:x}") == 2  # both workers
    # 13.6 s before, then 4.3 s (2.4 s of it writing the 4 MB of YAML in pure Python); 1.8 s with libyaml's emitter.
    assert cpu < BLOW_UP_CPU_S, f"ddpjob render took {cpu:.1f} s of CPU"


# Rule shapes and objects on which a rule reads what pruning keeps: the verdict on the pruned object is the verdict on
# the whole one, and a large field no rule names is dropped.
RULES = ["self.a.b.all(x, x > 0)", "!has(self.a) || !has(self.a.c)", "has(self.c) && self.c.d == 1 && 'k' in self.e",
         "!has(self.l) || size(self.l) < 3", "size(self) < 5", "size(self['a']) > 0", "self.e.exists(k, k == 'k')"]
OBJECTS = [{"a": {"b": [1, 2], "c": {"deep": 1}}, "c": {"d": 1, "x": 2}, "e": {"k": 1}, "l": [1, 2, 3], "big": [0] * 9},
           {"a": {"b": [0]}, "c": {"d": 2}, "e": {"j": 1}, "l": [], "big": list(range(9))},
           {"a": {"b": [], "c": None}, "c": {"d": 1}, "e": {"k": 0, "j": 0}}]


@pytest.mark.parametrize("rule", RULES)
def test_a_rule_judges_the_pruned_object_as_the_whole_one(rule):
    read = base._fields_read(rule)
    for whole in OBJECTS:
        pruned = base._prune(whole, read)
        assert base.evaluate_cel(rule, pruned) == base.evaluate_cel(rule, whole), (rule, whole, pruned)
        if "self." in rule and "size(self)" not in rule and "self[" not in rule:
            assert "big" not in pruned


@pytest.mark.timeout(120)
def test_long_lists_whose_entries_leave_out_an_optional_field_are_checked_in_seconds():
    """A rule that reads an absent field inside a macro (`self.checkpoint.mountPath` in volumeMounts.all() with no
    checkpoint, `e.prefix` for an envFrom without prefix) made celpy nest one error in the next per entry: 24 mounts
    cost 3 s and 460 MB, 28 cost 20 s and 6 GB, the legal 64 never ended. cel-go short-circuits; the rules now say
    it with a conditional, which both evaluate lazily."""
    doc = {"apiVersion": "elastic.ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "long"},
           "spec": {"replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer", "template": {
               "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(64)],
               "volumeMounts": [{"name": f"v{i}", "mountPath": f"/data/{i}"} for i in range(64)],
               "trainer": {"envFrom": [{"configMapRef": {"name": f"c{i}"}} for i in range(64)]}}}}
    started = time.process_time()
    job = validation.parse_job(doc)
    checked = time.process_time() - started
    assert len(job.spec.template.volume_mounts) == 64 and len(job.spec.template.trainer.env_from) == 64
    assert checked < 6, f"parse_job took {checked:.2f} s of CPU"
