"""bench_verify_graph.paired_summary, the statistics of --paired (settings replayed interleaved, round by round),
on CPU: a setting's ratio to the first is the median of the rounds' ratios with a bootstrap interval, so a slow
drift shared by every setting of a round cancels where the medians of separately timed runs would carry it."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_verify_graph import paired_summary  # noqa: E402


def _rounds(n: int, effect: float, seed: int) -> dict[str, list[float]]:
    """Round times of three settings under a shared drift of several percent: 'base', 'slower' (x effect) and
    'same' (x 1), each with its own 0.3% noise."""
    g = torch.Generator().manual_seed(seed)
    drift = 4.3 * (1 + 0.04 * torch.cumsum(torch.randn(n, generator=g), 0) / n ** 0.5)  # a random walk, ~4%

    def noisy(scale: float) -> list[float]:
        return (drift * scale * (1 + 0.003 * torch.randn(n, generator=g))).tolist()

    return {"base": noisy(1.0), "slower": noisy(effect), "same": noisy(1.0)}


def test_paired_summary_finds_a_small_effect_under_drift():
    seed = int(torch.randint(0, 1 << 30, (1,)))
    effect = 1.0 + float(torch.empty(1).uniform_(0.006, 0.02))  # 0.6-2%: below the drift
    times = _rounds(201, effect, seed)
    out = paired_summary(times, seed=seed)
    assert set(out) == set(times)
    for name, row in out.items():
        assert row["median_ms"] == pytest.approx(statistics.median(times[name]), abs=1e-4), (seed, name)
    assert out["base"]["vs_first"] == 1.0 and out["base"]["ci95"] == [1.0, 1.0], seed
    lo, hi = out["slower"]["ci95"]
    ratios = torch.tensor(times["slower"]) / torch.tensor(times["base"])
    assert out["slower"]["vs_first"] == pytest.approx(ratios.median().item(), abs=5e-5), seed  # odd rounds: one median
    # A 95% interval misses the truth one time in twenty by design: allow its own width on each side (~4 standard
    # errors of the median), still far tighter than the effect, which must lie outside "no effect".
    width = hi - lo
    assert lo - width <= effect <= hi + width and lo > 1.0, (seed, effect, lo, hi)
    assert width < 0.004, (seed, lo, hi)  # ~0.3% noise a round: a tight interval
    lo, hi = out["same"]["ci95"]
    assert lo - (hi - lo) <= 1.0 <= hi + (hi - lo), (seed, lo, hi)
    # The drift itself is larger than the effect: separate medians of halves of the run would not see it reliably.
    spread = max(times["base"]) / min(times["base"])
    assert spread - 1 > effect - 1, (seed, spread, effect)


def test_paired_summary_needs_equal_rounds():
    with pytest.raises(AssertionError, match="same rounds"):
        paired_summary({"a": [1.0, 2.0], "b": [1.0]})
    with pytest.raises(AssertionError, match="same rounds"):
        paired_summary({"a": [], "b": []})


class _FakeStats:
    def __init__(self):
        self.eager = {"target_verify": 0}


class _FakeRunner:
    """What paired_times uses of a ModelRunner: build, target_uniform, and the graph runners' eager counts."""

    def __init__(self, log: list, name: str, eager_from: int | None = None):
        self.log, self.name, self.eager_from, self.calls = log, name, eager_from, 0
        stats = _FakeStats()
        self.target_decode = self.target_verify = type("G", (), {"stats": stats})()

    def build(self, rows):
        return rows

    def target_uniform(self, bt, T, verify):
        self.calls += 1
        self.log.append(self.name)
        if self.eager_from is not None and self.calls > self.eager_from:
            self.target_verify.stats.eager["target_verify"] += 1


