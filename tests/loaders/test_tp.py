"""Tensor-parallel loading: rank r of 2 holds exactly its slice of every full parameter and reads only (about)
its share of the checkpoint bytes. No torch.distributed: the TP coordinates are patched, and loading never
calls a collective."""

from __future__ import annotations

import pytest
import torch

from sglang_eagle3.config import ModelConfig
from sglang_eagle3.distributed import parallel_state
from sglang_eagle3.distributed.parallel_state import TPInfo
from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.models.loader import hf_state_dict, load_draft, load_target, save_hf
from sglang_eagle3.testing import random_d2t, randomize, tiny_draft_config
from tests.loaders.ckpt import (
    fp8_config,
    int4_config,
    plain_model,
    write_deepseek_fp8,
    write_kimi_int4,
    write_sharded,
)

TP = 2


def expected_slice(name: str, full: torch.Tensor, local: torch.Tensor, rank: int) -> torch.Tensor:
    """This rank's part of a full parameter, found from the shapes alone: stacked w13 ([E, gate rows + up rows,
    ...]) splits each half; every other sharded parameter splits the one dim whose size differs."""
    if full.shape == local.shape:
        return full
    if ".w13_weight" in name:
        half, part = full.shape[1] // 2, local.shape[1] // 2
        gate, up = full[:, :half], full[:, half:]
        return torch.cat([gate[:, rank * part:(rank + 1) * part], up[:, rank * part:(rank + 1) * part]], dim=1)
    (dim,) = [d for d in range(full.dim()) if full.shape[d] != local.shape[d]]
    n = local.shape[dim]
    assert full.shape[dim] == n * TP, (name, full.shape, local.shape)
    return full.narrow(dim, rank * n, n)


def load_as_rank(monkeypatch, rank: int, fn):
    with monkeypatch.context() as m:
        m.setattr(parallel_state, "_TP", TPInfo(rank, TP))
        return fn()


def plain_ckpt(root: str) -> tuple[ModelConfig, str]:
    cfg = int4_config()
    write_sharded(hf_state_dict(plain_model(cfg, seed=8)), root, cfg.to_hf(), 3)
    return cfg, root


def stacked_ckpt(root: str) -> tuple[ModelConfig, str]:
    """transformers-5 stacked experts: each rank takes its rows of every expert out of one [E, 2I, H] tensor."""
    cfg = int4_config()
    sd = {k.replace("w13_weight", "gate_up_proj").replace("w2_weight", "down_proj"): v
          for k, v in plain_model(cfg, seed=8).state_dict().items()}
    write_sharded(sd, root, cfg.to_hf(), 2)
    return cfg, root


def kimi_ckpt(root: str) -> tuple[ModelConfig, str]:
    cfg = int4_config()
    return cfg, write_kimi_int4(root, cfg, seed=9)[0]


def fp8_ckpt(root: str) -> tuple[ModelConfig, str]:
    cfg = fp8_config()
    return cfg, write_deepseek_fp8(root, cfg, seed=10)[0]


@pytest.mark.parametrize("make", [plain_ckpt, stacked_ckpt, kimi_ckpt, fp8_ckpt],
                         ids=["plain", "stacked_experts", "kimi_int4", "deepseek_fp8"])
def test_rank_slices_equal_full_model_slices(tmp_path, monkeypatch, make):
    cfg, path = make(str(tmp_path))
    full_report = {}
    full = dict(load_target(path, dtype=torch.float32, report=full_report).named_parameters())
    for rank in range(TP):
        report = {}
        model = load_as_rank(monkeypatch, rank, lambda r=report: load_target(path, dtype=torch.float32, report=r))
        local = dict(model.named_parameters())
        assert set(local) == set(full)
        sharded = 0
        for name, p in local.items():
            want = expected_slice(name, full[name], p, rank)
            sharded += want is not full[name]
            torch.testing.assert_close(p, want, atol=0, rtol=0, msg=f"rank {rank}: {name}")
        assert sharded > 10  # attention, MLPs, experts, embedding and head are split
        # Each rank reads its slices only: well under the full read, at least the replicated share.
        assert report["bytes_read"] < 0.75 * full_report["bytes_read"], (report, full_report)


def test_fp8_slices_cut_through_blocks(tmp_path, monkeypatch):
    """dense intermediate 272 splits into 136-row slices: rank 1 starts inside block 1 (rows 128..255)."""
    cfg, path = fp8_ckpt(str(tmp_path))
    assert (cfg.intermediate_size // TP) % 128
    full = load_target(path, dtype=torch.float32).model.layers[0].mlp
    part = load_as_rank(monkeypatch, 1, lambda: load_target(path, dtype=torch.float32)).model.layers[0].mlp
    n = cfg.intermediate_size // TP
    torch.testing.assert_close(part.gate_proj.weight, full.gate_proj.weight[n:], atol=0, rtol=0)
    torch.testing.assert_close(part.down_proj.weight, full.down_proj.weight[:, n:], atol=0, rtol=0)


def test_draft_rank_slices(tmp_path, monkeypatch):
    cfg = int4_config()
    dcfg = tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96)
    src = randomize(Eagle3Draft(dcfg, dtype=torch.float32), seed=3)
    random_d2t(src, seed=4)
    save_hf(src, str(tmp_path))
    full = dict(load_draft(str(tmp_path), cfg, dtype=torch.float32).named_parameters())
    for rank in range(TP):
        model = load_as_rank(monkeypatch, rank, lambda: load_draft(str(tmp_path), cfg, dtype=torch.float32))
        for name, p in model.named_parameters():
            torch.testing.assert_close(p, expected_slice(name, full[name], p, rank), atol=0, rtol=0, msg=name)
        assert torch.equal(model.d2t, src.d2t) and torch.equal(model.t2d, src.t2d)
