"""Triton kernels vs references on the GPU at real shapes: one Kimi-K2.5 TP=8 rank (8 heads, kv_lora 512,
rope 64; 384 experts, H=7168, I=2048/8=256, top-8), contexts 1..32k, T=1..64, partially filled pages; RMSNorm
and rotary at the layer's shapes (rotary bit-identical to the reference); the INT4 GEMV path (T <= 128) and
the tile path against each other and the reference; a tiny model's forward with every kernel against every reference.

Outputs come from a poisoned allocator (the caching allocator's blocks are filled with NaN first), so an
element the kernel never writes shows up as NaN, which no bound accepts.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from gemv_fma_checks import (  # noqa: E402
    check_gemv_fma,
    check_gemv_fma_heads,
    check_gemv_fma_pair,
    check_gemv_fma_pair_norm,
)
from gqa_checks import check_draft_forward, check_gqa  # noqa: E402
from kernel_checks import (  # noqa: E402
    check_gemv,
    check_gemv_pair,
    check_latent_to_cache,
    check_mla,
    check_model_forward,
    check_moe_topk,
    check_moe_topk_order,
    check_rms_norm,
    check_rotary,
    cuda_kernels_per_moe_layer,
    make_mla_inputs,
    rel_err,
)
from mla_prefill_checks import check_mha_prefill, check_mha_prefill_model  # noqa: E402
from sampling_checks import (  # noqa: E402
    check_filters_kernel_vs_sort,
    check_gumbel_argmax,
    check_top_threshold,
    check_top_threshold_edges,
)

from sglang_eagle3 import kernels  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

HEADS, KV_LORA, ROPE = 8, 512, 64
EXPERTS, HIDDEN, INTER, TOP_K = 384, 7168, 256, 8


def poison_allocator(nbytes: int = 1 << 30) -> None:
    """Fill free caching-allocator memory with NaN so torch.empty inside launchers returns NaN."""
    torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").fill_(float("nan"))
    torch.cuda.synchronize()


@pytest.mark.parametrize("T", [1, 4, 17, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_topk_kimi(T, dtype):
    check_moe_topk(T, EXPERTS, TOP_K, 1, 1, True, True, 2.827, device="cuda", dtype=dtype, seed=T)


@pytest.mark.parametrize("T,bias,classes", [(1, True, 23), (5, False, 40), (64, False, 9)])
def test_moe_topk_kimi_order_with_ties(T, bias, classes):
    """Kimi's 384 experts in tied classes: picks by descending choice, lowest id first among equals."""
    check_moe_topk_order(T, EXPERTS, TOP_K, bias, classes, device="cuda", seed=200 + T)


@pytest.mark.parametrize("T", [1, 33])
def test_moe_topk_deepseek_grouped(T):
    check_moe_topk(T, 256, 8, 8, 4, True, True, 2.5, device="cuda", seed=100 + T)


MLA_CASES = [  # (T, page_size, seq_lens)
    (1, 64, [1]),
    (1, 64, [8192]),
    (1, 1, [32768]),
    (1, 16, [7, 1000, 4097, 31999]),
    (4, 64, [4, 333, 8200, 32768]),
    (4, 16, [5] * 3),
    (64, 64, [3000]),
    (2, 32, [2, 65, 129, 5000, 17, 12000, 2048, 100]),
]


@pytest.mark.parametrize("T,page_size,seq_lens", MLA_CASES)
def test_mla_attention(T, page_size, seq_lens):
    B = len(seq_lens)
    qn, qr, kv, pt, seq = make_mla_inputs(B, T, HEADS, KV_LORA, ROPE, page_size, seq_lens, "cuda", seed=T)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=KV_LORA, sm_scale=0.1352)
    poison_allocator()
    out = kernels.mla_attention(qn, qr, kv, pt, seq, **kw)
    ref = kernels.ref_mla_attention(qn, qr, kv, pt, seq, **kw)
    err = rel_err(out, ref)
    assert err < 1e-2, f"MLA rel err {err} ({T=} {page_size=} {seq_lens=})"


@pytest.mark.parametrize("T,page_size,seq_lens", [(1, 64, [1024]), (1, 16, [8192, 5]), (4, 64, [333, 8200])])
def test_mla_split_merge_repeated(T, page_size, seq_lens):
    """Split keys merged by the merge launch at real shapes (the GPU's tuned config), three calls in a row on
    one grid with shorter contexts each time, as graph replays run them."""
    check_mla(len(seq_lens), T, HEADS, KV_LORA, ROPE, page_size, seq_lens, device="cuda", seed=T, min_splits=2,
              calls=3)


@pytest.mark.parametrize("T,seq_lens", [(1, [1024]), (4, [64, 2000, 5])])
def test_mla_split_kv_capacity_far_above_context(T, seq_lens):
    """A page table sized for 16k+ keys (as a server's captured graphs hold it) over short contexts: most
    splits hold no key and store nothing; the merge must count only the active ones (the partials come from a
    NaN-poisoned allocator, so counting one it should not shows), three calls in a row on one grid."""
    poison_allocator()
    check_mla(len(seq_lens), T, HEADS, KV_LORA, ROPE, 64, seq_lens, device="cuda", seed=60 + T, min_splits=32,
              calls=3, spare=256)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,ctx", [(2, 1000), (4, 1000), (8, 1000), (4, 8100), (8, 8100), (4, 20000), (8, 20000)])
def test_mla_decode_verify_alike(T, ctx, dtype):
    """Kimi TP=8 shapes, the table's configs (BLOCK_M 16 for a decode, 32 for a verify of 4 or 8) and a page table
    of 33k keys as a server's graphs hold it: each token of a verify is the same bits as its decode alone. (At
    20000 keys the split size is 192 keys for both; a verify straddling a multiple of 64 x 132 keys would not be.)"""
    from kernel_checks import check_mla_decode_verify_alike

    check_mla_decode_verify_alike(T, HEADS, KV_LORA, ROPE, 64, ctx, device="cuda", dtype=dtype,
                                  spare=(33000 - ctx) // 64, seed=ctx + T)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,ctx,cap", [(3, 1000, 8448), (4, 1000, 8448), (8, 1000, 8448), (4, 8100, 8448),
                                       (8, 8300, 8448), (4, 16000, 16896), (8, 9000, 16896)])
