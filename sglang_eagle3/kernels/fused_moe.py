"""Launchers for the fused MoE kernels (bf16 and INT4 W4A16); semantics in ref_fused_moe(_int4).

Tile path (bf16 at any T, INT4 above GEMV_MAX_TOKENS tokens): four launches, grids fixed by shapes (graph-safe):
  align    one program:           pairs sorted by expert into blocks of BLOCK_M rows (moe_align)
  gate_up  over (block, I-block): act[pair] = silu(x W_gate^T) * (x W_up^T)      [T*k, I]  x.dtype
  down     over (block, H-block): y[pair]   = topk_w[pair] * act[pair] W_down^T  [T*k, H]  float32
  sum      over (token, H-block): out[t]    = sum over the k slots of y (+ add)  [T, H]    x.dtype
Each distinct expert's weights are read once per step, by its blocks (one block unless more than BLOCK_M pairs
chose it), as tl.dot tiles (INT4 decoded in registers).

INT4 GEMV path (decode/verify, T <= GEMV_MAX_TOKENS): two launches, no tl.dot, no atomics, no memset:
  gate_up  over (pair, I-block):  act[pair] = silu(x W_gate^T) * (x W_up^T)      [T*k, 8, I/8] float32
  down     over (token, H-block): out[t]    = sum_k topk_w * act W_down^T (+ add) [T, H]   x.dtype
Nibbles become floats by bit tricks (no int->float converts, see triton/fused_moe.py), against activations
taken nibble-major and pre-scaled (x by gate_up itself as it streams it, act by gate_up's store) so that the
inner loop needs no layout conversion of weight-sized tiles; each gate_up program streams BLOCK_N weight rows
of its pair's expert (pairs of a verify batch that share an expert run side by side and the L2 serves the
repeated lines: GEMV_PER_PAIR; or, with the config's ROWS, the program of every ROWS-th pair of an expert
decodes each weight word once for up to ROWS of its pairs); the k-slot sum is the down kernel's own loop, so its
output is final. With PDL the down kernel can start while gate_up runs; with PRELOAD it loads its weights before
its wait. With F16 (gate_up's config) x meets the weights in packed fp16, two weights an instruction; with F16 in
down's config, gate_up stores act as [T*k, 5, I/8] int32 instead (fp16 pairs and a power-of-two factor per word of
8) and the down kernel's dots run in packed fp16 as well.
``add`` (the shared experts' output) is added in the final store, rounded as a separate add would be.

INT4 dot path (verify batches whose tokens share experts; off unless SGLANG_EAGLE3_MOE_DOT_MAX, see
DOT_MAX_TOKENS): gate_up over (pair, I-block, H split) as tl.dot over each expert's pairs, run by the expert's
first pair (a weight decoded once per expert, not per pair; the last split to finish adds the partials), then
the GEMV path's down kernel on the act it stores.
"""

from __future__ import annotations

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.gemv import split_counters
from sglang_eagle3.kernels.quant import PACK_FACTOR
from sglang_eagle3.kernels.triton.fused_moe import (
    moe_align_kernel,
    moe_down_kernel,
    moe_gate_up_kernel,
    moe_int4_dot_gate_up_kernel,
    moe_int4_gemv_down_kernel,
    moe_int4_gemv_gate_up_kernel,
    moe_int4_swap_down_kernel,
    moe_int4_swap_gate_up_kernel,
    moe_sum_slots_kernel,
)

