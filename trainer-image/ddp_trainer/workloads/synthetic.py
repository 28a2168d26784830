"""Random tensors with learnable labels (a fixed random linear teacher), sized for benchmarks.

Options: samples (4096), eval_samples (1024), features (256), classes (10), hidden (512), layers (2).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..config import TrainConfig
from .state import with_state_block


def build_datasets(cfg: TrainConfig) -> tuple[TensorDataset, TensorDataset]:
    w = cfg.workload
    n, n_eval = w.get("samples", 4096), w.get("eval_samples", 1024)
    features, classes = w.get("features", 256), w.get("classes", 10)
    g = torch.Generator().manual_seed(1234)  # data is fixed; cfg.data.seed only drives order and init
    x = torch.randn(n + n_eval, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])


def build_model(cfg: TrainConfig) -> nn.Module:
    w = cfg.workload
    features, classes = w.get("features", 256), w.get("classes", 10)
    hidden, layers = w.get("hidden", 512), w.get("layers", 2)
    mods: list[nn.Module] = []
    width = features
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, classes))
    return with_state_block(nn.Sequential(*mods), cfg)
