"""bench_l2_prefetch.py on CPU: its cases are the launches the step's later prefetch plans fetch for (the same
matrices, in read order, at a Kimi-K2.5 TP=8 rank's shapes), and its argument parsing and L2 rotation."""

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
