"""Checks of the launch folds into the skinny GEMM (a decoder layer's input RMSNorm and residual add into the
q_a + kv_a launch; a MoE layer's routing into the tail of the router + shared expert launch), under the
interpreter (CASES, run by kernel_checks.py) and on the GPU (test_fold_gpu.py).

kernel_checks imports this module at its end, to merge CASES: its helpers are imported inside the functions.
"""

from __future__ import annotations

import math
import re

import torch

from sglang_eagle3 import env, kernels

EPS = 1e-6


def _interpreting() -> bool:
    from sglang_eagle3.kernels import tuning

    return tuning.interpreting()


def kernel_cast(x32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 x rounded to ``dtype`` as a kernel's cast rounds it: to nearest even on the GPU (as torch does),
    but the interpreter truncates float32 to bfloat16 (its float16 casts round to nearest)."""
    if dtype == torch.bfloat16 and not x32.is_cuda and _interpreting():
        return (x32.contiguous().view(torch.int32) & -65536).view(torch.float32).to(dtype)
    return x32.to(dtype)


def _splits(K: int, config: dict | None) -> int | None:
    """Split count a launch with ``config`` uses (as gemv._split_plan rounds it); None for the default config."""
    if config is None:
        return None
    k_per_split = math.ceil(math.ceil(K / config["SPLIT"]) / config["BLOCK_K"]) * config["BLOCK_K"]
    return math.ceil(K / k_per_split)


def fold_inputs(g, T, K, residual, dtype, device, strided):
    """(h [T, K], residual [T, K] or None, norm weight [K]) of an input-norm fold check, drawn from generator g;
    ``strided``: h a column slice of a wider tensor (row stride != K)."""
    base = (torch.randn(T, K + 8, generator=g) * 2).to(dtype).to(device)
    h = base[:, 3:3 + K] if strided else base[:, :K].contiguous()
    res = (torch.randn(T, K, generator=g) * 2).to(dtype).to(device) if residual else None
    nw = (1 + 0.3 * torch.randn(K, generator=g)).to(dtype).to(device)
    return h, res, nw


def check_fold_stream(stream, h, res) -> None:
    """A fold's returned stream: h + residual exactly as a kernel's cast rounds it (and torch's add on the GPU),
    h itself without a residual."""
    if res is not None:
        want = kernel_cast(h.float() + res.float(), h.dtype)
        assert torch.equal(stream, want), (
            f"new residual differs from h + residual in {(stream != want).sum().item()} of {stream.numel()}")
        if h.is_cuda:
            assert torch.equal(stream, h + res), "new residual != torch's h + residual"
    else:
        assert stream is h, "without a residual the stream is h itself"


def check_input_norm_fold(T, N1, N2, K, residual=True, dtype=torch.bfloat16, config=None, device="cpu", seed=0,
                          router=False, strided=False, min_splits=1, fma=None) -> dict:
    """triton_gemv_pair with a folded input RMSNorm (norm_weight, eps, residual), for MLA's q_a [N1] and kv_a
    [N2] (with ``router``: float32 logits and a gated second output, the same launch shape as the router and
    shared expert): the products within rounding of the float64 unfused math on the new stream (normed
    without intermediate rounding), the stream h + residual exactly as the kernel's cast rounds it (torch's
    add on the GPU) and h itself without a residual, row 0 the same at T=1, split-K counters reset.
    ``strided``: h is a column slice of a wider tensor (row stride != K). ``fma``: triton_gemv_pair's (False: the
    tensor-core fold wherever the CUDA-core pair would take it; gemv_fma_checks.check_gemv_fma_pair_norm checks that
    one)."""
    from kernel_checks import rel_err

    from sglang_eagle3.kernels.gemv import _COUNTERS, triton_gemv_pair

    splits = _splits(K, config)
    assert splits is None or splits >= min_splits, f"{config=} splits K={K} {splits} ways, the case wants {min_splits}"
    g = torch.Generator(device="cpu").manual_seed(seed)
    h, res, nw = fold_inputs(g, T, K, residual, dtype, device, strided)
    w1 = (torch.randn(N1, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    w2 = (torch.randn(N2, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    w2_up = (torch.randn(N2, K, generator=g) / math.sqrt(K)).to(dtype).to(device) if router else None
    out1_dtype = torch.float32 if router else None
    kw = dict(w2_up=w2_up, out1_dtype=out1_dtype, norm_weight=nw, eps=EPS, config=config, fma=fma)
    y1, y2, stream = triton_gemv_pair(h, w1, w2, residual=res, **kw)

    check_fold_stream(stream, h, res)
    assert y1.dtype == (out1_dtype or dtype) and y2.dtype == dtype, (y1.dtype, y2.dtype)

    # The kernel rounds x * g to the activation dtype and scales the fp32 product by rstd; the float64
    # reference rounds nothing before the product: the difference is that rounding and the output's.
    normed = kernels.ref_rms_norm(stream.double(), nw.double(), EPS)
    half_tol = 4e-3 if h.is_cuda else 1.2e-2  # the interpreter truncates (see kernel_cast): ~twice the error
    errs = []
    for name, y, w, up, tol in (("out1", y1, w1, None, half_tol),
                                ("out2", y2, w2, w2_up, (2e-2 if h.is_cuda else 3e-2) if router else half_tol)):
        ref = kernels.ref_gemv(normed, w.double(), w_up=None if up is None else up.double())
        err = rel_err(y, ref)
        assert err < tol, f"{name} rel err {err} >= {tol} ({T=} {N1=} {N2=} {K=} {residual=} {router=} {config=})"
        errs.append(err)

    one = triton_gemv_pair(h[:1], w1, w2, residual=None if res is None else res[:1], **kw)
    for name, a, b in zip(("out1", "out2", "stream"), one, (y1, y2, stream), strict=True):
        assert torch.equal(a[0], b[0]), f"{name}: row 0 differs between T=1 and T={T}"
    left = {str(d): int(c.abs().sum()) for d, c in _COUNTERS.items()}
    assert not any(left.values()), f"split-K counters not reset: {left}"
    return {"rel_err": errs, "splits": splits or "default config"}


def check_input_norm_fold_reference_path(seed=0) -> dict:
    """kernels.gemv_pair with a norm where the fold kernel does not run computes the unfused numbers: the
    norm (ref_rms_norm for float64, under autograd or with use_triton=False; else the rms_norm kernel, as the
    unfused layer runs it), then torch's products; without a residual the stream is h itself."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    K, N1, N2 = 48, 20, 11
    out = {}
    for dtype, T, use_triton, residual, grad in ((torch.float32, 3, False, True, False),
                                                 (torch.float32, 3, True, False, False),  # not a GEMV dtype
                                                 (torch.float64, 5, True, True, False),
                                                 (torch.bfloat16, 20, True, True, False),  # rows > GEMV_MAX_ROWS
                                                 (torch.bfloat16, 2, False, False, False),
                                                 (torch.float32, 4, True, True, True)):
        h = torch.randn(T, K, generator=g).to(dtype).requires_grad_(grad)
        res = torch.randn(T, K, generator=g).to(dtype) if residual else None
        nw = (1 + 0.3 * torch.randn(K, generator=g)).to(dtype)
        w1, w2 = torch.randn(N1, K, generator=g).to(dtype), torch.randn(N2, K, generator=g).to(dtype)
        y1, y2, stream = kernels.gemv_pair(h, w1, w2, norm_weight=nw, eps=EPS, residual=res, use_triton=use_triton)
        norm = (lambda *a: kernels.rms_norm(*a, use_triton=True)) if (
            use_triton and dtype != torch.float64 and not grad) else kernels.ref_rms_norm
        normed, want = norm(h, nw, EPS, res) if res is not None else (norm(h, nw, EPS), h)
        what = f"{dtype=} {T=} {use_triton=} {residual=} {grad=}"
        assert torch.equal(stream, want) and (res is not None or stream is h), f"stream differs ({what})"
        for y, w in ((y1, w1), (y2, w2)):
            assert torch.equal(y, torch.nn.functional.linear(normed, w)), f"products differ ({what})"
        if grad:
            (y1.sum() + y2.sum()).backward()
            assert h.grad is not None and torch.isfinite(h.grad).all(), f"no gradient through the fold ({what})"
        out[what] = "unfused numbers"
    return out


