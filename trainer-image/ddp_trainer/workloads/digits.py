"""sklearn's 8x8 handwritten digits (1797 images): a small MLP.

The train/test split (sklearn's `load_digits` and `train_test_split(test_size=0.2, random_state=0,
stratify=y)`, 1437/360 images) ships as digits.npz: importing sklearn took 1.8 s of every trainer
start, on the critical path of every restart (tests/trainer checks the file against sklearn).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..config import TrainConfig
from .state import with_state_block

DATA = Path(__file__).with_name("digits.npz")


def build_datasets(cfg: TrainConfig) -> tuple[TensorDataset, TensorDataset]:
    with np.load(DATA) as data:
        def to_ds(split: str) -> TensorDataset:  # pixel values are 0..16
            return TensorDataset(torch.tensor(data[f"x_{split}"] / 16.0, dtype=torch.float32),
                                 torch.tensor(data[f"y_{split}"], dtype=torch.long))
        return to_ds("train"), to_ds("test")


def build_model(cfg: TrainConfig) -> nn.Module:
    hidden = cfg.workload.get("hidden", 128)
    return with_state_block(nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                          nn.Linear(hidden, 10)), cfg)
