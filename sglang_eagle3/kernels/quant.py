"""Weight formats: compressed-tensors ``pack-quantized`` INT4 (Kimi-K2.5's routed experts) and DeepSeek-V3
block FP8. Torch code only; the fused kernels read the packed layout directly.

INT4 layout (per projection, as Kimi-K2.5 ships it):
  weight_packed int32 [out, in/8]: value j of a word sits in bits [4j, 4j+4) (little-endian nibbles),
                                   stored as q + 8 for q in [-8, 7], packed along the input dimension
  weight_scale  bf16  [out, in/group]: dequantised weight = q * scale (symmetric, no zero point)
"""

from __future__ import annotations

import torch

PACK_FACTOR = 8  # int4 values per int32 word


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q int8/int32 in [-8, 7], shape [..., K] with K % 8 == 0 -> int32 [..., K/8]."""
    assert q.shape[-1] % PACK_FACTOR == 0, f"last dim {q.shape[-1]} must be a multiple of {PACK_FACTOR}"
    assert int(q.min()) >= -8 and int(q.max()) <= 7, "int4 values must lie in [-8, 7]"
    u = (q.to(torch.int64) + 8).view(*q.shape[:-1], -1, PACK_FACTOR)  # [..., K/8, 8] in [0, 15]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=q.device)
    words = (u << shifts).sum(-1)  # [..., K/8] in [0, 2^32)
    # Two's complement into int32 range.
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_int4_values(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., K/8] -> int8 [..., K] values in [-8, 7]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nib = (packed[..., None] >> shifts) & 0xF  # [..., K/8, 8]; arithmetic shift is fine after masking
    return (nib - 8).to(torch.int8).reshape(*packed.shape[:-1], packed.shape[-1] * PACK_FACTOR)


def unpack_int4(packed: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dequantise: int32 [..., N, K/8] + scale [..., N, K/group] -> float32 [..., N, K]."""
    q = unpack_int4_values(packed).float()  # [..., N, K]
    K = q.shape[-1]
    assert scale.shape[-1] * group_size == K, f"scale groups {scale.shape[-1]} x {group_size} != K={K}"
    return (q.view(*q.shape[:-1], K // group_size, group_size) * scale.float()[..., None]).view(q.shape)


def quantize_int4(w: torch.Tensor, group_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-group INT4 quantisation (for tests and benchmarks): w [..., N, K] ->
    (packed int32 [..., N, K/8], scale [..., N, K/group] in w's dtype)."""
    K = w.shape[-1]
    assert K % group_size == 0, f"K={K} must be a multiple of group_size={group_size}"
    g = w.float().view(*w.shape[:-1], K // group_size, group_size)
    scale = (g.abs().amax(-1) / 7.0).clamp(min=1e-8)  # [..., N, K/group]
    q = (g / scale[..., None]).round().clamp(-8, 7).to(torch.int8).view(w.shape)
    return pack_int4(q), scale.to(w.dtype)


FP8_BLOCK = 128


def dequant_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """DeepSeek-V3 FP8: float8_e4m3fn [N, K] with scale_inv [ceil(N/b), ceil(K/b)] -> float32 [N, K]."""
    N, K = weight.shape
    nb, kb = (N + block - 1) // block, (K + block - 1) // block
    if tuple(scale_inv.shape) != (nb, kb):
        raise ValueError(f"weight_scale_inv shape {tuple(scale_inv.shape)} does not match weight "
                         f"{(N, K)} in {block}x{block} blocks (expected {(nb, kb)})")
    s = scale_inv.float().repeat_interleave(block, 0)[:N].repeat_interleave(block, 1)[:, :K]
    return weight.float() * s
