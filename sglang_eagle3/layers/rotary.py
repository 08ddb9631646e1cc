"""Rotary position embeddings: DeepSeek's interleaved rope with YaRN, and Llama's half-split rope."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

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
    otherwise the halves (x[i], x[i + d/2]) as Llama does."""

    def __init__(self, dim: int, max_positions: int, rope: RopeConfig, interleaved: bool):
        super().__init__()
        inv_freq, mscale = rope_inv_freq(dim, rope)
        t = torch.arange(max_positions, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)  # [P, dim/2]
        self.interleaved = interleaved
        self.max_positions = max_positions
        # Buffers (not parameters): moved with .to(device), never loaded from checkpoints.
        self.register_buffer("cos", freqs.cos() * mscale, persistent=False)  # float64; cast per use
        self.register_buffer("sin", freqs.sin() * mscale, persistent=False)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., N, heads, dim] or [..., N, dim] with positions [..., N]."""
        xf = x.float() if x.element_size() < 4 else x
        cos, sin = self.cos[positions].to(xf.dtype), self.sin[positions].to(xf.dtype)  # [..., N, dim/2]
        if x.dim() == positions.dim() + 2:
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        if self.interleaved:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
        else:
            x1, x2 = xf.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.to(x.dtype)
