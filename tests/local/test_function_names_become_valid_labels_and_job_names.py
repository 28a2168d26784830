"""issue 38 item 13 (function jobs): any legal Python name of the function (non-ASCII, a leading underscore,
very long, nothing ASCII at all) gives a valid job name (DNS-1035) and a valid `function` label value, so
`function_job.build` never makes a manifest the API server would refuse."""

from __future__ import annotations

import re

import pytest

from ddpjob_operator import function_job, model, validation
from ddpjob_operator.k8s_fields import LABEL_VALUE


def entraînement() -> None:
    print("training")


def 訓練() -> None:
    print("training")


def _private_step() -> None:
    print("training")


def ɸ2() -> None:  # a letter with no ASCII form, then a digit
    print("training")


def train_a_model_whose_name_is_far_longer_than_any_label_value_can_hold_in_kubernetes_at_all() -> None:
    print("training")


@pytest.mark.parametrize("fn, label, name_start", [
    (entraînement, "entrainement", "entrainement-"),
    (訓練, "function", "function-"),
    (_private_step, "private_step", "private-step-"),
    (ɸ2, "2", "fn-2-"),
    (train_a_model_whose_name_is_far_longer_than_any_label_value_can_hold_in_kubernetes_at_all,
     "train_a_model_whose_name_is_far_longer_than_any_label_value_can", "train-a-model-"),
], ids=["folded", "nothing-ascii", "leading-underscore", "digit-left", "long"])
def test_the_function_name_gives_a_valid_label_and_job_name(fn, label, name_start):
    fj = function_job.build(fn)
    labels = fj.manifest["metadata"]["labels"]
    assert labels[f"{model.GROUP}/function"] == label and len(label) <= 63 and re.fullmatch(LABEL_VALUE, label)
    assert fj.name.startswith(name_start) and fj.name.isascii() and len(fj.name) <= model.MAX_JOB_NAME_LENGTH
    validation.parse_job(fj.manifest)  # what the CRD accepts
    assert f"def {fn.__name__}(" in fj.program  # the program still calls the function by its own name