BLOCK_M = 16  # tile path: pairs per block of one expert (the dot's M), unless the gate_up config's "BLOCK_M" says
ALIGN_CHUNK = 1024  # pairs (and blocks) moe_align_kernel's one program handles per step
SUM_BLOCK = 1024
# INT4 GEMV path up to this many tokens (decode, verify, and batches of them), the tile path above. Measured on
# the H200 at Kimi TP=8 rank shapes (bench_moe_tile.py, benchmarks/results/h200/moe_tile_new_d7c1b3d.json): GEMV
# / tile 135 / 366 us at T=16, 506 / 900 at 64, 1001 / 1129 at 128, 1987 / 1232 at 256. The GEMV decodes a weight
# once per pair, the tile path once per expert, so the crossover moves up with the ALU:bandwidth ratio
# (the RTX PRO 6000's is higher than the H200's). With the swap kernels (moe_tile_crossover_1e7c374.json) the
# tile path wins from ~88 tokens (GEMV / tile 474 / 580 us at 64, 708 / 671 at 96, 944 / 717 at 128); the bound
# stays at 128 all the same: the tile path rounds each scaled weight to bf16, the GEMV path does not, and a
# verify batch (up to 128 tokens: 32 requests at k = 3) should compute what the decode it replaces computes.
GEMV_MAX_TOKENS = 128
# The dot path (gate_up as tl.dot over each expert's pairs) serves 2..DOT_MAX_TOKENS tokens: verify batches, whose
# tokens share experts (SGLANG_EAGLE3_MOE_DOT_MAX overrides; 0 turns it off). Off until measured.
DOT_MAX_TOKENS = 0
# gate_up of the GEMV path: one program per (pair, N block), pairs sharing an expert in parallel (True), or the
# expert's first pair doing all of them in turn (False); a config's "PER_PAIR" overrides it.
GEMV_PER_PAIR = True
# The GEMV path takes nibbles 5..7 from the word's high half (the kernels' SHIFT16: ~5% fewer instructions) from
# this many tokens up; at T=1 the H200 ran it ~30% slower back to back (triton/fused_moe.py, the trick's notes).
GEMV_SHIFT16_MIN_TOKENS = 2
MAGIC_BITS = 0x4B000000  # float bits of 2^23, passed at run time (see triton/fused_moe.py)


