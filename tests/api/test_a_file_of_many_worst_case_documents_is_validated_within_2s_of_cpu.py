"""`ddpjob validate` of a file holding as many DDPJobs as its budgets take (3 MiB, validation.MAX_YAML_NODES values):
within 2 s of CPU, imports included (issue 38, item 15), measured in a child process; the bound, BLOW_UP_CPU_S,
catches a blow-up. Before: 149 jobs of 128 env entries 5.5 s, 88 jobs of 64 tolerations and labels 28.6 s,
5,800 minimal jobs 2.6 s."""

from __future__ import annotations

import pytest

from .worst_cases import BLOW_UP_CPU_S, ddpjob, many_documents_text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", ["minimal", "env", "volumes-and-mounts", "tolerations-labels-annotations-node-selector",
                                   "scheduling-and-readiness-gates", "every-list-at-its-maximum"])
def test_a_file_of_as_many_worst_case_documents_as_it_may_hold_is_validated_within_2s_of_cpu(tmp_path, shape):
    path = tmp_path / "jobs.yaml"
    path.write_text(many_documents_text(shape))
    code, cpu = ddpjob("validate", path, tmp_path / "out.txt")
    said = (tmp_path / "out.txt").read_text()
    assert code == 0 and said.count("valid DDPJob worst") > 1, said[-2000:]
    assert cpu < BLOW_UP_CPU_S, f"ddpjob validate of {path.stat().st_size} bytes of {shape} took {cpu:.2f} s of CPU"
