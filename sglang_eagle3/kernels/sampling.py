"""Launchers for the sampler's kernels: the Gumbel-max sample (semantics: ref_gumbel_argmax in ref.py) and the
top_k / top_p thresholds without a sort (ref_top_threshold).

Programs over (row, chunk of CHUNK tokens) stream the scores once, hashing their noise as they go (no [R, V] noise
tensor), each storing its chunk's best as one int64 key; the row's largest key is its token (one max over a few
dozen keys a row). Grid fixed by shapes (graph-safe). One program a row took 106 us for a row of Kimi's 163840
tokens on the H200 (a chain of 80 blocks); a chunk of 4096 tokens a program spreads it over the SMs.
"""

from __future__ import annotations

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.triton.sampling import gumbel_argmax_kernel, top_select_kernel

CHUNK = 4096  # tokens a program: 40 programs a row at Kimi's vocabulary
SELECT_PASSES = 8  # 4-bit digits of the 32-bit ordered key
SELECT_CHUNK = 2048
SELECT_COMPACT = 2  # the third pass keeps its candidates; the passes after it read only those
SELECT_GROUP = 8  # chunks' candidate lists a program of those passes


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


def triton_top_threshold(z: torch.Tensor, lo: torch.Tensor, target: torch.Tensor,
                         zmax: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [R] thresholds for the rows of z float32 [R, V] (unit inner stride): with ``zmax`` [R] (each row's
    maximum) the top_p threshold at ``target`` [R] over the candidates z >= lo [R], without it the top_k one at
    target = k (float32); lo where the target leaves the filter off. See ref_top_threshold.

    A radix select in SELECT_PASSES + 1 launches, programs over (row, chunk of SELECT_CHUNK tokens) summing each
    chunk's weights per 4-bit digit (as integers: a row's threshold depends on the row alone, not on the batch or the
    order programs run in), the later passes over the candidates left. Replaces a sort of each row: at Kimi's 163840
    tokens torch's sort of 4 rows took ~0.2 ms on the H200, of 64 rows ~1.3 ms."""
    assert z.dim() == 2 and z.dtype == torch.float32 and z.stride(-1) == 1, (
        f"z must be float32 [R, V] with unit inner stride, got {z.dtype} {tuple(z.shape)} {z.stride()}")
    R, V = z.shape
    for name, t in (("lo", lo), ("target", target), ("zmax", zmax)):
        assert t is None or (t.shape == (R,) and t.dtype == torch.float32), (
            f"{name} must be float32 [{R}], got {t.dtype} {tuple(t.shape)}")
    assert 0 < V < 2**24, f"{V=} must lie in (0, 2^24) (counts are float32)"
    thr = torch.empty(R, dtype=torch.float32, device=z.device)
    if R == 0:
        return thr
    interp = tuning.interpreting()
    # One block of 2048 tokens a program (8 a thread at 8 warps: two 16-byte loads), 80 programs a row at Kimi's
    # vocabulary. A function of V alone. (H200: loops of blocks in longer chunks ran slower at few rows, and the
    # passes cost their programs' latency more than the tokens read: BENCHMARKS.md, twenty-second session.)
    chunk = min(SELECT_CHUNK, triton.next_power_of_2(V))
    C = triton.cdiv(V, chunk)
    hist = torch.zeros(SELECT_PASSES, R, 16, 16, dtype=torch.int64, device=z.device)  # (a bin a 128-byte line)
    state = torch.empty(R, SELECT_PASSES + 1, 4, dtype=torch.float64, device=z.device)
    cand = torch.empty(R, C * chunk, dtype=torch.float32, device=z.device)
    count = torch.empty(R, C, dtype=torch.int32, device=z.device)
    lo, target = lo.contiguous(), target.contiguous()
    zm = lo if zmax is None else zmax.contiguous()  # (never read without MASS)
    block_c = 64 if interp else 256  # a chunk's candidates a block row (~3% of 2048 after 8 bits, at 0.95 and 0.7)
    groups = triton.cdiv(C, SELECT_GROUP)
    for p in range(SELECT_PASSES + 1):
        finish, from_cands = p == SELECT_PASSES, SELECT_COMPACT < p < SELECT_PASSES
        top_select_kernel[(R, 1 if finish else groups if from_cands else C)](
            z, z.stride(0), V, C, p, lo, zm, target, hist, state, thr, cand, count, MASS=zmax is not None,
            PASSES=SELECT_PASSES, FROM_CANDS=from_cands, KEEP=p == SELECT_COMPACT, FINISH=finish, CHUNK=chunk,
            GROUP=SELECT_GROUP, BLOCK_C=block_c, num_warps=1 if interp else 8)
    return thr