def _check_routing(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> None:
    """Shapes, dtypes and layouts only. NOTE: the ids' values are not checked (a device sync, in captured launches):
    an id outside [0, E) reads another expert's or unowned memory (and moe_align counts past its table)."""
    assert x.dim() == 2 and x.is_contiguous(), f"x must be contiguous [T, H], got {tuple(x.shape)} {x.stride()}"
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"unsupported {x.dtype=}"
    assert topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == x.shape[0], (
        f"{tuple(topk_ids.shape)=} {tuple(topk_weights.shape)=} must both be [T={x.shape[0]}, k]")
    assert topk_ids.dtype == torch.int32 and topk_ids.is_contiguous(), (
        f"topk_ids must be contiguous int32, got {topk_ids.dtype}")
    assert topk_weights.dtype == torch.float32 and topk_weights.is_contiguous(), (
        f"topk_weights must be contiguous float32, got {topk_weights.dtype}")


def _check_add(x: torch.Tensor, add: torch.Tensor | None) -> None:
    if add is not None:
        assert add.shape == x.shape and add.dtype == x.dtype and add.stride(-1) == 1, (
            f"add must be [T, H] {x.dtype} with unit inner stride like x {tuple(x.shape)}, got "
            f"{tuple(add.shape)} {add.dtype} {add.stride()}")


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """The tile path's routing plan (moe_align_kernel): (sorted pairs [NB * block_m] int32, block expert [NB]
    int32, block rows [NB] int32). NB bounds the blocks any routing needs (each expert's last block is the only
    part-filled one), so the grid over blocks is fixed by shapes."""
    TK = topk_ids.numel()
    num_blocks = TK // block_m + min(TK, num_experts)
    dev = topk_ids.device
    sorted_pairs = torch.empty(num_blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    block_rows = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    if TK == 0:
        return sorted_pairs, block_expert, block_rows
    e_pad = triton.next_power_of_2(num_experts)
    counts = torch.empty(e_pad, dtype=torch.int32, device=dev)
    starts = torch.empty(e_pad, dtype=torch.int32, device=dev)
    ranks = torch.empty(TK, dtype=torch.int32, device=dev)
    tuning.interpreting()  # its loop over the largest expert's blocks has a loaded bound (see tuning)
    moe_align_kernel[(1,)](
        topk_ids, counts, ranks, starts, sorted_pairs, block_expert, block_rows, TK, num_experts, num_blocks,
        E_PAD=e_pad, BLOCK_M=block_m, CHUNK=min(ALIGN_CHUNK, triton.next_power_of_2(max(TK, num_blocks))),
        num_warps=4,
    )
    return sorted_pairs, block_expert, block_rows


def _launch(x, w13, s13, w2, s2, topk_weights, topk_ids, add, *, I: int, int4: bool, group: int,
            gate_up_cfg: dict, down_cfg: dict) -> torch.Tensor:
    T, H = x.shape
    E, k = w13.shape[0], topk_ids.shape[1]
    out = torch.empty_like(x)
    if T == 0:
        return out
    block_m = gate_up_cfg.get("BLOCK_M", BLOCK_M)  # the plan both kernels share: the gate_up config says
    plan = moe_align(topk_ids, E, block_m)
    act = torch.empty(T * k, I, dtype=x.dtype, device=x.device)
    per_pair = torch.empty(T * k, H, dtype=torch.float32, device=x.device)
    # The swap kernels' decode rounds (q - 8) * scale to bf16 once: bf16 activations and scales only (a model's
    # scales are stored in its dtype); any other dtype takes the group path, whatever the config says.
    if int4 and gate_up_cfg.get("SWAP") and x.dtype == s13.dtype == s2.dtype == torch.bfloat16:
        _launch_int4_swap(x, w13, s13, w2, s2, topk_weights, act, per_pair, plan, group=group, block_m=block_m,
                          gate_up_cfg=gate_up_cfg, down_cfg=down_cfg)
    else:
        _launch_tile(x, w13, s13, w2, s2, topk_weights, act, per_pair, plan, int4=int4, group=group,
                     block_m=block_m, gate_up_cfg=gate_up_cfg, down_cfg=down_cfg)
    moe_sum_slots_kernel[(T, triton.cdiv(H, SUM_BLOCK))](
        per_pair, add if add is not None else out, out, per_pair.stride(0),
        add.stride(0) if add is not None else 0, out.stride(0), H,
        TOP_K=k, HAS_ADD=add is not None, BLOCK=SUM_BLOCK, num_warps=4,
    )
    return out


def _launch_tile(x, w13, s13, w2, s2, topk_weights, act, per_pair, plan, *, int4: bool, group: int, block_m: int,
                 gate_up_cfg: dict, down_cfg: dict) -> None:
    """The tile path's gate_up and down: pairs as the dot's M, INT4 one scale group a K step."""
    H, I, k = x.shape[1], act.shape[1], act.shape[0] // x.shape[0]
    sorted_pairs, block_expert, block_rows = plan
    num_blocks = block_rows.shape[0]
    interpret = tuning.interpreting()
    prec = tuning.dot_precision(x.dtype)
    if s13 is None:  # bf16: the scale pointers are never read (INT4=False), any tensor will do
        s13, s2 = w13, w2
    # INT4 steps K one scale group at a time, and tl.dot's K must be >= 16 (the interpreter lets 8 by; a GPU
    # build fails inside Triton).
    assert not int4 or group >= 16, f"group_size={group}: the INT4 tile path needs groups of >= 16 (tl.dot's K)"
    moe_gate_up_kernel[(num_blocks, triton.cdiv(I, gate_up_cfg["BLOCK_N"]))](
        x, w13, s13, sorted_pairs, block_expert, block_rows, act,
        x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), act.stride(0),
        H, I, MAGIC_BITS,
        TOP_K=k, INT4=int4, GROUP=group, BLOCK_M=block_m,
        BLOCK_N=gate_up_cfg["BLOCK_N"], BLOCK_K=group if int4 else gate_up_cfg["BLOCK_K"], INTERPRET=interpret,
        DOT_PRECISION=prec,
        num_warps=gate_up_cfg["num_warps"], num_stages=gate_up_cfg["num_stages"],
    )
    moe_down_kernel[(num_blocks, triton.cdiv(H, down_cfg["BLOCK_N"]))](
        act, w2, s2, sorted_pairs, block_expert, block_rows, topk_weights, per_pair,
        act.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), per_pair.stride(0),
        H, I, MAGIC_BITS,
        INT4=int4, GROUP=group, BLOCK_M=block_m,
        BLOCK_N=down_cfg["BLOCK_N"], BLOCK_K=group if int4 else down_cfg["BLOCK_K"], INTERPRET=interpret,
        DOT_PRECISION=prec,
        num_warps=down_cfg["num_warps"], num_stages=down_cfg["num_stages"],
    )


def _words_a_step(block_w: int, words: int, group_words: int) -> int:
    """An INT4 kernel's words of K a step: the config's BLOCK_W, or less where K (padded to a power of two)
    is shorter, and never under one scale group."""
    bw = min(block_w, max(group_words, triton.next_power_of_2(words)))
    assert bw % group_words == 0 and bw & (bw - 1) == 0, f"BLOCK_W={bw} must be a power of two of whole groups"
    return bw


