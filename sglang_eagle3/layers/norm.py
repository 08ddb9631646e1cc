from __future__ import annotations

import torch
import torch.nn as nn

from sglang_eagle3 import kernels
from sglang_eagle3.layers.linear import sharded_loader


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 (float64 inputs stay float64), output in the input dtype, as DeepSeek and
    Llama do. One Triton launch on CUDA (kernels.rms_norm), the torch reference elsewhere and whenever
    autograd records through it."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = sharded_loader(None)
        self.use_triton: bool | None = None  # None: Triton on CUDA, reference elsewhere

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                out_rows: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [..., D] -> normed [..., D]; with ``residual``: (norm(x + residual), x + residual) from one
        launch. ``out`` receives the result (may be x itself, or a view); with ``out_rows`` [rows of x] row i
        lands in out[out_rows[i]] (MLA writes its latent straight into the paged cache)."""
        return kernels.rms_norm(x, self.weight, self.eps, residual, out=out, out_rows=out_rows,
                                use_triton=self.use_triton)
