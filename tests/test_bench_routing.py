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

from benchmarks.routing import DrawnRouting, RoutingChoice, draw_routing, drawn_routing, parse_routing  # noqa: E402
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
    assert parse_routing("own") == RoutingChoice("own") and not parse_routing("own").drawn
    assert parse_routing("uniform") == RoutingChoice("uniform") == parse_routing("reuse:0")
    assert parse_routing(" reuse:0.25 ") == RoutingChoice("reuse", reuse=0.25)
    for bad in ("reuse", "reuse:1.5", "reuse:-0.1", "reuse:x", "zipf", "", "trace:"):
        with pytest.raises(ValueError, match="expected own, uniform, reuse:P with 0 <= P <= 1, or trace:PATH"):
            parse_routing(bad)
    with pytest.raises(ValueError, match="no routing trace at /nonexistent/t.jsonl"):
        parse_routing("trace:/nonexistent/t.jsonl")
    assert drawn_routing(parse_routing("own"), 8, 2, 1, shapes=[(1, 2)]) is None
    labels = [parse_routing(t).label() for t in ("own", "uniform", "reuse:0.4")]
    assert "own" in labels[0] and "uniform" in labels[1] and "0.4" in labels[2]
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
        assert proc.returncode == 2 and "--routing 'reuse:x': expected own, uniform, reuse:P" in proc.stderr, (
            script, proc.stderr[-400:])


def test_routing_trace_of_the_embedded_pair_replays_in_the_benchmarks(tmp_path, monkeypatch):
    """SGLANG_EAGLE3_ROUTING_TRACE on a speculative engine (the embedded pair, CPU, eager): every eager target
    forward's ids of every MoE layer, written as the router chose them (checked against the layers' own routing,
    recomputed from their inputs); benchmarks/routing.py's trace:PATH then hands a benchmark those ids for each row
    count the trace holds, the router's own for the others, and refuses a trace of another model's shape."""
    from sglang_eagle3 import Engine
    from sglang_eagle3.runtime.routing_trace import read_trace

    path = tmp_path / "routing.jsonl"
    monkeypatch.setenv("SGLANG_EAGLE3_ROUTING_TRACE", str(path))
    eng = Engine(device="cpu", speculative_num_steps=2)
    seen = []  # (rows, layer inputs) of each MoE layer call, to recompute the routing from
    blocks = eng.runner.target.moe_blocks()
    hooks = [b.register_forward_pre_hook(lambda m, a: seen.append((m, a[0].reshape(-1, a[0].shape[-1]).clone())))
             for b in blocks]
    eng.generate("In the beginning", {"max_new_tokens": 8, "temperature": 0})
    for h in hooks:
        h.remove()
    tcfg = eng.runner.target.config
    eng.shutdown()
    assert all(b.route_observer is None for b in blocks), "the writer still observes after shutdown"
    header, forwards = read_trace(path)
    cfg = (header["num_experts"], header["top_k"], header["moe_layers"])
    assert cfg == (tcfg.n_routed_experts, tcfg.num_experts_per_tok, len(blocks))
    assert forwards and {fw["rows"] for fw in forwards} >= {3}, [fw["rows"] for fw in forwards]  # verify of k + 1
    # every recorded layer's ids are what its router picks for the input it saw, call by call
    calls = [ids for fw in forwards for ids in fw["ids"]]
    assert len(calls) == len(seen), (len(calls), len(seen))
    for ids, (block, x) in zip(calls, seen, strict=True):
        route = block.routing()
        _, want = kernels.moe_topk(block.gate(x), route.bias, **route.topk_kwargs())
        assert torch.equal(ids.sort(-1).values, want.long().sort(-1).values)
    E, k, L = cfg
    first3 = next(fw["ids"] for fw in forwards if fw["rows"] == 3)
    routing = DrawnRouting(E, k, L, trace=str(path), shapes=[(1, 3), (1, 1000)], device="cpu")
    assert torch.equal(routing.pool[3].long(), first3) and 1000 not in routing.pool
    assert routing.distinct_experts(3) == sum(len(set(layer.flatten().tolist())) for layer in first3)
    with pytest.raises(ValueError, match=f"{E} experts, top_k {k}, {L} MoE layers; this model has {E + 1}"):
        DrawnRouting(E + 1, k, L, trace=str(path), device="cpu")
    assert parse_routing(f"trace:{path}") == RoutingChoice("trace", path=str(path))



