"""Launcher for split-KV absorbed MLA attention (decode T=1, verify T=k+1); semantics in ref_mla_attention.

Grids fixed by shapes (graph-safe): a split pass over (request, query-row block, split), then, with more
than one split, mla_merge_splits_kernel over (query token, head, Dc block). The split count is derived from
the page table's capacity and the SM count, never from seq_lens values, so nothing syncs with the host; the
kernel divides the actual keys of each request evenly among the splits. With one split the split pass writes
the output and there is no merge launch (launch_plan).

With ``rope`` the queries' rope columns come un-rotated and the split pass rotates them as it loads them (the
same bits as the rotary kernel would store): MLA's rotary launch then only writes k, off q's critical path.

NOTE: merging in the split launch instead (the last split program of a row block merges, after an arrival
counter as the GEMV's split-K does) was built and measured slower on the H200 in every case timed, so it was
removed: docs/KERNELS.md, "MLA split merge".
"""

from __future__ import annotations

import math

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.triton.mla_attention import mla_merge_splits_kernel, mla_split_kv_kernel
from sglang_eagle3.kernels.triton.mla_prefill import mla_decompress_kernel

LOG2E = 1.4426950408889634
MAX_SPLITS = 256


def num_kv_splits(batch: int, sharing: int, max_keys: int, sms: int, cfg: dict) -> int:
    """Enough splits to give ctas_per_sm programs per SM, none shorter than min_keys_per_split keys; ``sharing``
    programs of a request share the SMs besides its splits (launch_plan: its kv heads, times its row blocks above
    SPLITS_BY_REQUEST_MAX_TOKENS)."""
    want = math.ceil(cfg["ctas_per_sm"] * sms / (batch * sharing))
    by_len = max(1, max_keys // cfg["min_keys_per_split"])
    return max(1, min(want, by_len, MAX_SPLITS))


# Up to this many new tokens a request (decode and verify widths) the split count does not follow the row blocks:
# a verify then divides a request's keys as the decode of its tokens does, and with the split kernel's row sums
# (independent of BLOCK_M and warps) and one merge tile a token's attention is the same bits in both (greedy
# speculation exactly lossless). It stays so while the split size does not move between the two, which it does only
# once the keys pass 64 x splits (8448 at batch 1 on 132 SMs) and then for a verify straddling a multiple of it.
# Above it (prefill chunks) the row blocks share the SMs, as before.
SPLITS_BY_REQUEST_MAX_TOKENS = 16


def launch_plan(batch: int, tokens_per_req: int, heads: int, max_keys: int, sms: int, cfg: dict,
                groups: int = 1) -> dict:
    """How a call launches, from shapes only, for ``batch`` requests of ``tokens_per_req`` x ``heads`` query
    rows per kv head (``groups`` kv heads; MLA has one) and a page table of ``max_keys`` slots a request:
    ``BLOCK_M``, ``row_blocks`` a kv head, ``splits``, ``num_stages`` (the config's, or short_split's) and
    ``merge``: "none" (one split: the split pass writes the output) or "separate" (a merge launch).

    ``short_split`` (a config key: {"max_tiles", "BLOCK_M", "num_stages"}, or None): where a request's splits
    follow the request alone (decode and verify widths) and no split can hold more than max_tiles key tiles
    whatever the context (the page table's capacity over the splits), the split pass takes that BLOCK_M and
    depth. For a verify of a Kimi TP=8 rank at batch 1 in an 8448-slot table: 16-row blocks (two programs a split
    instead of one of 32 rows) at one key-tile buffer, ~100 KB of shared memory, so that two programs a SM run
    the doubled grid in one wave; with splits of one or two tiles a deeper pipeline has nothing to overlap. Same
    splits and key tiles, so the same bits (the row sums do not depend on BLOCK_M); docs/KERNELS.md, "Verify rows
    in 16-row blocks where splits are short"."""
    rows = tokens_per_req * heads
    block_m = max(16, min(cfg["BLOCK_M"], triton.next_power_of_2(rows)))
    stages = cfg["num_stages"]
    by_request = tokens_per_req <= SPLITS_BY_REQUEST_MAX_TOKENS
    sharing = groups if by_request else groups * triton.cdiv(rows, block_m)
    splits = num_kv_splits(batch, sharing, max_keys, sms, cfg)
    short = cfg.get("short_split")
    if (short and by_request and block_m > short["BLOCK_M"]
            and triton.cdiv(max_keys, splits * cfg["BLOCK_N"]) <= short["max_tiles"]):
        block_m, stages = short["BLOCK_M"], short["num_stages"]
    return {"BLOCK_M": block_m, "row_blocks": triton.cdiv(rows, block_m), "splits": splits, "num_stages": stages,
            "merge": "none" if splits == 1 else "separate"}


def split_pass_smem(stages: int, block_m: int, block_n: int, Dc: int, Dr: int, elem: int,
                    separate_v: bool = False) -> int:
    """Shared memory (bytes) the split pass takes at ``num_stages=stages``: max(1, stages - 1) buffers of key tiles
    [block_n, Dc + Dr] (and value tiles [block_n, Dc] with separate values), the q tiles [block_m, Dc + Dr] and the
    probabilities [block_m, block_n], ``elem`` bytes an element, and 256 bytes for the pipeline's barriers. Triton
    3.6 allocates at most this and less than 256 bytes under it (tests/kernels/compile_checks.py checks it for
    bf16 and float32 with IEEE dots)."""
    row = Dc + Dr + (Dc if separate_v else 0)
    return (max(1, stages - 1) * block_n * row + block_m * (Dc + Dr) + block_m * block_n) * elem + 256


def split_pass_stages(stages: int, block_m: int, block_n: int, Dc: int, Dr: int, elem: int, smem: int,
                      separate_v: bool = False) -> int:
    """The config's pipeline depth, lowered until the split pass fits ``smem`` bytes a block: float32 caches (the
    exact test paths) have twice the tiles a table's bf16 depth was chosen for, and sm_120 has 99 KB a block."""
    while stages > 2 and split_pass_smem(stages, block_m, block_n, Dc, Dr, elem, separate_v) > smem:
        stages -= 1
    return stages


def merge_tile(splits: int, Dc: int, values: int) -> dict:
    """mla_merge_splits_kernel's tile: all splits (padded to a power of two) x BLOCK_D columns, ``values`` fp32
    values at most (the config's merge_tile; BLOCK_D >= 16; Dc a power of two, so BLOCK_D divides it)."""
    splits_pad = triton.next_power_of_2(splits)
    return {"SPLITS_PAD": splits_pad, "BLOCK_D": max(16, min(Dc, values // splits_pad))}


def _check_table(page_table: torch.Tensor, seq_lens: torch.Tensor, B: int) -> None:
    """The launchers' page table and seq_lens contract (the kernels index them unchecked).

    NOTE: values are not checked (a device sync, in captured launches): seq_lens[b] must lie in [T, P * page_size]
    (longer reads page-table entries past the request's row) and page ids must name pages of the cache. A request
    with seq_lens[b] < T has query rows that see no key: the reference gives NaN there, the kernels finite rows."""
    assert page_table.dtype == torch.int32 and page_table.stride(1) == 1, (
        f"page_table must be int32 with unit inner stride, got {page_table.dtype} {page_table.stride()}")
    assert seq_lens.dtype == torch.int32 and seq_lens.shape == (B,) and seq_lens.is_contiguous(), (
        f"seq_lens must be contiguous int32 [{B}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")


def _check_queries(q: torch.Tensor, q_name: str, q_rope: torch.Tensor, kv_cache: torch.Tensor, B: int, T: int,
                   Dc: int, *others: tuple[str, torch.Tensor]) -> None:
    """The MLA launchers' query and cache contract: q [B*T, H, ...] and q_rope [B*T, H, Dr] rows, kv_cache [slots, Dc
    + Dr]; these and ``others`` (name, tensor) of q_rope's dtype, each contiguous in its last dim."""
    BT, H = q.shape[:2]
    Dr = q_rope.shape[-1]
    assert BT == B * T, f"q rows {BT} != batch {B} x tokens_per_req {T}"
    assert q_rope.shape[:2] == (BT, H), f"{tuple(q_rope.shape)=} does not match {q_name} {tuple(q.shape)}"
    assert kv_cache.dim() == 2 and kv_cache.shape[1] == Dc + Dr, (
        f"kv_cache must be [slots, {Dc}+{Dr}], got {tuple(kv_cache.shape)}")
    for name, t in ((q_name, q), ("q_rope", q_rope), ("kv_cache", kv_cache), *others):
        assert t.stride(-1) == 1, f"{name} must be contiguous in its last dim, strides {t.stride()}"
        assert t.dtype == q_rope.dtype, f"{name} dtype {t.dtype} != q_rope dtype {q_rope.dtype}"


def _rope_kwargs(rope: tuple[torch.Tensor, torch.Tensor] | None, positions: torch.Tensor | None,
                 q_rope: torch.Tensor) -> dict:
    """The split kernel's arguments for rotating q's rope columns as it loads them (rope = (cos, sin) float32 [P,
    Dr/2], positions [B*T]), checked; {} without rope."""
    if rope is None:
        assert positions is None, "positions are for rope"
        return {}
    BT, Dr = q_rope.shape[0], q_rope.shape[-1]
    cos, sin = rope
    assert cos.dtype == sin.dtype == torch.float32, f"rope tables must be float32, got {cos.dtype} {sin.dtype}"
    assert cos.shape == sin.shape and cos.dim() == 2 and cos.shape[1] * 2 == Dr, (
        f"rope tables must be [P, {Dr // 2}], got {tuple(cos.shape)} {tuple(sin.shape)}")
    assert cos.stride() == sin.stride() and cos.stride(1) == 1, f"{cos.stride()=} {sin.stride()=}"
    assert positions is not None and positions.shape == (BT,) and positions.is_contiguous(), (
        f"rope needs the query tokens' positions, contiguous [{BT}], got "
        f"{None if positions is None else tuple(positions.shape)}")
    assert positions.dtype in (torch.int32, torch.int64), f"{positions.dtype=}"
    assert cos.device == sin.device == positions.device == q_rope.device, (
        f"rope on {cos.device}, positions on {positions.device}, q on {q_rope.device}")
    return dict(ROPE=True, pos_ptr=positions, cos_ptr=cos, sin_ptr=sin, stride_table=cos.stride(0))


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
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    positions: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """q_nope_latent [B*T, H, Dc], q_rope [B*T, H, Dr], kv_cache [slots, Dc+Dr] -> [B*T, H, Dc].

    ``rope`` = (cos, sin) float32 [P, Dr/2] with ``positions`` [B*T] (the query tokens' positions, in [0, P)):
    q_rope is un-rotated and is rotated in the kernel, DeepSeek's interleaved pairs; q_rope is not written."""
    B = page_table.shape[0]
    T = tokens_per_req
    BT, H, Dc = q_nope_latent.shape
    Dr = q_rope.shape[-1]
    assert Dc == kv_lora_rank, f"q_nope_latent last dim {Dc} != {kv_lora_rank=}"
    _check_queries(q_nope_latent, "q_nope_latent", q_rope, kv_cache, B, T, Dc)
    assert Dc & (Dc - 1) == 0 and Dr & (Dr - 1) == 0, f"{Dc=} and {Dr=} must be powers of two"
    _check_table(page_table, seq_lens, B)
    assert Dr >= 16 and Dc >= 16, f"MLA kernel needs rope dim {Dr=} and latent dim {Dc=} >= 16 (tl.dot's K)"
    rope_kw = _rope_kwargs(rope, positions, q_rope)
    if config is None:
        args = (q_nope_latent, q_rope, kv_cache, page_table, seq_lens)
        kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=kv_lora_rank, sm_scale=sm_scale, rope=rope,
                  positions=positions)
        config = tuning.get_config("mla_attention", q_rope.device, "rows", T * H,
                                   bench=lambda c: tuning.bench_us(lambda: triton_mla_attention(*args, **kw, config=c)))
    cfg = {**tuning.DEFAULTS["mla_attention"], **config}  # a sweep's partial config gets the other defaults
    return _launch_split_attention(q_nope_latent, q_rope, kv_cache, kv_cache.stride(0), None, page_table, seq_lens,
                                   T=T, groups=1, heads=H, Dc=Dc, Dr=Dr, page_size=page_size, sm_scale=sm_scale,
                                   cfg=cfg, **rope_kw)


def _launch_split_attention(qn, qr, k, stride_k_slot, v, page_table, seq_lens, *, T, groups, heads, Dc, Dr,
                            page_size, sm_scale, cfg, stride_k_group=0, stride_v_slot=0, stride_v_group=0,
                            **rope_kw) -> torch.Tensor:
    """The split pass (and merge) for query rows qn [B*T, groups*heads, Dc] (+ qr [.., Dr] when Dr > 0) over keys
    at k (slot / kv-head strides given) and values at v (None: the keys' first Dc columns) -> [B*T, groups*heads,
    Dc]. Callers have checked the shapes. Both forms are PDL family "mla" (SGLANG_EAGLE3_PDL_SKIP=mla: both)."""
    B, P = page_table.shape
    device = qn.device
    out = torch.empty(B * T, groups * heads, Dc, dtype=qn.dtype, device=device)
    if B * T == 0:
        return out
    plan = launch_plan(B, T, heads, P * page_size, tuning.sm_count(device), cfg, groups)
    block_m, row_blocks, splits, merge = plan["BLOCK_M"], plan["row_blocks"], plan["splits"], plan["merge"]
    blocks = groups * row_blocks  # a request's (kv head, row block) pairs
    if splits > 1:  # fp32 partials and log-sum-exps of every (request, kv head, row block, split)
        mid_o = torch.empty(B * blocks * splits * block_m * Dc, dtype=torch.float32, device=device)
        mid_lse = torch.empty(B * blocks * splits * block_m, dtype=torch.float32, device=device)
    else:  # the kernel never touches them
        mid_o = mid_lse = out
    v_kw = {} if v is None else dict(SEPARATE_V=True, v_ptr=v, stride_v_slot=stride_v_slot,
                                     stride_v_group=stride_v_group)
    pdl = tuning.pdl(device, "mla")
    mla_split_kv_kernel[(B, blocks, splits)](
        qn, qr, k, page_table, seq_lens, out, mid_o, mid_lse,
        qn.stride(0), qn.stride(1), qr.stride(0), qr.stride(1),
        stride_k_slot, page_table.stride(0), out.stride(0), out.stride(1),
        sm_scale * LOG2E, splits,
        T=T, H=heads, DC=Dc, DR=Dr, PAGE_SIZE=page_size, BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"],
        SPLIT_KV=splits > 1, DOT_PRECISION=tuning.dot_precision(qn.dtype), INTERPRET=tuning.interpreting(),
        num_warps=cfg["num_warps"],
        num_stages=split_pass_stages(plan["num_stages"], block_m, cfg["BLOCK_N"], Dc, Dr, k.element_size(),
                                     tuning.smem_per_block(device), v is not None),
        PDL=pdl, **tuning.pdl_launch(pdl), **rope_kw,
        **({} if groups == 1 else dict(GROUPS=groups, stride_kv_group=stride_k_group)), **v_kw,
    )
    if merge == "separate":
        tile = merge_tile(splits, Dc, cfg["merge_tile"])
        mla_merge_splits_kernel[(B * T, groups * heads, Dc // tile["BLOCK_D"])](
            mid_o, mid_lse, out, seq_lens, out.stride(0), out.stride(1), splits,
            T=T, H=heads, DC=Dc, BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], **tile,
            num_warps=cfg["merge_warps"], PDL=pdl, **tuning.pdl_launch(pdl),
            **({} if groups == 1 else dict(GROUPS=groups)),
        )
    return out


def gqa_uses_kernel(head_dim: int) -> bool:
    """Whether triton_gqa_attention takes heads this wide: tl.dot needs a power of two of at least 16."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def triton_gqa_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    tokens_per_req: int,
    page_size: int,
    sm_scale: float,
    config: dict | None = None,
) -> torch.Tensor:
    """Paged grouped-query attention for decode/verify/padded prefill: q [B*T, Hq, D], kv_cache [slots, 2, Hkv, D]
    (keys then values, the draft's KV pool layout) -> [B*T, Hq, D]; semantics in ref_gqa_attention (query i of
    request b sits at seq_lens[b] - T + i and sees the keys up to it). The MLA kernels with separate value rows
    and one score dot: only a request's own keys are read, whatever the page table's width."""
    B = page_table.shape[0]
    T = tokens_per_req
    BT, Hq, D = q.shape
    assert BT == B * T, f"q rows {BT} != batch {B} x tokens_per_req {T}"
    assert kv_cache.dim() == 4 and kv_cache.shape[1] == 2 and kv_cache.shape[3] == D, (
        f"kv_cache must be [slots, 2, kv_heads, {D}], got {tuple(kv_cache.shape)}")
    Hkv = kv_cache.shape[2]
    assert Hq % Hkv == 0, f"{Hq} query heads are not a multiple of {Hkv} kv heads"
    assert gqa_uses_kernel(D), f"head dim {D} must be a power of two >= 16 (tl.dot's K)"
    assert q.stride(-1) == 1 and kv_cache.stride(-1) == 1, f"{q.stride()=} {kv_cache.stride()=}: inner dims contiguous"
    assert q.dtype == kv_cache.dtype, f"q dtype {q.dtype} != kv_cache dtype {kv_cache.dtype}"
    _check_table(page_table, seq_lens, B)
    heads = Hq // Hkv
    if config is None:
        args = (q, kv_cache, page_table, seq_lens)
        kw = dict(tokens_per_req=T, page_size=page_size, sm_scale=sm_scale)
        config = tuning.get_config("gqa_attention", q.device, "rows", T * heads,
                                   bench=lambda c: tuning.bench_us(lambda: triton_gqa_attention(*args, **kw, config=c)))
    cfg = {**tuning.DEFAULTS["gqa_attention"], **config}
    k, v = kv_cache[:, 0], kv_cache[:, 1]  # [slots, Hkv, D] views
    return _launch_split_attention(q, q, k, k.stride(0), v, page_table, seq_lens, T=T, groups=Hkv, heads=heads,
                                   Dc=D, Dr=0, page_size=page_size, sm_scale=sm_scale, cfg=cfg,
                                   stride_k_group=k.stride(1), stride_v_slot=v.stride(0), stride_v_group=v.stride(1))


def mha_prefill_uses_kernel(nope: int, rope: int, v: int) -> bool:
    """Whether triton_mla_mha_prefill takes these head widths: keys and values as wide (the split kernel's DC
    serves both), powers of two of at least 16 (tl.dot's K). DeepSeek-V3 and Kimi-K2.5: 128, 64, 128."""
    return nope == v and all(d >= 16 and d & (d - 1) == 0 for d in (nope, rope))


def mha_scratch_width(heads: int, nope: int, rope: int, v: int) -> int:
    """Elements a cache slot takes in mla_mha_prefill's scratch: per head [k_nope | k_rope | v] (the kernel's
    layout; the reference does not use it)."""
    return heads * (nope + rope + v)


def triton_mla_mha_prefill(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_b_weight: torch.Tensor,
    scratch: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    tokens_per_req: int,
    page_size: int,
    kv_lora_rank: int,
    sm_scale: float,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    positions: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """MLA for prefill in the non-absorbed form (see triton/mla_prefill.py): q_nope [B*T, H, D], q_rope [B*T, H,
    Dr], kv_cache [slots, Dc + Dr], kv_b_weight [H * 2D, Dc] (kv_b_proj's rows on this rank: per head D key rows
    then D value rows), scratch [slots, H * (2D + Dr)] (overwritten at every slot of the requests' keys) ->
    [B*T, H, D], the heads' attention outputs before o_proj. Semantics in ref_mla_mha_prefill; ``rope`` /
    ``positions`` as for triton_mla_attention (q_rope un-rotated, rotated as the kernel loads it)."""
    B = page_table.shape[0]
    T = tokens_per_req
    BT, H, D = q_nope.shape
    Dr = q_rope.shape[-1]
    Dc = kv_lora_rank
    width = D + Dr + D
    _check_queries(q_nope, "q_nope", q_rope, kv_cache, B, T, Dc, ("kv_b_weight", kv_b_weight), ("scratch", scratch))
    assert mha_prefill_uses_kernel(D, Dr, D), f"head widths nope={D}, rope={Dr}: powers of two >= 16"
    assert kv_b_weight.shape == (H * 2 * D, Dc) and kv_b_weight.stride(1) == 1, (
        f"kv_b_weight must be [{H} heads x {2 * D}, {Dc}] with unit inner stride, got {tuple(kv_b_weight.shape)} "
        f"{kv_b_weight.stride()}")
    assert scratch.shape == (kv_cache.shape[0], H * width) and scratch.is_contiguous(), (
        f"scratch must be contiguous [{kv_cache.shape[0]} slots, {H * width}], got {tuple(scratch.shape)}")
    _check_table(page_table, seq_lens, B)
    rope_kw = _rope_kwargs(rope, positions, q_rope)
    if config is None:
        config = tuning.get_config("mla_mha_prefill", q_nope.device, "tokens", T)
    cfg = {**tuning.DEFAULTS["mla_mha_prefill"], **config}
    P = page_table.shape[1]
    if BT == 0:
        return q_nope.new_empty(0, H, D)
    block_k = min(cfg["decompress_block_k"], Dc)
    assert Dc % block_k == 0 and block_k >= 16, f"latent width {Dc} must be a multiple of a K step >= 16"
    device = q_nope.device
    pdl = tuning.pdl(device, "mla")
    per_head = scratch.view(-1, H, width)
    # Programs striding over a request's key tiles: decompress_ctas_per_sm a SM over the (head, part) columns,
    # never more than the capacity's tiles.
    tiles = min(triton.cdiv(P * page_size, cfg["decompress_block_n"]),
                max(1, cfg["decompress_ctas_per_sm"] * tuning.sm_count(q_nope.device) // (2 * H)))
    mla_decompress_kernel[(B, tiles, 2 * H)](
        kv_cache, page_table, seq_lens, kv_b_weight, per_head,
        kv_cache.stride(0), page_table.stride(0), kv_b_weight.stride(0), per_head.stride(0), per_head.stride(1),
        DC=Dc, DR=Dr, D=D, PAGE_SIZE=page_size, BLOCK_N=cfg["decompress_block_n"],
        BLOCK_K=block_k, DOT_PRECISION=tuning.dot_precision(kv_cache.dtype),
        INTERPRET=tuning.interpreting(), num_warps=cfg["decompress_warps"], num_stages=cfg["decompress_stages"],
        PDL=pdl, **tuning.pdl_launch(pdl),
    )
    # Each head a kv head of its own (GROUPS = H, one query head each), keys [k_nope | k_rope] at the head's
    # offset, values D + Dr further on.
    return _launch_split_attention(q_nope, q_rope, per_head, per_head.stride(0), per_head[:, :, D + Dr:],
                                   page_table, seq_lens, T=T, groups=H, heads=1, Dc=D, Dr=Dr, page_size=page_size,
                                   sm_scale=sm_scale, cfg=cfg, stride_k_group=per_head.stride(1),
                                   stride_v_slot=per_head.stride(0), stride_v_group=per_head.stride(1), **rope_kw)
