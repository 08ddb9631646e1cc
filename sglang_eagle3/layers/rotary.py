"""Rotary position embeddings: DeepSeek's interleaved rope with YaRN, and Llama's half-split rope."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from sglang_eagle3 import kernels
from sglang_eagle3.config import RopeConfig, yarn_get_mscale


def _yarn_correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def rope_inv_freq(dim: int, rope: RopeConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [dim/2] (float64) and the cos/sin magnitude scale (YaRN's mscale ratio)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    freq_extra = 1.0 / (rope.theta ** exponents)
    if rope.kind != "yarn":
        return freq_extra, 1.0
    freq_inter = 1.0 / (rope.factor * rope.theta ** exponents)
    low = max(math.floor(_yarn_correction_dim(rope.beta_fast, dim, rope.theta,
                                              rope.original_max_position_embeddings)), 0)
    high = min(math.ceil(_yarn_correction_dim(rope.beta_slow, dim, rope.theta,
                                              rope.original_max_position_embeddings)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra_mask = 1.0 - ramp  # 1 keeps the original (high-frequency) dims
    inv_freq = freq_inter * (1 - extra_mask) + freq_extra * extra_mask
    mscale = yarn_get_mscale(rope.factor, rope.mscale) / yarn_get_mscale(rope.factor, rope.mscale_all_dim)
    return inv_freq, mscale


class RotaryEmbedding(nn.Module):
    """cos/sin table over positions; ``interleaved`` rotates pairs (x[2i], x[2i+1]) as DeepSeek does,
    otherwise the halves (x[i], x[i + d/2]) as Llama does.

    Tables are float64 (the reference path for float64 inputs, bit for bit as before) plus a float32 copy
    for everything else: the Triton kernel reads it, and the reference casting it gives the same numbers as
    casting the float64 table per call did."""

    def __init__(self, dim: int, max_positions: int, rope: RopeConfig, interleaved: bool):
        super().__init__()
        inv_freq, mscale = rope_inv_freq(dim, rope)
        t = torch.arange(max_positions, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)  # [P, dim/2]
        self.interleaved = interleaved
        self.max_positions = max_positions
        # Buffers (not parameters): moved with .to(device), never loaded from checkpoints.
        self.register_buffer("cos", freqs.cos() * mscale, persistent=False)  # float64
        self.register_buffer("sin", freqs.sin() * mscale, persistent=False)
        self.register_buffer("cos_f32", self.cos.float(), persistent=False)  # [P, dim/2] float32
        self.register_buffer("sin_f32", self.sin.float(), persistent=False)
        self.use_triton: bool | None = None  # None: Triton on CUDA, reference elsewhere

    def tables(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [P, dim/2] for operands of ``dtype``: float64 for float64, else float32 (the kernels')."""
        if dtype == torch.float64:
            return self.cos, self.sin
        # NOTE: model.to(dtype) would cast these buffers too; the kernel needs float32.
        return self.cos_f32.float(), self.sin_f32.float()

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., N, heads, dim] or [..., N, dim] with positions [..., N] -> rotated copy."""
        cos, sin = self.tables(x.dtype)
        if positions.dim() == 1 and x.dim() in (2, 3):
            return kernels.apply_rotary(x, None, positions, cos, sin, interleaved=self.interleaved,
                                        use_triton=self.use_triton)[0]
        return kernels.ref_rotate(x, positions, cos, sin, self.interleaved)

    def rotate_(self, q: torch.Tensor | None, k: torch.Tensor, positions: torch.Tensor, *,
                k_out: torch.Tensor | None = None, k_out_rows: torch.Tensor | None = None,
                c_norm: tuple | None = None) -> None:
        """Rotates q [N, heads, dim] in place (q None: k alone, a launch that does not wait for q) and k [N, dim]
        or [N, kv_heads, dim] in place, or into rows k_out_rows [N] of k_out (cache slots) when given (strided
        views allowed), positions [N]: one launch on CUDA, which with ``c_norm`` = (c, norm weight, eps, c_out)
        also RMS-normalises c into those rows of c_out. Not for tensors autograd must differentiate."""
        kernels.apply_rotary(**self.rotate_args(q, k, positions, k_out=k_out, k_out_rows=k_out_rows, c_norm=c_norm),
                             use_triton=self.use_triton)

    def rotate_args(self, q: torch.Tensor | None, k: torch.Tensor, positions: torch.Tensor, *,
                    k_out: torch.Tensor | None = None, k_out_rows: torch.Tensor | None = None,
                    c_norm: tuple | None = None) -> dict:
        """rotate_'s work as kernels.apply_rotary's keyword arguments, for a launch that does it beside its own
        (kernels.gemv's ``rotary``)."""
        cos, sin = self.tables(k.dtype)
        return dict(q=q, k=k, positions=positions, cos=cos, sin=sin, interleaved=self.interleaved, inplace=True,
                    k_out=k_out, k_out_rows=k_out_rows, c_norm=c_norm)
