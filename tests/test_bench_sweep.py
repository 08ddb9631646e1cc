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