def tied_experts(E: int, n_group: int) -> list[int]:
    """Experts 1 and 5 (or the last) of every group: check_router_topk_fold's ties."""
    per = E // n_group
    return [g * per + j for g in range(n_group) for j in (1, min(5, per - 1))]


def _check_routed(weights, ids, logits, route, ties: bool, what: str) -> None:
    """Weights and ids torch.equal to triton_moe_topk's on the same logits; with ``ties`` (tied_experts' rows
    set up to tie, as the checks below do) the lowest tied ids come first in every row."""
    from sglang_eagle3.kernels.moe_topk import triton_moe_topk

    T, E = logits.shape
    assert weights.shape == ids.shape == (T, route.top_k) and weights.dtype == torch.float32 and (
        ids.dtype == torch.int32), (weights.shape, ids.shape, weights.dtype, ids.dtype)
    want_w, want_ids = triton_moe_topk(logits, route.bias, **route.topk_kwargs())
    assert torch.equal(ids, want_ids), f"ids differ from moe_topk on the same logits {what}:\n{ids}\n{want_ids}"
    assert torch.equal(weights, want_w), (
        f"weights differ from moe_topk on the same logits {what}: max |diff| {(weights - want_w).abs().max()}")
    if ties:
        chosen = sorted(tied_experts(E, route.n_group))[:2 * route.topk_group][:route.top_k]
        assert ids[:, :len(chosen)].tolist() == [chosen] * T, f"tie-break: {ids.tolist()} should start {chosen}"


def _check_counters_reset() -> None:
    """Every split-K / routing arrival counter is back at 0 (the next call and graph replays rely on it)."""
    from sglang_eagle3.kernels.gemv import _COUNTERS

    left = {str(d): int(c.abs().sum()) for d, c in _COUNTERS.items()}
    assert not any(left.values()), f"split-K / routing counters not reset: {left}"


