"""`--workload-option state_mb=N` of the bundled workloads: training state of a chosen size, for recovery
benchmarks (bench/recovery.py --state-mb) that ask whether a restart grows with the state.

It adds one parameter block to the model, sized so that the model plus its AdamW state (the parameters and
the two moments: 12 bytes per parameter) is about N MiB. The block takes part in every step, as a layer
would: its gradient (zeros: it adds 0 x its sum to the output) is all-reduced by DDP, AdamW updates it and
keeps its moments, and checkpoints save and load it. Nothing is downloaded.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ConfigError, TrainConfig

BYTES_PER_PARAMETER = 12  # fp32 parameter + AdamW's exp_avg and exp_avg_sq
MAX_STATE_MB = 65536.0


class WithStateBlock(nn.Module):
    def __init__(self, inner: nn.Module, parameters: int):
        super().__init__()
        self.inner = inner
        self.state_block = nn.Parameter(torch.zeros(parameters))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 0.0 * self.state_block.sum()


def with_state_block(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """`model` itself without the option (or 0); else it wrapped with a block filling the state to size."""
    megabytes = cfg.workload.get("state_mb", 0.0)
    if not 0 <= megabytes <= MAX_STATE_MB:
        raise ConfigError(f"workload.options.state_mb must be between 0 and {MAX_STATE_MB:g} (MiB of model plus "
                          f"AdamW state), got {megabytes:g}")
    if megabytes == 0:
        return model
    have = sum(p.numel() for p in model.parameters())
    parameters = max(int(megabytes * 2**20) // BYTES_PER_PARAMETER - have, 1)
    return WithStateBlock(model, parameters)