def test_mla_short_split_decode_verify_alike(T, ctx, cap, dtype):
    """Kimi TP=8 shapes in a page table of ``cap`` slots (batch 1: 132 splits of one or two 64-key tiles at most),
    where the table's short_split runs a verify in 16-row blocks at one key-tile buffer: each token the same bits as
    its decode alone, and the whole verify the same bits as the table's 32-row plan without short_split."""
    from kernel_checks import check_mla_decode_verify_alike, check_mla_short_split

    from sglang_eagle3.kernels import tuning

    cfg = tuning.get_config("mla_attention", torch.device("cuda"), "rows", T * HEADS)
    if not cfg["short_split"]:  # the derived sm_120 table (SGLANG_EAGLE3_EMULATE_GPU) has none
        pytest.skip("this GPU's config table runs no short_split")
    spare = cap // 64 - math.ceil((ctx + T) / 64)
    plans = check_mla_decode_verify_alike(T, HEADS, KV_LORA, ROPE, 64, ctx, device="cuda", dtype=dtype, spare=spare,
                                          seed=ctx + T + 7)
    # the verify in 16-row blocks, on the splits of its decodes
    assert plans["verify"][1] == 16 and len({splits for splits, _ in plans.values()}) == 1, plans
    check_mla_short_split(1, T, HEADS, KV_LORA, ROPE, 64, [ctx + T], cfg, spare, device="cuda", dtype=dtype,
                          seed=ctx + T + 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,seq_lens", [(1, [1, 65, 1000, 8192]), (1, [8300, 32768]), (4, [4, 1000, 8200]),
                                        (8, [9, 20000])])
def test_mla_page_layouts_same_bits(T, seq_lens, dtype):
    """Kimi TP=8 shapes at the table's config for T: the same keys in pages of 16 (a page id a key: the table's
    64-key tiles span pages) and of 64 and 128 (each tile in one page: the split pass's in-page addressing), a
    page table of 33k keys: the same bits from every layout, each near the reference."""
    from kernel_checks import check_mla_page_layouts

    from sglang_eagle3.kernels import tuning

    poison_allocator()
    cfg = tuning.get_config("mla_attention", torch.device("cuda"), "rows", T * HEADS)
    check_mla_page_layouts(len(seq_lens), T, HEADS, KV_LORA, ROPE, seq_lens, [16, 64, 128], cfg, device="cuda",
                           dtype=dtype, seed=T, capacity=33024)


def test_mla_float32_is_ieee():
    """float32 MLA sums in IEEE float32 (tuning.dot_precision), as torch's float32 reference does: TF32 would
    miss this bound by ~100x."""
    check_mla(2, 4, HEADS, KV_LORA, ROPE, 16, [300, 4100], device="cuda", seed=5, dtype=torch.float32, tol=1e-5)


# The Kimi-shaped EAGLE-3 draft at TP=8: 64 query heads and 8 kv heads, head_dim 128 -> 8 on 1 a rank; and two
# kv heads a rank (a Llama-style draft with 16 kv heads at TP=8).
@pytest.mark.parametrize("T,Hq,Hkv,page_size,seq_lens", [
    (1, 8, 1, 64, [1]), (1, 8, 1, 64, [1024, 37]), (1, 8, 1, 64, [8192]), (1, 8, 1, 16, [32768]),
    (4, 8, 1, 64, [4, 8200]), (4, 16, 2, 64, [333, 4100, 65]), (19, 8, 1, 64, [19, 3000]),
])
def test_gqa_attention_draft_shapes(T, Hq, Hkv, page_size, seq_lens):
    """The draft's paged attention at real shapes vs ref_gqa_attention (NaN-poisoned scratch), three calls in a
    row on one grid with shorter contexts, as graph replays run them."""
    poison_allocator()
    check_gqa(len(seq_lens), T, Hq, Hkv, 128, page_size, seq_lens, device="cuda", seed=70 + T, calls=3)


@pytest.mark.parametrize("T,seq_lens", [(1, [1024]), (4, [64, 2000, 5])])
def test_gqa_capacity_far_above_context(T, seq_lens):
    """A page table for 16k+ keys over short contexts (a server's graphs): most splits hold no key; the pool's
    pages no request owns hold 1e4, so reading one shows."""
    poison_allocator()
    check_gqa(len(seq_lens), T, 8, 1, 128, 64, seq_lens, device="cuda", seed=80 + T, min_splits=16, calls=3,
              spare=256)


# MLA prefill in the non-absorbed form at a Kimi TP=8 rank's shapes: 8 heads, nope / v 128, rope 64, latent 512;
# prefill chunks over prefixes, padded batches, page sizes 64 and 16.
@pytest.mark.parametrize("T,page_size,seq_lens", [
    (64, 64, [64]), (64, 16, [64, 3000]), (256, 64, [256, 8448]), (1024, 64, [1024]), (1024, 64, [9216]),
    (32, 64, [32, 32, 100, 5000]),
])
def test_mha_prefill_kimi_shapes(T, page_size, seq_lens):
    """Decompression + attention vs ref_mla_mha_prefill (NaN scratch: a key not decompressed shows), three calls
    on one grid with shorter contexts, as graph replays run them; the op's tuned config."""
    poison_allocator()
    check_mha_prefill(len(seq_lens), T, HEADS, 128, ROPE, KV_LORA, page_size, seq_lens, device="cuda", seed=90 + T,
                      calls=3)


