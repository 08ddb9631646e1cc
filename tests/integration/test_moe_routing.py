"""Our moe_topk against SGLang 0.5.23's own torch routing (a peer comparison), and the swap's dispatch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from .conftest import needs_sglang

pytestmark = [needs_sglang, pytest.mark.sglang]

# (E, n_group, topk_group, top_k): Kimi-K2.5 (ungrouped 384), DeepSeek-V3 (256 in 8 groups), irregular.
CASES = [(384, 1, 1, 8), (256, 8, 4, 8), (96, 4, 2, 6)]


def sglang_torch_routing(logits, bias, *, top_k, n_group, topk_group, scale):
    """SGLang's torch implementations, undecorated (torch.compile would need a compiler on CPU)."""
    import sglang.srt.layers.moe.topk as topk

    if n_group == 1:  # what biased_grouped_topk_gpu falls back to for Kimi's single group off CUDA
        fn = topk.kimi_k2_biased_topk_impl
        return fn(logits, logits, bias, top_k, True, routed_scaling_factor=scale,
                  apply_routed_scaling_factor_on_output=True)
    fn = getattr(topk.biased_grouped_topk_impl, "_torchdynamo_orig_callable", topk.biased_grouped_topk_impl)
    return fn(logits, logits, bias, top_k, True, n_group, topk_group, routed_scaling_factor=scale,
              apply_routed_scaling_factor_on_output=True)


def assert_same_routing(ours, theirs):
    (w1, i1), (w2, i2) = ours, theirs
    assert w1.dtype == torch.float32 and i1.dtype == torch.int32 and w1.shape == w2.shape
    s1, o1 = i1.long().sort(dim=-1)
    s2, o2 = i2.long().sort(dim=-1)
    assert torch.equal(s1, s2), "expert id sets differ"
    torch.testing.assert_close(w1.gather(1, o1), w2.gather(1, o2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("E,n_group,topk_group,top_k", CASES)
@pytest.mark.parametrize("scale", [1.0, 2.827])
def test_ref_moe_topk_matches_sglang_torch_routing(E, n_group, topk_group, top_k, scale):
    from sglang_eagle3.integration.moe_routing import resolve_moe_topk

    moe_topk = resolve_moe_topk()
    gen = torch.Generator().manual_seed(E + top_k)
    for T in (1, 7, 33):
        logits = torch.randn(T, E, generator=gen) * 3
        bias = torch.randn(E, generator=gen) * 0.1
        ours = moe_topk(logits, bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                        renormalize=True, routed_scaling_factor=scale)
        theirs = sglang_torch_routing(logits, bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                                      scale=scale)
        assert_same_routing(ours, theirs)


_INTERPRETER_CHECK = r"""
import sys, torch
from sglang_eagle3.kernels.moe_topk import triton_moe_topk
sys.path.insert(0, sys.argv[1])
from tests.integration.test_moe_routing import CASES, assert_same_routing, sglang_torch_routing
for E, g, tg, k in CASES:
    logits = torch.randn(5, E) * 3
    bias = torch.randn(E) * 0.1
    ours = triton_moe_topk(logits, bias, top_k=k, n_group=g, topk_group=tg, routed_scaling_factor=2.5)
    assert_same_routing(ours, sglang_torch_routing(logits, bias, top_k=k, n_group=g, topk_group=tg, scale=2.5))
print("INTERPRETER_OK")
"""


def test_triton_kernel_in_interpreter_matches_sglang():
    try:
        import triton  # noqa: F401

        import sglang_eagle3.kernels.moe_topk  # noqa: F401
    except ImportError as e:
        pytest.skip(f"Triton launcher not importable here: {e}")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", _INTERPRETER_CHECK, repo_root], env=env, capture_output=True,
                          text=True, timeout=300)
    assert "INTERPRETER_OK" in proc.stdout, proc.stderr[-3000:]


def test_swap_dispatch_and_scaling(monkeypatch):
    from sglang_eagle3.integration import moe_routing

    calls = []
    original = lambda *a, **k: calls.append(("sglang", a, k)) or "sglang"
    ours = lambda logits, bias, **k: calls.append(("ours", k)) or "ours"
    counters = {}
    swap = moe_routing.wrap_biased_grouped_topk(original, ours, counters)
    logits, bias = torch.randn(3, 16), torch.randn(16)
    # CPU tensors: SGLang keeps the call.
    assert swap(logits, logits, bias, 4, True, 2, 1, routed_scaling_factor=2.0) == "sglang"
    assert moe_routing.supports(logits, bias, num_expert_group=2, topk_group=1, num_fused_shared_experts=0,
                                topk=4) == "not a CUDA tensor"
    # Pretend CUDA: ours takes it; the factor reaches the weights only when SGLang folds it into top-k.
    monkeypatch.setattr(moe_routing, "supports", lambda *a, **k: None)
    assert swap(logits, logits, bias, 4, True, 2, 1, routed_scaling_factor=2.0) == "ours"
    assert calls[-1][1] == {"top_k": 4, "n_group": 2, "topk_group": 1, "renormalize": True,
                            "routed_scaling_factor": 1.0}
    swap(logits, logits, bias, 4, True, 2, 1, routed_scaling_factor=2.0, apply_routed_scaling_factor_on_output=True)
    assert calls[-1][1]["routed_scaling_factor"] == 2.0
    assert counters == {"sglang": 1, "ours": 2}


def test_unsupported_configs_stay_with_sglang():
    from sglang_eagle3.integration.moe_routing import supports

    class FakeCuda(torch.Tensor):
        is_cuda = True

    logits = torch.randn(2, 16).as_subclass(FakeCuda)
    bias = torch.randn(16)
    ok = dict(num_expert_group=4, topk_group=2, topk=4)
    assert supports(logits, bias, num_fused_shared_experts=0, **ok) is None
    assert "shared-expert" in supports(logits, bias, num_fused_shared_experts=1, **ok)
    assert "correction bias" in supports(logits, torch.randn(2, 16), num_fused_shared_experts=0, **ok)
    assert "group layout" in supports(logits, bias, num_fused_shared_experts=0, num_expert_group=3,
                                      topk_group=1, topk=2)
