"""issue 38 item 4 (function jobs): the program `run_local` and `local_job` write for the local "mount" is a new
file renamed into place, so a link planted at its name is replaced, never written through; a link at the
directory itself, or at the run's own directories above it, is refused naming it before anything is written."""

from __future__ import annotations

import os

import pytest

from ddpjob_operator import function_job, validation


def train() -> None:
    print("training")


def test_a_link_at_the_program_file_is_replaced_and_its_target_kept(tmp_path):
    fj = function_job.build(train, name="linked")
    mount = tmp_path / "mount"
    mount.mkdir()
    precious = tmp_path / "precious.py"
    precious.write_text("mine")
    (mount / function_job.PROGRAM).symlink_to(precious)

    job = function_job.local_job(fj, mount)
    assert precious.read_text() == "mine"
    program = mount / function_job.PROGRAM
    assert not program.is_symlink() and program.read_text() == fj.program
    assert job.spec.entrypoint == str(program.resolve())
    assert sorted(os.listdir(mount)) == [function_job.PROGRAM]  # no temp file left behind


@pytest.mark.parametrize("link", ["mount", "state/linked", "state"])
def test_a_linked_directory_is_refused_before_anything_is_written(tmp_path, link):
    fj = function_job.build(train, name="linked")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / link).symlink_to(elsewhere)
    with pytest.raises(validation.InvalidJob) as refused:
        if link == "mount":
            function_job.local_job(fj, tmp_path / "mount")
        else:
            function_job.run_local(fj, state_dir=tmp_path / "state")
    assert f"{tmp_path / link}: is a symbolic link" in str(refused.value) and "Fix:" in str(refused.value)
    assert os.listdir(elsewhere) == []
