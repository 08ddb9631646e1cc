"""The prefetch plans' benchmarks on CPU: bench_l2_prefetch.py's cases are the launches the step's later prefetch
plans fetch for (the same matrices, in read order, at a Kimi-K2.5 TP=8 rank's shapes), with its argument parsing
and L2 rotation; bench_launch_floor.py forks its read-only structure's prefetches where the model's hooks fork."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_l2_prefetch as bench  # noqa: E402


def test_cases_are_what_the_plans_fetch(monkeypatch):
    from benchmarks.bench_verify_graph import kimi_config
    from sglang_eagle3.distributed import parallel_state
    from sglang_eagle3.layers.overlap import WeightPrefetcher
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM

    monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPInfo(0, 8, simulated=True))  # one rank's slice
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(kimi_config(3, 384), dtype=torch.bfloat16, int4_experts=True)
    layers = model.model.layers
    assert hasattr(layers[1].mlp, "shared_experts")  # a MoE layer

    def shapes(i, plan):
        return [tuple(w.shape) for w in WeightPrefetcher.plan_weights(layers, i, plan)]

    cases = {c.name: c for c in bench.CASES}
    assert [tuple(m) for m in cases["o_proj"].mats] == shapes(1, "prefetch_mid_o")
    assert [tuple(m) for m in cases["o_proj"].mats + cases["router+shared gate/up"].mats] == shapes(1, "prefetch_mid")
    assert [tuple(m) for m in cases["q_a+kv_a"].mats] == shapes(1, "prefetch_next_moe")  # layer 2's
    for c in bench.CASES:
        assert c.nbytes == sum(n * k * 2 for n, k in c.mats)


def test_windows_and_rotation():
    assert bench.parse_window("none") == ("none", 0.0)
    assert bench.parse_window("spin:8") == ("spin", 8.0)
    assert bench.parse_window("read:12.5") == ("read", 12.5)
    for bad in ("spin", "read:-1", "sleep:3", "read:x", "spin:0"):
        with pytest.raises(SystemExit, match="--windows"):
            bench.parse_window(bad)
    assert bench.L2_ROTATE_BYTES >= 3 * (50 << 20)  # several H200 L2s: no replay finds the last one's lines
    for nbytes in (1 << 20, 14680064, 30277632, 300 << 20):
        copies = bench.copies_for(nbytes)
        assert 2 <= copies <= 32, (nbytes, copies)
        assert copies * nbytes >= bench.L2_ROTATE_BYTES or copies == 32, (nbytes, copies)
        assert copies == 2 or (copies - 1) * nbytes < bench.L2_ROTATE_BYTES, (nbytes, copies)  # no more than needed


def test_launch_floor_forks_where_the_model_does():
    from benchmarks import bench_launch_floor as floor
    from sglang_eagle3.layers.overlap import Overlaps
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.testing import tiny_config

    n = 4
    cfg = tiny_config(vocab=64, hidden=32, heads=2, layers=n, q_lora=16, kv_lora=16, nope=8, rope=8, v=8,
                      experts=4, top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48, max_pos=64, dense=1)
    model = DeepseekV3ForCausalLM(cfg, dtype=torch.float32)
    layers = [floor.layer_launches(i == 0, 1024) for i in range(n)]  # layer 0 dense, as Kimi's (and cfg's)
    for plan, spec in (("mid", "prefetch_mid"), ("next_moe", "prefetch_next_moe"),
                       ("mid,next_moe", "prefetch_mid,prefetch_next_moe"), ("none", "none")):
        model.model.set_overlaps(Overlaps.parse(spec))
        forks = floor.prefetch_forks(layers, plan)
        attn = [i for i, layer in enumerate(model.model.layers) if layer.self_attn.after_kv_a is not None]
        moe = [i for i, layer in enumerate(model.model.layers) if getattr(layer.mlp, "after_router", None)]
        assert sorted(i for i, name in forks if name == "q_a + kv_a") == attn, plan
        assert sorted(i for i, name in forks if name == "router + shared gate/up") == moe, plan
        for (i, name), targets in forks.items():  # what is fetched: prefetch_mid's / prefetch_next_moe's matrices
            want = ([(i, "o_proj")] + ([(i, "router + shared gate/up")] if i > 0 else [])
                    if name == "q_a + kv_a" else [(i + 1, "q_a + kv_a")])
            assert targets == want, (plan, i, name, targets)
    with pytest.raises(SystemExit, match="--prefetch-variants"):
        floor.prefetch_forks(layers, "late")
