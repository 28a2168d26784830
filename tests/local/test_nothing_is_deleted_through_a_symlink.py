"""issue 31 item 3: a new local run empties `.ddpjob/<job>/logs` and `.../checkpoints`; a symbolic link there
(or at `.ddpjob` or `.ddpjob/<job>`, committed in a cloned repository) must never have its target emptied:
the run is refused before anything starts, naming the link and the fix, and the target keeps its files."""

from __future__ import annotations

import pytest

from ddpjob_operator import cli

from .harness import manifest, write_manifest


@pytest.mark.parametrize("link", [".ddpjob", ".ddpjob/linked", ".ddpjob/linked/logs", ".ddpjob/linked/checkpoints"])
def test_a_linked_state_directory_is_refused_and_its_target_kept(capsys, tmp_path, monkeypatch, link):
    monkeypatch.chdir(tmp_path)
    job = write_manifest(tmp_path, manifest("linked"))
    precious = tmp_path / "precious"
    (precious / "logs").mkdir(parents=True)  # what a link at .ddpjob or .ddpjob/linked would be emptied through
    (precious / "linked" / "logs").mkdir(parents=True)
    (precious / "linked" / "checkpoints").mkdir(parents=True)
    kept = [precious / "keep.txt", precious / "logs" / "keep.txt", precious / "linked" / "logs" / "keep.txt",
            precious / "linked" / "checkpoints" / "keep.txt"]
    for f in kept:
        f.write_text("mine")
    (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / link).symlink_to(precious)

    code = cli.main(["run", str(job), "--local"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INVALID, err
    assert f"{link}: is a symbolic link (to {precious})" in err and f"`rm {link}`" in err and "Traceback" not in err
    assert all(f.read_text() == "mine" for f in kept)
    assert (tmp_path / link).is_symlink()  # refused, not "fixed": the link is the user's to remove


def test_a_dangling_link_is_refused_too(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write_manifest(tmp_path, manifest("linked"))
    (tmp_path / ".ddpjob" / "linked").mkdir(parents=True)
    (tmp_path / ".ddpjob" / "linked" / "logs").symlink_to(tmp_path / "not-yet")
    assert cli.main(["run", str(job), "--local"]) == cli.EXIT_INVALID
    assert ".ddpjob/linked/logs: is a symbolic link" in capsys.readouterr().err
    assert not (tmp_path / "not-yet").exists()  # nothing created through it either
