"""A Python function as a job (function_job): the program built from its source, what cannot be shipped
(each refused with the fix), and the manifest submit() builds run locally with real torchrun."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from ddpjob_operator import function_job, validation
from ddpjob_operator.local.view import PlainView

SCALE = 10


def allreduce_ranks(out_dir: str, scale: int = 1) -> None:
    """Every process adds (rank + 1) * scale over the group and writes what it saw."""
    import json
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(value)
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": value.item(),
                   "group_rank": int(os.environ["GROUP_RANK"])}, f)
    dist.destroy_process_group()


def fails(message: str) -> None:
    raise ValueError(message)


def uses_a_module_global() -> None:
    print(os.getcwd(), SCALE)


def test_the_program_is_the_function_and_a_call_with_json_kwargs(tmp_path):
    fj = function_job.build(allreduce_ranks, name="sum", replicas=2, kwargs={"out_dir": "/x", "scale": 3})
    text = fj.program
    assert "def allreduce_ranks(out_dir: str, scale: int = 1) -> None:" in text
    assert text.rstrip().endswith("allreduce_ranks(**_ddpjob_json.loads('{\"out_dir\": \"/x\", \"scale\": 3}'))")
    compile(text, "ddpjob_function.py", "exec")
    spec = fj.manifest["spec"]
    assert spec["entrypoint"] == f"{function_job.MOUNT_PATH}/{function_job.PROGRAM}"
    assert spec["template"]["volumes"] == [{"name": "function", "configMap": {"name": "sum-function"}}]
    assert spec["template"]["volumeMounts"][0]["mountPath"] == function_job.MOUNT_PATH
    assert fj.config_map["metadata"]["name"] == "sum-function"
    validation.parse_job(fj.manifest)  # what the CRD accepts
    generated = function_job.build(allreduce_ranks).name
    assert generated.startswith("allreduce-ranks-") and len(generated) <= 50


@pytest.mark.parametrize("fn, field, words", [
    (lambda: None, "train_fn", "a lambda has no name"),
    (uses_a_module_global, "train_fn", "uses the global name(s) SCALE, os, which are not shipped"),
    (print, "train_fn", "is not a function"),
])
def test_what_cannot_be_shipped_is_refused_with_the_fix(fn, field, words):
    with pytest.raises(validation.InvalidJob) as raised:
        function_job.build(fn)
    error = raised.value.errors[0]
    assert error.path == field and words in error.message and error.fix


def test_closures_kwargs_size_and_names_are_refused_with_the_fix():
    threshold = 3

    def closure() -> None:
        print(threshold)

    with pytest.raises(validation.InvalidJob, match=r"closure.*threshold.*Fix: define it at the top level"):
        function_job.build(closure)
    with pytest.raises(validation.InvalidJob, match=r"kwargs: kwargs cannot travel as JSON.*Fix"):
        function_job.build(fails, kwargs={"message": object()})
    with pytest.raises(validation.InvalidJob, match=r"metadata.name"):
        function_job.build(fails, name="Not_A_Name")
    with pytest.raises(validation.InvalidJob, match=r"spec.replicas: must be >= 1"):
        function_job.build(fails, replicas=0)
    with pytest.raises(validation.InvalidJob, match=r"at most 1 MiB.*Fix: ship large code in an image"):
        function_job.build(fails, kwargs={"message": "x" * function_job.CONFIG_MAP_LIMIT})


def test_the_function_runs_in_every_process_locally_with_real_torchrun(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    fj = function_job.build(allreduce_ranks, name="sum", replicas=2, kwargs={"out_dir": str(out), "scale": 5},
                            env={"OMP_NUM_THREADS": "1"},
                            spec={"rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 1}})
    local = function_job.local_job(fj, tmp_path / "mount")
    # The manifest submit() sends, but for the path the ConfigMap is mounted at.
    sent = validation.parse_job(fj.manifest).spec.wire()
    assert {k: v for k, v in local.spec.wire().items() if k != "entrypoint"} == \
        {k: v for k, v in sent.items() if k != "entrypoint"}
    assert Path(local.spec.entrypoint).read_text() == fj.program
    phase = function_job.run_local(fj, state_dir=tmp_path / ".ddpjob",
                                   view=PlainView(Console(file=open(os.devnull, "w"))))
    assert phase == "Succeeded"
    seen = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"], r["sum"]) for r in seen] == [(0, 2, 15.0), (1, 2, 15.0)]
    assert sorted(r["group_rank"] for r in seen) == [0, 1]  # one process in each worker


def test_an_exception_in_the_function_fails_the_job_locally(tmp_path):
    fj = function_job.build(fails, name="boom", kwargs={"message": "bad data in shard 3"},
                            spec={"rendezvous": {"joinTimeoutSeconds": 60, "lastCallTimeoutSeconds": 1}})
    phase = function_job.run_local(fj, state_dir=tmp_path / ".ddpjob",
                                   view=PlainView(Console(file=open(os.devnull, "w"))))
    assert phase == "Failed"
    log = (tmp_path / ".ddpjob" / "boom" / "logs" / "boom-worker-0.log").read_text()
    assert "ValueError: bad data in shard 3" in log


LEARNING_RATE = 0.1


def defaults_read_a_global(lr: float = LEARNING_RATE) -> None:
    print(lr)


def annotated(config: "Config", steps: int = 3) -> None:  # noqa: F821 - never evaluated in the program
    print(config, steps)


def test_defaults_that_read_globals_are_refused_and_annotations_are_never_evaluated():
    with pytest.raises(validation.InvalidJob, match=r"global name\(s\) LEARNING_RATE"):
        function_job.build(defaults_read_a_global)
    program = function_job.build(annotated, kwargs={"config": "c"}).program
    assert program.startswith("# Generated") and "from __future__ import annotations" in program
    namespace: dict = {"__name__": "not_main"}
    exec(compile(program, "ddpjob_function.py", "exec"), namespace)  # defining it needs no `Config`
    assert callable(namespace["annotated"])