def test_read_trace_refuses_what_is_not_a_trace(tmp_path):
    """read_trace names the file (and line) of a file that is not a routing trace, another version, or a forward
    whose ids do not fit the header (layers, top_k, experts)."""
    import json

    from sglang_eagle3.runtime.routing_trace import FORMAT, read_trace

    head = {"format": FORMAT, "version": 1, "num_experts": 4, "top_k": 2, "moe_layers": 2}
    good = {"rows": 1, "ids": [[[0, 3]], [[1, 2]]]}
    cases = {"plain.txt": ["hello"], "v2.jsonl": [dict(head, version=2)],
             "layers.jsonl": [head, {"rows": 1, "ids": [[[0, 3]]]}],
             "expert.jsonl": [head, good, {"rows": 1, "ids": [[[0, 4]], [[1, 2]]]}],
             "rows.jsonl": [head, {"rows": 2, "ids": good["ids"]}], "broken.jsonl": [head, "{"]}
    said = {"plain.txt": "not a routing trace", "v2.jsonl": "version 2", "layers.jsonl": ":2: a forward's ids",
            "expert.jsonl": ":3: a forward's ids", "rows.jsonl": ":2: a forward's ids",
            "broken.jsonl": ":2: not a forward"}
    for name, lines in cases.items():
        f = tmp_path / name
        f.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
        with pytest.raises(ValueError, match=said[name]) as err:
            read_trace(f)
        assert str(f) in str(err.value)
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps(head) + "\n" + json.dumps(good) + "\n")
    header, forwards = read_trace(ok)
    assert header == head and forwards[0]["rows"] == 1 and forwards[0]["ids"].tolist() == good["ids"]


@pytest.mark.gpu
def test_routing_trace_is_refused_beside_cuda_graphs(monkeypatch, tmp_path):
    """A replayed graph runs no Python: a trace asked for with CUDA graphs on is refused by name before the engine
    builds its runner."""
    from sglang_eagle3 import Engine
    from sglang_eagle3.config import ConfigError

    monkeypatch.setenv("SGLANG_EAGLE3_ROUTING_TRACE", str(tmp_path / "t.jsonl"))
    with pytest.raises(ConfigError, match="SGLANG_EAGLE3_ROUTING_TRACE=.*disable_cuda_graph=True"):
        Engine(device="cuda", speculative_num_steps=2)
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("reuse", [0.0, 0.4, 0.8])
def test_trace_stats_recover_the_reuse_a_trace_was_drawn_with(tmp_path, reuse):
    """benchmarks/routing.py stats: on a trace written from draw_routing at a known P (one request a forward), the
    estimated reuse lands near P and the distinct experts a layer near what the draws hold; the CLI prints it and
    names a file that is not a trace."""
    import json
    import subprocess

    from benchmarks.routing import trace_stats
    from sglang_eagle3.runtime.routing_trace import FORMAT

    E, k, L, n, forwards = 48, 6, 8, 5, 30
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    lines = [json.dumps({"format": FORMAT, "version": 1, "num_experts": E, "top_k": k, "moe_layers": L})]
    distinct = []
    for _ in range(forwards):
        ids = draw_routing(E, k, L, 1, n, reuse, g)
        distinct += [len(set(layer.flatten().tolist())) for layer in ids]
        lines.append(json.dumps({"rows": n, "ids": ids.tolist()}))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    row = trace_stats(str(path))["rows"][n]
    assert row["forwards"] == forwards
    assert row["distinct_experts_a_layer"] == round(sum(distinct) / len(distinct), 2)
    assert abs(row["reuse_estimate"] - reuse) < 0.08, row  # 4 x 8 x 30 token pairs: a standard error of ~0.01
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "routing.py"), "stats", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["rows"][str(n)]["forwards"] == forwards, proc.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("x\n")
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "routing.py"), "stats", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"{bad}: not a routing trace" in proc.stderr