@pytest.mark.parametrize("T,seq_lens", [(64, [64, 200]), (256, [4100])])
def test_mha_prefill_capacity_far_above_context(T, seq_lens):
    """A page table for 16k+ keys (a server's prefill graphs) over short contexts: the decompression's tiles past a
    request's keys exit, the attention reads none of them; float32 inputs sum in IEEE float32."""
    poison_allocator()
    check_mha_prefill(len(seq_lens), T, HEADS, 128, ROPE, KV_LORA, 64, seq_lens, device="cuda", seed=95 + T,
                      calls=2, spare=256, dtype=torch.float32, tol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_mha_prefill_model(dtype, tol):
    """A tiny Kimi-shaped model's ragged prefill (over a prefix) with the MHA form on kernels vs the absorbed form
    on references, and a decode step over the caches it wrote."""
    check_mha_prefill_model("cuda", dtype, tol, seed=9)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_draft_forward_kernels(dtype, tol):
    """The draft's paged forwards (ragged extend, decode, extend of 3) on kernels vs on references."""
    check_draft_forward(device="cuda", dtype=dtype, tol=tol, seed=7)


def moe_weights(int4: bool, seed: int):
    """Random full-pool expert weights made on the GPU (packed INT4 drawn directly as random words)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if int4:
        p13 = torch.randint(-2**31, 2**31 - 1, (EXPERTS, 2 * INTER, HIDDEN // 8), generator=g, device="cuda",
                            dtype=torch.int32)
        s13 = (torch.rand(EXPERTS, 2 * INTER, HIDDEN // 32, generator=g, device="cuda") * 0.004).bfloat16()
        p2 = torch.randint(-2**31, 2**31 - 1, (EXPERTS, HIDDEN, INTER // 8), generator=g, device="cuda",
                           dtype=torch.int32)
        s2 = (torch.rand(EXPERTS, HIDDEN, INTER // 32, generator=g, device="cuda") * 0.01).bfloat16()
        return p13, s13, p2, s2
    w13 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g, device="cuda", dtype=torch.bfloat16)
           / math.sqrt(HIDDEN))
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=g, device="cuda", dtype=torch.bfloat16) / math.sqrt(INTER)
    return w13, w2


def routing(T: int, skew: bool, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    pool = 10 if skew else EXPERTS  # skew: many tokens share experts (more than one 16-pair chunk)
    ids = torch.stack([torch.randperm(pool, generator=g)[:TOP_K] for _ in range(T)]).int().cuda()
    w = torch.rand(T, TOP_K, generator=g)
    return (w / w.sum(-1, keepdim=True)).cuda(), ids


@pytest.fixture(scope="module")
def bf16_weights():
    return moe_weights(False, 0)


@pytest.fixture(scope="module")
def int4_weights():
    return moe_weights(True, 1)


MOE_CASES = [(1, False), (3, False), (8, False), (64, False), (64, True)]


@pytest.mark.parametrize("T,skew", MOE_CASES)
def test_fused_moe_bf16(bf16_weights, T, skew):
    w13, w2 = bf16_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(T, skew, T)
    poison_allocator()
    out = kernels.fused_moe(x, w13, w2, topk_w, ids)
    err = rel_err(out, kernels.ref_fused_moe(x, w13, w2, topk_w, ids))
    assert err < 1e-2, f"bf16 MoE rel err {err} ({T=} {skew=})"


@pytest.mark.parametrize("T,skew", MOE_CASES)
def test_fused_moe_int4(int4_weights, T, skew):
    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(T, skew, 1000 + T)
    poison_allocator()
    out = kernels.fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids)
    err = rel_err(out, kernels.ref_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids))
    assert err < 1e-2, f"INT4 MoE rel err {err} ({T=} {skew=})"


@pytest.mark.parametrize("T", [2, 4, 8])
def test_fused_moe_int4_token_independent_of_batch(int4_weights, T):
    """Decode (one token) and verify (T tokens, experts shared between them) give a token a bit-identical MoE
    output under one launch config: speculative greedy output equals plain decoding only if the verify batch
    computes each token as decode would. (The sm_90 table tunes T=1 and T>1 separately: tiles that differ
    also order the fp32 sums differently, ~1e-9 apart on the H200; the test pins the T>1 config.)"""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(T, True, 2000 + T)  # skewed: tokens share experts
    cfg = {stage: tuning.get_config(f"fused_moe_int4_gemv_{stage}", x.device, "tokens", T)
           for stage in ("gate_up", "down")}
    batch = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, config=cfg, path="gemv")
    for t in range(T):
        one = triton_fused_moe_int4(x[t:t + 1], p13, s13, p2, s2, topk_w[t:t + 1], ids[t:t + 1], 32, config=cfg,
                                    path="gemv")
        assert torch.equal(one[0], batch[t]), (t, (one[0].float() - batch[t].float()).abs().max().item())


@pytest.mark.parametrize("T,skew", [(1, False), (2, False), (5, False), (8, False), (8, True)])
def test_fused_moe_int4_gemv_vs_tile(int4_weights, T, skew):
    """The GEMV path (the default at these T) against the reference and against the tile path, with the shared
    experts' output added in the final store."""
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    shared = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.1  # folded into the last store
    topk_w, ids = routing(T, skew, 2000 + T)
    poison_allocator()
    gemv = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="gemv")
    tile = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="tile")
    ref = kernels.ref_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared)
    assert rel_err(gemv, ref) < 1e-2, f"GEMV rel err {rel_err(gemv, ref)} ({T=} {skew=})"
    assert rel_err(gemv, tile) < 1e-2, f"GEMV vs tile rel err {rel_err(gemv, tile)} ({T=} {skew=})"


# (T, skew, gate_up, down or None for the table's); F16 on in both where the test turns it on (down's: act in packed
# fp16 too), PRELOAD (every slot's weights as one tile) or the slot loop.
GEMV_F16 = [(1, False, {"BLOCK_N": 16, "BLOCK_W": 128, "num_warps": 8},
             {"BLOCK_N": 8, "BLOCK_W": 32, "num_warps": 2, "PRELOAD": True}),
            (3, True, {"BLOCK_N": 8, "BLOCK_W": 128, "num_warps": 4},
             {"BLOCK_N": 32, "BLOCK_W": 32, "num_warps": 4, "PRELOAD": False}),
            (8, False, {"BLOCK_N": 32, "BLOCK_W": 64, "num_warps": 4}, None),
            (16, True, {"BLOCK_N": 16, "BLOCK_W": 64, "num_warps": 4},
             {"BLOCK_N": 16, "BLOCK_W": 32, "num_warps": 2, "PRELOAD": True})]


@pytest.mark.parametrize("case", range(len(GEMV_F16)))
def test_fused_moe_int4_gemv_f16(int4_weights, case, monkeypatch):
    """gate_up and down in packed fp16 (F16) at Kimi TP=8 shapes: the inline PTX bit-identical to its plain-op
    emulation (what the interpreter runs), near the reference and within a few fp16 roundings of the fp32 form
    (same tiles), and a token alone bit-identical to the same token in the batch; the shared experts' output added
    in the final store."""
    import importlib

    from sglang_eagle3.kernels import tuning

    fm = importlib.import_module("sglang_eagle3.kernels.fused_moe")  # (kernels.fused_moe is also a function)
    T, skew, gate_up, down = GEMV_F16[case]
    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    shared = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.1
    topk_w, ids = routing(T, skew, 7000 + T)
    down = down or tuning.get_config("fused_moe_int4_gemv_down", x.device, "tokens", T)

    def run(f16, n=T):
        return fm.triton_fused_moe_int4(x[:n], p13, s13, p2, s2, topk_w[:n], ids[:n], 32, shared[:n], path="gemv",
                                        config={"gate_up": {**gate_up, "F16": f16}, "down": {**down, "F16": f16}})

    poison_allocator()
    f16, f32 = run(True), run(False)
    ref = kernels.ref_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared)
    assert rel_err(f16, ref) < 1e-2, f"F16 rel err {rel_err(f16, ref)} ({T=} {gate_up=})"
    apart = ((f16.float() - f32.float()).abs().max() / f32.float().abs().max()).item()
    assert apart <= 2**-7, f"F16 vs fp32 form: {apart} of the outputs' scale apart ({T=} {gate_up=})"
    assert torch.equal(run(True, 1)[0], f16[0])
    monkeypatch.setattr(fm.tuning, "interpreting", lambda: True)  # the emulation, compiled for the GPU
    emulated = run(True)
    assert torch.equal(emulated, f16), (emulated.float() - f16.float()).abs().max().item()


