"""The kernel benchmark's sweep output: configs per token count folded into a table's buckets, which the
launchers' bucket lookup then reads back as swept (tuning._pick_bucket), for every token count."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_kernels import buckets_of  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402


@pytest.mark.parametrize("seed", range(6))
def test_buckets_round_trip(seed):
    rng = random.Random(seed)
    configs = [{"BLOCK_N": bn, "num_warps": w} for bn in (4, 8, 16) for w in (2, 4)]
    n = rng.randint(1, 9)
    per_t = {}
    for t in range(1, n + 1):  # runs of equal configs, as a sweep of a few T over a table gives
        per_t[t] = per_t[t - 1] if t > 1 and rng.random() < 0.5 else rng.choice(configs)
    buckets = buckets_of(per_t, "tokens")
    assert "max_tokens" not in buckets[-1]
    cfgs = [{k: v for k, v in b.items() if not k.startswith("max_")} for b in buckets]
    assert all(a != b for a, b in zip(cfgs, cfgs[1:], strict=False))  # no two neighbours alike
    for t, cfg in per_t.items():
        assert tuning._pick_bucket(buckets, "tokens", t) == cfg, (t, per_t, buckets)
    assert tuning._pick_bucket(buckets, "tokens", n + 5) == per_t[n]  # past the last key: the last config


def test_buckets_need_every_key():
    with pytest.raises(AssertionError, match="every key from 1"):
        buckets_of({1: {"a": 1}, 3: {"a": 2}}, "tokens")


def test_tile_table_ops_buckets_by_next_swept_t():
    """bench_moe_tile's table from per-T winners: a T takes the next swept T's winner, equal runs merge, the
    largest swept T's bucket is unbounded."""
    from benchmarks.bench_moe_tile import tile_table_ops

    gu = [{"BLOCK_M": 16, "BLOCK_N": n} for n in (32, 64)]
    dn = [{"BLOCK_N": n} for n in (64, 128)]
    ops = tile_table_ops({64: (gu[0], dn[0]), 16: (gu[0], dn[0]), 2048: (gu[1], dn[0]), 256: (gu[0], dn[1])})
    assert ops["fused_moe_int4_gate_up"] == [{"max_tokens": 256, **gu[0]}, gu[1]]
    assert ops["fused_moe_int4_down"] == [{"max_tokens": 64, **dn[0]}, {"max_tokens": 256, **dn[1]}, dn[0]]


FORMS = [(gu_f16, gu_w, dn_f16, dn_w) for gu_f16 in (False, True) for dn_f16 in (False, True)
         for gu_w, dn_w in ((128, 32), (64, 16))]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f"gu{f[0]}-w{f[1]}-dn{f[2]}-w{f[3]}")
def test_gemv_sweep_keeps_the_tables_arithmetic(form):
    """Every joint candidate of the INT4 GEMV sweep keeps the table's F16 and BLOCK_W in each op (a table mixing them
    across buckets computes a verify's token apart from its decode), varies tiles only, takes ROWS 2 only in the F16
    gate_up and a gate_up BLOCK_N of whole act words under an F16 down; and a table of per-T winners drawn from them
    is one arithmetic at every T."""
    from benchmarks.bench_kernels import gemv_form_candidates

    gu_f16, gu_w, dn_f16, dn_w = form
    table_cfg = {"gate_up": {**tuning.DEFAULTS["fused_moe_int4_gemv_gate_up"], "F16": gu_f16, "BLOCK_W": gu_w},
                 "down": {**tuning.DEFAULTS["fused_moe_int4_gemv_down"], "F16": dn_f16, "BLOCK_W": dn_w}}
    pairs = gemv_form_candidates(table_cfg)
    assert len(pairs) == len({repr(p) for p in pairs}) > 8
    for pair in pairs:
        for op, cfg in pair.items():
            assert set(cfg) == set(tuning.DEFAULTS[f"fused_moe_int4_gemv_{op}"]), (op, cfg)
            assert (cfg["F16"], cfg["BLOCK_W"]) == (table_cfg[op]["F16"], table_cfg[op]["BLOCK_W"]), (op, cfg)
        assert pair["gate_up"]["ROWS"] == 1 or gu_f16
        assert not dn_f16 or pair["gate_up"]["BLOCK_N"] % 8 == 0
    assert any(p["gate_up"]["ROWS"] == 2 for p in pairs) == gu_f16
    assert {p["down"]["PRELOAD"] for p in pairs} == {False, True}

    rng = random.Random(sum(map(int, form)))
    per_t = {t: rng.choice(pairs) for t in range(1, 9)}
    for op in ("gate_up", "down"):
        buckets = buckets_of({t: c[op] for t, c in per_t.items()}, "tokens")
        assert len({(b["F16"], b["BLOCK_W"]) for b in buckets}) == 1


@pytest.mark.parametrize("sweep_us, kept", [(9.0, "sweep"), (9.95, "table"), (11.0, "table")])
def test_gemv_sweep_confirms_its_winner(monkeypatch, sweep_us, kept):
    """A sweep's winner replaces the table's config only where it beats it by more than 1% in the alternating
    confirmation (its 10-replay sweep time can be luck); a winner equal to the table's is not timed again."""
    import benchmarks.bench_kernels as bk

    table_cfg, best = {"gate_up": {"BLOCK_N": 16}}, {"gate_up": {"BLOCK_N": 32}}
    timed = []

    def fake_time_graph(calls, replays=30):
        timed.append(calls)
        return {"table": 10.0, "sweep": sweep_us}[calls] + random.uniform(-0.01, 0.01)

    monkeypatch.setattr(bk, "time_graph", fake_time_graph)
    rows = []
    chosen = bk.confirm_pair(rows, lambda cfg: "table" if cfg is table_cfg else "sweep", table_cfg, best)
    assert chosen == (best if kept == "sweep" else table_cfg)
    assert timed == ["table", "sweep"] * 3 and rows[-1]["kept"] == kept
    timed.clear()
    assert bk.confirm_pair(rows, lambda cfg: "table", table_cfg, dict(table_cfg)) == table_cfg and not timed


