"""`seed_step`: a rank's random streams at a step depend on (seed, step, rank) only, never on the draws that
came before, which is what makes a resume from any checkpoint (a rescue included) draw what an undisturbed
run draws."""

from __future__ import annotations

import random

import numpy as np
import torch

from ddp_trainer.runtime import seed_step


def draws() -> tuple[float, float, list[float]]:
    dropout = torch.nn.functional.dropout(torch.ones(64), p=0.5, training=True)
    return random.random(), float(np.random.rand()), dropout.tolist()


def test_the_same_seed_step_and_rank_draw_the_same_whatever_came_before():
    seed_step(7, 12, 1)
    first = draws()
    for _ in range(5):  # history: what a run that trained other steps first would have drawn
        draws()
    seed_step(7, 12, 1)
    assert draws() == first


def test_another_step_rank_or_seed_draws_differently():
    def at(seed: int, step: int, rank: int):
        seed_step(seed, step, rank)
        return draws()

    base = at(7, 12, 1)
    assert all(base != other for other in (at(7, 13, 1), at(7, 12, 0), at(8, 12, 1)))