# gate_up's ROWS form (a weight word decoded once for up to ROWS pairs of its expert): (T, skew, gate_up config).
GEMV_ROWS = [(4, True, {"BLOCK_N": 8, "BLOCK_W": 128, "num_warps": 4, "ROWS": 4}),
             (16, False, {"BLOCK_N": 8, "BLOCK_W": 128, "num_warps": 4, "ROWS": 2}),
             (64, False, {"BLOCK_N": 16, "BLOCK_W": 128, "num_warps": 8, "ROWS": 4}),
             (64, True, {"BLOCK_N": 8, "BLOCK_W": 128, "num_warps": 4, "ROWS": 4}),
             (37, True, {"BLOCK_N": 16, "BLOCK_W": 128, "num_warps": 4, "ROWS": 2})]


@pytest.mark.parametrize("case", range(len(GEMV_ROWS)))
def test_fused_moe_int4_gemv_rows(int4_weights, case, monkeypatch):
    """The ROWS form at Kimi TP=8 shapes: bit-identical to the one-pair form at the same tiles (each row runs the
    same operations in the same order; only the decoding of the weights is shared), to its plain-op emulation, and a
    token alone to the same token in the batch; near the reference. (Across tiles, BLOCK_N or warps:
    test_fused_moe_int4_gemv_tiles_round_alike.)"""
    import importlib

    from sglang_eagle3.kernels import tuning

    fm = importlib.import_module("sglang_eagle3.kernels.fused_moe")
    T, skew, gate_up = GEMV_ROWS[case]
    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(T, skew, 9000 + T)
    down = tuning.get_config("fused_moe_int4_gemv_down", x.device, "tokens", T)
    rows_cfg = {"gate_up": {**gate_up, "F16": True}, "down": down}

    def run(config, n=T, t0=0):
        return fm.triton_fused_moe_int4(x[t0:t0 + n], p13, s13, p2, s2, topk_w[t0:t0 + n], ids[t0:t0 + n], 32,
                                        path="gemv", config=config)

    poison_allocator()
    out = run(rows_cfg)
    one_pair = run({"gate_up": {**rows_cfg["gate_up"], "ROWS": 1}, "down": down})
    assert torch.equal(out, one_pair), (out.float() - one_pair.float()).abs().max().item()
    err = rel_err(out, kernels.ref_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32))
    assert err < 1e-2, f"ROWS rel err {err} ({T=} {gate_up=})"
    assert torch.equal(run(rows_cfg, 1, T // 2)[0], out[T // 2])
    monkeypatch.setattr(fm.tuning, "interpreting", lambda: True)  # the emulation, compiled for the GPU
    emulated = run(rows_cfg)
    assert torch.equal(emulated, out), (emulated.float() - out.float()).abs().max().item()


@pytest.mark.parametrize("T,base", [(2, 1), (3, 1), (4, 1), (5, 1), (8, 1), (16, 1), (17, 8), (64, 1)])
def test_fused_moe_int4_table_buckets_round_alike(int4_weights, T, base):
    """A token computed alone under a smaller bucket's table configs (base=1: decode) and the same token in a batch
    of T under T's configs (a verify, or the ROWS form's buckets above 16 tokens) get the same MoE output bit for
    bit: what exactly lossless greedy speculation needs of the MoE. The buckets' tiles differ (gate_up 16 x 8 warps,
    32 x 4, 16 x 4; down with and without PRELOAD); the kernels' sums run in one fixed order whatever the tiles
    (kernels/triton/exact.py). Until the twenty-fifth session they did not, and this test was expected to fail where
    the configs differed."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    def configs(n):
        return {stage: tuning.get_config(f"fused_moe_int4_gemv_{stage}", torch.device("cuda"), "tokens", n)
                for stage in ("gate_up", "down")}

    alone_cfg, batch_cfg = configs(base), configs(T)
    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(T, True, 9500 + T)
    batch = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, path="gemv", config=batch_cfg)
    for t in range(T):
        one = triton_fused_moe_int4(x[t:t + 1], p13, s13, p2, s2, topk_w[t:t + 1], ids[t:t + 1], 32, path="gemv",
                                    config=alone_cfg)
        assert torch.equal(one[0], batch[t]), (T, t, batch_cfg, alone_cfg,
                                               (one[0].float() - batch[t].float()).abs().max().item())


# Tiles of every shape the sm_90 table uses and some it does not (BLOCK_W fixed: it sets the group slots the fp32
# accumulators hold, so the tables keep it in every bucket).
GATE_UP_TILES = [{"BLOCK_N": bn, "BLOCK_W": 128, "num_warps": w, "F16": True, "ROWS": r}
                 for bn, w, r in ((16, 8, 2), (16, 8, 1), (32, 4, 1), (16, 4, 1), (16, 4, 2), (8, 4, 4), (8, 2, 1),
                                  (64, 8, 1), (32, 8, 2))]
DOWN_TILES = [{"BLOCK_N": bn, "BLOCK_W": 32, "num_warps": w, "PRELOAD": pre, "F16": True}
              for bn, w, pre in ((8, 2, True), (32, 4, False), (16, 2, True), (16, 2, False), (64, 4, False),
                                 (32, 8, True), (8, 1, True))]
# ... and with registers capped ("maxnreg": ptxas spills past it; which registers hold what changes, no arithmetic)
GATE_UP_TILES += [{"BLOCK_N": bn, "BLOCK_W": 128, "num_warps": w, "F16": True, "ROWS": 1, "maxnreg": 128}
                  for bn, w in ((16, 4), (8, 2))]
DOWN_TILES += [{"BLOCK_N": 8, "BLOCK_W": 32, "num_warps": 2, "PRELOAD": True, "F16": True, "maxnreg": 80}]


@pytest.mark.parametrize("T,skew", [(1, False), (4, True), (8, False)])
def test_fused_moe_int4_gemv_tiles_round_alike(int4_weights, T, skew):
    """Every gate_up tile (BLOCK_N, warps, ROWS, a register cap) with every down tile (BLOCK_N, warps, PRELOAD, a
    register cap) gives the same MoE output bit for bit, at Kimi TP=8 shapes with the shared experts' output
    added: a table may give each T the tiles that are fastest there without a verify rounding a token apart from its
    decode."""
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    shared = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.1
    topk_w, ids = routing(T, skew, 9700 + T)
    first = None
    for gate_up in GATE_UP_TILES:
        for down in DOWN_TILES:
            out = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="gemv",
                                        config={"gate_up": gate_up, "down": down})
            if first is None:
                first = out
                assert rel_err(out, _ref_int4_chunked(x, p13, s13, p2, s2, topk_w, ids, shared)) < 1e-2
            assert torch.equal(out, first), (gate_up, down, (out.float() - first.float()).abs().max().item())


DOT_CONFIGS = [None, {"BLOCK_N": 32, "BLOCK_W": 16, "num_warps": 4, "EXACT": True},
               {"BLOCK_N": 16, "BLOCK_W": 32, "num_warps": 4, "EXACT": False, "SPLIT": 3},
               {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_W": 32, "num_warps": 8, "EXACT": True, "SPLIT": 8}]


@pytest.mark.parametrize("cfg", range(len(DOT_CONFIGS)))
@pytest.mark.parametrize("T,skew", [(2, False), (4, True), (8, False), (16, True), (24, True)])
def test_fused_moe_int4_dot_path(int4_weights, T, skew, cfg):
    """The dot path (gate_up as tensor-core dots over each expert's pairs) against the reference and the GEMV
    path, the shared experts' output added in the final store; skewed routings put up to T pairs on one expert
    (more than a 16-row block at T=24 with BLOCK_M 16: the block loop), split-K over H (3: a short last split).
    EXACT configs form the products the GEMV path forms (exact fp32 weights, TF32 dots), so they differ from
    it only in fp32 summation order: at most a bf16 rounding apart (2^-8 of the largest output, twice)."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    shared = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.1
    topk_w, ids = routing(T, skew, 6000 + T)
    gate_up = DOT_CONFIGS[cfg] or tuning.get_config("fused_moe_int4_dot_gate_up", x.device, "tokens", T)
    config = {"gate_up": gate_up, "down": tuning.get_config("fused_moe_int4_gemv_down", x.device, "tokens", T)}
    poison_allocator()
    dot = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="dot", config=config)
    gemv = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="gemv")
    ref = _ref_int4_chunked(x, p13, s13, p2, s2, topk_w, ids, shared)
    assert rel_err(dot, ref) < 1e-2, f"dot rel err {rel_err(dot, ref)} ({T=} {skew=} {gate_up=})"
    apart = ((dot.float() - gemv.float()).abs().max() / gemv.float().abs().max()).item()
    bound = 8e-3 if gate_up.get("EXACT", True) else 2e-2
    assert apart <= bound, f"dot vs GEMV {apart} of the outputs' scale apart ({T=} {skew=} {gate_up=})"


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("T", [3, 8, 20])
def test_fused_moe_int4_dot_path_exact(T, exact, split):
    """The dot path bit for bit against a float64 re-implementation on inputs whose sums are exact in any order
    (kernel_checks.check_fused_moe_int4_gemv_exact): a slip in nibble order, scales, row gathering or the
    split-K reduction shows."""
    from kernel_checks import check_fused_moe_int4_gemv_exact

    cfg = {"gate_up": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_W": 16, "num_warps": 4, "EXACT": exact,
                       "SPLIT": split},
           "down": {"BLOCK_N": 32, "BLOCK_W": 32, "num_warps": 4, "PRELOAD": False}}
    check_fused_moe_int4_gemv_exact(T, 24, 256, 32, 4, device="cuda", seed=70 + T, skew=True,
                                    dtype=torch.bfloat16, config=cfg, path="dot")


