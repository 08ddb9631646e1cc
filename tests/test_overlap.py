"""Side-stream overlaps (layers/overlap.py): the knob, and on CUDA that every overlap changes no value, eagerly
and in replayed CUDA graphs (the same kernels run, only on another stream or beside an L2 prefetch)."""

from __future__ import annotations

import pytest
import torch

from sglang_eagle3 import env
from sglang_eagle3.layers.overlap import OVERLAPS, Overlaps

VARIANTS = ("none", "shared_down", "mla_k_path", "rope_side", "prefetch_attn", "shared_down,mla_k_path,prefetch_late",
            "shared_down,rope_side", "prefetch_next", "shared_down,prefetch_mid", "prefetch_mid_o",
            "shared_down,mla_k_path,prefetch_mid", "shared_down,prefetch_mid,prefetch_next_moe")


def test_overlap_knob(monkeypatch):
    assert Overlaps.parse("") == Overlaps() == Overlaps.parse("none")
    assert Overlaps.parse(" shared_down , prefetch_late") == Overlaps(shared_down=True, prefetch="prefetch_late")
    assert Overlaps.parse("rope_side,shared_down") == Overlaps(shared_down=True, rope_side=True)
    with pytest.raises(ValueError, match="prefetch_atn"):
        Overlaps.parse("shared_down,prefetch_atn")
    with pytest.raises(ValueError, match="at most one prefetch plan"):
        Overlaps.parse("prefetch_attn,prefetch_next")
    with pytest.raises(AssertionError, match="prefetch='x'"):
        Overlaps(prefetch="x")
    assert Overlaps.parse("prefetch_mid_o,shared_down") == Overlaps(shared_down=True, prefetch="prefetch_mid_o")
    assert Overlaps.parse("prefetch_next_moe,prefetch_mid") == Overlaps(prefetch="prefetch_mid", prefetch_next_moe=True)
    with pytest.raises(ValueError, match="at most one prefetch plan"):
        Overlaps.parse("prefetch_mid,prefetch_mid_o")
    monkeypatch.setenv(env.OVERLAP.name, "prefetch_next")
    assert Overlaps.from_env() == Overlaps(prefetch="prefetch_next")
    monkeypatch.delenv(env.OVERLAP.name)
    assert Overlaps.from_env() == Overlaps.parse(env.DEFAULT_OVERLAP)
    assert set(OVERLAPS) >= {n.strip() for n in env.DEFAULT_OVERLAP.split(",") if n.strip()}


def _tiny_moe_model(seed: int):
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.testing import randomize, tiny_config

    cfg = tiny_config(vocab=128, hidden=32, heads=2, layers=3, q_lora=16, kv_lora=16, nope=8, rope=8, v=8,
                      experts=4, top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48, max_pos=256, dense=1)
    model = DeepseekV3ForCausalLM(cfg, dtype=torch.float32)
    randomize(model, seed)
    return model


def _cpu_verify_logits(model, seed: int) -> torch.Tensor:
    """The target's verify forward (2 requests x 3 tokens) on CPU, with the model's overlaps as set."""
    from sglang_eagle3.testing import verify_batch_on_cpu

    runner, rows = verify_batch_on_cpu(model, T=3, bs=2, dtype=torch.float32, backend="auto", num_pages=12,
                                       page_size=8, max_context=48, min_ctx=2, max_ctx=16, pages_per_req=3, seed=seed)
    bt = runner.build(rows)
    with torch.inference_mode():
        return runner.target_verify.fn(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table,
                                       seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc, tokens_per_req=3)[0]


def test_cpu_forward_unchanged_by_overlaps():
    """Off CUDA the overlaps do nothing: the verify logits are the same object-for-object computation."""
    seed = int(torch.randint(0, 1 << 30, (1,)))
    model = _tiny_moe_model(seed)
    outs = []
    for spec in ("none", "shared_down,prefetch_late"):
        model.model.set_overlaps(Overlaps.parse(spec))
        outs.append(_cpu_verify_logits(model, seed))
    assert torch.equal(outs[0], outs[1])


