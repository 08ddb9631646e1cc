from __future__ import annotations

import torch
import torch.nn as nn

from sglang_eagle3.layers.linear import sharded_loader


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, output in the input dtype (as DeepSeek and Llama do)."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = sharded_loader(None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.element_size() < 4 else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.to(xf.dtype)).to(x.dtype)