def _launch_int4_swap(x, w13, s13, w2, s2, topk_weights, act, per_pair, plan, *, group: int, block_m: int,
                      gate_up_cfg: dict, down_cfg: dict) -> None:
    """The tile path with the weights as the dot's M (the config's "SWAP"; bf16 activations): BLOCK_W words of
    K a step, scales applied to the weights before the dot (rounded to bf16, see triton/fused_moe.py)."""
    H, I, k = x.shape[1], act.shape[1], act.shape[0] // x.shape[0]
    sorted_pairs, block_expert, block_rows = plan
    num_blocks = block_rows.shape[0]
    interpret = tuning.interpreting()
    h_words, i_words, group_words = H // PACK_FACTOR, I // PACK_FACTOR, group // PACK_FACTOR
    default = tuning.DEFAULTS["fused_moe_int4_gate_up"]["BLOCK_W"]  # (an explicit config may leave it out)
    bn, bw = gate_up_cfg["BLOCK_N"], _words_a_step(gate_up_cfg.get("BLOCK_W", default), h_words, group_words)
    moe_int4_swap_gate_up_kernel[(num_blocks, triton.cdiv(I, bn))](
        x, w13, s13, sorted_pairs, block_expert, block_rows, act,
        x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), act.stride(0),
        I, h_words, MAGIC_BITS,
        TOP_K=k, GROUP_WORDS=group_words, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_W=bw,
        EVEN=I % bn == 0 and h_words % bw == 0, INTERPRET=interpret,
        num_warps=gate_up_cfg["num_warps"], num_stages=1,  # prefetches by hand (see the kernel)
    )
    bn, bw = down_cfg["BLOCK_N"], _words_a_step(down_cfg.get("BLOCK_W", default), i_words, group_words)
    moe_int4_swap_down_kernel[(num_blocks, triton.cdiv(H, bn))](
        act, w2, s2, sorted_pairs, block_expert, block_rows, topk_weights, per_pair,
        act.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), per_pair.stride(0),
        H, i_words, MAGIC_BITS,
        GROUP_WORDS=group_words, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_W=bw,
        EVEN=H % bn == 0 and i_words % bw == 0, INTERPRET=interpret,
        num_warps=down_cfg["num_warps"], num_stages=1,
    )


def _configs(op: str, x: torch.Tensor, config: dict | None, bench_fn) -> tuple[dict, dict]:
    """(gate_up config, down config): explicit, from the table, or autotuned per stage."""
    if config is not None:
        return config["gate_up"], config["down"]
    T = x.shape[0]
    gate_up = tuning.get_config(f"{op}_gate_up", x.device, "tokens", T,
                                bench=lambda c: bench_fn({"gate_up": c, "down": tuning.DEFAULTS[f"{op}_down"]}))
    down = tuning.get_config(f"{op}_down", x.device, "tokens", T,
                             bench=lambda c: bench_fn({"gate_up": gate_up, "down": c}))
    return gate_up, down


