"""benchmarks/probe_invariance.py on CPU: how it names the module where a verify row first leaves the decode of the
same token (synthetic call records), and the whole probe on a tiny DeepSeek-V3 with the torch references."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.probe_invariance import Recorder, culprits, probe  # noqa: E402
from sglang_eagle3.distributed.parallel_state import init_tp  # noqa: E402
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM  # noqa: E402
from sglang_eagle3.runtime.model_runner import ModelRunner  # noqa: E402
from sglang_eagle3.testing import randomize, tiny_config  # noqa: E402


def test_culprits_are_the_modules_where_a_row_first_differs():
    T, i = 3, 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, 5, generator=g)
    y = torch.randn(T, 5, generator=g)
    heads = torch.randn(T * 4, 2, generator=g)  # 4 rows a token (heads)
    nudged = y.clone()
    nudged[i] += 1e-3
    # verify: a(x) -> y, b(y) -> heads, parent(x) -> y, c(heads) -> heads (a second call of b too)
    verify = [("m.a", x, y), ("m.b", y, heads), ("m", x, y), ("m.b", y, y), ("m.c", heads, heads)]
    # decode of token i: "m.a" rounds row i apart (so does its parent "m"); "m.b" sees the difference; "m.c"'s
    # input (a heads-shaped row) is identical and its output is not
    other_heads = heads[4 * i:4 * i + 4].clone()
    other_heads[0, 0] += 1.0
    decode = [("m.a", x[i:i + 1], nudged[i:i + 1]), ("m.b", nudged[i:i + 1], heads[4 * i:4 * i + 4]),
              ("m", x[i:i + 1], nudged[i:i + 1]), ("m.b", y[i:i + 1], y[i:i + 1]),
              ("m.c", heads[4 * i:4 * i + 4], other_heads)]
    found = culprits(verify, decode, i, T)
    assert [c["module"] for c in found] == ["m.a", "m.c"], found
    assert abs(found[0]["max_abs_diff"] - 1e-3) < 1e-6 and found[1]["max_abs_diff"] == 1.0
    assert culprits(verify, [(n, a[i:i + 1] if a.shape[0] == T else a[4 * i:4 * i + 4],
                              o[i:i + 1] if o.shape[0] == T else o[4 * i:4 * i + 4]) for n, a, o in verify], i, T) == []


def test_probe_runs_on_a_tiny_model():
    init_tp(0, 1)
    cfg = tiny_config(vocab=96, hidden=64, heads=4, layers=2, experts=8, top_k=2, n_group=1, topk_group=1,
                      moe_inter=32, inter=96)
    model = randomize(DeepseekV3ForCausalLM(cfg, dtype=torch.float32), 3, 1.0)
    runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=8, page_size=16, max_context=96,
                         device=torch.device("cpu"), dtype=torch.float32, use_cuda_graph=False, cuda_graph_max_bs=1,
                         verify_widths=(2, 3), attention_backend="torch", moe_backend="torch")
    rec = Recorder(model, layers=2)
    cases = probe(runner, rec, contexts=[20], widths=[3], pages=[1, 2, 3, 4, 5, 6], graphs=False)
    rows = cases[0]["eager"]
    assert [r["row"] for r in rows] == [0, 1, 2] and cases[0]["T"] == 3
    for r in rows:  # CPU matmuls of 1 and 3 rows may round apart; then some module is named and it is a leaf-most one
        assert r["identical"] or r["culprits"], r
        names = [c["module"] for c in r.get("culprits", [])]
        assert not any(a != b and b.startswith(a + ".") for a in names for b in names), names
    assert not rec.on and rec.calls == []
