"""`--workload-option state_mb=N` (workloads/state.py): the bundled workloads' model plus its AdamW state is
about N MiB, the block trains like a layer (AdamW keeps moments for it), and a bad size is a ConfigError."""

from __future__ import annotations

import pytest
import torch

from ddp_trainer.config import ConfigError, parse_config
from ddp_trainer.workloads import default_optimizer, load_workload


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = [*model.state_dict().values(),
               *(t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("workload", ["digits", "synthetic"])
def test_state_mb_sizes_model_and_adamw_state(workload):
    cfg = parse_config(["--workload", workload, "--workload-option", "state_mb=16"])
    w = load_workload(workload)
    model = w.build_model(cfg)
    optimizer = default_optimizer(model, cfg)
    features = 64 if workload == "digits" else 256
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, features)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    optimizer.step()
    assert abs(state_bytes(model, optimizer) - 16 * 2**20) < 2**16  # AdamW's step counters: a few bytes
    assert model.state_block.grad is not None and torch.count_nonzero(model.state_block.grad) == 0


def test_without_state_mb_the_model_is_unchanged():
    cfg = parse_config(["--workload", "digits"])
    assert isinstance(load_workload("digits").build_model(cfg), torch.nn.Sequential)


@pytest.mark.parametrize("value", ["-1", "70000"])
def test_state_mb_out_of_range_names_the_option(value):
    cfg = parse_config(["--workload", "digits", "--workload-option", f"state_mb={value}"])
    with pytest.raises(ConfigError, match="workload.options.state_mb must be between 0 and 65536"):
        load_workload("digits").build_model(cfg)
