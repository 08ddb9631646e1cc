"""What keeps loading memory near one shard: lazy slices read only their bytes, FP8 dequantises only the
blocks it needs, and shards are opened one at a time and closed before the next."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglang_eagle3.kernels.quant import dequant_fp8_block
from sglang_eagle3.models import loader
from sglang_eagle3.models.loader import Fp8BlockTensor, LazyTensor, ReadStats, hf_state_dict, load_target, read_header
from tests.loaders.ckpt import (
    fp8_config,
    fp8_quantize,
    int4_config,
    plain_model,
    write_deepseek_fp8,
    write_kimi_int4,
    write_sharded,
)


class SpyHandle:
    """A safe_open handle that records which tensors are fetched."""

    def __init__(self, handle):
        self.h, self.calls = handle, []

    def get_tensor(self, name):
        self.calls.append(name)
        return self.h.get_tensor(name)


@pytest.fixture
def one_file(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"w": torch.randn(300, 260, generator=g), "stack": torch.randn(4, 6, 10, generator=g)}
    q, s = fp8_quantize(tensors["w"])
    tensors.update(q=q, s=s)
    f = str(tmp_path / "t.safetensors")
    save_file(tensors, f)
    return f, tensors, read_header(f)


def test_narrow_is_a_view_of_the_map(one_file):
    """narrow returns the slice as a view of the shard's memory map: the weight_loader's copy is the only copy."""
    f, tensors, infos = one_file
    with safe_open(f, "pt") as h:
        spy, stats = SpyHandle(h), ReadStats()
        lazy = LazyTensor(spy, infos["w"], stats)
        assert lazy.shape == (300, 260) and spy.calls == []
        rows = lazy.narrow(0, 150, 150)
        cols = lazy.narrow(1, 130, 130)
        assert torch.equal(rows, tensors["w"][150:]) and torch.equal(cols, tensors["w"][:, 130:])
        mapped = h.get_tensor("w")
        assert rows.untyped_storage().data_ptr() == mapped.untyped_storage().data_ptr()  # no copy made
        assert stats.bytes_read == 2 * 150 * 260 * 4  # the slices' bytes, not the tensor's


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_narrow_touches_only_the_slice_pages(tmp_path):
    """Physically: reading a 1/8 row slice of a 64 MB tensor maps about 8 MB of the file, not 64 MB."""
    f = str(tmp_path / "big.safetensors")
    save_file({"w": torch.ones(4096, 4096)}, f)
    info = read_header(f)["w"]
    with safe_open(f, "pt") as h:
        before = _rss()
        part = LazyTensor(h, info).narrow(0, 1024, 512)
        assert float(part.sum()) == 512 * 4096  # reads every byte of the slice
        grown = _rss() - before
    assert grown < 24 << 20, f"RSS grew {grown >> 20} MB for an 8 MB slice of a 64 MB tensor"


def test_lazy_views_compose(one_file):
    """One expert's half of a stacked gate_up_proj, then a TP slice of it: exactly that block."""
    f, tensors, infos = one_file
    with safe_open(f, "pt") as h:
        spy, stats = SpyHandle(h), ReadStats()
        up = LazyTensor(spy, infos["stack"], stats).select(2).view(0, 3, 3)  # expert 2, rows 3..5
        assert up.shape == (3, 10) and spy.calls == []  # nothing fetched yet
        part = up.narrow(1, 5, 5)
        assert torch.equal(part, tensors["stack"][2, 3:6, 5:10])
        assert stats.bytes_read == 3 * 5 * 4
        with pytest.raises(IndexError):
            up.view(0, 2, 2)


@pytest.mark.parametrize("dim,start,length", [(0, 0, 300), (0, 150, 150), (0, 100, 37), (1, 130, 130), (1, 255, 5)])
def test_fp8_narrow_matches_full_dequant(one_file, dim, start, length):
    f, tensors, infos = one_file
    want = dequant_fp8_block(tensors["q"], tensors["s"]).narrow(dim, start, length)
    with safe_open(f, "pt") as h:
        spy = SpyHandle(h)
        t = Fp8BlockTensor(LazyTensor(spy, infos["q"]), tensors["s"])
        got = t.narrow(dim, start, length)
    assert torch.equal(got, want)
    assert spy.calls == ["q"]


def _track_open_shards(monkeypatch):
    state = {"open": 0, "max": 0, "opened": []}
    real = loader._open_shard

    @contextlib.contextmanager
    def tracked(file):
        with real(file) as h:
            state["open"] += 1
            state["max"] = max(state["max"], state["open"])
            state["opened"].append(os.path.basename(file))
            try:
                yield h
            finally:
                state["open"] -= 1

    monkeypatch.setattr(loader, "_open_shard", tracked)
    return state


def test_plain_shards_streamed_one_at_a_time(tmp_path, monkeypatch):
    cfg = int4_config()
    write_sharded(hf_state_dict(plain_model(cfg, seed=0)), str(tmp_path), cfg.to_hf(), 4)
    state = _track_open_shards(monkeypatch)
    load_target(str(tmp_path), dtype=torch.float32)
    assert state["max"] == 1
    assert state["opened"] == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]  # each once, in order


def test_kimi_shards_one_at_a_time(tmp_path, monkeypatch):
    path, _ = write_kimi_int4(str(tmp_path), int4_config(), seed=0, n_shards=3)
    state = _track_open_shards(monkeypatch)
    load_target(path, dtype=torch.float32)
    assert state["max"] == 1  # weight_shape checks and streaming each open one shard at a time


def test_fp8_scale_from_another_shard_is_read_and_released(tmp_path, monkeypatch):
    """Scales in their own shard: each is copied out while its weight's shard is open (2 open at most,
    briefly), nothing is held across tensors."""
    path, _ = write_deepseek_fp8(str(tmp_path), fp8_config(), seed=0)
    state = _track_open_shards(monkeypatch)
    load_target(path, dtype=torch.float32)
    assert state["max"] == 2 and state["open"] == 0


def test_progress_bar_for_long_loads(tmp_path, monkeypatch):
    """Several shards, or one file past PROGRESS_MIN_BYTES (a large draft is one model.safetensors)."""
    from sglang_eagle3.models import loader as ld

    sd = {"a": torch.zeros(64), "b": torch.zeros(32)}
    one, three = str(tmp_path / "one"), str(tmp_path / "three")
    write_sharded(sd, one, {}, 1)
    write_sharded(sd, three, {}, 2)
    small, sharded = ld.CheckpointIndex.scan(one), ld.CheckpointIndex.scan(three)
    assert not ld._shows_progress(small) and ld._shows_progress(sharded)
    monkeypatch.setattr(ld, "PROGRESS_MIN_BYTES", small.nbytes)
    assert ld._shows_progress(small)
