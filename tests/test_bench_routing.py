"""benchmarks/routing.py, the benchmarks' drawn routing, on CPU: DrawnRouting replaces every MoE layer's expert ids
(kernels.moe_topk, looked up at call time) by draws made ahead, one a layer and row count, taken in turn; keeps
the real weights; leaves unprepared row counts to the router; puts the original back. draw_routing's statistics
against what its rule implies: uniform picks, and the previous token's experts kept with probability P."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.routing import DrawnRouting, draw_routing, parse_routing, routing_label  # noqa: E402
from sglang_eagle3 import kernels  # noqa: E402


def test_drawn_routing_replaces_ids_in_turn_and_restores():
    E, k, layers, T = 37, 6, 3, 5
    kw = dict(top_k=k, n_group=1, topk_group=1)
    logits = torch.randn(T, E)
    w_ref, ids_ref = kernels.moe_topk(logits, None, **kw)
    original = kernels.moe_topk
    other = torch.randn(T + 1, E)
    _, other_ref = kernels.moe_topk(other, None, **kw)
    with DrawnRouting(E, k, layers, shapes=[(1, T)], seed=int(torch.randint(1 << 30, ())), device="cpu") as routing:
        assert kernels.moe_topk is not original
        calls = [kernels.moe_topk(logits, None, **kw) for _ in range(2 * layers + 1)]
        _, ids_other = kernels.moe_topk(other, None, **kw)  # no draw for T + 1 rows: the router's own
        with pytest.raises(ValueError, match="top_k"):
            kernels.moe_topk(logits, None, top_k=k - 1, n_group=1, topk_group=1)
    assert kernels.moe_topk is original
    pool = routing.pool[T]
    assert pool.shape == (layers, T, k) and pool.dtype == torch.int32
    for i, (w, ids) in enumerate(calls):
        assert torch.equal(w, w_ref), "the routing weights must stay the router's"
        assert torch.equal(ids, pool[i % layers]), f"call {i} must take layer {i % layers}'s draw"
    assert all(not torch.equal(pool[0], pool[i]) for i in range(1, layers)), "layers drew alike"
    assert all(len(set(row)) == k for row in pool.reshape(-1, k).tolist()), "an expert drawn twice for one token"
    assert pool.min() >= 0 and pool.max() < E
    assert not torch.equal(pool[0].sort(1).values, ids_ref.sort(1).values)
    assert routing.own_rows == {T + 1} and torch.equal(ids_other, other_ref)
    assert routing.distinct_experts(T) == sum(len(set(pool[i].flatten().tolist())) for i in range(layers))
    with pytest.raises(KeyError, match="no routing drawn for 6 rows"):
        routing.distinct_experts(T + 1)


def test_unprepared_rows_keep_the_routers_ids():
    E, k = 23, 4
    logits = torch.randn(3, E)
    kw = dict(top_k=k, n_group=1, topk_group=1)
    _, ids_ref = kernels.moe_topk(logits, None, **kw)
    with DrawnRouting(E, k, 2, shapes=[(2, 2)], device="cpu") as routing:
        _, ids = kernels.moe_topk(logits, None, **kw)
    assert torch.equal(ids, ids_ref) and routing.own_rows == {3}


def _overlaps(ids: torch.Tensor, tokens: int) -> list[int]:
    """Experts each row shares with the row before it in its request ([layers, rows, k] draws)."""
    out = []
    for layer in ids.tolist():
        for r in range(1, len(layer)):
            if r % tokens:
                out.append(len(set(layer[r]) & set(layer[r - 1])))
    return out


@pytest.mark.parametrize("reuse", [0.0, 0.3, 0.75])
def test_draw_routing_keeps_the_previous_tokens_experts_at_the_rate_asked(reuse):
    """Mean experts a token shares with the one before it against the rule's expectation: K ~ Binomial(k, P) kept,
    k - K fresh from the E - K not kept, of which k - K are the earlier token's dropped ones."""
    E, k, layers, requests, tokens = 64, 8, 40, 6, 5
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    ids = draw_routing(E, k, layers, requests, tokens, reuse, g)
    assert ids.shape == (layers, requests * tokens, k)
    assert all(len(set(row)) == k for row in ids.reshape(-1, k).tolist())
    expect = sum(math.comb(k, j) * reuse ** j * (1 - reuse) ** (k - j) * (j + (k - j) ** 2 / (E - j))
                 for j in range(k + 1))
    got = _overlaps(ids, tokens)
    mean = sum(got) / len(got)
    sd = (sum((x - mean) ** 2 for x in got) / len(got)) ** 0.5
    assert abs(mean - expect) < 5 * sd / len(got) ** 0.5 + 1e-9, (mean, expect)
    # requests are independent: a request's first token shares no more with the one before than uniform draws do
    firsts = [len(set(layer[r]) & set(layer[r - 1])) for layer in ids.tolist() for r in range(tokens, len(layer),
                                                                                                 tokens)]
    assert sum(firsts) / len(firsts) < k * k / E + 1.0
    # uniform over experts: every expert drawn, none far past its share
    counts = torch.bincount(ids.flatten().long(), minlength=E)
    if reuse == 0.0:
        share = ids.numel() / E
        assert counts.min() > 0.5 * share and counts.max() < 1.6 * share, counts


def test_draw_routing_reuse_one_is_one_set_a_request():
    ids = draw_routing(50, 5, 3, 4, 6, 1.0, torch.Generator().manual_seed(1))
    for layer in ids:
        for req in layer.reshape(4, 6, 5):
            assert all(set(row.tolist()) == set(req[0].tolist()) for row in req)


def test_routing_arguments_and_errors():
    assert parse_routing("own") is None and parse_routing("uniform") == 0.0 and parse_routing(" reuse:0.25 ") == 0.25
    for bad in ("reuse", "reuse:1.5", "reuse:-0.1", "reuse:x", "zipf", ""):
        with pytest.raises(ValueError, match="expected own, uniform or reuse:P"):
            parse_routing(bad)
    assert "own" in routing_label(None) and "uniform" in routing_label(0.0) and "0.4" in routing_label(0.4)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="top_k=9"):
        draw_routing(8, 9, 1, 1, 1, 0.0, g)
    with pytest.raises(ValueError, match="requests=0"):
        draw_routing(8, 2, 1, 0, 1, 0.0, g)
    with pytest.raises(ValueError, match="reuse=2"):
        DrawnRouting(8, 2, 1, 2.0, device="cpu")
    with pytest.raises(ValueError, match="rows=7 is not whole requests of 2"):
        DrawnRouting(8, 2, 1, device="cpu").prepare(7, 2)


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


def test_step_benchmarks_refuse_an_unreadable_routing():
    """bench_verify_graph.py and profile_step.py name a --routing they cannot read and stop (exit 2) before they
    build anything or ask for a GPU."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    for script in ("bench_verify_graph.py", "profile_step.py"):
        proc = subprocess.run([sys.executable, str(root / "benchmarks" / script), "--routing", "reuse:x"],
                              capture_output=True, text=True, timeout=120, cwd=root)
        assert proc.returncode == 2 and "--routing 'reuse:x': expected own, uniform or reuse:P" in proc.stderr, (
            script, proc.stderr[-400:])
