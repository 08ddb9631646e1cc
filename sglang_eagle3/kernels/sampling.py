"""Launcher for the Gumbel-max sampling kernel (semantics: ref_gumbel_argmax in ref.py).

Programs over (row, chunk of CHUNK tokens) stream the scores once, hashing their noise as they go (no [R, V] noise
tensor), each storing its chunk's best as one int64 key; the row's largest key is its token (one max over a few
dozen keys a row). Grid fixed by shapes (graph-safe). One program a row took 106 us for a row of Kimi's 163840
tokens on the H200 (a chain of 80 blocks); a chunk of 4096 tokens a program spreads it over the SMs.
"""

from __future__ import annotations

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.triton.sampling import gumbel_argmax_kernel

CHUNK = 4096  # tokens a program: 40 programs a row at Kimi's vocabulary


def triton_gumbel_argmax(scores: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                         token_ids: torch.Tensor | None = None) -> torch.Tensor:
    """scores float [R, V] (unit inner stride), keys int64 [R] in [0, 2^32), positions int [R] -> int64 [R] (column
    indices); token_ids int [V]: the token whose noise column v takes (default: v)."""
    assert scores.dim() == 2 and scores.stride(-1) == 1, (
        f"scores must be [R, V] with unit inner stride, got {tuple(scores.shape)} strides {scores.stride()}")
    R, V = scores.shape
    assert keys.shape == (R,) and positions.shape == (R,), (
        f"keys {tuple(keys.shape)} and positions {tuple(positions.shape)} must be [{R}]")
    assert not keys.dtype.is_floating_point and not positions.dtype.is_floating_point, (
        f"keys and positions must be integers, got {keys.dtype} and {positions.dtype}")
    assert 0 < V < 2**31, f"{V=} must lie in (0, 2^31)"
    assert token_ids is None or (token_ids.shape == (V,) and not token_ids.dtype.is_floating_point), (
        f"token_ids must be integers [{V}], got {None if token_ids is None else (token_ids.dtype, token_ids.shape)}")
    if R == 0:
        return torch.empty(0, dtype=torch.int64, device=scores.device)
    interp = tuning.interpreting()
    block = 256 if interp else 1024
    chunk = min(CHUNK, triton.cdiv(V, block) * block)
    part = torch.empty(R, triton.cdiv(V, chunk), dtype=torch.int64, device=scores.device)
    token_map = scores if token_ids is None else token_ids.contiguous()  # (never read without a map)
    gumbel_argmax_kernel[part.shape](scores, keys.contiguous(), positions.contiguous(), part, V, scores.stride(0),
                                     token_map, CHUNK=chunk, BLOCK_V=block, HAS_MAP=token_ids is not None,
                                     num_warps=1 if interp else 4)
    return (2**31 - 1) - (part.amax(1) & 0xFFFFFFFF)  # the token in the best key's low bits
