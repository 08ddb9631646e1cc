"""Launcher for the Gumbel-max sampling kernel (semantics: ref_gumbel_argmax in ref.py).

One program a row streams the row's scores once, hashing its noise as it goes (no [R, V] noise tensor), so a
speculative round's sampler costs one read of its logits. Grid fixed by shapes (graph-safe).
"""

from __future__ import annotations

import torch

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.triton.sampling import gumbel_argmax_kernel


def triton_gumbel_argmax(scores: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """scores float [R, V] (unit inner stride), keys int64 [R] in [0, 2^32), positions int [R] -> int64 [R]."""
    assert scores.dim() == 2 and scores.stride(-1) == 1, (
        f"scores must be [R, V] with unit inner stride, got {tuple(scores.shape)} strides {scores.stride()}")
    R, V = scores.shape
    assert keys.shape == (R,) and positions.shape == (R,), (
        f"keys {tuple(keys.shape)} and positions {tuple(positions.shape)} must be [{R}]")
    assert not keys.dtype.is_floating_point and not positions.dtype.is_floating_point, (
        f"keys and positions must be integers, got {keys.dtype} and {positions.dtype}")
    assert 0 < V < 2**31, f"{V=} must lie in (0, 2^31)"
    out = torch.empty(R, dtype=torch.int64, device=scores.device)
    if R:
        interp = tuning.interpreting()
        gumbel_argmax_kernel[(R,)](scores, keys.contiguous(), positions.contiguous(), out, V, scores.stride(0),
                                   BLOCK_V=256 if interp else 2048, num_warps=1 if interp else 8)
    return out