@pytest.mark.parametrize("shape,residual,strided,inplace", [
    ((1, HIDDEN), False, False, False),  # input / post-attention norm at decode
    ((8, HIDDEN), True, False, False),  # fused with the residual add, verify T=8
    ((3, 1536), False, False, False),  # q_a_layernorm
    ((5, KV_LORA), False, True, True),  # kv_a_layernorm in place inside kv_a's rows
    ((2, 300, HIDDEN), False, False, False),  # prefill-sized
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm(shape, residual, strided, inplace, dtype):
    poison_allocator()
    check_rms_norm(shape, dtype, residual=residual, strided=strided, inplace=inplace, device="cuda",
                   seed=len(shape) + shape[-1], max_ulp=2.0 if dtype == torch.bfloat16 else 8.0)


@pytest.mark.parametrize("N", [1, 7, 64, 1000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("inplace", [True, False])
def test_rotary_bit_identical(N, dtype, inplace):
    """MLA's interleaved rope (q [N, 8, 64] inside q, k [N, 64] inside kv_a) and the draft's neox rope
    (32 q heads, 8 kv heads of 128): with fp fusion off the kernel rounds exactly as the torch reference."""
    poison_allocator()
    check_rotary(N, HEADS, 1, ROPE, True, dtype, inplace=inplace, device="cuda", seed=N, max_ulp=0.0)
    check_rotary(N, 32, 8, 128, False, dtype, inplace=inplace, device="cuda", seed=N + 1, max_ulp=0.0)


@pytest.mark.parametrize("one_launch", [False, True])
@pytest.mark.parametrize("N", [1, 8, 333])
def test_latent_to_cache(N, one_launch):
    """MLA's kv_a norm and k rope scatter straight into the paged cache rows (no index_put); with one_launch
    the norm runs inside the rotary launch, as the layer calls it."""
    poison_allocator()
    check_latent_to_cache(N, HEADS, KV_LORA, ROPE, device="cuda", seed=N, one_launch=one_launch)


GEMV_SHAPES = [  # (N, K, heads, layout, epilogue): every dense projection of a Kimi TP=8 rank layer
    (1536, 7168, 1, "nk", None), (576, 7168, 1, "nk", None), (1536, 1536, 1, "nk", None),
    (512, 128, 8, "kn", None), (128, 512, 8, "nk", None), (7168, 1024, 1, "nk", "add"),
    (384, 7168, 1, "nk", "f32"), (256, 7168, 1, "nk", "gated"), (7168, 256, 1, "nk", None),
    (2304, 7168, 1, "nk", "gated"), (1000, 333, 1, "nk", None),  # irregular: masks on N and K
]


@pytest.mark.parametrize("T", [1, 4, 16])
@pytest.mark.parametrize("N,K,heads,layout,epi", GEMV_SHAPES)
def test_gemv_projections(T, N, K, heads, layout, epi):
    """The skinny GEMM at real shapes with its heuristic config (split-K handshake across up to ~500
    programs on the GPU), against a float64 product: all elements written, rows independent of T, counters
    reset."""
    poison_allocator()
    check_gemv(T, N, K, heads, layout, epi, device="cuda", seed=T * 7 + N)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("N,K,norm", [(1536, 1536, True), (1536, 1536, False), (3072, 1536, True),
                                      (1000, 1100, False)], ids=["kimi_q_b_norm", "kimi_q_b", "dsv3_q_b_norm",
                                                                 "irregular"])
def test_gemv_fma(T, N, K, norm):
    """The CUDA-core GEMV at q_b's shapes (Kimi, DeepSeek-V3 TP=8 ranks) and an irregular one: against a float64
    product, every row bit-identical alone, in pairs and fours as in the batch (its 1-, 2- and 4-row programs),
    triton_gemv's dispatch equal to it, the tensor-core kernel within the rounding."""
    poison_allocator()
    check_gemv_fma(T, N, K, norm, device="cuda", seed=T * 11 + N + K)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("N1,N2,K", [(384, 256, 7168), (256, 256, 7168), (101, 37, 2050)],
                         ids=["kimi_router_shared", "dsv3_router_shared", "irregular"])
def test_gemv_fma_pair(T, N1, N2, K):
    """The CUDA-core router + shared gate/up pair at Kimi's and DeepSeek-V3's TP=8 rank shapes and an irregular
    one: against float64 products, every row bit-identical alone and in groups of 2, 4, 8 as in the batch,
    triton_gemv_pair's dispatch equal to it, the tensor-core pair within the rounding."""
    poison_allocator()
    check_gemv_fma_pair(T, N1, N2, K, device="cuda", seed=T * 7 + N1 + K)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("N1,N2,K,lanes", [(1536, 576, 7168, 128), (1536, 576, 7168, 256), (101, 37, 2050, 128)],
                         ids=["qkv_a_l128", "qkv_a_l256", "irregular"])
def test_gemv_fma_pair_plain(T, N1, N2, K, lanes):
    """MLA's q_a + kv_a as a plain CUDA-core pair (the default since the thirty-seventh session) at the Kimi /
    DeepSeek-V3 TP=8 rank's shape (the default 128 lanes and the 256 it was paired against) and an irregular one:
    against float64 products, every row bit-identical alone and in groups of 2, 4, 8 as in the batch,
    triton_gemv_pair's dispatch equal to it (at the default config), the tensor-core pair within the rounding."""
    from sglang_eagle3.kernels.gemv import fma_pair_config

    poison_allocator()
    cfg = None if lanes == 128 else dict(fma_pair_config(N1, N2, K, gated=False), LANES=256, num_warps=8)
    check_gemv_fma_pair(T, N1, N2, K, device="cuda", seed=T * 3 + N1 + K + lanes, config=cfg, gated=False)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("N1,N2,K,residual", [(1536, 576, 7168, True), (1536, 576, 7168, False), (101, 37, 2050, True)],
                         ids=["qkv_a_residual", "qkv_a_first_layer", "irregular"])
def test_gemv_fma_pair_norm(T, N1, N2, K, residual):
    """The decoder layer's input RMSNorm (and residual add) folded into the CUDA-core q_a + kv_a pair (the input_norm
    fusion) at the Kimi / DeepSeek-V3 TP=8 rank's shape and an irregular one: against float64 products of the
    normed stream, the stream exactly torch's h + residual's rounding, every row bit-identical alone and in groups of
    2, 4, 8 as in the batch, triton_gemv_pair's dispatch equal to it, the tensor-core fold within the rounding and
    the RMSNorm kernel then the pair far inside it."""
    poison_allocator()
    check_gemv_fma_pair_norm(T, N1, N2, K, residual=residual, device="cuda", seed=T * 13 + N1 + K + residual)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("B,N,K,view", [(8, 128, 512, True), (16, 128, 512, False), (3, 37, 1000, False)],
                         ids=["kimi_w_uv", "dsv3_w_uv", "irregular"])
def test_gemv_fma_heads(T, B, N, K, view):
    """The CUDA-core GEMV per head at MLA's W_UV on Kimi's and DeepSeek-V3's TP=8 ranks (8 / 16 heads, from strided
    views of kv_b_proj's weight for Kimi) and an irregular shape: against a float64 product, each head equal to the
    2-D form, rows bit-identical alone and in groups as in the batch, triton_gemv's dispatch equal to it, the
    tensor-core kernel within the rounding."""
    poison_allocator()
    check_gemv_fma_heads(T, B, N, K, device="cuda", seed=T * 5 + B + K, w_view=view)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("kind", ["kimi_q_b_norm", "kimi_router_shared", "kimi_w_uv", "irregular_pair"])
def test_gemv_fma_lanes_first(T, kind):
    """The CUDA-core forms with the weight tile lanes first (the config key LANES_FIRST, kernels/gemv.py lanes_first:
    the A/B candidate) at the Kimi TP=8 rank's shapes: the same checks as the default tile (float64 products, rows
    bit-identical in any grouping: decode == verify)."""
    from sglang_eagle3.kernels.gemv import fma_config, fma_pair_config

    poison_allocator()
    seed = T * 13 + len(kind)
    if kind == "kimi_q_b_norm":
        check_gemv_fma(T, 1536, 1536, True, device="cuda", seed=seed,
                       config={**fma_config(1536, 1536), "LANES_FIRST": True})
    elif kind == "kimi_w_uv":
        check_gemv_fma_heads(T, 8, 128, 512, device="cuda", seed=seed, w_view=True,
                             config={**fma_config(128, 512), "LANES_FIRST": True})
    else:
        n1, n2, k = (384, 256, 7168) if kind == "kimi_router_shared" else (101, 37, 2050)
        check_gemv_fma_pair(T, n1, n2, k, device="cuda", seed=seed,
                            config={**fma_pair_config(n1, n2, k), "LANES_FIRST": True})


@pytest.mark.parametrize("T", [1, 4, 16])
def test_gemv_q_b_with_q_a_layernorm(T):
    """MLA's q_b [1536 -> 8 x 192] with the q_a RMSNorm folded into its launch."""
    poison_allocator()
    check_gemv(T, 1536, 1536, device="cuda", seed=40 + T, norm=True)


@pytest.mark.parametrize("T", [1, 4, 16])
def test_gemv_pair_q_a_kv_a(T):
    """MLA's q_a [1536] and kv_a [576] projections of one x in one launch, split-K across both."""
    poison_allocator()
    check_gemv_pair(T, 1536, 576, HIDDEN, device="cuda", seed=T)
    check_gemv_pair(T, 1536, 576, HIDDEN, device="cuda", seed=T + 1,
                    config={"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT": 6, "num_warps": 4, "num_stages": 4})


@pytest.mark.parametrize("T", [1, 4, 16])
def test_gemv_pair_router_and_shared_expert(T):
    """The router (384 experts, float32 logits) and the shared expert's gate/up + SiLU (256 = 2048/8) in one
    launch, against float64 products and against the single-matrix kernel with the same config."""
    poison_allocator()
    check_gemv_pair(T, EXPERTS, INTER, HIDDEN, device="cuda", seed=50 + T, router=True)
    check_gemv_pair(T, EXPERTS, INTER, HIDDEN, device="cuda", seed=60 + T, router=True,
                    config={"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT": 11, "num_warps": 4, "num_stages": 2})


@pytest.mark.parametrize("B,S", [(1, 1), (2, 4), (3, 7)])
def test_model_forward_kernels_vs_reference(B, S):
    """A tiny Kimi-shaped bf16 model, INT4 experts: every kernel against every reference through the
    layers (GEMV MoE path for B*S <= 8, the tile path above)."""
    check_model_forward("cuda", torch.bfloat16, tol=3e-2, B=B, S=S, seed=B * 10 + S, hidden=256)


@pytest.mark.parametrize("T", [1, 4])
def test_kernels_per_moe_layer(T):
    """Launch budget of one MoE decoder layer (eager step, counted by the profiler). By the code, with the
    default launch fusions (env.NO_FUSE unset: env.DEFAULT_NO_FUSE off): 2 norms (input and post-attention,
    each with its residual add), 1 rope (q in place, k and the kv_a norm of the latent into the cache), MLA (1
    at this test's short context, where one split needs no merge; 2 at long contexts), GEMV launches: q_a +
    kv_a (one), q_b (with the q_a norm), W_UK, W_UV, o_proj, router + shared gate/up (one, SiLU * up fused),
    shared down; moe_topk; 2 INT4 GEMV MoE kernels (gate_up, which lays out x itself, and down with the shared
    add folded in) = 14 (14 measured on the H200 at 07e39a0; 12 with the input-norm fold and the routing tail,
    which are off by default as measured slower; 19 as the second session shipped; ~90 at first)."""
    counts = cuda_kernels_per_moe_layer(T)
    print(f"T={T}: {counts}")
    assert counts["per_moe_layer"] <= 14, counts


def test_graph_replay_equals_eager(int4_weights):
    """All ops captured in one CUDA graph; replay after changing the inputs in place equals eager."""
    p13, s13, p2, s2 = int4_weights
    T, B, page_size = 4, 2, 64
    logits = torch.randn(B * T, EXPERTS, device="cuda")
    bias = torch.rand(EXPERTS, device="cuda") * 0.1
    x = torch.randn(B * T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    qn, qr, kv, pt, seq = make_mla_inputs(B, T, HEADS, KV_LORA, ROPE, page_size, [900, 4000], "cuda", seed=7)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=KV_LORA, sm_scale=0.1352)
    norm_w = torch.rand(HIDDEN, device="cuda", dtype=torch.bfloat16) + 0.5
    pos = torch.randint(0, 4096, (B * T,), device="cuda")
    cos, sin = torch.rand(4096, ROPE // 2, device="cuda"), torch.rand(4096, ROPE // 2, device="cuda")
    q_full = torch.randn(B * T, HEADS, 128 + ROPE, device="cuda", dtype=torch.bfloat16)
    kv_a = torch.randn(B * T, KV_LORA + ROPE, device="cuda", dtype=torch.bfloat16)

    def step():
        w, ids = kernels.moe_topk(logits, bias, top_k=TOP_K, n_group=1, topk_group=1, routed_scaling_factor=2.827)
        moe = kernels.fused_moe_int4(x, p13, s13, p2, s2, w, ids)  # B*T = 8 tokens: the GEMV path
        attn = kernels.mla_attention(qn, qr, kv, pt, seq, **kw)
        normed, res = kernels.rms_norm(x, norm_w, 1e-6, moe)
        q_rope, k_rope = kernels.apply_rotary(q_full[..., 128:], kv_a[:, KV_LORA:], pos, cos, sin, interleaved=True)
        return moe, attn, normed, res, q_rope, k_rope

    step()  # compile and tune outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs_g = step()
    logits.copy_(torch.randn_like(logits))
    x.copy_(torch.randn_like(x))
    seq.copy_(torch.tensor([1500, 3001], dtype=torch.int32))
    pos.copy_(torch.randint(0, 4096, pos.shape, device="cuda"))
    q_full.copy_(torch.randn_like(q_full))
    graph.replay()
    torch.cuda.synchronize()
    outs_e = step()
    for name, g, e in zip(("MoE", "MLA", "rms_norm", "residual", "q rope", "k rope"), outs_g, outs_e, strict=True):
        assert torch.equal(g, e), f"{name} replay differs from eager"


# --- MoE batches above decode sizes: the GEMV path up to 128 tokens, the tile path (prefill) above ----------
@pytest.mark.parametrize("T,block_m,pool", [(16, 16, None), (256, 16, None), (2048, 64, None), (300, 16, 12)])
def test_moe_align_real_shapes(T, block_m, pool):
    """The routing plan at 384 experts with the GPU's atomics ranking the pairs (the interpreter runs them in
    order): every pair once, in a block of its expert, blocks packed."""
    from moe_tile_checks import check_moe_align

    check_moe_align(T, EXPERTS, TOP_K, block_m, device="cuda", seed=T, pool=pool, invalid=3)


def _ref_int4_chunked(x, p13, s13, p2, s2, topk_w, ids, add=None, chunk=32):
    """ref_fused_moe_int4 a few tokens at a time (a token's reference output depends on nothing else; the
    reference gathers every pair's expert, too much memory at prefill sizes)."""
    outs = [kernels.ref_fused_moe_int4(x[i:i + chunk], p13, s13, p2, s2, topk_w[i:i + chunk], ids[i:i + chunk], 32,
                                       None if add is None else add[i:i + chunk])
            for i in range(0, x.shape[0], chunk)]
    return torch.cat(outs)


@pytest.mark.parametrize("T,skew,path", [(9, False, "tile"), (24, True, "tile"), (100, False, "gemv"),
                                         (100, False, "tile"), (128, True, "gemv"), (256, False, None),
                                         (1000, True, None)])
def test_fused_moe_int4_large_batch_vs_reference(int4_weights, T, skew, path):
    """Both INT4 paths at batched-verify and prefill sizes (None: the launcher's choice, the tile path above
    GEMV_MAX_TOKENS), the shared experts' output added in the final store."""
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    shared = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.1
    topk_w, ids = routing(T, skew, 3000 + T)
    poison_allocator()
    out = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path=path)
    err = rel_err(out, _ref_int4_chunked(x, p13, s13, p2, s2, topk_w, ids, shared))
    assert err < 1e-2, f"INT4 MoE rel err {err} ({T=} {skew=} {path=})"


SWAP_CONFIGS = [  # the swap kernels (weights as the dot's M) at plan blocks of 16, 64 and 128 pairs
    {"gate_up": {"SWAP": True, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_W": 16, "num_warps": 4, "num_stages": 1},
     "down": {"BLOCK_N": 64, "BLOCK_W": 16, "num_warps": 4, "num_stages": 1}},
    {"gate_up": {"SWAP": True, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_W": 16, "num_warps": 8, "num_stages": 1},
     "down": {"BLOCK_N": 128, "BLOCK_W": 16, "num_warps": 8, "num_stages": 1}},
    {"gate_up": {"SWAP": True, "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_W": 8, "num_warps": 8, "num_stages": 1},
     "down": {"BLOCK_N": 64, "BLOCK_W": 8, "num_warps": 4, "num_stages": 1}},
]


@pytest.mark.parametrize("cfg", range(len(SWAP_CONFIGS)))
@pytest.mark.parametrize("T,skew", [(40, True), (200, False), (1000, True)])
def test_fused_moe_int4_swap_vs_reference(int4_weights, T, skew, cfg):
    """The tile path's swap kernels (scaled weights rounded to bf16 before the dot) against the float
    reference and against the group path (exact weights), with the shared experts' add; and a token's output
    alone equals its row in the batch, bit for bit."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    shared = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.1
    topk_w, ids = routing(T, skew, 6000 + T)
    poison_allocator()
    config = SWAP_CONFIGS[cfg]
    out = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="tile", config=config)
    err = rel_err(out, _ref_int4_chunked(x, p13, s13, p2, s2, topk_w, ids, shared))
    assert err < 1e-2, f"swap rel err {err} ({T=} {skew=} {config=})"
    group = {stage: tuning.get_config(f"fused_moe_int4_{stage}", x.device, "tokens", T)
             for stage in ("gate_up", "down")}
    group["gate_up"].pop("SWAP", None)
    exact = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="tile", config=group)
    assert rel_err(out, exact) < 1e-2, f"swap vs group path rel err {rel_err(out, exact)}"
    for t in (0, T // 2, T - 1):
        one = triton_fused_moe_int4(x[t:t + 1], p13, s13, p2, s2, topk_w[t:t + 1], ids[t:t + 1], 32,
                                    shared[t:t + 1], path="tile", config=config)
        assert torch.equal(one[0], out[t]), (t, (one[0].float() - out[t].float()).abs().max().item())


@pytest.mark.parametrize("T", [12, 40])
def test_fused_moe_int4_tile_token_independent_of_batch(int4_weights, T):
    """A token's tile-path output is bit-identical alone and in a batch whose tokens share its experts (blocks
    of several rows, pairs ranked by atomics in a varying order), at the table's config for the batch."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(T, True, 4000 + T)
    cfg = {stage: tuning.get_config(f"fused_moe_int4_{stage}", x.device, "tokens", T) for stage in ("gate_up", "down")}
    batch = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, config=cfg, path="tile")
    again = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, config=cfg, path="tile")
    assert torch.equal(batch, again), "two calls on the same batch differ"
    for t in range(0, T, 5):
        one = triton_fused_moe_int4(x[t:t + 1], p13, s13, p2, s2, topk_w[t:t + 1], ids[t:t + 1], 32, config=cfg,
                                    path="tile")
        assert torch.equal(one[0], batch[t]), (t, (one[0].float() - batch[t].float()).abs().max().item())


@pytest.mark.parametrize("path,T", [("tile", 24), ("dot", 4)])
def test_fused_moe_int4_graph_replay(int4_weights, path, T):
    """The tile path (its routing plan built inside the graph) and the dot path (its split counters reset by
    the last arrival) captured in a CUDA graph replay new routing and inputs as eager computes them, routings
    with shared experts and without."""
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(T, path == "dot", 5000)
    moe = functools.partial(triton_fused_moe_int4, w13_packed=p13, w13_scale=s13, w2_packed=p2, w2_scale=s2,
                            path=path)
    out = moe(x, topk_weights=topk_w, topk_ids=ids)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe(x, topk_weights=topk_w, topk_ids=ids)
    for seed in (5001, 5002):
        new_w, new_ids = routing(T, seed == 5001, seed)
        x.copy_(torch.randn_like(x))
        topk_w.copy_(new_w)
        ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, moe(x, topk_weights=topk_w, topk_ids=ids)), (path, seed)


@pytest.mark.parametrize("R,V", [(1, 163840), (16, 163840), (37, 1000)])
def test_gumbel_argmax_kimi_vocab(R, V):
    """The sampling kernel's tokens equal the reference's (up to near ties from a last-place log difference)."""
    res = check_gumbel_argmax(R, V, device="cuda", seed=R)
    assert res["near_tie_differences"] <= 1, res


@pytest.mark.parametrize("mass", [True, False], ids=["top_p", "top_k"])
@pytest.mark.parametrize("R,V", [(1, 163840), (6, 163840), (64, 163840), (29, 1000)])
def test_top_threshold_kimi_vocab(R, V, mass):
    """The radix select's top_p / top_k thresholds equal the reference's (top_p: but at a float-rounding
    boundary), one row to a batch of 64 (16 requests verifying 4 tokens) at Kimi's vocabulary."""
    res = check_top_threshold(R, V, device="cuda", seed=R + 100 * mass, mass=mass)
    assert res["boundary_differences"] <= 1, res


@pytest.mark.parametrize("V", [3000, 163840])
def test_top_threshold_edges(V):
    """One finite token, underflowed weights, ties, masked thirds: the select equals the reference exactly."""
    check_top_threshold_edges(V, device="cuda")


@pytest.mark.parametrize("R,V", [(12, 163840), (30, 7001)])
def test_filters_kernel_vs_sort_kimi_vocab(R, V):
    """The sampler's filters through the radix selects keep what the sort path keeps, and a row alone keeps what it
    keeps in a batch with every filter on."""
    res = check_filters_kernel_vs_sort(R, V, device="cuda", seed=R)
    assert res["boundary_differences"] <= 1, res