def triton_fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, add: torch.Tensor | None = None, *,
                     config: dict | None = None) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H]; w2 [E, H, I] (x.dtype); topk_* [T, k] -> [T, H] (+ add [T, H], with the
    roundings of a separate add)."""
    _check_routing(x, topk_weights, topk_ids)
    _check_add(x, add)
    E, two_i, H = w13.shape
    I = two_i // 2
    assert H == x.shape[1] and two_i == 2 * I, f"w13 {tuple(w13.shape)} does not match x {tuple(x.shape)}"
    assert w2.shape == (E, H, I), f"w2 must be [{E}, {H}, {I}], got {tuple(w2.shape)}"
    for name, w in (("w13", w13), ("w2", w2)):
        assert w.dtype == x.dtype and w.stride(-1) == 1, f"{name} must be {x.dtype} with unit inner stride"

    def bench_fn(c):
        return tuning.bench_us(lambda: triton_fused_moe(x, w13, w2, topk_weights, topk_ids, add, config=c))

    gate_up, down = _configs("fused_moe", x, config, bench_fn)
    return _launch(x, w13, None, w2, None, topk_weights, topk_ids, add, I=I, int4=False, group=0,
                   gate_up_cfg=gate_up, down_cfg=down)


def _int4_outputs(x: torch.Tensor, topk_ids: torch.Tensor, I: int,
                  act_f16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [T, H] like x, act): what the INT4 gate_up kernels (GEMV and dot path) store and the GEMV down kernel
    reads. act is [T*k, 8, I/8] float32, nibble-major and pre-scaled, or with ``act_f16`` [T*k, 5, I/8] int32 in
    the down kernel's packed fp16 form (4 rows of fp16 pairs, one of per-word factors: the kernel's
    _store_act_f16); the down launcher tells the two apart by dtype."""
    rows, dtype = (5, torch.int32) if act_f16 else (PACK_FACTOR, torch.float32)
    return torch.empty_like(x), torch.empty(topk_ids.numel(), rows, I // PACK_FACTOR, dtype=dtype, device=x.device)


def _register_cap(cfg: dict) -> dict:
    """The launch option for a GEMV MoE config's "maxnreg" (None: none): ptxas keeps the kernel within that many
    registers a thread (spilling past it), so more programs fit a SM. At T = 4 the 16-row gate_up takes 167 and 3
    programs a SM, 396 of its 512 in the first wave; at 128 (one 8-byte spill, sm_90) 4 a SM hold them all."""
    return {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}


def _launch_int4_gemv(x, w13, s13, w2, s2, topk_weights, topk_ids, add, *, I: int, group: int,
                      gate_up_cfg: dict, down_cfg: dict) -> torch.Tensor:
    T, H = x.shape
    k = topk_ids.shape[1]
    bn = gate_up_cfg["BLOCK_N"]
    # down in packed fp16 (its config's "F16"): for 16-bit activations, as gate_up's F16, and gate_up blocks of
    # whole words (each word of act gets its own scale where it is computed: _store_act_f16).
    act_f16 = down_cfg.get("F16", False) and x.dtype in (torch.bfloat16, torch.float16) and bn % PACK_FACTOR == 0
    out, act = _int4_outputs(x, topk_ids, I, act_f16)
    if T == 0:
        return out
    TK, h_words, group_words = T * k, H // PACK_FACTOR, group // PACK_FACTOR
    interpret = tuning.interpreting()  # (also makes the loop over a loaded count work there, see tuning)
    pdl = tuning.pdl(x.device, "moe")
    shift16 = T >= GEMV_SHIFT16_MIN_TOKENS  # act's pre-scaling follows it: down gets the same
    # EVEN (no masks) when the blocks tile the matrices exactly, as at real model shapes.
    bw = _words_a_step(gate_up_cfg["BLOCK_W"], h_words, group_words)
    # The packed fp16 dots (the config's "F16") for 16-bit activations, exact in fp16 once scaled; float32 ones
    # keep the fp32 form, which rounds nothing (the kernel's comment above F16_X_SCALE has the numerics).
    f16 = gate_up_cfg.get("F16", False) and x.dtype in (torch.bfloat16, torch.float16)
    # Pairs of one expert a program (the config's "ROWS", F16 only): each weight word decoded once for them all.
    rows = gate_up_cfg.get("ROWS", 1) if f16 else 1
    assert rows in (1, 2, 4), f"gate_up config ROWS={rows} must be 1, 2 or 4"
    moe_int4_gemv_gate_up_kernel[(TK, triton.cdiv(I, bn))](
        x, w13, s13, topk_ids, act,
        x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), act.stride(0),
        TK, I, h_words, MAGIC_BITS,
        TOP_K=k, TK_PAD=triton.next_power_of_2(TK), GROUP_WORDS=group_words,
        BLOCK_N=bn, BLOCK_W=bw, EVEN=I % bn == 0 and h_words % bw == 0,
        PER_PAIR=gate_up_cfg.get("PER_PAIR", GEMV_PER_PAIR), SHIFT16=shift16, F16=f16, INTERPRET=interpret,
        ACT_F16=act_f16, ROWS=rows, num_warps=gate_up_cfg["num_warps"],
        num_stages=1,  # prefetches by hand (see the kernel)
        PDL=pdl, **tuning.pdl_launch(pdl), **_register_cap(gate_up_cfg),
    )
    _launch_gemv_down(act, w2, s2, topk_weights, topk_ids, add, out, group=group, down_cfg=down_cfg, pdl=pdl,
                      shift16=shift16)
    return out


