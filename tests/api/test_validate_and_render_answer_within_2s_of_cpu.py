"""Anything under 3 MiB is answered by `ddpjob validate` and `ddpjob render` within 2 s of CPU, imports included
(issue 38, item 15): every list of the model at its maximum, alone and all at once, and a root of 49,000
unknown keys (test_a_file_of_many_worst_case_documents_...: as many such documents as a file's budgets take). Each command runs in a child process and its own CPU time is
measured; the bound, BLOW_UP_CPU_S, catches a blow-up.

Before (on this machine): 128 env entries 4.8 s, 64 volumes and mounts 5.0 s, 64 gates 3.2 s, 32 init containers
mounting 64 volumes each 30 s, every list at once 40 s; 49,000 unknown keys 1.5 s, most of it suggestions."""

from __future__ import annotations

import pytest

from .worst_cases import BLOW_UP_CPU_S, SHAPES, ddpjob, legal_text, unknown_root_keys_text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_manifest_with_lists_at_their_maximum_is_answered_within_2s_of_cpu(tmp_path, shape, command):
    path = tmp_path / "job.yaml"
    path.write_text(legal_text(shape))
    code, cpu = ddpjob(command, path, tmp_path / "out.txt")
    assert code == 0, (tmp_path / "out.txt").read_text()[-2000:]
    assert cpu < BLOW_UP_CPU_S, f"ddpjob {command} of {shape} took {cpu:.2f} s of CPU"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["validate", "render"])
def test_49000_unknown_root_keys_are_refused_in_a_few_lines_within_2s_of_cpu(tmp_path, command):
    path = tmp_path / "job.yaml"
    path.write_text(unknown_root_keys_text())
    code, cpu = ddpjob(command, path, tmp_path / "out.txt")
    said = (tmp_path / "out.txt").read_text().splitlines()
    assert code == 2
    assert 'unknownField0: unknown field "unknownField0"' in said[0]
    assert len(said) <= 25 and "more after it" in said[-1] and "Fix: keep only apiVersion" in said[-1], said[-3:]
    assert cpu < BLOW_UP_CPU_S, f"ddpjob {command} took {cpu:.2f} s of CPU"
