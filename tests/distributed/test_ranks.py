"""The multi-GPU benchmarks' launcher (bench/ranks.py) and simulated rank slices that still all-reduce, on CPU
with gloo: results come back by rank, a failing rank is named, and tp_all_reduce sums only when asked to."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_eagle3.bench.ranks import SAFE_ENV, run_ranks
from sglang_eagle3.distributed import parallel_state
from sglang_eagle3.distributed.parallel_state import init_tp, tp_all_gather_last_dim, tp_all_reduce, tp_min_int


def _slice_collectives(rank, world, seed):
    """A simulated TP=8 slice on each rank: what the two collectives do with and without simulated_all_reduce;
    before that, the real ranks agreeing on the smallest of their values (tp_min_int: the KV pool's pages at
    start-up), which a simulated slice keeps as its own."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed + rank))
    value = (seed * 7919 + rank * 104729) % 1000003
    out = {"x": x.clone(), "env": {k: os.environ.get(k) for k in SAFE_ENV}, "value": value}
    init_tp(rank, world)
    out["min"] = tp_min_int(value, torch.device("cpu"))
    init_tp(0, 8, simulated=True)
    out["min_simulated"] = tp_min_int(value, torch.device("cpu"))
    out["skipped"] = tp_all_reduce(x.clone())
    init_tp(0, 8, simulated=True, simulated_all_reduce=True)
    out["reduced"] = tp_all_reduce(x.clone())
    out["gathered_shape"] = tuple(tp_all_gather_last_dim(x.clone()).shape)  # stays this rank's slice
    out["tp"] = parallel_state.get_tp()
    return out


def _fail_on_rank_one(rank, world, _):
    if rank == 1:
        raise ValueError("planted failure")
    return rank


def _die_on_rank_one(rank, world, _):
    if rank == 1:
        os._exit(3)  # no result, no traceback: as a segfault or an OOM kill would leave it
    import torch.distributed as dist

    dist.barrier()  # rank 0 waits for the dead rank: the launcher must not wait with it
    return rank


def _hang(rank, world, _):
    import time

    time.sleep(60)


def test_simulated_slices_all_reduce_over_the_real_group():
    seed = int(torch.randint(0, 10_000, ()).item())
    res = run_ranks(3, _slice_collectives, seed, device="cpu", timeout=120)
    total = sum(res[r]["x"] for r in range(3))
    smallest = min(res[r]["value"] for r in range(3))
    for r in range(3):
        assert res[r]["min"] == smallest and res[r]["min_simulated"] == res[r]["value"]
        assert torch.equal(res[r]["skipped"], res[r]["x"])
        torch.testing.assert_close(res[r]["reduced"], total)
        assert res[r]["gathered_shape"] == (3, 5)
        assert res[r]["tp"].size == 8 and res[r]["tp"].simulated_all_reduce
        assert res[r]["env"] == SAFE_ENV


def test_failing_rank_is_named():
    with pytest.raises(RuntimeError, match=r"rank 1: ValueError: planted failure"):
        run_ranks(2, _fail_on_rank_one, None, device="cpu", timeout=120)


def test_dead_rank_is_named_and_nothing_is_left():
    import multiprocessing

    with pytest.raises(RuntimeError, match=r"rank 1: exited with code 3 without a result"):
        run_ranks(2, _die_on_rank_one, None, device="cpu", timeout=120)
    assert not multiprocessing.active_children()


def test_ranks_past_the_deadline_are_stopped():
    import multiprocessing
    import time

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ranks \[0, 1\] gave no result within 8 s"):
        run_ranks(2, _hang, None, device="cpu", timeout=8)
    assert time.monotonic() - t0 < 40 and not multiprocessing.active_children()


def test_bad_arguments():
    before = parallel_state.get_tp()
    with pytest.raises(ValueError, match="world >= 2, got 1"):
        run_ranks(1, _fail_on_rank_one, None, device="cpu")
    with pytest.raises(ValueError, match="'tpu'"):
        run_ranks(2, _fail_on_rank_one, None, device="tpu")
    with pytest.raises(ValueError, match="simulated rank slices only"):
        init_tp(0, 2, simulated_all_reduce=True)
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        init_tp(0, 8, simulated=True, simulated_all_reduce=True)  # no process group in this process
    assert parallel_state.get_tp() == before  # a refused init_tp leaves the coordinates as they were