def test_paired_times_rotates_the_order_and_refuses_eager(monkeypatch):
    import benchmarks.bench_verify_graph as bvg

    monkeypatch.setattr(bvg, "median_ms", lambda fn, iters: (fn(), 1.0)[1])
    monkeypatch.setattr(bvg.torch.cuda, "synchronize", lambda: None)
    log: list[str] = []
    kept = [(n, _FakeRunner(log, n)) for n in ("a", "b", "c")]
    times = bvg.paired_times(kept, 1024, 4, [[1, 2]], rounds=6, warmup=2)
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6, "c": 6}
    rounds = log[6:]  # after 2 warm-up calls each
    assert [rounds[i * 3:(i + 1) * 3] for i in range(3)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    log.clear()
    kept = [("a", _FakeRunner(log, "a")), ("b", _FakeRunner(log, "b", eager_from=4))]  # b falls back to eager
    with pytest.raises(RuntimeError, match="'b' ran eager at ctx 1024 T=4"):
        bvg.paired_times(kept, 1024, 4, [[1, 2]], rounds=4, warmup=2)


def test_env_settings_reread_per_setting():
    """apply_env_settings: a setting of --env-variants that names SGLANG_EAGLE3_OVERLAP or SGLANG_EAGLE3_NO_FUSE
    reaches a model built before it (as a fresh start would), and the environment as it was comes back after."""
    from benchmarks.bench_verify_graph import apply_env_settings
    from sglang_eagle3 import env
    from sglang_eagle3.layers.overlap import Overlaps
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.testing import tiny_config

    cfg = tiny_config(vocab=64, hidden=32, heads=2, layers=2, q_lora=16, kv_lora=16, nope=8, rope=8, v=8,
                      experts=4, top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48, max_pos=64, dense=1)
    model = DeepseekV3ForCausalLM(cfg, dtype=torch.float32)
    built = model.model.overlaps
    moe = model.model.layers[1].mlp
    fused = moe.fuse_router_shared
    with env.overrides({env.OVERLAP.name: "prefetch_mid_o", env.NO_FUSE.name: "router_shared"}):
        apply_env_settings(model)
        assert model.model.overlaps == Overlaps(prefetch="prefetch_mid_o")
        assert model.model.layers[1].self_attn.after_kv_a is not None
        assert moe.fuse_router_shared is False
        apply_env_settings(model, "shared_down")  # an --overlap-variants value wins over the environment
        assert model.model.overlaps == Overlaps(shared_down=True)
    apply_env_settings(model)
    assert model.model.overlaps == built and moe.fuse_router_shared == fused


def test_report_paired_verdicts():
    """report.py's paired table and verdicts, from paired_summary on drifting rounds: a setting faster at verify of
    4 and not slower at decode is 'on'; one slower at decode is 'off'; one level at verify is 'off'."""
    from benchmarks.bench_verify_graph import paired_summary
    from benchmarks.report import paired_table, paired_verdict

    seed = int(torch.randint(0, 1 << 30, (1,)))
    # (decode, verify of 4) effects; "level at decode" is 0.1% faster, which keeps its interval off the wrong side
    # of 1 (the median's interval is ~+-0.05% at this noise) but for a rare draw
    effects = {"base": (1.0, 1.0), "wins": (0.999, 0.97), "slower at decode": (1.02, 0.97), "level": (0.999, 1.0)}
    paired = []
    for ctx in (1024, 8192):
        for T, col in ((1, 0), (4, 1)):
            g = torch.Generator().manual_seed(seed + ctx + T)
            drift = 4.0 * (1 + 0.04 * torch.cumsum(torch.randn(201, generator=g), 0) / 201 ** 0.5)
            times = {name: (drift * e[col] * (1 + 0.002 * torch.randn(201, generator=g))).tolist()
                     for name, e in effects.items()}
            paired.append({"context": ctx, "T": T, "rounds": 201, "settings": paired_summary(times, seed=seed)})
    d = {"git_commit": "abcdef0123", "gpu": "test", "paired": paired}
    verdicts = {}
    for name in effects:
        rows = {(p["context"], p["T"]): p["settings"][name] for p in paired}
        verdicts[name] = paired_verdict(rows)
    assert verdicts["wins"].startswith("on"), (seed, verdicts)
    assert verdicts["slower at decode"] == "off: slower at decode", (seed, verdicts)
    assert verdicts["level"] == "off: not faster at verify of 4", (seed, verdicts)
    assert paired_verdict({(1024, 1): paired[0]["settings"]["wins"]}).startswith("undecided")
    table = paired_table(d)
    assert table.count("\n| ") == len(effects) + 1 and "(the base)" in table and "1024 T=4" in table, table


def test_report_cli_help_and_unreadable_files(tmp_path):
    """report.py answers --help (it read '--help' as a file name) and names a file it cannot read, exit status 1,
    still rendering the readable ones."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "report.py"
    assert subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True).returncode == 0
    good = tmp_path / "other.json"
    good.write_text(json.dumps({"something": 1}))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "missing.json"), str(good)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "missing.json" in proc.stderr and "no renderer" in proc.stdout
