"""The INT4 MoE mma path (tensor-core gate_up for verify batches, then the GEMV path's down kernel) on the GPU
at one Kimi-K2.5 TP=8 rank's shapes (384 experts, H=7168, I=256, top-8), T = 2..8, tokens routed over all
experts or sharing a few: against ref_fused_moe_int4 and the GEMV path (outputs and the fp32 gate_up
activations), bit for bit on exact inputs, per token independent of the batch, and replayed from a CUDA
graph as eager computes it. Outputs come from a poisoned allocator (see test_kernels_gpu.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_checks import rel_err  # noqa: E402
from moe_mma_checks import MMA_ONE_SLICE, MMA_SMALL, check_mma_exact, gate_up_acts  # noqa: E402
from test_kernels_gpu import EXPERTS, HIDDEN, TOP_K, moe_weights, poison_allocator  # noqa: E402

from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHARED_POOL = 12  # a verify step of 4 tokens routed ~10-12 distinct experts on the Kimi slice


@pytest.fixture(scope="module")
def int4_weights():
    return moe_weights(True, 3)


def routing(T: int, pool: int, seed: int, offset: int = 0):
    """topk (weights [T, 8] summing to 1, ids [T, 8] int32) over experts offset .. offset + pool - 1."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.stack([torch.randperm(pool, generator=g)[:TOP_K] + offset for _ in range(T)]).int().cuda()
    w = torch.rand(T, TOP_K, generator=g)
    return (w / w.sum(-1, keepdim=True)).cuda(), ids


def mma_config(T: int) -> dict:
    """The mma path's table config (its defaults until the table has one), never autotuned: a tune here would
    be cached for the op whatever the shapes it ran at."""
    dev = torch.device("cuda")
    return {"gate_up": tuning.get_config("fused_moe_int4_mma_gate_up", dev, "tokens", T),
            "down": tuning.get_config("fused_moe_int4_gemv_down", dev, "tokens", T)}


@pytest.mark.parametrize("pool", [EXPERTS, SHARED_POOL])
@pytest.mark.parametrize("T", [2, 3, 4, 5, 8])
def test_mma_vs_gemv_and_reference(int4_weights, T, pool):
    """Outputs (with the shared experts' output added in the last store) within bf16 rounding of the
    reference and of the GEMV path; the fp32 gate_up activations of the two paths within float32 rounding
    (they differ only in the order of the fp32 sums)."""
    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    shared = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.1
    topk_w, ids = routing(T, pool, 3000 + T)
    poison_allocator()
    mma = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="mma", config=mma_config(T))
    gemv = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, path="gemv")
    ref = kernels.ref_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared)
    act_mma, act_gemv = gate_up_acts([x, p13, s13, p2, s2, topk_w, ids])
    errs = {"mma_vs_ref": rel_err(mma, ref), "gemv_vs_ref": rel_err(gemv, ref), "mma_vs_gemv": rel_err(mma, gemv),
            "act_mma_vs_gemv": rel_err(act_mma, act_gemv)}
    print(f"T={T} pool={pool}: {errs}")
    assert errs["mma_vs_ref"] < 1e-2, errs
    assert errs["mma_vs_gemv"] < 2e-3, errs
    assert errs["act_mma_vs_gemv"] < 1e-5, errs


@pytest.mark.parametrize("config", ["table", MMA_SMALL, MMA_ONE_SLICE], ids=["table", "small", "one_slice"])
@pytest.mark.parametrize("T,E,I,top_k,skew", [(2, EXPERTS, 32, 8, False), (5, EXPERTS, 32, 8, True),
                                               (8, 64, 64, 4, False), (8, 64, 64, 4, True)])
def test_mma_exact(T, E, I, top_k, skew, config):
    """Bit for bit against the exact result on integer-valued bf16 inputs (H=256: the exactness bound of
    moe_mma_checks.exact_int4_moe_inputs), unmasked and masked tiles, one and several K slices."""
    check_mma_exact(T, E, 256, I, top_k, device="cuda", seed=T * 10 + E, skew=skew, dtype=torch.bfloat16,
                    config=mma_config(T) if config == "table" else config)


@pytest.mark.parametrize("T", [2, 4, 8])
def test_mma_token_independent_of_batch(int4_weights, T):
    """A token's output is bit-identical alone (T=1) and in a verify batch sharing its experts, under one
    config: each token is its own column of the tensor-core tiles, the K slices add up in slice order."""
    p13, s13, p2, s2 = int4_weights
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(T, SHARED_POOL, 4000 + T)
    cfg = mma_config(T)
    batch = triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, config=cfg, path="mma")
    for t in range(T):
        one = triton_fused_moe_int4(x[t:t + 1], p13, s13, p2, s2, topk_w[t:t + 1], ids[t:t + 1], 32, config=cfg,
                                    path="mma")
        assert torch.equal(one[0], batch[t]), (t, (one[0].float() - batch[t].float()).abs().max().item())


def test_mma_candidates_agree(int4_weights):
    """Every autotune candidate of the mma gate_up gives the GEMV path's activations (T=4, shared experts)."""
    p13, s13, p2, s2 = int4_weights
    x = torch.randn(4, HIDDEN, device="cuda", dtype=torch.bfloat16)
    topk_w, ids = routing(4, SHARED_POOL, 5000)
    args = [x, p13, s13, p2, s2, topk_w, ids]
    for cand in tuning.CANDIDATES["fused_moe_int4_mma_gate_up"]:
        act_mma, act_gemv = gate_up_acts(args, {"gate_up": cand})
        assert rel_err(act_mma, act_gemv) < 1e-5, (cand, rel_err(act_mma, act_gemv))


def test_mma_graph_replay_equals_eager(int4_weights):
    """The mma path captured in a CUDA graph (T=4, with the shared add), replayed after the inputs change in
    place, over all experts and over a few (different numbers of distinct experts: the grid's slots with no
    expert exit), equals eager each time; two replays per routing (the arrival counters are back at 0)."""
    p13, s13, p2, s2 = int4_weights
    T = 4
    x = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    shared = torch.randn(T, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.1
    topk_w, ids = routing(T, EXPERTS, 6000)
    cfg = mma_config(T)

    def step():
        return triton_fused_moe_int4(x, p13, s13, p2, s2, topk_w, ids, 32, shared, config=cfg, path="mma")

    step()  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = step()
    for i, (pool, offset) in enumerate(((EXPERTS, 0), (SHARED_POOL, 100), (TOP_K, 300), (EXPERTS, 0))):
        new_w, new_ids = routing(T, pool, 6001 + i, offset)
        topk_w.copy_(new_w)
        ids.copy_(new_ids)
        x.copy_(torch.randn_like(x))
        shared.copy_(torch.randn_like(shared) * 0.1)
        for _ in range(2):
            out_g.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            eager = step()
            assert torch.equal(out_g, eager), f"replay differs from eager ({pool=} {offset=})"
