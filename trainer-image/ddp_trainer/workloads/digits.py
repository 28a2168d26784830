"""sklearn's 8x8 handwritten digits (1797 images, bundled with sklearn, no download): a small MLP."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..config import TrainConfig


def build_datasets(cfg: TrainConfig) -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    # Fixed split, independent of the training seed, so every run evaluates on the same 360 images.
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)

    def to_ds(xs, ys):  # pixel values are 0..16
        return TensorDataset(torch.tensor(xs / 16.0, dtype=torch.float32), torch.tensor(ys, dtype=torch.long))

    return to_ds(x_train, y_train), to_ds(x_test, y_test)


def build_model(cfg: TrainConfig) -> nn.Module:
    hidden = cfg.workload.get("hidden", 128)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))
