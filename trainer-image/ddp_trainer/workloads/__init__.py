"""Workloads: what to train. A workload is a module exposing factories (see docs/trainer.md):

    build_datasets(cfg) -> (train_dataset, eval_dataset)   map-style; items (input, target) or dicts
    build_model(cfg) -> torch.nn.Module
    build_optimizer(model, cfg) -> torch.optim.Optimizer    optional, default from cfg.optim
    loss_fn(output, target) -> scalar Tensor                optional, default cross_entropy
    collate_fn(samples) -> batch                            optional, default torch's default_collate
    train_step(model, batch, cfg) -> scalar loss Tensor     optional, see default_train_step
    eval_step(model, batch, cfg) -> {"loss": sum, "count": n, ["correct": c, "scored": m]}   optional

`cfg` is the full TrainConfig; workload-specific knobs are in cfg.workload.options
(`--workload-option key=value`, read with cfg.workload.get("key", default)).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..config import ConfigError, TrainConfig

BUNDLED = {"digits": "ddp_trainer.workloads.digits", "synthetic": "ddp_trainer.workloads.synthetic"}


@dataclass(frozen=True)
class Workload:
    name: str
    build_datasets: Callable[[TrainConfig], tuple[Any, Any]]
    build_model: Callable[[TrainConfig], torch.nn.Module]
    build_optimizer: Callable[[torch.nn.Module, TrainConfig], torch.optim.Optimizer]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    collate_fn: Callable[[list[Any]], Any] | None = None
    train_step: Callable[[torch.nn.Module, Any, TrainConfig], torch.Tensor] | None = None
    eval_step: Callable[[torch.nn.Module, Any, TrainConfig], dict[str, Any]] | None = None


def default_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)


def load_workload(name: str) -> Workload:
    module_name = BUNDLED.get(name, name)
    try:
        module: ModuleType = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"workload.name {name!r} is neither bundled ({', '.join(BUNDLED)}) "
                          f"nor an importable module: {e}") from e
    missing = [f for f in ("build_datasets", "build_model") if not callable(getattr(module, f, None))]
    if missing:
        raise ConfigError(f"workload.name {name!r}: module {module_name} lacks {', '.join(missing)}")
    return Workload(name=name, build_datasets=module.build_datasets, build_model=module.build_model,
                    build_optimizer=getattr(module, "build_optimizer", default_optimizer),
                    loss_fn=getattr(module, "loss_fn", F.cross_entropy),
                    collate_fn=getattr(module, "collate_fn", None), train_step=getattr(module, "train_step", None),
                    eval_step=getattr(module, "eval_step", None))