@pytest.mark.parametrize("tokens", [1, 3, 4, 8])
def test_launch_floor_experts_match_uniform_draws(tokens):
    """bench_launch_floor.py's --tokens T reads uniform_experts(T) experts a MoE layer: the distinct experts that
    draw_routing's uniform draws (reuse 0) give T tokens on average, counted from the draws."""
    from benchmarks import bench_launch_floor as floor

    gen = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    ids = draw_routing(floor.EXPERTS, floor.TOP_K, layers=400, requests=1, tokens=tokens, reuse=0.0, generator=gen)
    distinct = torch.tensor([float(len(set(layer.flatten().tolist()))) for layer in ids])
    se = distinct.std().item() / math.sqrt(len(distinct))
    assert abs(distinct.mean().item() - floor.uniform_experts(tokens)) <= 0.5 + 4 * se
    plan = floor.layer_launches(False, 1024, floor.uniform_experts(tokens))
    decode = floor.layer_launches(False, 1024)
    grown = {n for (n, b, _), (_, b0, _) in zip(plan, decode, strict=True) if b != b0}
    assert grown <= {"experts gate/up", "experts down"}, "only the experts' launches read more at a verify"
    with pytest.raises(SystemExit, match="--tokens"):
        floor.uniform_experts(0)


def test_launch_gaps_match_each_launch_in_the_last_moe_layer():
    """benchmarks/launch_gaps.py pairs each launch of the floor's MoE-layer plan with its kernel in the profile's last
    MoE layer, the side-stream shared down wherever it ran, and sets the read-only time of its bytes beside it."""
    import random

    from benchmarks import bench_launch_floor as floor
    from benchmarks import launch_gaps

    plan = [{"launch": n, "bytes": b, "stream": s} for n, b, s in floor.layer_launches(False, 1024, 31)]
    sizes = sorted({p["bytes"] for p in plan})
    read = {b: random.uniform(1, 30) for b in sizes}
    fl = {"tokens": 4, "plan_of_a_moe_layer": plan,
          "sizes": [{"mb": round(b / 1e6, 4), "alone_us": read[b]} for b in sizes]}
    layer = [{"kernel": launch_gaps.KERNEL_OF[p["launch"]], "us_median": random.uniform(1, 40), "us": 0.0}
             for p in plan]
    own = {p["launch"]: k["us_median"] for p, k in zip(plan, layer, strict=True)}
    moved = layer[:]
    shared = next(i for i, p in enumerate(plan) if p["launch"] == "shared down")
    moved.insert(shared + 2, moved.pop(shared))  # the side stream's launch ran after the routing
    head = [{"kernel": "rms_norm_kernel", "us": 9.0}, {"kernel": "moe_int4_gemv_down_kernel", "us": 99.0}]
    profile = {"steps": [{"T": 4, "sequence": head + moved + [{"kernel": "rms_norm_kernel", "us": 1.0}]},
                         {"T": 8, "sequence": moved}]}
    (table,) = launch_gaps.gaps(profile, [fl])  # T=8 has no floor: left out
    assert [r["launch"] for r in table["rows"]] == [p["launch"] for p in plan]
    for r, p in zip(table["rows"], plan, strict=True):
        assert r["own_us"] == own[p["launch"]] and r["read_only_us"] == read[p["bytes"]]
    broken = [k for k in moved if k["kernel"] != "moe_topk_kernel"]
    with pytest.raises(SystemExit, match="moe_topk_kernel"):
        launch_gaps.gaps({"steps": [{"T": 4, "sequence": head + broken}]}, [fl])

