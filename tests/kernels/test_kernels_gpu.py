"""Triton kernels vs references on the GPU at real shapes: one Kimi-K2.5 TP=8 rank (8 heads, kv_lora 512,
rope 64; 384 experts, H=7168, I=2048/8=256, top-8), contexts 1..32k, T=1..64, partially filled pages.

Outputs come from a poisoned allocator (the caching allocator's blocks are filled with NaN first), so an
element the kernel never writes shows up as NaN, which no bound accepts.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_checks import check_moe_topk, make_mla_inputs, rel_err  # noqa: E402

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


def test_graph_replay_equals_eager(int4_weights):
    """All four ops captured in one CUDA graph; replay after changing the inputs in place equals eager."""
    p13, s13, p2, s2 = int4_weights
    T, B, page_size = 4, 2, 64
    logits = torch.randn(B * T, EXPERTS, device="cuda")
    bias = torch.rand(EXPERTS, device="cuda") * 0.1
    x = torch.randn(B * T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    qn, qr, kv, pt, seq = make_mla_inputs(B, T, HEADS, KV_LORA, ROPE, page_size, [900, 4000], "cuda", seed=7)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=KV_LORA, sm_scale=0.1352)

    def step():
        w, ids = kernels.moe_topk(logits, bias, top_k=TOP_K, n_group=1, topk_group=1, routed_scaling_factor=2.827)
        moe = kernels.fused_moe_int4(x, p13, s13, p2, s2, w, ids)
        attn = kernels.mla_attention(qn, qr, kv, pt, seq, **kw)
        return moe, attn

    step()  # compile and tune outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_g, attn_g = step()
    logits.copy_(torch.randn_like(logits))
    x.copy_(torch.randn_like(x))
    seq.copy_(torch.tensor([1500, 3001], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    moe_e, attn_e = step()
    assert torch.equal(moe_g, moe_e), "MoE replay differs from eager"
    assert torch.equal(attn_g, attn_e), "MLA replay differs from eager"
