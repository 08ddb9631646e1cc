"""Checks of deferred split-K reductions (kernels/split_sum.py): a split skinny-GEMM launch with ``defer`` leaves
its partials, and its readers (the skinny GEMM's x, the routing kernel's logits, the rotary launch's k and
latent) add them as they load. What they compute must be bit-identical to what they compute from the tensors
the launch stores without ``defer``: under the interpreter (CASES, run by kernel_checks.py) and on the GPU at
one Kimi-K2.5 TP=8 rank's shapes (test_split_sum_gpu.py).

kernel_checks imports this module at its end, to merge CASES: its helpers are imported inside the functions.
"""

from __future__ import annotations

import importlib

import torch

from sglang_eagle3 import env, kernels

EPS = 1e-6
# Split-K over 3-4 splits of small programs (the interpreter stays quick); the GPU tests use the launchers' own.
SPLIT_SMALL = {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT": 4, "num_warps": 4}


def _equal(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    bad = ~((a == b) | (a.isnan() & b.isnan()))
    assert not bad.any(), f"{what}: {int(bad.sum())} of {a.numel()} differ (max {(a.float() - b.float()).abs().max()})"


def check_qkv_readers(T: int, N1: int, N2: int, K: int, *, rope: int = 64, config: dict | None = None,
                      device: str = "cpu", dtype=torch.bfloat16, seed: int = 0) -> dict:
    """MLA's q_a [N1] + kv_a [N2 = latent + rope] pair deferred: q_b's GEMV with the q_a norm (NORM_PRE) on the
    q_a SplitSum, and the rotary launch writing the normed latent and the rotated rope key into permuted cache
    rows from the kv_a SplitSum, bit-identical to the same launches on the stored q_a and kv_a. materialize()
    gives the stored tensors (bit for bit on the GPU: the same sums, round to nearest)."""
    from sglang_eagle3.kernels.gemv import triton_gemv, triton_gemv_pair
    from sglang_eagle3.kernels.rotary import triton_apply_rotary

    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    x = rnd(T, K)
    w1, w2 = rnd(N1, K, scale=K ** -0.5), rnd(N2, K, scale=K ** -0.5)
    q_a, kv_a = triton_gemv_pair(x, w1, w2, config=config)
    d1, d2 = triton_gemv_pair(x, w1, w2, config=config, defer=True)
    assert isinstance(d1, kernels.SplitSum) and isinstance(d2, kernels.SplitSum), "the launch did not split K"
    if device != "cpu":
        _equal(d1.materialize(), q_a, "q_a materialize")
        _equal(d2.materialize(), kv_a, "kv_a materialize")
    # q_b with q_a's norm folded in (NORM_PRE: every program reads the whole row for its rstd)
    wq = rnd(96, N1, scale=N1 ** -0.5)
    nw = (1 + 0.3 * torch.randn(N1, generator=g)).to(dtype).to(device)
    _equal(triton_gemv(d1, wq, norm_weight=nw, eps=EPS), triton_gemv(q_a, wq, norm_weight=nw, eps=EPS), "q_b")
    # the rotary launch: kv_a norm of the latent + rope of the key into cache rows
    C = N2 - rope
    slots = T + 5
    rows = torch.randperm(slots, generator=g)[:T].to(device)
    positions = torch.randint(0, 100, (T,), generator=g).to(device)
    freqs = torch.outer(torch.arange(128, dtype=torch.float64), torch.rand(rope // 2, generator=g, dtype=torch.float64))
    cos, sin = freqs.cos().float().to(device), freqs.sin().float().to(device)
    cnw = (1 + 0.3 * torch.randn(C, generator=g)).to(dtype).to(device)
    caches = []
    for c, k in ((kv_a[:, :C], kv_a[:, C:]), (d2.columns(0, C), d2.columns(C, rope))):
        cache = torch.full((slots, N2), float("nan"), dtype=dtype, device=device)
        triton_apply_rotary(None, k, positions, cos, sin, interleaved=True, inplace=True, k_out=cache[:, C:],
                            k_out_rows=rows, c_norm=(c, cnw, EPS, cache[:, :C]))
        caches.append(cache)
    _equal(caches[1], caches[0], "cache rows from the rotary launch")
    return {"splits": d1.split}


def check_moe_readers(T: int, E: int, S: int, K: int, *, top_k: int = 8, n_group: int = 1, topk_group: int = 1,
                      config: dict | None = None, device: str = "cpu", dtype=torch.bfloat16, seed: int = 0) -> dict:
    """The router [E, float32 logits] + shared expert gate/up [S, gated] pair deferred: the routing kernel on
    the logits SplitSum and the shared down GEMV on the gated SplitSum (with a residual add), bit-identical to
    the same launches on the stored logits and activation; the dispatch's reference fallback reads
    materialize()."""
    from sglang_eagle3.kernels.gemv import triton_gemv, triton_gemv_pair
    from sglang_eagle3.kernels.moe_topk import triton_moe_topk

    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    x = rnd(T, K)
    wr, wg, wu = rnd(E, K, scale=3 * K ** -0.5), rnd(S, K, scale=K ** -0.5), rnd(S, K, scale=K ** -0.5)
    logits, act = triton_gemv_pair(x, wr, wg, w2_up=wu, out1_dtype=torch.float32, config=config)
    dl, da = triton_gemv_pair(x, wr, wg, w2_up=wu, out1_dtype=torch.float32, config=config, defer=True)
    assert isinstance(dl, kernels.SplitSum) and da.gated, "the launch did not split K"
    _equal(dl.materialize(), logits, "logits materialize")  # float32: no rounding, the same sums
    bias = (torch.rand(E, generator=g) * 0.5).to(device)
    kw = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, renormalize=True, routed_scaling_factor=2.5)
    w_ref, i_ref = triton_moe_topk(logits, bias, **kw)
    w_got, i_got = triton_moe_topk(dl, bias, **kw)
    _equal(i_got, i_ref, "routing ids")
    _equal(w_got, w_ref, "routing weights")
    wd = rnd(K, S, scale=S ** -0.5)
    res = rnd(T, K)
    _equal(triton_gemv(da, wd, add=res), triton_gemv(act, wd, add=res), "shared down")
    # the reference fallback of the dispatch (use_triton=False) on the materialized activation
    ref = kernels.gemv(da, wd, use_triton=False)
    expect = kernels.ref_gemv(da.materialize(), wd)
    _equal(ref, expect, "reference path on materialize()")
    return {"splits": dl.split}


def check_split_sum_model(device: str = "cpu", dtype=torch.bfloat16, B: int = 2, S: int = 5, seed: int = 0,
                          config: dict | None = None, hidden: int = 256) -> dict:
    """A small Kimi-shaped model (kernel_checks.kimi_like_model) through the model runner, every op on its
    kernel, with both split sums on vs off (NO_FUSE): the decode and verify logits and the KV cache bit-equal,
    and the deferred launches ran (SplitSums out of the q_a + kv_a and the router + shared launches of every
    layer). ``config``: the skinny GEMM's config for every launch (forces split-K at these small shapes)."""
    from kernel_checks import kimi_like_model, set_kernels

    from sglang_eagle3.runtime.model_runner import ModelRunner

    gemv_mod = importlib.import_module("sglang_eagle3.kernels.gemv")  # kernels.gemv is also a function

    layers, page = 2, 4
    pages_per_req = (S + 8) // page + 1
    pages = [list(range(1 + b * pages_per_req, 1 + (b + 1) * pages_per_req)) for b in range(B)]
    results, deferred = {}, {}
    config_fn = gemv_mod.gemv_config
    for no_fuse in (env.DEFAULT_NO_FUSE, env.DEFAULT_NO_FUSE + ",qkv_split_sum,moe_split_sum"):
        with env.overrides({env.NO_FUSE.name: no_fuse}):  # layers read it while they are built
            model = kimi_like_model(device, dtype, layers=layers, hidden=hidden, seed=seed)
        ids = torch.randint(0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(seed))
        runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=B * pages_per_req + 2, page_size=page,
                             max_context=pages_per_req * page, device=torch.device(device), dtype=dtype,
                             use_cuda_graph=False, cuda_graph_max_bs=B, verify_widths=(3,), attention_backend="auto")
        set_kernels(model, True)
        outs = []
        gemv_pair = kernels.gemv_pair

        def spy(*args, outs=outs, gemv_pair=gemv_pair, **kwargs):
            res = gemv_pair(*args, **kwargs)
            outs.append(sum(isinstance(r, kernels.SplitSum) for r in res))
            return res

        kernels.gemv_pair = spy
        if config is not None:
            gemv_mod.gemv_config = lambda *a, **k: dict(config)
        try:
            prompts = ids.tolist()
            runner.target_extend(runner.build([(prompts[b], 0, pages[b]) for b in range(B)]))
            start = len(outs)
            decode, _ = runner.target_uniform(runner.build([([prompts[b][-1]], S, pages[b]) for b in range(B)]), 1,
                                              verify=False)
            verify, _ = runner.target_uniform(
                runner.build([((prompts[b] * 3)[:3], S + 1, pages[b]) for b in range(B)]), 3, verify=True)
        finally:
            kernels.gemv_pair = gemv_pair
            gemv_mod.gemv_config = config_fn
        results[no_fuse] = (decode, verify, [kv.clone() for kv in runner.target_kv.layers])
        deferred[no_fuse] = sum(outs[start:])
    on, off = results.values()
    _equal(on[0], off[0], "decode logits")
    _equal(on[1], off[1], "verify logits")
    for i, (a, b) in enumerate(zip(on[2], off[2], strict=True)):
        _equal(a, b, f"KV cache of layer {i}")
    n_on, n_off = deferred.values()
    # per forward: 2 SplitSums from each layer's q_a + kv_a launch, 2 from each MoE layer's router + shared one
    moe_layers = layers - 1
    assert n_on == 2 * (2 * layers + 2 * moe_layers) and n_off == 0, f"SplitSums: {n_on} on, {n_off} off"
    return {"split_sums": n_on}


CASES = {
    "split_sum_qkv_t3": lambda: check_qkv_readers(3, 40, 48, 200, rope=16, config=SPLIT_SMALL, seed=80),
    "split_sum_qkv_fp16_t1": lambda: check_qkv_readers(1, 24, 40, 136, rope=8, config=SPLIT_SMALL,
                                                       dtype=torch.float16, seed=81),
    "split_sum_moe_grouped_t3": lambda: check_moe_readers(3, 48, 20, 128, top_k=6, n_group=4, topk_group=2,
                                                          config=SPLIT_SMALL, seed=82),
    "split_sum_moe_t16": lambda: check_moe_readers(16, 40, 16, 96, top_k=8, config=SPLIT_SMALL, seed=83),
    "split_sum_model": lambda: check_split_sum_model(config={**SPLIT_SMALL, "SPLIT": 3}, seed=84, hidden=96),
}
