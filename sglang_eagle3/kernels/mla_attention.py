"""Launcher for split-KV absorbed MLA attention (decode T=1, verify T=k+1); semantics in ref_mla_attention.

A grid fixed by shapes (graph-safe) over (request, query-row block, split). The split count is derived from
the page table's capacity and the SM count, never from seq_lens values, so nothing syncs with the host; the
kernel divides the actual keys of each request evenly among the splits. With more than one split the
partials of a row block are merged in one of two ways, chosen per call from shapes alone (launch_plan):

- in the launch: the last of the row block's programs to finish merges them (an arrival counter it resets,
  as the GEMV's split-K does). No second launch, but one program reads all of the row block's fp32
  partials (splits x real rows x Dc x 4 bytes) from L2;
- a second launch, mla_merge_splits_kernel, over (query token, head, Dc block): the same bytes spread over
  many programs (128 at B=1 decode, 8 heads, 128 splits), for one more kernel (2.3 us a call in the H200
  step profile, benchmarks/results/h200/profile_step.json).

``max_merge_kb`` in the config is the largest partials size (KB) merged in the launch. It is a measured knob:
``benchmarks/bench_kernels.py --sweep mla`` times both paths per shape; 0 always launches the merge, a huge
value never does.
"""

from __future__ import annotations

import math

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.gemv import _counters
from sglang_eagle3.kernels.triton.mla_attention import mla_merge_splits_kernel, mla_split_kv_kernel

LOG2E = 1.4426950408889634
MAX_SPLITS = 256
MAX_MERGE_STEP = 16  # splits whose partials one in-launch merge step loads (the step is unrolled)
MERGE_TILE = 4096  # fp32 partials per separate-merge program: 32 registers a thread at MERGE_WARPS warps
MERGE_WARPS = 4


