"""Programmatic dependent launch on the GPU: a chain of skinny GEMMs at one Kimi-K2.5 TP=8 rank's shapes,
each launch consuming its predecessor's output, gives the same numbers with PDL on (with nothing before the
grid-dependency wait, or the L2 prefetch of the weight slab there) as with PDL off, eagerly and replayed from
a CUDA graph; MLA attention launched right after the kernel that writes this step's latents reads them; the
INT4 MoE's down kernel, which loads its routing and weights before its wait, reads this step's routing. A
launch that read its input before the wait would read stale values (NaN from the poisoned allocator, or the
ones the test writes over a replay's outputs) and fail here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_kernels_gpu import poison_allocator  # noqa: E402

from sglang_eagle3.kernels.gemv import triton_gemv, triton_gemv_pair  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

HIDDEN, Q_LORA, KV_A, EXPERTS, SHARED = 7168, 1536, 576, 384, 256


def _chain(weights: dict, x: torch.Tensor) -> list[torch.Tensor]:
    """q_a + kv_a -> q_b (with the q_a norm) -> o_proj-like [HIDDEN, Q_LORA] + residual -> router + shared
    expert -> shared down + residual: every launch reads what the one before wrote."""
    q_a, kv_a = triton_gemv_pair(x, weights["q_a"], weights["kv_a"])
    q = triton_gemv(q_a, weights["q_b"], norm_weight=weights["norm"], eps=1e-6)
    h = triton_gemv(q, weights["o"], add=x)
    logits, act = triton_gemv_pair(h, weights["router"], weights["gate"], w2_up=weights["up"],
                                   out1_dtype=torch.float32)
    out = triton_gemv(act, weights["down"], add=h)
    return [q_a, kv_a, q, h, logits, act, out]


def _weights(seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def w(*shape, scale=0.02):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    return {"q_a": w(Q_LORA, HIDDEN), "kv_a": w(KV_A, HIDDEN), "q_b": w(Q_LORA, Q_LORA), "o": w(HIDDEN, Q_LORA),
            "norm": (1 + w(Q_LORA, scale=0.1)).contiguous(), "router": w(EXPERTS, HIDDEN), "gate": w(SHARED, HIDDEN),
            "up": w(SHARED, HIDDEN), "down": w(HIDDEN, SHARED)}


@pytest.mark.parametrize("l2_prefetch", ["0", "1"])
@pytest.mark.parametrize("T", [1, 4, 7])
def test_pdl_chain_equals_no_pdl(T, l2_prefetch, monkeypatch):
    poison_allocator()
    weights = _weights(T)
    x = (torch.randn(T, HIDDEN, device="cuda") * 0.5).to(torch.bfloat16)
    monkeypatch.setenv("SGLANG_EAGLE3_PDL", "0")
    ref = [t.clone() for t in _chain(weights, x)]
    monkeypatch.setenv("SGLANG_EAGLE3_PDL", "1")
    monkeypatch.setenv("SGLANG_EAGLE3_PDL_L2_PREFETCH", l2_prefetch)
    eager = _chain(weights, x)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    x_static = x.clone()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        replayed = _chain(weights, x_static)
    torch.cuda.current_stream().wait_stream(stream)
    for t in replayed:  # nothing left over from the capture's own run can pass for a replay's output
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    names = ["q_a", "kv_a", "q_b", "o_proj", "router", "shared act", "shared down"]
    for name, r, e, g in zip(names, ref, eager, replayed, strict=True):
        assert not torch.isnan(e).any() and not torch.isnan(g).any(), f"{name}: NaN ({T=} {l2_prefetch=})"
        assert torch.equal(g, e), f"{name}: replay differs from eager: {(g.float() - e.float()).abs().max()}"
        assert torch.equal(e, r), f"{name}: PDL differs from no PDL: {(e.float() - r.float()).abs().max()}"


@pytest.mark.parametrize("T,ctx", [(1, 1024), (4, 1024), (4, 8192)])
def test_pdl_mla_reads_this_steps_keys_after_the_wait(T, ctx, monkeypatch):
    """The MLA launch right after the launch that writes this step's latents into the cache (the RMSNorm
    kernel scattering into the cache rows), both PDL, in a graph: the new rows, NaN before every replay, are
    read as written. (A check of the wait's placement, not a proof: a race needs the timing to line up.)"""
    import math

    from kernel_checks import make_mla_inputs

    from sglang_eagle3 import kernels

    monkeypatch.setenv("SGLANG_EAGLE3_PDL", "1")
    monkeypatch.delenv("SGLANG_EAGLE3_PDL_SKIP", raising=False)
    H, Dc, Dr, page = 8, 512, 64, 64
    qn, qr, kv, pt, seq = make_mla_inputs(1, T, H, Dc, Dr, page, [ctx], "cuda", seed=T)
    pos = torch.arange(ctx - T, ctx, device="cuda")
    rows = (pt[0, pos // page].long() * page + pos % page)
    src = torch.randn(T, Dc, device="cuda").to(torch.bfloat16)
    norm_w = torch.ones(Dc, dtype=torch.bfloat16, device="cuda")
    kw = dict(tokens_per_req=T, page_size=page, kv_lora_rank=Dc, sm_scale=1.0 / math.sqrt(192))

    def step():
        kernels.rms_norm(src, norm_w, 1e-6, out=kv[:, :Dc], out_rows=rows, use_triton=True)
        return kernels.triton_mla_attention(qn, qr, kv, pt, seq, **kw)

    step()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = step()
    torch.cuda.current_stream().wait_stream(stream)
    stale = 0
    for _ in range(20):
        kv[rows, :Dc] = float("nan")
        out.fill_(float("nan"))
        graph.replay()
        stale += int(torch.isnan(out).any())  # a NaN: this step's keys were read before they were written
    ref = kernels.ref_mla_attention(qn, qr, kv, pt, seq, **kw)
    assert stale == 0, f"{stale} of 20 replays read this step's keys before the write"
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("T", [1, 2, 4, 8])
def test_pdl_moe_down_preload_reads_this_steps_routing(T, monkeypatch):
    """Router logits -> top-k -> INT4 gate_up -> down, all PDL, in a graph, the down kernel loading its routing
    and every slot's weights before its wait (PRELOAD): new logits and x before every replay, so a down kernel
    that read the routing of the step before, or act before gate_up wrote it, would be off. Each replay equals
    the same kernels run eagerly with PDL off, bit for bit, and the slot loop (another summation order) to
    within 1% of the output's scale."""
    from kernel_checks import make_moe_inputs

    from sglang_eagle3 import kernels
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    E, H, I, top_k = 64, HIDDEN, 256, 8  # a TP=8 rank's expert slice (I/8 = 32 words: one chunk)
    x, p13, s13, p2, s2, _, _ = make_moe_inputs(T, E, H, I, top_k, "cuda", True, seed=T)
    bias = torch.randn(E, device="cuda") * 0.1
    logits = torch.randn(T, E, device="cuda")

    def step(preload: bool):
        w, ids = kernels.moe_topk(logits, bias, top_k=top_k, n_group=1, topk_group=1, routed_scaling_factor=2.5,
                                  use_triton=True)
        down = {**tuning.get_config("fused_moe_int4_gemv_down", x.device, "tokens", T), "PRELOAD": preload}
        gate_up = tuning.get_config("fused_moe_int4_gemv_gate_up", x.device, "tokens", T)
        return triton_fused_moe_int4(x, p13, s13, p2, s2, w, ids, 32, path="gemv",
                                     config={"gate_up": gate_up, "down": down})

    monkeypatch.setenv("SGLANG_EAGLE3_PDL", "1")
    monkeypatch.delenv("SGLANG_EAGLE3_PDL_SKIP", raising=False)
    monkeypatch.delenv("SGLANG_EAGLE3_MOE_DOWN_PRELOAD", raising=False)
    step(True)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = step(True)
    torch.cuda.current_stream().wait_stream(stream)
    for i in range(8):
        logits.copy_(torch.randn(T, E, device="cuda") * (1 + i))
        x.copy_(torch.randn(T, H, device="cuda").to(x.dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        monkeypatch.setenv("SGLANG_EAGLE3_PDL", "0")
        same, slot_loop = step(True), step(False)
        monkeypatch.setenv("SGLANG_EAGLE3_PDL", "1")
        assert not torch.isnan(out).any(), f"replay {i}: NaN"
        assert torch.equal(out, same), (
            f"replay {i} ({T=}): PRELOAD under PDL differs from PRELOAD without PDL by "
            f"{(out.float() - same.float()).abs().max()}")
        scale = slot_loop.float().abs().max()
        diff = (out.float() - slot_loop.float()).abs().max()
        assert diff <= 1e-2 * scale, f"replay {i} ({T=}): PRELOAD vs slot loop {diff} (outputs up to {scale})"
