"""A trainer workload (`--workload workload_with_a_fixed_cost_per_micro_batch`, this folder on PYTHONPATH) whose
every training micro-batch costs a fixed wall time (`--workload-option micro_batch_seconds=S`): a step's own
time then tells how many micro-batches it trained, whatever else the machine is doing."""

from __future__ import annotations

import time

import torch
from torch.utils.data import TensorDataset


def build_datasets(cfg):
    samples = cfg.workload.get("samples", 96)
    inputs = torch.randn(samples, 8, generator=torch.Generator().manual_seed(0))
    targets = (inputs.sum(dim=1) > 0).long()
    return TensorDataset(inputs, targets), TensorDataset(inputs[:16], targets[:16])


def build_model(cfg):
    return torch.nn.Linear(8, 2)


def train_step(model, batch, cfg):
    time.sleep(cfg.workload.get("micro_batch_seconds", 0.0))
    inputs, targets = batch
    return torch.nn.functional.cross_entropy(model(inputs), targets)
