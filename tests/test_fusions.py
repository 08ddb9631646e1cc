"""Launch fusions (env.NO_FUSE): parsing of the knob, and the fused inference path computes what the unfused
one does (here through the torch references on CPU; the Triton kernels of each fusion are checked against
their references in tests/kernels)."""

from __future__ import annotations

import pytest
import torch

from sglang_eagle3 import env


def test_fusion_knob(monkeypatch):
    monkeypatch.delenv(env.NO_FUSE.name, raising=False)
    assert all(env.fusion_on(n) for n in env.FUSIONS)
    monkeypatch.setenv(env.NO_FUSE.name, " kv_norm, router_shared")
    assert [env.fusion_on(n) for n in env.FUSIONS] == [True, False, False]
    monkeypatch.setenv(env.NO_FUSE.name, "all")
    assert not any(env.fusion_on(n) for n in env.FUSIONS)
    monkeypatch.setenv(env.NO_FUSE.name, "qa_norm,kv_nrom")
    with pytest.raises(ValueError, match="kv_nrom"):
        env.fusion_on("qa_norm")


def _verify_logits(monkeypatch, no_fuse: str, dtype, seed: int):
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.testing import randomize, tiny_config, verify_batch_on_cpu

    monkeypatch.setenv(env.NO_FUSE.name, no_fuse)
    cfg = tiny_config(vocab=256, hidden=64, heads=4, layers=3, q_lora=32, kv_lora=32, nope=16, rope=16, v=16,
                      experts=8, top_k=2, n_group=2, topk_group=1, moe_inter=32, inter=96, yarn=True, max_pos=512,
                      dense=1)
    model = DeepseekV3ForCausalLM(cfg, dtype=dtype)
    randomize(model, seed)
    T = 3
    runner, rows = verify_batch_on_cpu(model, T=T, bs=2, dtype=dtype, backend="auto", num_pages=16, page_size=8,
                                       max_context=64, min_ctx=4, max_ctx=20, pages_per_req=3, seed=seed)
    bt = runner.build(rows)
    with torch.inference_mode():
        logits = runner.target_verify.fn(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table,
                                         seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc, tokens_per_req=T)[0]
    return logits.float(), [kv.clone() for kv in runner.target_kv.layers]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_path_equals_unfused(monkeypatch, dtype):
    seed = int(torch.randint(0, 1 << 30, (1,)))
    fused, cache_f = _verify_logits(monkeypatch, "", dtype, seed)
    plain, cache_p = _verify_logits(monkeypatch, "all", dtype, seed)
    # The fused kernels round where the separate ops store (normed rows in the activation dtype): same numbers.
    assert torch.equal(fused, plain), (seed, (fused - plain).abs().max().item())
    for a, b in zip(cache_f, cache_p, strict=True):
        assert torch.equal(a, b), seed
