"""Driver for Nsight Compute (ncu) on the decode kernels of one Kimi-K2.5 TP=8 rank at T=1: the GEMVs q_a + kv_a
(split-K over K = 7168), q_b (with the q_a norm) and o_proj, a read-only kernel of q_a + kv_a's bytes, MLA at
1k and 8k context (split + merge; mla_table: T = 1 and 4 at 1k in an 8448-slot table; mla_long: T = 1 and 4 at
32k in a 131072-slot table), the INT4 MoE (gate_up,
down; moe_verify: T=4 and 8 with tokens sharing experts; moe_uniform: T = 1, 4, 8 over all 384 experts, a trained
router's spread, beside a read-only kernel of 32 MB, down's bytes at T=4; moe_dot: the dot path's gate_up;
moe_tile: the tile path at 256 and 1024 tokens), the routing, each
launched a few times on fresh data (past the L2). ncu serialises kernels, so PDL overlap is absent here: this
is for the hardware counters of one launch (DRAM throughput, stall reasons, occupancy), not for timing the
chain.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
        --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats -s 8 \
        python benchmarks/ncu_decode.py [gemv fma_rows mla mla_table mla_long moe moe_verify moe_uniform moe_dot \
                                         moe_tile topk]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import (  # noqa: E402
    make_moe_weights,
    mla_case,
    moe_case,
    stream_read_kernel,
    topk_case,
)
from sglang_eagle3.kernels.gemv import triton_gemv, triton_gemv_fma_pair, triton_gemv_pair  # noqa: E402


def gemvs() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g, device="cuda") * 0.02).to(torch.bfloat16)

    x, attn = w(1, 7168), w(1, 1024)
    nw = torch.ones(1536, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        q_a, _ = triton_gemv_pair(x, w(1536, 7168), w(576, 7168))
        triton_gemv(q_a, w(1536, 1536), norm_weight=nw, eps=1e-6)
        triton_gemv(attn, w(7168, 1024))
        flat = w(2112 * 7168)  # q_a + kv_a's bytes, 16 programs a SM (the best grid at this size)
        out = torch.empty(4096, device="cuda")
        n = flat.numel()
        per = triton.cdiv(triton.cdiv(n, 132 * 16), 1024) * 1024
        stream_read_kernel[(triton.cdiv(n, per),)](flat, out, n, per, BLOCK=1024, num_warps=4)


def fma_rows() -> None:
    """The CUDA-core forms at T = 1, 2, 4 (one launch each, fresh weights): the router + shared gate/up pair
    (384 + 256 gated rows, K = 7168) and q_a + kv_a as that pair's form would run it (1536 + 576 rows, its gated
    half left out: a 576-row second matrix read as gate and up halves), for why their time grows with T while
    their bytes do not."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g, device="cuda") * 0.02).to(torch.bfloat16)

    for T in (1, 2, 4):
        x = w(T, 7168)
        triton_gemv_fma_pair(x, w(384, 7168), w(256, 7168), w(256, 7168), out1_dtype=torch.float32)
        triton_gemv_fma_pair(x, w(1536, 7168), w(288, 7168), w(288, 7168))


def main() -> None:
    parts = sys.argv[1:] or ["gemv", "mla", "moe", "topk"]
    if "gemv" in parts:
        gemvs()
    if "fma_rows" in parts:
        fma_rows()
    if "mla" in parts:
        for ctx in (1024, 8192):
            calls, *_ = mla_case(1, 1, ctx)
            for c in calls()[:3]:
                c()
    if "mla_table" in parts:  # 1k context in the step benchmark's 8448-slot table (most splits hold no key)
        for T in (1, 4):
            calls, *_ = mla_case(1, T, 1024, capacity=8448)
            for c in calls()[:2]:
                c()
    if "mla_long" in parts:  # 32k context in a 128k server's 131072-slot table, T = 1 and 4 (every split active)
        for T in (1, 4):
            calls, *_ = mla_case(1, T, 32768, capacity=131072)
            for c in calls()[:2]:
                c()
    if "moe" in parts:
        calls, *_ = moe_case(1, True, make_moe_weights(True))
        for c in calls()[:3]:
            c()
    if "moe_verify" in parts:  # verify batches whose tokens share experts (top-8 of the first 12)
        weights = make_moe_weights(True)
        for T in (4, 8):
            calls, *_ = moe_case(T, True, weights, path="gemv", pool=12)
            for c in calls()[:2]:
                c()
    if "moe_uniform" in parts:  # verify batches whose tokens share (almost) nothing: 31 experts a layer at T=4
        weights = make_moe_weights(True)
        for T in (1, 4, 8):
            calls, *_ = moe_case(T, True, weights, path="gemv")
            for c in calls()[:2]:
                c()
        flat = torch.empty(32 << 20, dtype=torch.uint8, device="cuda").view(torch.bfloat16)  # 16 programs a SM
        out = torch.empty(4096, device="cuda")
        n = flat.numel()
        per = triton.cdiv(triton.cdiv(n, torch.cuda.get_device_properties(0).multi_processor_count * 16), 1024) * 1024
        stream_read_kernel[(triton.cdiv(n, per),)](flat, out, n, per, BLOCK=1024, num_warps=4)
    if "moe_dot" in parts:  # the dot path (bf16 weights, split 4) at T=1 and at T=4 on 12 shared experts
        weights = make_moe_weights(True)
        config = {"gate_up": {"BLOCK_N": 32, "BLOCK_W": 16, "num_warps": 4, "EXACT": False, "SPLIT": 4},
                  "down": {"BLOCK_N": 32, "BLOCK_W": 32, "num_warps": 4, "PRELOAD": False}}
        for T, pool in ((1, 384), (4, 12)):
            calls, *_ = moe_case(T, True, weights, path="dot", pool=pool)
            for c in calls(config=config)[:2]:
                c()
    if "moe_tile" in parts:  # the tile path (prefill sizes; the swap kernels at the sm_90 table) at 256 and 1024
        weights = make_moe_weights(True)
        for T in (256, 1024):
            calls, *_ = moe_case(T, True, weights, path="tile")
            for c in calls()[:2]:
                c()
    if "topk" in parts:
        calls, *_ = topk_case(1)
        for c in calls()[:3]:
            c()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
