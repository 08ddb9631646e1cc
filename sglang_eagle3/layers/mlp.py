from __future__ import annotations

import torch
import torch.nn as nn

from sglang_eagle3.layers.linear import ColumnParallelLinear, RowParallelLinear, matmul_wt


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
        # silu(x Wg^T) * (x Wu^T) in one launch at decode sizes (the GEMV's gated epilogue), else torch.
        act = matmul_wt(x, self.gate_proj.weight, self.gate_proj.use_triton, w_up=self.up_proj.weight)
        return self.down_proj(act)
