"""docs/hf-and-lightning.md's Python snippets are complete scripts, run here as written (issue 32, item 6): each
under torchrun with two processes (Gloo, CPU) as DDPJob starts it, where it commits the callback's checkpoints
and finishes, and with plain `python` (no torchrun: the Lightning snippet read `os.environ["RANK"]` and failed
there). A snippet edited into something that does not run fails this test."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from trainer_harness import job_dir, PY, base_env, kill_tree, read_json, start, tail

from ddp_trainer.runtime import frameworks

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "hf-and-lightning.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL)
# framework (its subdirectory on the volume) -> (its checkpoints' names, the modules it needs)
FRAMEWORKS = {"hf": (r"checkpoint-(\d+)", ("transformers", "accelerate")),
              "lightning": (r"step-(\d+)\.ckpt", ("lightning",))}

pytestmark = pytest.mark.slow


def _framework(snippet: str) -> str:
    return "hf" if "from ddp_trainer.runtime import hf" in snippet else "lightning"


def test_the_doc_has_one_snippet_per_framework() -> None:
    assert sorted(map(_framework, SNIPPETS)) == ["hf", "lightning"]


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_the_docs_snippet_runs_as_written_under_torchrun_and_alone(tmp_path: Path, framework: str) -> None:
    pattern, modules = FRAMEWORKS[framework]
    for module in modules:
        pytest.importorskip(module)
    script = tmp_path / "train.py"
    script.write_text(next(s for s in SNIPPETS if _framework(s) == framework))

    # The plain run shares nothing with torchrun's (no job, its own directory): it runs beside it.
    alone_out, alone_err = tmp_path / "alone.out", tmp_path / "alone.err"
    with open(alone_out, "w") as out, open(alone_err, "w") as err:
        alone = subprocess.Popen([PY, str(script)], cwd=tmp_path, env=base_env(None, HF_HUB_OFFLINE="1"),
                                 stdout=out, stderr=err, start_new_session=True)
    ck, log = tmp_path / "ck", tmp_path / "torchrun.log"
    env = base_env(ck, HF_HUB_OFFLINE="1", DDPJOB_CHECKPOINT_INTERVAL_STEPS="20")
    try:
        proc = start([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
                      "--monitor-interval=0.2", str(script)], env, log)
        try:
            assert proc.wait(240) == 0, tail(log)
        finally:
            kill_tree(proc, signal.SIGKILL)
        alone_code = alone.wait(240)
    finally:
        kill_tree(alone, signal.SIGKILL)
    result = read_json(job_dir(ck) / "result.json")
    assert result and result["status"] == "completed" and result["step"] == 40 and result["world_size"] == 2, \
        (result, tail(log))
    found = frameworks.newest_complete(ck / "local.test" / framework, re.compile(f"^{pattern}$"))
    assert found is not None and found[0] == 40, tail(log)

    assert alone_code == 0, (alone_out.read_text() + alone_err.read_text())[-4000:]
    assert "Traceback" not in alone_err.read_text(), alone_err.read_text()[-4000:]