def num_kv_splits(batch: int, row_blocks: int, max_keys: int, sms: int, cfg: dict) -> int:
    """Enough splits to give ctas_per_sm programs per SM, none shorter than min_keys_per_split keys."""
    want = math.ceil(cfg["ctas_per_sm"] * sms / (batch * row_blocks))
    by_len = max(1, max_keys // cfg["min_keys_per_split"])
    return max(1, min(want, by_len, MAX_SPLITS))


def launch_plan(batch: int, tokens_per_req: int, heads: int, max_keys: int, sms: int, cfg: dict,
                kv_lora_rank: int = 512) -> dict:
    """How a call launches, from shapes only, for ``batch`` requests of ``tokens_per_req`` x ``heads`` query
    rows, a page table of ``max_keys`` slots a request and latent width ``kv_lora_rank`` (512 in DeepSeek-V3
    and Kimi): ``BLOCK_M``, ``row_blocks`` a request, ``splits``, ``partials_kb`` (the fp32 partials one row
    block's merge reads: splits x real rows x kv_lora_rank x 4 bytes, in KB) and ``merge``: "none" (one
    split: the programs write the output), "in_launch" (partials_kb <= cfg max_merge_kb) or "separate"."""
    rows = tokens_per_req * heads
    block_m = max(16, min(cfg["BLOCK_M"], triton.next_power_of_2(rows)))
    row_blocks = triton.cdiv(rows, block_m)
    splits = num_kv_splits(batch, row_blocks, max_keys, sms, cfg)
    partials = splits * min(block_m, rows) * kv_lora_rank * 4 if splits > 1 else 0
    if splits == 1:
        merge = "none"
    elif partials <= cfg["max_merge_kb"] * 1024:
        merge = "in_launch"
    else:
        merge = "separate"
    return {"BLOCK_M": block_m, "row_blocks": row_blocks, "splits": splits, "partials_kb": partials / 1024,
            "merge": merge}


def merge_tiles(block_m: int, rows: int, Dc: int, cfg: dict) -> dict:
    """The in-launch split merge's tiles: MERGE_M rows (a block's real rows, padded to a power of two), MERGE_D
    columns (a power of two) so the fp32 accumulator takes at most merge_regs / 2 registers a thread, and
    MERGE_S splits per step (1..MAX_MERGE_STEP, unrolled) so the partials loaded in one step take at most
    merge_regs."""
    threads = 32 * cfg["num_warps"]
    merge_m = min(block_m, triton.next_power_of_2(rows))
    acc_cols = max(1, cfg["merge_regs"] // 2 * threads // merge_m)
    merge_d = min(Dc, 1 << (acc_cols.bit_length() - 1))
    merge_s = max(1, min(MAX_MERGE_STEP, cfg["merge_regs"] * threads // (merge_m * merge_d)))
    return {"MERGE_M": merge_m, "MERGE_D": merge_d, "MERGE_S": merge_s}


def separate_merge_tile(splits: int, Dc: int) -> dict:
    """mla_merge_splits_kernel's tile: all splits (padded to a power of two) x BLOCK_D columns, MERGE_TILE
    fp32 values at most (BLOCK_D >= 16; Dc a power of two, so BLOCK_D divides it)."""
    splits_pad = triton.next_power_of_2(splits)
    return {"SPLITS_PAD": splits_pad, "BLOCK_D": max(16, min(Dc, MERGE_TILE // splits_pad))}


def triton_mla_attention(
    q_nope_latent: torch.Tensor,
    q_rope: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    tokens_per_req: int,
    page_size: int,
    kv_lora_rank: int,
    sm_scale: float,
    config: dict | None = None,
) -> torch.Tensor:
    """q_nope_latent [B*T, H, Dc], q_rope [B*T, H, Dr], kv_cache [slots, Dc+Dr] -> [B*T, H, Dc]."""
    B, P = page_table.shape
    T = tokens_per_req
    BT, H, Dc = q_nope_latent.shape
    Dr = q_rope.shape[-1]
    assert BT == B * T, f"q rows {BT} != batch {B} x tokens_per_req {T}"
    assert q_rope.shape[:2] == (BT, H), f"{tuple(q_rope.shape)=} does not match {tuple(q_nope_latent.shape)=}"
    assert Dc == kv_lora_rank, f"q_nope_latent last dim {Dc} != {kv_lora_rank=}"
    assert kv_cache.dim() == 2 and kv_cache.shape[1] == Dc + Dr, (
        f"kv_cache must be [slots, {Dc}+{Dr}], got {tuple(kv_cache.shape)}")
    assert Dc & (Dc - 1) == 0 and Dr & (Dr - 1) == 0, f"{Dc=} and {Dr=} must be powers of two"
    for name, t in (("q_nope_latent", q_nope_latent), ("q_rope", q_rope), ("kv_cache", kv_cache)):
        assert t.stride(-1) == 1, f"{name} must be contiguous in its last dim, strides {t.stride()}"
        assert t.dtype == q_rope.dtype, f"{name} dtype {t.dtype} != q_rope dtype {q_rope.dtype}"
    assert page_table.dtype == torch.int32 and page_table.stride(1) == 1, (
        f"page_table must be int32 with unit inner stride, got {page_table.dtype} {page_table.stride()}")
    assert seq_lens.dtype == torch.int32 and seq_lens.shape == (B,) and seq_lens.is_contiguous(), (
        f"seq_lens must be contiguous int32 [{B}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")

    assert Dr >= 16 and Dc >= 16, f"MLA kernel needs rope dim {Dr=} and latent dim {Dc=} >= 16 (tl.dot's K)"
    device = q_rope.device
    rows = T * H
    if config is None:
        args = (q_nope_latent, q_rope, kv_cache, page_table, seq_lens)
        kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=kv_lora_rank, sm_scale=sm_scale)
        config = tuning.get_config("mla_attention", device, "rows", rows,
                                   bench=lambda c: tuning.bench_us(lambda: triton_mla_attention(*args, **kw, config=c)))
    cfg = {**tuning.DEFAULTS["mla_attention"], **config}  # a sweep's partial config gets the other defaults
    out = torch.empty(BT, H, Dc, dtype=q_rope.dtype, device=device)
    if BT == 0:
        return out
    plan = launch_plan(B, T, H, P * page_size, tuning.sm_count(device), cfg, Dc)
    block_m, row_blocks, splits, merge = plan["BLOCK_M"], plan["row_blocks"], plan["splits"], plan["merge"]
    if splits > 1:  # fp32 partials and log-sum-exps of every (request, row block, split)
        mid_o = torch.empty(B * row_blocks * splits * block_m * Dc, dtype=torch.float32, device=device)
        mid_lse = torch.empty(B * row_blocks * splits * block_m, dtype=torch.float32, device=device)
    else:  # the kernel never touches them
        mid_o = mid_lse = out
    count = _counters(device, B * row_blocks) if merge == "in_launch" else out  # one counter a row block
    pdl = tuning.pdl(device)
    mla_split_kv_kernel[(B, row_blocks, splits)](
        q_nope_latent, q_rope, kv_cache, page_table, seq_lens, out, mid_o, mid_lse, count,
        q_nope_latent.stride(0), q_nope_latent.stride(1), q_rope.stride(0), q_rope.stride(1),
        kv_cache.stride(0), page_table.stride(0), out.stride(0), out.stride(1),
        sm_scale * LOG2E, splits,
        T=T, H=H, DC=Dc, DR=Dr, PAGE_SIZE=page_size, BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"],
        SPLIT_KV=splits > 1, MERGE_IN_LAUNCH=merge == "in_launch",
        DOT_PRECISION=tuning.dot_precision(q_rope.dtype), INTERPRET=tuning.interpreting(),
        **merge_tiles(block_m, rows, Dc, cfg),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        PDL=pdl, **tuning.pdl_launch(pdl),
    )
    if merge == "separate":
        tile = separate_merge_tile(splits, Dc)
        mla_merge_splits_kernel[(BT, H, Dc // tile["BLOCK_D"])](
            mid_o, mid_lse, out, out.stride(0), out.stride(1), splits,
            T=T, H=H, DC=Dc, BLOCK_M=block_m, **tile,
            num_warps=MERGE_WARPS, PDL=pdl, **tuning.pdl_launch(pdl),
        )
    return out