def test_later_prefetch_plans(monkeypatch):
    """prefetch_mid / prefetch_mid_o / prefetch_next_moe: each layer's hook is called once a forward, right after the
    launch it waits for (q_a + kv_a's; the MoE router + shared gate/up's) with that launch's output or input, and
    asks for what is read next (o_proj, then the router + shared gate/up launch's weights; the next layer's q_a and
    kv_a); the layer-start path issues nothing for them; the later forks go to the prefetcher's own stream."""
    from sglang_eagle3 import kernels
    from sglang_eagle3.layers import mla
    from sglang_eagle3.layers.overlap import MID_PLANS, WeightPrefetcher

    seed = int(torch.randint(0, 1 << 30, (1,)))
    model = _tiny_moe_model(seed)
    layers = model.model.layers
    attn0, moe1 = layers[0].self_attn, layers[1].mlp
    assert not hasattr(layers[0].mlp, "shared_experts") and hasattr(moe1, "shared_experts")  # dense=1: layer 0
    names = {id(p): n for n, p in model.named_parameters()}

    def plan_names(plan):
        return [[names[id(w)] for w in WeightPrefetcher.plan_weights(layers, i, plan)] for i in range(3)]

    for plan in MID_PLANS:
        router_shared = ["mlp.gate.weight", "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"]
        want_moe = ["self_attn.o_proj.weight"] + (router_shared if plan == "prefetch_mid" else [])
        assert plan_names(plan) == [["model.layers.0.self_attn.o_proj.weight"]] + [
            [f"model.layers.{i}.{n}" for n in want_moe] for i in (1, 2)], plan
    assert plan_names("prefetch_next_moe") == [
        [f"model.layers.{i}.self_attn.q_a_proj.weight", f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight"]
        for i in (1, 2)] + [[]]

    events = []
    issued = []
    monkeypatch.setattr(WeightPrefetcher, "issue",
                        lambda self, layers_, i, plan, like, stream: issued.append((i, plan, stream is self.late)))
    monkeypatch.setattr(WeightPrefetcher, "_bulk_capable", staticmethod(lambda like: True))  # as on an H200
    pair, gemv = kernels.gemv_pair, kernels.gemv
    monkeypatch.setattr(mla.kernels, "gemv_pair", lambda *a, **k: events.append(("pair",)) or pair(*a, **k))
    monkeypatch.setattr(mla.kernels, "gemv", lambda *a, **k: events.append(("gemv",)) or gemv(*a, **k))
    real_mid = WeightPrefetcher.mid_layer

    def mid(self, layers_, i, plan, like):
        events.append(("hook", i, plan, tuple(like.shape)))
        real_mid(self, layers_, i, plan, like)

    monkeypatch.setattr(WeightPrefetcher, "mid_layer", mid)
    kv_width, hidden = attn0.kv_lora_rank + attn0.rope_dim, model.config.hidden_size
    for spec in ("shared_down,prefetch_mid", "prefetch_mid_o", "shared_down,prefetch_next_moe",
                 "prefetch_mid,prefetch_next_moe"):
        overlaps = Overlaps.parse(spec)
        model.model.set_overlaps(overlaps)
        events.clear()
        issued.clear()
        _cpu_verify_logits(model, seed)
        want = []
        for i in range(3):  # per layer in order: after q_a + kv_a, then (MoE layers but the last) after the router
            if overlaps.prefetch in MID_PLANS:
                want.append((i, overlaps.prefetch, (6, kv_width)))
            if overlaps.prefetch_next_moe and i == 1:
                want.append((i, "prefetch_next_moe", (6, hidden)))
        hooks = [k for k, e in enumerate(events) if e[0] == "hook"]
        assert [events[k][1:] for k in hooks] == want, (spec, events)
        assert all(events[k - 1] == ("pair",) for k in hooks), (spec, events)  # right after the launch waited for
        assert issued == [(i, plan, True) for i, plan, _ in want], (spec, issued)  # on the late stream only
    model.model.set_overlaps(Overlaps.parse("shared_down"))
    assert all(layer.self_attn.after_kv_a is None for layer in layers) and moe1.after_router is None


def _cuda_logits(model, spec: str, ctx: int, Ts=(1, 4)) -> dict:
    """{(T, 'eager'|'graph'): logits} of one request at context ``ctx`` with overlaps ``spec``."""
    from sglang_eagle3.runtime.model_runner import ModelRunner

    model.model.set_overlaps(Overlaps.parse(spec))
    page_size = 16
    runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=ctx // page_size + 4, page_size=page_size,
                         max_context=ctx + 16, device=torch.device("cuda"), dtype=torch.bfloat16,
                         use_cuda_graph=True, cuda_graph_max_bs=2, verify_widths=tuple(T for T in Ts if T > 1),
                         attention_backend="triton", moe_backend="triton")
    g = torch.Generator(device="cuda").manual_seed(3)
    for kv in runner.target_kv.layers:
        kv.copy_(torch.randn(kv.shape, generator=g, device="cuda"))
    runner.capture_graphs()
    pages = list(range(1, ctx // page_size + 3))
    out = {}
    with torch.inference_mode():
        for T in Ts:
            bt = runner.build([(list(range(7, 7 + T)), ctx, pages)])
            target = runner.target_verify if T > 1 else runner.target_decode
            out[(T, "eager")] = target.fn(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table,
                                          seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc,
                                          tokens_per_req=T)[0].clone()
            out[(T, "graph")] = runner.target_uniform(bt, T, verify=T > 1)[0].clone()
    assert runner.stats.as_dict()["target_verify"]["eager"] == 0
    return out


@pytest.fixture(scope="module")
def overlap_model_and_base():
    """A small Kimi-like model on the GPU and its logits with no overlap (eager and replayed)."""
    import sys
    from pathlib import Path

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    sys.path.insert(0, str(Path(__file__).parent / "kernels"))
    from kernel_checks import kimi_like_model

    model = kimi_like_model("cuda", layers=4, hidden=256, seed=int(torch.randint(0, 1 << 30, (1,))))
    return model, _cuda_logits(model, "none", ctx=200)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", VARIANTS[1:])
def test_gpu_overlaps_change_no_value(overlap_model_and_base, spec):
    """Every overlap variant gives bit-identical logits to none, eager and replayed (decode and verify T=4)."""
    model, base = overlap_model_and_base
    got = _cuda_logits(model, spec, ctx=200)
    for key, ref in base.items():
        assert torch.equal(got[key], ref), (spec, key, (got[key].float() - ref.float()).abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["shared_down,prefetch_mid", "prefetch_mid_o", "shared_down,prefetch_next_moe",
                                  "prefetch_mid,prefetch_next_moe"])
def test_gpu_later_prefetch_issued(overlap_model_and_base, monkeypatch, spec):
    """On the GPU the later prefetch plans really launch their prefetch: once a hook a forward, in the layers'
    order, each with its plan's bytes (so a paired step run of them cannot time a silent no-op)."""
    from sglang_eagle3.layers import overlap
    from sglang_eagle3.layers.moe import DeepseekMoE

    model, _ = overlap_model_and_base
    tables = []
    real = overlap.l2_prefetch
    monkeypatch.setattr(overlap, "l2_prefetch", lambda table: tables.append(table) or real(table))  # no copy: capture
    _cuda_logits(model, spec, ctx=200)
    overlaps, layers = Overlaps.parse(spec), model.model.layers
    plans = []  # the hooks of one forward, in order
    for i, layer in enumerate(layers):
        if overlaps.prefetch in overlap.MID_PLANS:
            plans.append((i, overlaps.prefetch))
        if overlaps.prefetch_next_moe and isinstance(layer.mlp, DeepseekMoE) and i + 1 < len(layers):
            plans.append((i, "prefetch_next_moe"))
    want = [sum(w.numel() * w.element_size() for w in overlap.WeightPrefetcher.plan_weights(layers, i, plan))
            for i, plan in plans]
    got = [int(t[:, 1].sum()) for t in tables]  # the cached tables: read after the capture
    assert len(got) >= 2 * len(want) and len(got) % len(want) == 0, (got, plans)  # eager, capture (and warm-up)
    for k in range(0, len(got), len(want)):  # each forward: every hook, in order, its weights (each range widened
        # to 16-byte bounds: < 32 bytes more a tensor, 4 tensors at most)
        assert all(0 <= g - w < 32 * 4 for g, w in zip(got[k:k + len(want)], want, strict=True)), (got, want)
