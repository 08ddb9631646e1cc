"""The KV pool's size on a GPU: what a token costs, what fits under mem_fraction_static, and what the worker does
when the default pool (max_running_requests x context_length) or an explicit max_total_tokens does not fit.
The device's memory is faked here (torch.cuda.mem_get_info); tests/gpu/test_cuda_engine.py runs it for real."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from sglang_eagle3.config import ConfigError
from sglang_eagle3.engine import EngineArgs
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.runtime.kv_cache import kv_bytes_per_token, pages_that_fit
from sglang_eagle3.runtime.model_runner import ModelRunner
from sglang_eagle3.runtime.worker import fit_kv_pages
from tests.conftest import small_config, small_draft_config

GIB = 1 << 30


@pytest.fixture(scope="module")
def models():
    cfg = small_config()
    return DeepseekV3ForCausalLM(cfg, dtype=torch.bfloat16), Eagle3Draft(small_draft_config(cfg), dtype=torch.bfloat16)


def _scratch_width(target) -> int:
    """The MLA prefill scratch's elements a slot, counted from the heads on this rank (not from the layer's own
    helper): heads x (nope + rope + v)."""
    cfg, attn = target.config, target.model.layers[0].self_attn
    return attn.num_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)


@pytest.mark.parametrize("with_draft", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mha", [0, 64])
def test_bytes_per_token_is_what_the_pools_hold(models, with_draft, dtype, mha):
    """Independent count: the pools ModelRunner allocates (the MLA prefill scratch with mha_prefill_tokens),
    bytes over slots."""
    target, draft = models
    draft = draft if with_draft else None
    pages, page = 7, 4
    runner = ModelRunner(target, draft, aux_layer_ids=(0, 1, 1) if draft else (), num_pages=pages, page_size=page,
                         max_context=16, device=torch.device("cpu"), dtype=dtype, use_cuda_graph=False,
                         cuda_graph_max_bs=1, verify_widths=(4,), attention_backend="torch", mha_prefill_tokens=mha)
    pools = list(runner.target_kv.layers) + (list(runner.draft_kv.layers) if draft else [])
    assert (runner.target_kv.mha_scratch is not None) == bool(mha)
    if mha:
        pools.append(runner.target_kv.mha_scratch)
    held = sum(t.numel() * t.element_size() for t in pools)
    scratch = _scratch_width(target) if mha else 0
    assert kv_bytes_per_token(target.config, draft, dtype, scratch) * pages * page == held
    target.set_mha_prefill(0)  # the module-scoped model as the other tests expect it


def test_pages_that_fit_keeps_the_reserve():
    rng = random.Random(0)
    for _ in range(200):
        total = rng.randrange(8, 200) * GIB
        free = rng.randrange(0, total)
        frac = rng.uniform(0.05, 0.95)
        per_page = rng.randrange(1, 1 << 20)
        n = pages_that_fit(free, total, frac, per_page)
        used_after = (total - free) + n * per_page
        if n > 0:  # static memory within the fraction, and one page more would not be
            assert used_after <= frac * total + 1
            assert used_after + per_page > frac * total
        else:
            assert (total - free) + per_page > frac * total


def _args(**kw):
    return EngineArgs(**{"model_path": "x", "page_size": 16, **kw})


def _plan(args, context=4096):
    tokens = args.max_total_tokens or args.max_running_requests * (context + args.page_size)
    return {"num_pages": tokens // args.page_size + 2, "context_length": context}


def _fake_memory(monkeypatch, free, total):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))


def test_default_pool_that_fits_is_kept(models, monkeypatch):
    target, draft = models
    args = _args(max_running_requests=4)
    _fake_memory(monkeypatch, 100 * GIB, 140 * GIB)
    plan = _plan(args)
    assert fit_kv_pages(plan, target, draft, args, torch.device("cpu"), torch.bfloat16) == plan["num_pages"]


def test_default_pool_too_big_is_cut_with_a_warning(models, monkeypatch, caplog):
    """Kimi-like: a 262144-token context x 32 requests cannot fit; the pool becomes what fits, not an OOM."""
    target, draft = models
    args = _args(max_running_requests=32)
    plan = _plan(args, context=262144)
    per_page = kv_bytes_per_token(target.config, draft, torch.bfloat16, _scratch_width(target)) * args.page_size
    total = 96 * GIB
    free = int((1 - args.mem_fraction_static) * total) + 1000 * per_page + 5  # room for 1000 pages beyond the reserve
    _fake_memory(monkeypatch, free, total)
    with caplog.at_level(logging.WARNING, logger="sglang_eagle3.runtime.worker"):
        pages = fit_kv_pages(plan, target, draft, args, torch.device("cpu"), torch.bfloat16)
    assert pages == 1000 < plan["num_pages"]
    assert "KV cache cut to 15968 tokens" in caplog.text and "max_running_requests=32" in caplog.text


def test_explicit_max_total_tokens_that_does_not_fit_is_refused(models, monkeypatch):
    target, draft = models
    args = _args(max_total_tokens=1 << 24)
    per_page = kv_bytes_per_token(target.config, draft, torch.bfloat16, _scratch_width(target)) * args.page_size
    total = 80 * GIB
    _fake_memory(monkeypatch, int((1 - args.mem_fraction_static) * total) + 50 * per_page + 5, total)
    with pytest.raises(ConfigError, match=r"max_total_tokens=16777216 does not fit: 768 tokens do"):
        fit_kv_pages(_plan(args), target, draft, args, torch.device("cpu"), torch.bfloat16)


def test_no_room_at_all_is_a_clear_error(models, monkeypatch):
    target, draft = models
    args = _args(mem_fraction_static=0.5)
    _fake_memory(monkeypatch, 30 * GIB, 80 * GIB)  # the weights already took more than half
    with pytest.raises(ConfigError, match=r"no room for a KV cache: 30.0 of 80.0 GiB free.*mem_fraction_static=0.5"):
        fit_kv_pages(_plan(args), target, draft, args, torch.device("cpu"), torch.bfloat16)


@pytest.mark.parametrize("kw,match", [
    ({"mem_fraction_static": 0.0}, "mem_fraction_static=0.0 must lie in"),
    ({"mem_fraction_static": 1.2}, "mem_fraction_static=1.2 must lie in"),
    ({"mem_fraction_static": "0.8"}, "mem_fraction_static='0.8' must be a finite number"),
    ({"max_total_tokens": 8}, "max_total_tokens=8 must be an integer >= page_size=16"),
    ({"mha_prefill_tokens": -1}, "mha_prefill_tokens=-1 must be an integer >= 0"),
    ({"mha_prefill_tokens": True}, "mha_prefill_tokens=True must be an integer"),
])
def test_bad_sizing_args_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        _args(**kw)
