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


def test_summarize_settings_groups_alternations(capsys):
    """bench_verify_graph.summarize_settings: the runs of a setting repeated by --env-variants grouped per shape,
    their median, and the ratio to the first setting at that shape."""
    from benchmarks.bench_verify_graph import print_summary, summarize_settings

    def case(env, ctx, T, ms):
        return {"backend": "triton", "overlaps": "o", "env": env, "context": ctx, "T": T, "batch": 1, "graph_ms": ms}

    cases = [case("", 1024, 1, 4.9), case("", 1024, 4, 6.7), case("X=0", 1024, 1, 4.8), case("X=0", 1024, 4, 6.5),
             case("", 1024, 1, 4.7), case("", 1024, 4, 6.9), case("X=0", 1024, 1, 4.6), case("X=0", 1024, 4, 6.6),
             case("", 1024, 1, 5.0)]
    rows = summarize_settings(cases)
    assert [(r["env"], r["T"]) for r in rows] == [("", 1), ("", 4), ("X=0", 1), ("X=0", 4)]
    assert rows[0]["graph_ms_runs"] == [4.9, 4.7, 5.0] and rows[0]["graph_ms_median"] == 4.9
    assert rows[0]["vs_first_setting"] == 1.0 and rows[1]["vs_first_setting"] == 1.0
    assert rows[2]["graph_ms_median"] == 4.7 and rows[2]["vs_first_setting"] == round(4.7 / 4.9, 3)
    assert rows[3]["graph_ms_median"] == 6.55 and rows[3]["vs_first_setting"] == round(6.55 / 6.8, 3)
    print_summary(rows)
    out = capsys.readouterr().out
    assert "ctx  1024 T=1 triton o X=0: 4.80 / 4.60  median 4.70  x0.959" in out, out
    print_summary(summarize_settings(cases[:2]))  # one setting, timed once a shape: nothing to summarize
    assert capsys.readouterr().out == ""