def test_variant_tables_change_only_their_configs():
    """Each paired-run table of benchmarks/variant_tables.py reads back, key by key, as the checked-in sm_90 table
    with its changes at its keys only, and passes the check SGLANG_EAGLE3_CONFIG_TABLE applies over the checked-in
    table (tuning.over_checked_in: what fixes a token's bits the same in every bucket)."""
    import json

    from benchmarks.variant_tables import KEYS, VARIANTS, variant_table

    base = json.loads((tuning.CONFIG_DIR / "sm_90.json").read_text())
    for name, changes in VARIANTS.items():
        table = variant_table(name, base)
        assert set(table["ops"]) == {op for op, _, _ in changes}, name
        tuning.over_checked_in(table, base["arch"], base["sm_counts"][0], name)
        for op in table["ops"]:
            key_name, last = KEYS[op]
            for k in range(1, last + 8):
                want = tuning.table_config(base, op, key_name, k)
                for (c_op, lo, hi), change in changes.items():
                    if c_op == op and lo <= k and (hi is None or k <= hi):
                        want = {**want, **change}
                assert tuning.table_config(table, op, key_name, k) == want, (name, op, k)


def test_profile_by_t_table():
    """profile_step's side-by-side table: a row a kernel in order of its time at the largest T, its us a call at
    each T ('-' where it did not run), the graph and busy time a layer from the steps' ms."""
    from benchmarks.profile_step import by_t_table

    def step(T, graph_ms, kernels):
        return {"T": T, "graph_ms": graph_ms, "kernel_busy_ms": graph_ms * 0.8,
                "kernels": [{"kernel": n, "per_step_us": us * c * 2, "calls_per_layer": c, "us_per_call": us}
                            for n, us, c in kernels]}

    rows = by_t_table([step(1, 0.2, [("gate_up", 9.9, 0.75), ("merge", 2.9, 1.0)]),
                       step(4, 0.4, [("merge", 2.8, 2.0), ("gate_up", 27.2, 0.75), ("big_tail", 3.0, 0.25)])], 2)
    assert rows[0].split()[-2:] == ["T=1", "T=4"]
    assert [r.split()[0] for r in rows[1:4]] == ["gate_up", "merge", "big_tail"]
    assert rows[2].split()[1] == "(1.00)"  # calls a layer at the first T a kernel ran
    assert rows[1].split()[-3:] == ["(0.75)", "9.90", "27.20"] and rows[3].split()[-2:] == ["-", "3.00"]
    assert rows[4].split()[-2:] == ["100.0", "200.0"] and rows[5].split()[-2:] == ["80.0", "160.0"]


def test_sweep_table_written_only_where_the_engine_takes_it(tmp_path):
    """bench_kernels' sweeps write their table only once it passes the check SGLANG_EAGLE3_CONFIG_TABLE applies
    (over the checked-in sm_90 table); a refused one leaves the timings (sweep.json) and no table. run_sweep's MLA
    verify candidates keep the decode winner's split size, key tile and merge (the keys that fix a token's sums)."""
    import json

    from benchmarks import bench_kernels as bk

    sms = json.loads((tuning.CONFIG_DIR / "sm_90.json").read_text())["sm_counts"][0]
    good = {"arch": "sm_90", "sm_counts": [sms], "ops": {
        "fused_moe_int4_gemv_gate_up": [{"max_tokens": 2, "BLOCK_N": 8, "F16": True}, {"BLOCK_N": 16, "F16": True}]}}
    bk.write_sweep_table(tmp_path, good, {"t": [1.0]})
    assert json.loads((tmp_path / "sweep_table.json").read_text()) == good
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = {**good, "ops": {"fused_moe_int4_gemv_gate_up": [{"max_tokens": 2, "BLOCK_N": 8, "F16": True},
                                                            {"BLOCK_N": 16, "F16": False}]}}
    with pytest.raises(ValueError, match=r"the sweep's table for .*bad/sweep_table.json over sm_90.json: "
                                         r"fused_moe_int4_gemv_gate_up's buckets differ"):
        bk.write_sweep_table(bad_dir, bad, {"t": [1.0]})
    assert json.loads((bad_dir / "sweep.json").read_text()) == {"t": [1.0]}
    assert not (bad_dir / "sweep_table.json").exists()
    decode = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3, "ctas_per_sm": 2,
              "min_keys_per_split": 256}
    keys = tuning.ONE_ARITHMETIC_KEYS["mla_attention"]
    full = {**tuning.DEFAULTS["mla_attention"], **decode}
    cands = bk.mla_verify_candidates(decode)
    assert len(cands) > 1 and all({**tuning.DEFAULTS["mla_attention"], **c}[k] == full[k] for c in cands for k in keys)
    for c in cands:
        tuning.check_table({"ops": {"mla_attention": [{"max_rows": 16, **decode}, c]}}, "t")
