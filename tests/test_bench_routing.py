"""bench_verify_graph.UniformRouting, the benchmarks' load-balanced routing, on CPU: it replaces every MoE
layer's routing (looked up at call time) with distinct uniformly drawn experts, keeps the real weights, and
puts the original back."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_verify_graph import UniformRouting  # noqa: E402
from sglang_eagle3 import kernels  # noqa: E402


def test_uniform_routing_replaces_ids_and_restores():
    E, T, k = 37, 200, 6
    logits = torch.randn(T, E)
    kw = dict(top_k=k, n_group=1, topk_group=1)
    w_ref, ids_ref = kernels.moe_topk(logits, None, **kw)
    original = kernels.moe_topk
    with UniformRouting(E) as routing:
        assert kernels.moe_topk is not original
        w, ids = kernels.moe_topk(logits, None, **kw)
        _, ids2 = kernels.moe_topk(logits, None, **kw)
    assert kernels.moe_topk is original
    assert torch.equal(w, w_ref) and ids.dtype == torch.int32 and ids.shape == (T, k)
    assert all(len(set(row)) == k for row in ids.tolist()), "an expert drawn twice for one token"
    assert ids.min() >= 0 and ids.max() < E
    assert not torch.equal(ids, ids2), "the same draw twice"
    assert len(routing.ids) == 2 and torch.equal(routing.ids[0], ids)
    # ~uniform: every expert is drawn, none more than ~twice its share (T*k/E = 32 per expert here)
    counts = torch.bincount(ids.flatten().long(), minlength=E)
    assert counts.min() > 0 and counts.max() < 2.5 * T * k / E, counts
    assert not torch.equal(ids.sort(1).values, ids_ref.sort(1).values)