def check_router_topk_fold(T, E, N2, K, *, top_k=8, n_group=1, topk_group=1, bias=True, renormalize=True,
                           scale=1.0, config=None, norm=False, ties=False, dtype=torch.bfloat16, device="cpu",
                           seed=0, min_splits=1) -> dict:
    """triton_gemv_pair with a routing tail (router [E] float32 logits, shared expert gate/up [N2] gated):
    weights and ids torch.equal to triton_moe_topk on the launch's own logits, the logits and the shared
    activation (and with ``norm`` the input-norm fold's stream) torch.equal to the same launch without the
    tail, the routing the reference's (same experts, weights within float32 rounding; not with ties) and the
    products within rounding of float64; every split-K and routing counter back at 0.

    ``ties``: the router rows of tied_experts are zero (score 0.5 exactly) and their bias the highest, so every
    group's best two tie with every other group's: the routing takes the lowest groups and, within the
    chosen, the lowest ids first."""
    from kernel_checks import rel_err

    from sglang_eagle3.kernels.gemv import Routing, triton_gemv_pair

    splits = _splits(K, config)
    assert splits is None or splits >= min_splits, f"{config=} splits K={K} {splits} ways, the case wants {min_splits}"
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(T, K, generator=g) * 2).to(dtype)
    w1 = torch.randn(E, K, generator=g) / math.sqrt(K)
    w2 = (torch.randn(N2, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    w2_up = (torch.randn(N2, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    corr = torch.rand(E, generator=g) * 0.5 if bias else None
    if ties:
        assert bias, "ties need the bias to put the tied experts first"
        tied = tied_experts(E, n_group)
        w1[tied] = 0.0
        corr[tied] = 2.0  # > any other score + bias (< 1.5)
    w1 = w1.to(dtype).to(device)
    x = x.to(device)
    corr = corr.to(device) if bias else None
    kw = dict(w2_up=w2_up, out1_dtype=torch.float32, config=config)
    if norm:
        kw.update(norm_weight=(1 + 0.3 * torch.randn(K, generator=g)).to(dtype).to(device), eps=EPS,
                  residual=(torch.randn(T, K, generator=g) * 2).to(dtype).to(device))
    route = Routing(corr, top_k, n_group, topk_group, renormalize, scale)
    outs = triton_gemv_pair(x, w1, w2, route=route, **kw)
    # (the routing tail is the tensor-core kernel's: without it a gated pair may take the CUDA-core form)
    plain = triton_gemv_pair(x, w1, w2, fma=False, **kw)
    assert len(outs) == len(plain) + 2, (len(outs), len(plain))
    names = ("logits", "shared act", "stream")[:len(plain)]
    for name, a, b in zip(names, outs[:len(plain)], plain, strict=True):
        assert torch.equal(a, b), f"{name} differs with the routing tail in {(a != b).sum().item()} places"
    logits, weights, ids = outs[0], outs[-2], outs[-1]
    what = f"({T=} {E=} {n_group=} {topk_group=} {top_k=} {bias=} {renormalize=} {config=} {norm=} {ties=})"
    _check_routed(weights, ids, logits, route, ties, what)
    if not ties:  # the routing itself, against the torch reference (order within a row is free)
        ref_w, ref_ids = kernels.ref_moe_topk(logits, corr, **route.topk_kwargs())
        ids_s, order = ids.long().sort(dim=1)
        ref_s, ref_order = ref_ids.long().sort(dim=1)
        assert torch.equal(ids_s, ref_s), f"routing differs from ref_moe_topk {what}"
        err = rel_err(weights.gather(1, order), ref_w.gather(1, ref_order))
        assert err < 1e-6, f"weights rel err {err} against ref_moe_topk {what}"
    x_ref = x.double()
    if norm:
        x_ref = kernels.ref_rms_norm(outs[2].double(), kw["norm_weight"].double(), EPS)
    tol = (1e-2 if x.is_cuda else 2e-2) if norm else 1e-3
    err_logits = rel_err(logits, kernels.ref_gemv(x_ref, w1.double()))
    err_act = rel_err(outs[1], kernels.ref_gemv(x_ref, w2.double(), w_up=w2_up.double()))
    assert err_logits < tol and err_act < 3e-2, f"products: logits rel err {err_logits}, act {err_act} {what}"
    _check_counters_reset()
    return {"splits": splits or "default config", "logits_rel_err": err_logits, "ids_row0": ids[0].tolist()}


def check_router_topk_reference_path(seed=0) -> dict:
    """kernels.gemv_pair with ``route`` where the skinny GEMM does not run (float32, > GEMV_MAX_ROWS rows,
    use_triton=False, autograd) returns the unfused numbers: its products, then the moe_topk op on the logits
    (same use_triton); where it runs (bf16 rows under the interpreter) the routing equals moe_topk's on its
    logits. The Routing spec's and the launcher's asserts name the values."""
    from sglang_eagle3.kernels.gemv import Routing

    g = torch.Generator(device="cpu").manual_seed(seed)
    K, E, N2 = 48, 24, 11
    bias = torch.rand(E, generator=g)
    route = Routing(bias, top_k=4, n_group=4, topk_group=2, renormalize=True, routed_scaling_factor=2.5)
    out = {}
    for dtype, T, use_triton, norm, grad in ((torch.float32, 3, True, False, False),  # not a GEMV dtype
                                             (torch.bfloat16, 20, True, True, False),  # rows > GEMV_MAX_ROWS
                                             (torch.bfloat16, 2, False, False, False),
                                             (torch.float32, 4, None, True, True),
                                             (torch.bfloat16, 3, True, True, False)):  # the kernel
        x = torch.randn(T, K, generator=g).to(dtype).requires_grad_(grad)
        w1, w2, w2_up = (torch.randn(n, K, generator=g).to(dtype) for n in (E, N2, N2))
        kw = dict(w2_up=w2_up, out1_dtype=torch.float32, use_triton=use_triton)
        if norm:
            kw.update(norm_weight=(1 + 0.3 * torch.randn(K, generator=g)).to(dtype), eps=EPS,
                      residual=torch.randn(T, K, generator=g).to(dtype))
        outs = kernels.gemv_pair(x, w1, w2, route=route, **kw)
        plain = kernels.gemv_pair(x, w1, w2, **kw)
        what = f"{dtype=} {T=} {use_triton=} {norm=} {grad=}"
        assert len(outs) == len(plain) + 2, what
        for a, b in zip(outs[:len(plain)], plain, strict=True):
            assert torch.equal(a, b), f"products differ with route ({what})"
        want = kernels.moe_topk(outs[0].detach(), bias, **route.topk_kwargs(), use_triton=use_triton)
        assert torch.equal(outs[-1], want[1]) and torch.equal(outs[-2], want[0]), f"routing differs ({what})"
        out[what] = "moe_topk's numbers"
    x = torch.randn(2, K, generator=g).bfloat16()
    w1, w2 = torch.randn(E, K, generator=g).bfloat16(), torch.randn(N2, K, generator=g).bfloat16()
    for bad, pattern in ((dict(route=route), "out1_dtype"),
                         (dict(route=Routing(bias, top_k=4, n_group=5, topk_group=2), out1_dtype=torch.float32),
                          "E=24 experts must be divisible by self.n_group=5"),
                         (dict(route=Routing(bias, top_k=13, n_group=4, topk_group=2), out1_dtype=torch.float32),
                          "self.top_k=13 exceeds the 12"),
                         (dict(route=Routing(bias[:20], top_k=4), out1_dtype=torch.float32), r"bias must be .*\[24\]")):
        for use_triton in (True, False):
            try:
                kernels.gemv_pair(x, w1, w2, use_triton=use_triton, **bad)
            except AssertionError as exc:
                assert re.search(pattern, str(exc)), f"{use_triton=}: {exc!s} does not match {pattern!r}"
            else:
                raise AssertionError(f"no assertion for {pattern!r} ({use_triton=})")
    try:
        Routing(None, top_k=2, n_group=2, topk_group=3)
    except AssertionError as exc:
        assert "topk_group=3" in str(exc), exc
    else:
        raise AssertionError("Routing accepted topk_group > n_group")
    return out


def check_route_beside_gemv(T, E, N, K, *, top_k=8, n_group=1, topk_group=1, bias=True, renormalize=True,
                            scale=1.0, config=None, ties=False, dtype=torch.bfloat16, device="cpu", seed=0,
                            min_splits=1) -> dict:
    """triton_gemv with routing programs beside it (a MoE layer's shared expert down projection [N, K] and the
    routing of router logits [T, E] written by an earlier launch): the product torch.equal to the same launch
    without them, weights and ids torch.equal to triton_moe_topk on the same logits (and with ``ties`` the
    lowest ids first), the product within rounding of float64; split-K counters back at 0."""
    from kernel_checks import rel_err

    from sglang_eagle3.kernels.gemv import Routing, triton_gemv

    splits = _splits(K, config)
    assert splits is None or splits >= min_splits, f"{config=} splits K={K} {splits} ways, the case wants {min_splits}"
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(dtype).to(device)
    w = (torch.randn(N, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    logits = torch.randn(T, E + 3, generator=g)[:, :E]  # a strided view: rows E + 3 apart
    corr = torch.rand(E, generator=g) * 0.5 if bias else None
    if ties:
        assert bias, "ties need the bias to put the tied experts first"
        tied = tied_experts(E, n_group)
        logits[:, tied] = 0.0
        corr[tied] = 2.0
    logits = logits.to(device)
    corr = corr.to(device) if bias else None
    route = Routing(corr, top_k, n_group, topk_group, renormalize, scale)
    out, weights, ids = triton_gemv(x, w, route=route, route_logits=logits, config=config)
    plain = triton_gemv(x, w, config=config)
    assert torch.equal(out, plain), f"product differs with routing beside it in {(out != plain).sum().item()} places"
    what = f"({T=} {E=} {N=} {K=} {n_group=} {topk_group=} {top_k=} {bias=} {renormalize=} {config=} {ties=})"
    _check_routed(weights, ids, logits, route, ties, what)
    err = rel_err(out, kernels.ref_gemv(x.double(), w.double()))
    assert err < 1e-2, f"product rel err {err} {what}"
    _check_counters_reset()
    return {"splits": splits or "default config", "rel_err": err, "ids_row0": ids[0].tolist()}


def check_route_beside_reference_path(seed=0) -> dict:
    """kernels.gemv with ``route`` where the skinny GEMM does not run (float32, > GEMV_MAX_ROWS rows,
    use_triton=False) returns gemv's product and the moe_topk op's routing of the logits; where it runs the
    same numbers; bad arguments name the value."""
    from sglang_eagle3.kernels.gemv import Routing

    g = torch.Generator(device="cpu").manual_seed(seed)
    K, E, N = 40, 32, 19
    bias = torch.rand(E, generator=g)
    route = Routing(bias, top_k=4, n_group=4, topk_group=2, renormalize=True, routed_scaling_factor=2.5)
    out = {}
    for dtype, T, use_triton in ((torch.float32, 3, True), (torch.bfloat16, 20, True), (torch.bfloat16, 2, False),
                                 (torch.bfloat16, 3, True)):
        x = torch.randn(T, K, generator=g).to(dtype)
        w = torch.randn(N, K, generator=g).to(dtype)
        logits = torch.randn(T, E, generator=g)
        y, weights, ids = kernels.gemv(x, w, route=route, route_logits=logits, use_triton=use_triton)
        what = f"{dtype=} {T=} {use_triton=}"
        assert torch.equal(y, kernels.gemv(x, w, use_triton=use_triton)), f"product differs with route ({what})"
        want = kernels.moe_topk(logits, bias, **route.topk_kwargs(), use_triton=use_triton)
        assert torch.equal(weights, want[0]) and torch.equal(ids, want[1]), f"routing differs ({what})"
        out[what] = "gemv's and moe_topk's numbers"
    x, w = torch.randn(2, K, generator=g).bfloat16(), torch.randn(N, K, generator=g).bfloat16()
    for bad, pattern in ((dict(route=route, route_logits=torch.randn(2, E).bfloat16()), "float32 router logits"),
                         (dict(route=route, route_logits=torch.randn(3, E)), r"route_logits must be \[2, E\]"),
                         (dict(route=Routing(bias, top_k=4, n_group=5, topk_group=2), route_logits=torch.randn(2, E)),
                          "E=32 experts must be divisible by self.n_group=5"),
                         (dict(route_logits=torch.randn(2, E)), "route_logits without route")):
        try:
            kernels.triton_gemv(x, w, **bad)
        except AssertionError as exc:
            assert re.search(pattern, str(exc)), f"{exc!s} does not match {pattern!r}"
        else:
            raise AssertionError(f"no assertion for {pattern!r}")
    return out


def rope_wuk_inputs(T, H, nope, C, R, dtype, device, seed, slots=None, P=64):
    """MLA's rotary + W_UK operands of T tokens: q [T, H, nope + R], kv_a [T, C + R], the kv_a norm weight [C],
    positions in [0, P), T distinct cache slots of ``slots``, a random cache [slots, C + R], fp32 cos/sin
    [P, R/2], and W_UK [H, nope, C] (row stride C: an N-contiguous [H, C, nope] view as the layer passes it)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    slots = slots or 3 * T + 5
    q = torch.randn(T, H, nope + R, generator=g).to(dtype).to(device)
    kv_a = torch.randn(T, C + R, generator=g).to(dtype).to(device)
    nw = (torch.rand(C, generator=g) + 0.5).to(dtype).to(device)
    pos = torch.randint(0, P, (T,), generator=g).to(device)
    loc = torch.randperm(slots, generator=g)[:T].to(device)
    cache = torch.randn(slots, C + R, generator=g).to(dtype).to(device)
    freqs = torch.outer(torch.arange(P, dtype=torch.float64), 1.0 / 1000 ** (torch.arange(0, R, 2) / R))
    cos, sin = freqs.cos().float().to(device), freqs.sin().float().to(device)
    w_uk = (torch.randn(H, nope, C, generator=g) / math.sqrt(nope)).to(dtype).to(device)
    return q, kv_a, nw, pos, loc, cache, cos, sin, w_uk


def _rope_wuk_rotary(q, kv_a, nw, pos, loc, cache, cos, sin, nope, C, norm=True) -> dict:
    """apply_rotary's arguments of MLA's rotary launch (as layers/mla.py _latent_rotary builds them)."""
    c_norm = (kv_a[:, :C], nw, EPS, cache[:, :C]) if norm else None
    return dict(q=q[..., nope:], k=kv_a[:, C:], positions=pos, cos=cos, sin=sin, interleaved=True, inplace=True,
                k_out=cache[:, C:], k_out_rows=loc, c_norm=c_norm)


def check_rope_beside_gemv(T, H, nope, C, R, *, dtype=torch.bfloat16, config=None, norm=True, device="cpu",
                           seed=0) -> dict:
    """triton_gemv of q_nope @ W_UK with MLA's rotary launch in programs beside it (``rotary``, ROPE_SIDE): q
    (its rope columns rotated in place, the rest untouched), the cache (normed latent and rotated k in the
    tokens' slots, every other slot untouched) and the product torch.equal to the two launches one after
    the other; kv_a untouched; the product within rounding of float64 and the rotary within an ulp of the
    reference; split-K counters back at 0."""
    from kernel_checks import rel_err, ulp_err

    from sglang_eagle3.kernels.gemv import triton_gemv

    q0, kv_a, nw, pos, loc, cache0, cos, sin, w_uk = rope_wuk_inputs(T, H, nope, C, R, dtype, device, seed)
    w = w_uk.transpose(1, 2)  # [H, C, nope], N-contiguous
    outs = []
    for fused in (True, False):
        q, cache, kv = q0.clone(), cache0.clone(), kv_a.clone()
        rotary = _rope_wuk_rotary(q, kv, nw, pos, loc, cache, cos, sin, nope, C, norm)
        if fused:
            y = triton_gemv(q[..., :nope], w, rotary=rotary, config=config)
        else:
            kernels.triton_apply_rotary(**rotary)
            y = triton_gemv(q[..., :nope], w, config=config)
        assert torch.equal(kv, kv_a), "kv_a must stay as it was"
        outs.append((y, q, cache))
    what = f"({T=} {H=} {nope=} {C=} {R=} {dtype=} {config=} {norm=})"
    for name, a, b in zip(("W_UK product", "q", "cache"), outs[0], outs[1], strict=True):
        assert torch.equal(a, b), f"{name} differs with the rotary beside W_UK in {(a != b).sum().item()} places {what}"
    y, q, cache = outs[0]
    assert torch.equal(q[..., :nope], q0[..., :nope]), f"q_nope written {what}"
    err = rel_err(y, torch.einsum("thn,hnc->thc", q0[..., :nope].double(), w_uk.double()))
    assert err < 1e-2, f"product rel err {err} {what}"
    q_ref, k_ref = kernels.ref_apply_rotary(q0[..., nope:], kv_a[:, C:], pos, cos, sin, interleaved=True)
    ulps = max(ulp_err(q[..., nope:].contiguous(), q_ref.contiguous()), ulp_err(cache[loc, C:], k_ref))
    assert ulps <= 2.0, f"rotary off the reference by {ulps} ulp {what}"
    others = torch.ones(cache.shape[0], dtype=torch.bool, device=cache.device)
    others[loc] = False
    assert torch.equal(cache[others], cache0[others]), f"wrote cache slots outside the tokens' {what}"
    if not norm:
        assert torch.equal(cache[loc, :C], cache0[loc, :C]), f"latent written without c_norm {what}"
    _check_counters_reset()
    return {"rel_err": err, "rotary_ulps": ulps}


def check_rope_beside_reference_path(seed=0) -> dict:
    """kernels.gemv with ``rotary`` where the Triton path does not run (float32, use_triton=False) runs
    apply_rotary and then the product: the same numbers as the two ops; where it runs, the same as the
    kernels one after the other; bad arguments name the value."""
    from sglang_eagle3.kernels.gemv import Routing

    T, H, nope, C, R = 3, 2, 16, 32, 16

    def with_and_without(dtype, use_triton, product, what):
        """The rotary given to gemv against apply_rotary then gemv (``product(q)``: gemv's x and w), bit for bit."""
        q0, kv_a, nw, pos, loc, cache0, cos, sin, _ = rope_wuk_inputs(T, H, nope, C, R, dtype, "cpu", seed)
        res = []
        for fused in (True, False):
            q, cache = q0.clone(), cache0.clone()
            rotary = _rope_wuk_rotary(q, kv_a, nw, pos, loc, cache, cos, sin, nope, C)
            if not fused:
                kernels.apply_rotary(**rotary, use_triton=use_triton)
            res.append((kernels.gemv(*product(q), rotary=rotary if fused else None, use_triton=use_triton), q, cache))
        for name, a, b in zip(("product", "q", "cache"), *res, strict=True):
            assert torch.equal(a, b), f"{name} differs with rotary= ({what})"

    out = {}
    for dtype, use_triton in ((torch.float32, True), (torch.bfloat16, False), (torch.bfloat16, True)):
        w_uk = rope_wuk_inputs(T, H, nope, C, R, dtype, "cpu", seed)[-1]
        what = f"{dtype=} {use_triton=}"
        with_and_without(dtype, use_triton, lambda q, w_uk=w_uk: (q[..., :nope], w_uk.transpose(1, 2)), what)
        out[what] = "apply_rotary's and gemv's numbers"
    # A 2-D product in the CUDA-core form's shape range (fma_form: K >= 1024): no side programs there, so the rotary
    # launch runs first and the product is the one without it, bit for bit.
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    x2, w2 = torch.randn(T, 1024, generator=g).bfloat16(), (torch.randn(24, 1024, generator=g) / 32).bfloat16()
    with_and_without(torch.bfloat16, True, lambda q: (x2, w2), "beside a CUDA-core-form product")
    out["2-D, the CUDA-core form's shape"] = "the rotary launch first, the same numbers"
    q0, kv_a, nw, pos, loc, cache0, cos, sin, w_uk = rope_wuk_inputs(T, H, nope, C, R, torch.bfloat16, "cpu", seed)
    rotary = _rope_wuk_rotary(q0, kv_a, nw, pos, loc, cache0, cos, sin, nope, C)
    route = Routing(None, top_k=2)
    for fn, bad, pattern in (
            (kernels.triton_gemv, dict(rotary={**rotary, "inplace": False}), "works in place: inplace=True, got False"),
            (kernels.gemv, dict(rotary={**rotary, "inplace": False}), "works in place: inplace=True, got False"),
            (kernels.triton_gemv, dict(rotary={**rotary, "positions": pos[:2]}), r"2 positions for T=3 rows"),
            (kernels.gemv, dict(rotary=rotary, route=route, route_logits=torch.randn(T, 8)), "rotary and route")):
        try:
            fn(q0[..., :nope], w_uk.transpose(1, 2), **bad)
        except AssertionError as exc:
            assert re.search(pattern, str(exc)), f"{exc!s} does not match {pattern!r}"
        else:
            raise AssertionError(f"no assertion for {pattern!r}")
    return out


def pin_routing(model: torch.nn.Module) -> None:
    """Correction biases a whole sigmoid range apart: every token picks the same experts (the weights still
    follow the scores). Two paths that round differently then cannot route a token to other experts, which
    would change its logits by O(1) and hide the rounding-sized difference a comparison is after."""
    from sglang_eagle3.layers.moe import DeepseekMoE

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, DeepseekMoE):
                bias = m.gate.e_score_correction_bias
                bias.copy_(torch.arange(bias.numel(), dtype=bias.dtype, device=bias.device))


def check_input_norm_fold_model(device="cpu", dtype=torch.bfloat16, tol=3e-2, B=2, S=5, hidden=64, seed=0) -> dict:
    """A small Kimi-shaped model (kimi_like_model, routing pinned) with the input-norm fold on vs off
    (NO_FUSE=input_norm), every op on its kernel: prefill, one decode step and a verify of 3 per request
    through the model runner give the same logits within tolerance, and the fold ran in every layer of every
    decode/verify forward."""
    from kernel_checks import kimi_like_model, rel_err, set_kernels

    from sglang_eagle3.runtime.model_runner import ModelRunner

    layers = 2
    page = 4
    pages_per_req = (S + 8) // page + 1
    pages = [list(range(1 + b * pages_per_req, 1 + (b + 1) * pages_per_req)) for b in range(B)]
    logits, folds = {}, {}
    for no_fuse in ("", "input_norm"):
        with env.overrides({env.NO_FUSE.name: no_fuse}):  # layers read it while they are built
            model = kimi_like_model(device, dtype, layers=layers, hidden=hidden, seed=seed)
        pin_routing(model)
        ids = torch.randint(0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(seed))
        runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=B * pages_per_req + 2, page_size=page,
                             max_context=pages_per_req * page, device=torch.device(device), dtype=dtype,
                             use_cuda_graph=False, cuda_graph_max_bs=B, verify_widths=(3,), attention_backend="auto")
        set_kernels(model, True)  # after the runner, which sets the backends it is given
        calls = []
        gemv_pair = kernels.gemv_pair

        def spy(*args, calls=calls, gemv_pair=gemv_pair, **kwargs):
            calls.append(kwargs.get("norm_weight") is not None)
            return gemv_pair(*args, **kwargs)

        kernels.gemv_pair = spy
        try:
            prompts = ids.tolist()
            prefill, _ = runner.target_extend(runner.build([(prompts[b], 0, pages[b]) for b in range(B)]))
            start = len(calls)
            decode, _ = runner.target_uniform(runner.build([([prompts[b][-1]], S, pages[b]) for b in range(B)]), 1,
                                              verify=False)
            verify, _ = runner.target_uniform(
                runner.build([((prompts[b] * 3)[:3], S + 1, pages[b]) for b in range(B)]), 3, verify=True)
        finally:
            kernels.gemv_pair = gemv_pair
        logits[no_fuse] = (prefill, decode, verify)
        folds[no_fuse] = sum(calls[start:])
    assert folds == {"": 2 * layers, "input_norm": 0}, f"input norm folds per (decode + verify): {folds}"
    errs = {}
    for name, a, b in zip(("prefill", "decode", "verify"), logits[""], logits["input_norm"], strict=True):
        errs[name] = rel_err(a, b)
        assert errs[name] < tol, f"{name} logits with the fold vs without: rel err {errs[name]} ({dtype=})"
    return errs


# Split-K over 3-4 splits of 64 (the last one short), in small programs (the interpreter stays quick).
FOLD_SPLIT = {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT": 4, "num_warps": 4}
FOLD_ONE = {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT": 1, "num_warps": 4}  # one program streams all of K
FOLD_SPLIT_NMAJOR = {"BLOCK_N": 16, "BLOCK_K": 16, "SPLIT": 3, "num_warps": 4}  # K = 48 in 3 splits of 16

CASES = {
    "fold_split_residual_t3": lambda: check_input_norm_fold(3, 40, 23, 200, config=FOLD_SPLIT, seed=60, min_splits=4),
    "fold_split_no_residual_t16": lambda: check_input_norm_fold(16, 37, 17, 136, residual=False, config=FOLD_SPLIT,
                                                                seed=61, min_splits=3),
    "fold_no_split_residual_t16_strided": lambda: check_input_norm_fold(16, 21, 35, 168, config=FOLD_ONE, seed=62,
                                                                        strided=True),
    "fold_no_split_fp16_no_residual_t1": lambda: check_input_norm_fold(1, 19, 33, 112, residual=False,
                                                                       dtype=torch.float16, config=FOLD_ONE, seed=63),
    "fold_split_fp16_residual_t3_strided": lambda: check_input_norm_fold(3, 29, 9, 176, dtype=torch.float16,
                                                                         config=FOLD_SPLIT, seed=64, strided=True,
                                                                         min_splits=3),
    "fold_default_config_residual_t1": lambda: check_input_norm_fold(1, 33, 21, 96, seed=65),
    "fold_router_gated_split_t3": lambda: check_input_norm_fold(3, 24, 13, 144, config=FOLD_SPLIT, seed=66,
                                                                router=True, min_splits=3),
    "fold_reference_path": lambda: check_input_norm_fold_reference_path(seed=67),
    # float16: the interpreter's bfloat16 truncation, amplified through the random model, would need a loose bound
    "fold_model_fp16": lambda: check_input_norm_fold_model(dtype=torch.float16, tol=1e-2, seed=68),
    # The routing tail: 3 router row blocks of 16 (E = 48, or 40: the last one short) and 1-2 shared ones.
    "route_split_grouped_t3": lambda: check_router_topk_fold(3, 48, 20, 128, top_k=6, n_group=4, topk_group=2,
                                                             scale=2.5, config=FOLD_SPLIT, seed=70, min_splits=4),
    "route_no_split_kimi_like_t16": lambda: check_router_topk_fold(16, 40, 16, 96, top_k=8, scale=2.827,
                                                                   config=FOLD_ONE, seed=71),
    "route_split_fp16_no_bias_no_renorm_t1": lambda: check_router_topk_fold(
        1, 40, 24, 136, top_k=4, n_group=5, topk_group=3, bias=False, renormalize=False, scale=1.5,
        dtype=torch.float16, config=FOLD_SPLIT, seed=72, min_splits=3),
    "route_no_split_ties_t3": lambda: check_router_topk_fold(3, 48, 16, 64, top_k=6, n_group=4, topk_group=2,
                                                             config=FOLD_ONE, ties=True, seed=73),
    "route_split_ties_t16": lambda: check_router_topk_fold(16, 40, 16, 128, top_k=3, n_group=4, topk_group=1,
                                                           config=FOLD_SPLIT, ties=True, seed=74, min_splits=4),
    "route_with_input_norm_split_t3": lambda: check_router_topk_fold(3, 40, 20, 128, top_k=8, scale=2.5, norm=True,
                                                                     config=FOLD_SPLIT, seed=75, min_splits=4),
    "route_default_config_t1": lambda: check_router_topk_fold(1, 48, 24, 96, top_k=8, n_group=2, topk_group=1,
                                                              seed=76),
    "route_reference_path": lambda: check_router_topk_reference_path(seed=77),
    # Routing programs beside a GEMV (the shared expert's down projection), split-K or not.
    "route_beside_split_grouped_t3": lambda: check_route_beside_gemv(3, 48, 40, 200, top_k=6, n_group=4,
                                                                     topk_group=2, scale=2.5, config=FOLD_SPLIT,
                                                                     seed=80, min_splits=4),
    "route_beside_no_split_kimi_like_t16": lambda: check_route_beside_gemv(16, 40, 37, 96, top_k=8, scale=2.827,
                                                                           config=FOLD_ONE, seed=81),
    "route_beside_fp16_no_bias_no_renorm_t1": lambda: check_route_beside_gemv(
        1, 40, 24, 136, top_k=4, n_group=5, topk_group=3, bias=False, renormalize=False, scale=1.5,
        dtype=torch.float16, config=FOLD_SPLIT, seed=82, min_splits=3),
    "route_beside_ties_t5": lambda: check_route_beside_gemv(5, 48, 16, 64, top_k=6, n_group=4, topk_group=2,
                                                            config=FOLD_ONE, ties=True, seed=83),
    "route_beside_default_config_t2": lambda: check_route_beside_gemv(2, 64, 48, 96, top_k=8, seed=84),
    "route_beside_reference_path": lambda: check_route_beside_reference_path(seed=85),
    # MLA's rotary launch beside W_UK (q_nope [T, H, nope] @ an N-contiguous [H, C, nope] view), split or not.
    "rope_beside_wuk_t1": lambda: check_rope_beside_gemv(1, 2, 16, 32, 16, seed=90),
    "rope_beside_wuk_split_t5": lambda: check_rope_beside_gemv(5, 3, 48, 32, 16, config=FOLD_SPLIT_NMAJOR, seed=91),
    "rope_beside_wuk_fp16_no_norm_t3": lambda: check_rope_beside_gemv(3, 2, 16, 48, 32, dtype=torch.float16,
                                                                      norm=False, seed=92),
    "rope_beside_reference_path": lambda: check_rope_beside_reference_path(seed=93),
}