def _launch_gemv_down(act, w2, s2, topk_weights, topk_ids, add, out, *, group: int, down_cfg: dict,
                      pdl: bool, shift16: bool) -> None:
    """The GEMV path's down kernel: out = sum over each token's k slots of topk_w * act W_down^T (+ add), from
    act [T*k, 8, I/8] fp32 as either gate_up kernel stores it (nibble-major, pre-scaled with ``shift16``'s
    powers of two), or from act [T*k, 5, I/8] int32 in the packed fp16 form (the dots then in packed fp16;
    _int4_outputs)."""
    T, H = out.shape
    k = topk_ids.shape[1]
    i_words, group_words = act.shape[2], group // PACK_FACTOR
    f16 = act.dtype == torch.int32
    bn, bw = down_cfg["BLOCK_N"], _words_a_step(down_cfg["BLOCK_W"], i_words, group_words)
    # All k slots' weights as one tile loaded before the PDL wait (the config's "PRELOAD"; the sm_90 table turns
    # it on up to T = 6): needs the slots to tile as a power of two and the intermediate slice in one chunk
    # (I/8 <= BLOCK_W: Kimi and DeepSeek-V3 at TP=8, 32 words); SGLANG_EAGLE3_MOE_DOWN_PRELOAD=0 turns it off.
    preload = (down_cfg.get("PRELOAD", False) and tuning.moe_down_preload() and k & (k - 1) == 0
               and i_words <= bw)
    moe_int4_gemv_down_kernel[(T, triton.cdiv(H, bn))](
        act, w2, s2, topk_ids, topk_weights, add if add is not None else out, out,
        act.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1),
        add.stride(0) if add is not None else 0, out.stride(0),
        H, MAGIC_BITS,
        I_WORDS=i_words, TOP_K=k, GROUP_WORDS=group_words, HAS_ADD=add is not None,
        BLOCK_N=bn, BLOCK_W=bw, EVEN=H % bn == 0 and i_words % bw == 0, PRELOAD=preload, SHIFT16=shift16,
        F16=f16, INTERPRET=tuning.interpreting(),
        num_warps=down_cfg["num_warps"], num_stages=1,  # straight-line code: nothing to pipeline
        enable_fp_fusion=False,  # every product rounded alone: its fixed-order sums then agree across configs
        PDL=pdl, **tuning.pdl_launch(pdl), **_register_cap(down_cfg),
    )


def _launch_int4_dot(x, w13, s13, w2, s2, topk_weights, topk_ids, add, *, I: int, group: int,
                     gate_up_cfg: dict, down_cfg: dict) -> torch.Tensor:
    """The dot path: gate_up as tensor-core dots over each expert's pairs (moe_int4_dot_gate_up_kernel), then
    the GEMV path's down kernel on the act it stores."""
    T, H = x.shape
    k = topk_ids.shape[1]
    out, act = _int4_outputs(x, topk_ids, I)  # (fp32 act: the down kernel keeps its fp32 form here, F16 or not)
    if T == 0:
        return out
    TK, h_words, group_words = T * k, H // PACK_FACTOR, group // PACK_FACTOR
    interpret = tuning.interpreting()
    pdl = tuning.pdl(x.device, "moe")
    bn, bw = gate_up_cfg["BLOCK_N"], _words_a_step(gate_up_cfg["BLOCK_W"], h_words, group_words)
    # tl.dot wants every dimension >= 16; a block of rows covers the tokens that can share an expert (a token
    # takes an expert at most once), more rows than that loop.
    block_m = gate_up_cfg.get("BLOCK_M", max(16, min(64, triton.next_power_of_2(T))))
    # Split-K over H: each split a whole number of BLOCK_W chunks; partials and counters only when split.
    split = max(1, min(gate_up_cfg.get("SPLIT", 1), triton.cdiv(h_words, bw)))
    split_words = triton.cdiv(triton.cdiv(h_words, split), bw) * bw
    split = triton.cdiv(h_words, split_words)
    nb = triton.cdiv(I, bn)
    if split > 1:
        part = torch.empty(split, TK, 2 * I, dtype=torch.float32, device=x.device)
        count = split_counters(x.device, TK * nb, owner="moe")
    else:
        part = count = act  # never read
    moe_int4_dot_gate_up_kernel[(TK, nb, split)](
        x, w13, s13, topk_ids, act, part, count,
        x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), act.stride(0),
        TK, I, h_words, split_words, MAGIC_BITS,
        TOP_K=k, TK_PAD=triton.next_power_of_2(TK), GROUP_WORDS=group_words, BLOCK_M=block_m,
        BLOCK_N=bn, BLOCK_W=bw, SPLIT=split, EVEN=I % bn == 0 and h_words % split_words == 0,
        EXACT=gate_up_cfg.get("EXACT", False), INTERPRET=interpret,
        num_warps=gate_up_cfg["num_warps"], num_stages=1,  # prefetches by hand (see the kernel)
        PDL=pdl, **tuning.pdl_launch(pdl),
    )
    _launch_gemv_down(act, w2, s2, topk_weights, topk_ids, add, out, group=group, down_cfg=down_cfg, pdl=pdl,
                      shift16=False)  # the dot gate_up decodes with the shift by 20 (_int4_group)
    return out


