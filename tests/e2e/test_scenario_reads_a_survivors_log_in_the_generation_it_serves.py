"""The e2e scenario's log reading, without a cluster (issue 38, item 19): a survivor carried into a later
generation keeps the pod, and the generation label, it was created with, so a test looking for a
generation's lines must read the survivors' pods too. `test_hf.py` missed rank 0's resume this way."""

from __future__ import annotations

from .scenario import PodRecord

HF_SURVIVOR_LOG = "step=60 epoch=0 loss=2.1\nresumed from checkpoint step=61 (saved at world_size=2, now 2)\nstep=62\n"


def record(name: str, generation: int, log: str, served: set[int]) -> PodRecord:
    return PodRecord(name=name, uid=name, index=0, generation=generation, attempt=0, log=log, generations=served)


def test_a_survivor_without_start_up_lines_is_read_whole_for_the_generation_it_was_carried_into():
    survivor = record("w0", 0, HF_SURVIVOR_LOG, {0, 1})
    assert "resumed from checkpoint step=61" in survivor.log_served(1)
    assert "resumed from checkpoint" in survivor.log_served(0)  # unsplittable: the whole log either way


def test_a_pod_that_never_served_a_generation_has_no_lines_of_it():
    replaced = record("w1", 0, HF_SURVIVOR_LOG, {0})
    assert replaced.log_served(1) == ""


def test_a_trainer_with_start_up_lines_is_split_by_them():
    log = ("rank=0 world_size=2 group_rank=0 restart_count=0 generation=0 workload=digits\nstep=10\n"
           "rank=0 world_size=2 group_rank=0 restart_count=0 generation=1 workload=digits\n"
           "resumed from checkpoint step=11 epoch=0\n")
    survivor = record("w0", 0, log, {0, 1})
    assert "step=10" not in survivor.log_served(1) and "step=11" in survivor.log_served(1)
    assert "step=10" in survivor.log_served(0) and "step=11" not in survivor.log_served(0)
