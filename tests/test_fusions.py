"""Launch fusions (env.NO_FUSE): parsing of the knob, and the fused inference path computes what the unfused
one does (here through the torch references on CPU, or the Triton kernels under the interpreter with
SGLANG_EAGLE3_TRITON_ON_CPU=1; the Triton kernels of each fusion are checked against their references in
tests/kernels)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from sglang_eagle3 import env


def test_fusion_knob(monkeypatch):
    monkeypatch.delenv(env.NO_FUSE.name, raising=False)  # the default: all but DEFAULT_NO_FUSE
    assert [n for n in env.FUSIONS if not env.fusion_on(n)] == [n for n in env.FUSIONS
                                                                if n in env.DEFAULT_NO_FUSE.split(",")]
    monkeypatch.setenv(env.NO_FUSE.name, "")
    assert all(env.fusion_on(n) for n in env.FUSIONS)
    monkeypatch.setenv(env.NO_FUSE.name, " kv_norm, router_shared")
    assert [n for n in env.FUSIONS if not env.fusion_on(n)] == ["kv_norm", "router_shared"]
    monkeypatch.setenv(env.NO_FUSE.name, "input_norm")
    assert [n for n in env.FUSIONS if not env.fusion_on(n)] == ["input_norm"]
    monkeypatch.setenv(env.NO_FUSE.name, "router_topk")
    assert [n for n in env.FUSIONS if not env.fusion_on(n)] == ["router_topk"]
    monkeypatch.setenv(env.NO_FUSE.name, "all")
    assert not any(env.fusion_on(n) for n in env.FUSIONS)
    monkeypatch.setenv(env.NO_FUSE.name, "qa_norm,kv_nrom")
    with pytest.raises(ValueError, match="kv_nrom"):
        env.fusion_on("qa_norm")


def _verify_logits(monkeypatch, no_fuse: str, dtype, seed: int, pin_routing: bool = False):
    """(logits, KV caches, calls) of one verify step, calls counting the kernels.gemv_pair calls that took a
    layer's input norm ("folds"), the gemv_pair or gemv calls that routed ("routes") and the gemv calls with a
    rotary beside them ("ropes"). ``pin_routing``: every token picks the same experts
    (tests/kernels/fold_checks.pin_routing)."""
    from sglang_eagle3 import kernels
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.testing import randomize, tiny_config, verify_batch_on_cpu

    sys.path.insert(0, str(Path(__file__).parent / "kernels"))
    import fold_checks

    monkeypatch.setenv(env.NO_FUSE.name, no_fuse)
    folds, routes, ropes = [], [], []
    gemv_pair, gemv = kernels.gemv_pair, kernels.gemv

    def spy(*args, **kwargs):
        folds.append(kwargs.get("norm_weight") is not None)
        routes.append(kwargs.get("route") is not None)
        return gemv_pair(*args, **kwargs)

    def spy_gemv(*args, **kwargs):  # routing beside a GEMV (the shared expert's down projection)
        routes.append(kwargs.get("route") is not None)
        ropes.append(kwargs.get("rotary") is not None)
        return gemv(*args, **kwargs)

    monkeypatch.setattr(kernels, "gemv_pair", spy)
    monkeypatch.setattr(kernels, "gemv", spy_gemv)
    cfg = tiny_config(vocab=256, hidden=64, heads=4, layers=3, q_lora=32, kv_lora=32, nope=16, rope=16, v=16,
                      experts=8, top_k=2, n_group=2, topk_group=1, moe_inter=32, inter=96, yarn=True, max_pos=512,
                      dense=1)
    model = DeepseekV3ForCausalLM(cfg, dtype=dtype)
    randomize(model, seed)
    if pin_routing:
        fold_checks.pin_routing(model)
    T = 3
    runner, rows = verify_batch_on_cpu(model, T=T, bs=2, dtype=dtype, backend="auto", num_pages=16, page_size=8,
                                       max_context=64, min_ctx=4, max_ctx=20, pages_per_req=3, seed=seed)
    bt = runner.build(rows)
    with torch.inference_mode():
        logits = runner.target_verify.fn(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table,
                                         seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc, tokens_per_req=T)[0]
    monkeypatch.undo()
    calls = {"folds": sum(folds), "routes": sum(routes), "ropes": sum(ropes)}
    return logits.float(), [kv.clone() for kv in runner.target_kv.layers], calls


def _same_as_unfused(monkeypatch, no_fuse: str, dtype) -> tuple[dict, dict, int]:
    """The verify logits and KV caches with SGLANG_EAGLE3_NO_FUSE=no_fuse equal those with every fusion off, bit for
    bit, on one fresh seed; -> (call counts with it, with every fusion off, the seed) for the caller's checks."""
    seed = int(torch.randint(0, 1 << 30, (1,)))
    fused, cache_f, calls = _verify_logits(monkeypatch, no_fuse, dtype, seed)
    plain, cache_p, calls_off = _verify_logits(monkeypatch, "all", dtype, seed)
    assert torch.equal(fused, plain), (seed, (fused - plain).abs().max().item())
    for a, b in zip(cache_f, cache_p, strict=True):
        assert torch.equal(a, b), seed
    return calls, calls_off, seed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_path_equals_unfused(monkeypatch, dtype):
    """The fused kernels round where the separate ops store (normed rows in the activation dtype), and the
    routing tail runs the routing kernel's own function on the stored logits: the same numbers. All but
    input_norm's Triton kernel, which scales the bf16 products by rstd instead of rounding the normed rows
    (kernels/triton/gemv.py): with the references (on CPU by default) it is bit-equal too; under
    the interpreter (SGLANG_EAGLE3_TRITON_ON_CPU=1) the others are compared bit for bit without it, and its
    half-precision logits within rounding, with the routing pinned (else a rounding-sized difference can send
    a token to another expert)."""
    layers, moe_layers = 3, 2
    fold_kernel = dtype != torch.float32 and env.TRITON_ON_CPU.flag() and env.TRITON_INTERPRET.flag()
    calls, calls_off, seed = _same_as_unfused(monkeypatch, "input_norm" if fold_kernel else "", dtype)
    folds, routes, folds_off, routes_off = calls["folds"], calls["routes"], calls_off["folds"], calls_off["routes"]
    assert routes == moe_layers and routes_off == 0, f"routed in {routes} of {moe_layers} MoE layers ({routes_off=})"
    if fold_kernel:
        folded, _, calls = _verify_logits(monkeypatch, "", dtype, seed, pin_routing=True)
        folds = calls["folds"]
        unfolded, _, _ = _verify_logits(monkeypatch, "input_norm", dtype, seed, pin_routing=True)
        err = ((folded - unfolded).norm() / unfolded.norm()).item()
        assert err < 5e-2, (seed, err)  # ~2e-2 here (the unfused Triton path and the references: ~3e-2)
    assert folds == layers and folds_off == 0, f"input norm folded in {folds} of {layers} layers ({folds_off} unfused)"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_route_beside_shared_down_equals_unfused(monkeypatch, dtype):
    """route_shared_down (router_topk off, as by default): the routing runs in programs beside the shared
    expert's down projection, the routing kernel's own function on the same stored logits and the GEMV's
    own programs: the same numbers as every fusion off, bit for bit (references on CPU; the Triton kernels
    under the interpreter with SGLANG_EAGLE3_TRITON_ON_CPU=1)."""
    calls, calls_off, _ = _same_as_unfused(monkeypatch, "input_norm,router_topk,q_rope_attn", dtype)
    routes, routes_off = calls["routes"], calls_off["routes"]
    assert routes == 2 and routes_off == 0, f"routed beside the shared down in {routes} of 2 MoE layers ({routes_off=})"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_beside_w_uk_equals_unfused(monkeypatch, dtype):
    """rope_wuk (q_rope_attn off, as by default): MLA's rotary launch handed to W_UK's GEMV, which runs it in
    programs of its own launch (Triton) or first (the references): the same numbers as every fusion off, bit
    for bit, in each of the 3 layers (references on CPU; the Triton kernels under the interpreter with
    SGLANG_EAGLE3_TRITON_ON_CPU=1)."""
    calls, calls_off, _ = _same_as_unfused(monkeypatch, "input_norm,router_topk,q_rope_attn,route_shared_down",
                                           dtype)
    ropes, ropes_off = calls["ropes"], calls_off["ropes"]
    assert ropes == 3 and ropes_off == 0, f"rotary beside W_UK in {ropes} of 3 layers ({ropes_off=})"


