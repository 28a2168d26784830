"""Issue 37 item 1: the trainer spells each `DDPJOB_*` variable once, in ddp_trainer/runtime/contract.py, and
every one it reads is one the operator (and the local runner, through the same launch.worker_env) sets on
every worker, under the same name as the operator's own contract (agent/contract.py). The operator never
imports torch; this test imports both sides."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ddp_trainer.runtime import contract as trainer_contract
from ddpjob_operator import launch, model
from ddpjob_operator.agent import contract as operator_contract

TRAINER = Path(trainer_contract.__file__).resolve().parents[1]  # trainer-image/ddp_trainer
NAME = re.compile(r"\bDDPJOB_[A-Z0-9_]*[A-Z0-9]\b")  # not a family: DDPJOB_CHECKPOINT_*


def trainer_names() -> dict[str, str]:
    return {key: value for key, value in vars(trainer_contract).items()
            if key.endswith("_ENV") and isinstance(value, str) and value.startswith("DDPJOB_")}


def every_worker_env() -> dict[str, str]:
    """What a worker gets with every feature on that switches a DDPJOB_ variable (checkpoints, in process)."""
    spec = model.DDPJobSpec.model_validate({
        "replicas": 2, "image": "trainer:1", "entrypoint": "ddp_trainer", "checkpoint": {"claimTemplate": {"size": "1Gi"}},
        "failurePolicy": {"recovery": "InProcess"}})
    return launch.worker_env(spec, job_name="job", namespace="ns", index=0, generation=0, endpoint="job-rdzv:29400",
                             rdzv_id="uid-g0", local_addr="127.0.0.1", master_addr="127.0.0.1")


def test_every_name_the_trainer_reads_is_one_the_operator_sets() -> None:
    names = set(trainer_names().values())
    assert names, "the trainer's contract names no DDPJOB_ variable"
    assert names - set(every_worker_env()) == set()


def test_a_name_both_contracts_hold_has_the_same_value() -> None:
    shared = trainer_names().keys() & {key for key in vars(operator_contract) if key.endswith("_ENV")}
    assert {"PROGRESS_URL_ENV", "PROGRESS_TOKEN_ENV", "PROGRESS_CA_ENV", "INPROCESS_ENV", "SPARE_PLACE_ENV",
            "REJOIN_TIMEOUT_ENV"} <= shared
    assert {key: trainer_names()[key] for key in shared} == {key: getattr(operator_contract, key) for key in shared}


def test_the_trainer_mentions_no_ddpjob_variable_its_contract_lacks() -> None:
    """Docstrings and messages may name a variable; each one they name is the contract's."""
    mentioned = {name for path in TRAINER.rglob("*.py") for name in NAME.findall(path.read_text())}
    assert mentioned - set(trainer_names().values()) == set()


def test_no_module_but_the_contract_spells_a_variables_name_as_a_value() -> None:
    """A string that is exactly a variable's name (what `os.environ.get` takes) lives in contract.py only."""
    spelled = {}
    for path in TRAINER.rglob("*.py"):
        where = path.relative_to(TRAINER).as_posix()
        if where == "runtime/contract.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                spelled.setdefault(where, []).append(f"line {node.lineno}: {node.value}")
            if isinstance(node, ast.keyword) and node.arg and NAME.fullmatch(node.arg):  # os.environ.update(NAME=...)
                spelled.setdefault(where, []).append(f"line {node.value.lineno}: {node.arg}=")
    assert spelled == {}
