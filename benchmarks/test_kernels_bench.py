"""pytest-benchmark microbenchmarks of the Triton kernels at Kimi-K2.5 TP=8 decode shapes (skipped without
CUDA). Wall-clock per call including launch; benchmarks/bench_kernels.py gives the graph-replayed numbers.

    pytest benchmarks/test_kernels_bench.py -o addopts="" --benchmark-only
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _synced(fn):
    def run():
        out = fn()
        torch.cuda.synchronize()
        return out
    return run


@pytest.mark.parametrize("T", [1, 64])
def test_bench_moe_topk(benchmark, T):
    from benchmarks.bench_kernels import topk_case

    calls, _ = topk_case(T)
    benchmark(_synced(calls()[0]))


@pytest.mark.parametrize("B,T,ctx", [(1, 1, 8192), (4, 4, 8192)])
def test_bench_mla(benchmark, B, T, ctx):
    from benchmarks.bench_kernels import mla_case

    calls, _ = mla_case(B, T, ctx)
    benchmark(_synced(calls()[0]))


@pytest.mark.parametrize("T", [1, 8])
def test_bench_fused_moe_int4(benchmark, T):
    from benchmarks.bench_kernels import make_moe_weights, moe_case

    calls, _, _ = moe_case(T, True, make_moe_weights(True))
    benchmark(_synced(calls()[0]))
