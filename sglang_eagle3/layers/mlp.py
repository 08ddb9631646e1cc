from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_eagle3.layers.linear import ColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)); gate/up column-parallel, down row-parallel.

    ``reduce=False`` leaves down's partial sums un-reduced so the MoE block can add them to the routed
    experts' partial sums and all-reduce once.
    """

    def __init__(self, hidden: int, intermediate: int, dtype=None, reduce: bool = True):
        super().__init__()
        self.gate_proj = ColumnParallelLinear(hidden, intermediate, dtype=dtype)
        self.up_proj = ColumnParallelLinear(hidden, intermediate, dtype=dtype)
        self.down_proj = RowParallelLinear(intermediate, hidden, dtype=dtype, reduce=reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