def test_read_fusions_after_build(monkeypatch):
    """Layers read the fusions when built; read_fusions() reads them again (a benchmark timing one setting
    after another on one model)."""
    from sglang_eagle3.layers.mla import MLAAttention
    from sglang_eagle3.layers.moe import DeepseekMoE
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.testing import tiny_config

    monkeypatch.setenv(env.NO_FUSE.name, "")  # every fusion on
    model = DeepseekV3ForCausalLM(tiny_config(vocab=64, hidden=32, heads=2, layers=2, q_lora=16, kv_lora=16, nope=8,
                                              rope=8, v=8, experts=4, top_k=2, moe_inter=16, inter=32, dense=1))
    moe = [m for m in model.modules() if isinstance(m, DeepseekMoE)]
    mla = [m for m in model.modules() if isinstance(m, MLAAttention)]
    assert moe and mla and all(m.fuse_route_down and m.fuse_router_shared for m in moe)
    monkeypatch.setenv(env.NO_FUSE.name, "route_shared_down,qa_norm")
    for m in model.modules():
        if hasattr(m, "read_fusions"):
            m.read_fusions()
    assert all(not m.fuse_route_down and m.fuse_router_shared for m in moe)
    assert all(not m.fuse_qa_norm and m.fuse_kv_norm and m.fuse_rope_wuk for m in mla)