def triton_fused_moe_int4(x: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                          w2_packed: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor, group_size: int = 32, add: torch.Tensor | None = None, *,
                          config: dict | None = None, path: str | None = None) -> torch.Tensor:
    """W4A16: w13_packed int32 [E, 2I, H/8] + w13_scale [E, 2I, H/g]; w2_packed [E, H, I/8] + w2_scale
    [E, H, I/g] -> [T, H] in x.dtype (+ add [T, H], with the roundings of a separate add).

    path: "gemv" (no tl.dot; decode/verify sizes), "dot" (gate_up as tl.dot over each expert's pairs, down as
    the GEMV's; verify sizes), "tile" (tl.dot over grouped pairs), or None: dot for 2..DOT_MAX_TOKENS, gemv up to
    GEMV_MAX_TOKENS, tile above. ``config`` ({"gate_up": ..., "down": ...}) is for the chosen path."""
    _check_routing(x, topk_weights, topk_ids)
    _check_add(x, add)
    E, two_i, h_words = w13_packed.shape
    I = two_i // 2
    H = x.shape[1]
    # Powers of two: the kernels step K by whole groups in power-of-two blocks (a group of 48 failed in the tile
    # path's tl.arange, and the GEMV path's message named BLOCK_W, not the group).
    assert group_size >= PACK_FACTOR and group_size & (group_size - 1) == 0, (
        f"{group_size=} must be a power of two >= {PACK_FACTOR} (whole int32 words)")
    assert H % group_size == 0 and I % group_size == 0, f"{H=} and {I=} must be multiples of {group_size=}"
    assert h_words * PACK_FACTOR == H and two_i == 2 * I, f"w13_packed {tuple(w13_packed.shape)} vs {H=}"
    assert w13_scale.shape == (E, two_i, H // group_size), f"{tuple(w13_scale.shape)=} for {group_size=}"
    assert w2_packed.shape == (E, H, I // PACK_FACTOR), f"w2_packed {tuple(w2_packed.shape)} vs {H=} {I=}"
    assert w2_scale.shape == (E, H, I // group_size), f"{tuple(w2_scale.shape)=} for {group_size=}"
    for name, t in (("w13_packed", w13_packed), ("w2_packed", w2_packed)):
        assert t.dtype == torch.int32 and t.stride(-1) == 1, f"{name} must be int32, unit inner stride"
    for name, t in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
        assert t.stride(-1) == 1, f"{name} must have unit inner stride, got {t.stride()}"
    if path is None:
        T = x.shape[0]
        path = "dot" if 2 <= T <= tuning.moe_dot_max(DOT_MAX_TOKENS) else "gemv" if T <= GEMV_MAX_TOKENS else "tile"
    assert path in ("gemv", "dot", "tile"), f"{path=} must be 'gemv', 'dot' or 'tile'"
    args = (x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, group_size, add)

    def bench_fn(c):
        return tuning.bench_us(lambda: triton_fused_moe_int4(*args, config=c, path=path))

    if path == "gemv":
        gate_up, down = _configs("fused_moe_int4_gemv", x, config, bench_fn)
        return _launch_int4_gemv(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, add,
                                 I=I, group=group_size, gate_up_cfg=gate_up, down_cfg=down)
    if path == "dot":  # the down kernel is the GEMV path's, at its config for T
        down = config["down"] if config is not None else tuning.get_config(
            "fused_moe_int4_gemv_down", x.device, "tokens", x.shape[0])
        gate_up = config["gate_up"] if config is not None else tuning.get_config(
            "fused_moe_int4_dot_gate_up", x.device, "tokens", x.shape[0],
            bench=lambda c: bench_fn({"gate_up": c, "down": down}))
        return _launch_int4_dot(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, add,
                                I=I, group=group_size, gate_up_cfg=gate_up, down_cfg=down)
    gate_up, down = _configs("fused_moe_int4", x, config, bench_fn)  # (INT4 steps K one scale group at a time)
    return _launch(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, add, I=I, int4=True,
                   group=group_size, gate_up_cfg=gate_up, down_cfg=down)
