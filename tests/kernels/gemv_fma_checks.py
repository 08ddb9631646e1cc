"""Cases for the skinny GEMM's CUDA-core form (kernels/gemv.py triton_gemv_fma, triton/gemv.py gemv_fma_kernel)
against ref_gemv. Merged into kernel_checks.CASES: the interpreter runs them on CPU, the GPU suite at the Kimi /
DeepSeek-V3 q_b shapes.
"""

from __future__ import annotations

import math

import torch

from sglang_eagle3 import kernels
from sglang_eagle3.kernels.gemv import (
    fma_form,
    fma_pair_form,
    triton_gemv,
    triton_gemv_fma,
    triton_gemv_fma_pair,
    triton_gemv_pair,
)


def _rows_alike_in_any_batch(run, whole: tuple, what: str) -> None:
    """Every row computed alone and in groups of 2, 4 and 8 (the kernels' 1-, 2-, 4- and 8-row programs) bit-identical
    to the same rows of the whole batch's outputs ``whole`` (decode == verify for one token); ``run(rows)``: the
    outputs of a launch on those rows of x."""
    T = whole[0].shape[0]
    for size in (1, 2, 4, 8):
        for t0 in range(0, T - size + 1, size):
            parts = run(slice(t0, t0 + size))
            assert all(torch.equal(p, o[t0:t0 + size]) for p, o in zip(parts, whole, strict=True)), (
                f"rows {t0}..{t0 + size - 1} computed as a batch of {size} differ from the same rows in a batch of "
                f"{T} ({what})")


def check_gemv_fma(T: int, N: int, K: int, norm: bool, device: str = "cpu", seed: int = 0,
                   dtype=torch.bfloat16, config: dict | None = None) -> dict:
    """The CUDA-core GEMV (optionally with the RMSNorm of x folded in) against a float64 product of the same
    rounded inputs, every element written (output poisoned first); each row alone and each group of 2, 4 and 8
    rows (the kernel's 1-, 2-, 4- and 8-row programs) bit-identical to the same rows in the whole batch (decode
    == verify for one token); and, where fma_form takes the shape, triton_gemv's dispatch equal to it bit for
    bit, while fma=False (the tensor-core kernel) agrees within the rounding."""
    from kernel_checks import rel_err

    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(T, K, generator=g) * 2).to(dtype).to(device)
    w = (torch.randn(N, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    nw = (1 + 0.3 * torch.randn(K, generator=g)).to(dtype).to(device) if norm else None
    kw = dict(norm_weight=nw, eps=1e-6) if norm else {}
    out = torch.full((T, N), float("nan"), dtype=dtype, device=device)
    triton_gemv_fma(x, w, out=out, config=config, **kw)
    xr = kernels.ref_rms_norm(x, nw, 1e-6) if norm else x  # the normed x rounded to x's dtype, as the kernel
    ref = kernels.ref_gemv(xr.double(), w.double())
    # (Triton's interpreter casts float32 to bfloat16 by truncation, not to nearest: twice the error on CPU.)
    tol = 3e-3 if x.is_cuda else (1e-2 if norm else 6e-3)
    err = rel_err(out, ref)
    assert err < tol, f"gemv_fma rel err {err} >= {tol} ({T=} {N=} {K=} {norm=})"
    _rows_alike_in_any_batch(lambda rows: (triton_gemv_fma(x[rows], w, config=config, **kw),), (out,),
                             f"{N=} {K=} {norm=}")
    routed = fma_form(N, K, x, w, epilogue=False)
    if routed and config is None:
        via = triton_gemv(x, w, **kw)
        assert torch.equal(via, out), "triton_gemv's CUDA-core dispatch differs from triton_gemv_fma"
    tc = triton_gemv(x, w, fma=False, **kw)
    apart = rel_err(tc, out)
    assert apart < 2 * tol, f"tensor-core and CUDA-core GEMV apart by {apart} ({T=} {N=} {K=} {norm=})"
    return {"rel_err": err, "dispatched": routed}


def check_gemv_fma_pair(T: int, N1: int, N2: int, K: int, device: str = "cpu", seed: int = 0,
                        dtype=torch.bfloat16, config: dict | None = None, gated: bool = True) -> dict:
    """The CUDA-core pair (a MoE layer's float32 router logits and its shared expert's SiLU(gate) * up from one
    launch; without ``gated``, two plain products in x's dtype, as MLA's q_a and kv_a) against float64 products of
    the same inputs, every element written (outputs of a poisoned allocation checked finite); each row alone and in
    groups of 2, 4 and 8 bit-identical to the same rows of the whole batch (decode == verify); where fma_pair_form
    takes the shape (SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR at its default), triton_gemv_pair's dispatch equal to it bit
    for bit, and its tensor-core form (fma=False) within the rounding."""
    from kernel_checks import rel_err

    from sglang_eagle3 import env

    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(T, K, generator=g) * 2).to(dtype).to(device)
    w1, w2, w2_up = ((torch.randn(n, K, generator=g) / math.sqrt(K)).to(dtype).to(device) for n in (N1, N2, N2))
    if not gated:
        w2_up = None
    out1 = torch.float32 if gated else None
    y1, y2 = triton_gemv_fma_pair(x, w1, w2, w2_up, out1_dtype=out1, config=config)
    assert y1.dtype == (out1 or dtype) and y2.dtype == dtype and y1.shape == (T, N1) and y2.shape == (T, N2)
    assert bool(torch.isfinite(y1).all()) and bool(torch.isfinite(y2).all()), "an output element left unwritten"
    ref1 = kernels.ref_gemv(x.double(), w1.double())
    ref2 = kernels.ref_gemv(x.double(), w2.double(), w_up=None if w2_up is None else w2_up.double())
    # (the activation rounds gate, SiLU and up to x's dtype; a plain product rounds once; the interpreter's bf16
    # casts truncate)
    tol1 = 1e-5 if gated else (3e-3 if x.is_cuda else 6e-3)
    tol2 = (2e-2 if x.is_cuda else 4e-2) if gated else tol1
    err1, err2 = rel_err(y1, ref1), rel_err(y2, ref2)
    assert err1 < tol1 and err2 < tol2, f"gemv_fma_pair rel err {err1}, {err2} ({T=} {N1=} {N2=} {K=} {gated=})"
    _rows_alike_in_any_batch(
        lambda rows: triton_gemv_fma_pair(x[rows], w1, w2, w2_up, out1_dtype=out1, config=config), (y1, y2),
        f"{N1=} {N2=} {K=} {gated=}")
    with env.overrides({env.GEMV_FMA_PLAIN_PAIR.name: None}):
        routed = fma_pair_form(K, gated=gated, epilogue=False)
        if routed and config is None:
            via = triton_gemv_pair(x, w1, w2, w2_up=w2_up, out1_dtype=out1)
            assert torch.equal(via[0], y1) and torch.equal(via[1], y2), "triton_gemv_pair's CUDA-core dispatch differs"
    tc = triton_gemv_pair(x, w1, w2, w2_up=w2_up, out1_dtype=out1, fma=False)
    apart = max(rel_err(tc[0], y1), rel_err(tc[1], y2))
    assert apart < 2 * max(tol1, tol2), f"tensor-core and CUDA-core pair apart by {apart} ({T=} {N1=} {N2=} {K=})"
    return {"rel_err": [err1, err2], "dispatched": routed}


def check_gemv_fma_pair_norm(T: int, N1: int, N2: int, K: int, residual: bool = True, device: str = "cpu",
                             seed: int = 0, dtype=torch.bfloat16, config: dict | None = None,
                             strided: bool = False) -> dict:
    """The input-norm fold in the CUDA-core plain pair (MLA's q_a + kv_a of RMSNorm(h + residual), NORM_PRE):
    the products within rounding of float64 unfused math on the new stream (normed without rounding), every
    element written (outputs of a poisoned allocation checked finite); the stream h + residual exactly as a
    kernel's cast rounds it (torch's add on the GPU), h itself without a residual; each row alone and in groups
    of 2, 4 and 8 bit-identical to the same rows of the whole batch (decode == verify: the sums of squares and
    the products in one order whatever T is); where fma_pair_form takes the shape, triton_gemv_pair's dispatch
    equal to it bit for bit, and the tensor-core fold (fma=False) within the rounding. ``strided``: h a column
    slice of a wider tensor."""
    from fold_checks import EPS, check_fold_stream, fold_inputs
    from kernel_checks import rel_err

    g = torch.Generator(device="cpu").manual_seed(seed)
    h, res, nw = fold_inputs(g, T, K, residual, dtype, device, strided)
    w1, w2 = ((torch.randn(n, K, generator=g) / math.sqrt(K)).to(dtype).to(device) for n in (N1, N2))
    kw = dict(config=config, norm_weight=nw, eps=EPS)
    y1, y2, stream = triton_gemv_fma_pair(h, w1, w2, None, residual=res, **kw)
    assert y1.dtype == y2.dtype == dtype and y1.shape == (T, N1) and y2.shape == (T, N2)
    assert bool(torch.isfinite(y1).all()) and bool(torch.isfinite(y2).all()), "an output element left unwritten"
    check_fold_stream(stream, h, res)
    normed = kernels.ref_rms_norm(stream.double(), nw.double(), EPS)
    tol = 4e-3 if h.is_cuda else 1.2e-2  # bf16(s * rstd * weight) into the products; the interpreter truncates
    errs = [rel_err(y, kernels.ref_gemv(normed, w.double())) for y, w in ((y1, w1), (y2, w2))]
    assert max(errs) < tol, f"norm-folded CUDA-core pair rel err {errs} >= {tol} ({T=} {N1=} {N2=} {K=} {residual=})"
    _rows_alike_in_any_batch(
        lambda rows: triton_gemv_fma_pair(h[rows], w1, w2, None, residual=None if res is None else res[rows], **kw),
        (y1, y2, stream), f"{N1=} {N2=} {K=} {residual=} norm")
    routed = fma_pair_form(K, gated=False, epilogue=False)
    if routed and config is None:
        via = triton_gemv_pair(h, w1, w2, norm_weight=nw, eps=EPS, residual=res)
        assert all(torch.equal(a, b) for a, b in zip(via, (y1, y2, stream), strict=True)), (
            "triton_gemv_pair's CUDA-core dispatch of the fold differs")
    tc = triton_gemv_pair(h, w1, w2, norm_weight=nw, eps=EPS, residual=res, fma=False)
    assert torch.equal(tc[2], stream), "the tensor-core fold's stream differs"
    apart = max(rel_err(tc[0], y1), rel_err(tc[1], y2))
    assert apart < 2 * tol, f"tensor-core and CUDA-core folds apart by {apart} ({T=} {N1=} {N2=} {K=})"
    # Unfused: the RMSNorm kernel, then the same pair. The fold rounds the normed x as that kernel does; only the
    # order of the sum of squares differs (a last-bit rstd now and then), so the two agree far inside the rounding
    # of x that separates either from float64.
    normed_x = kernels.rms_norm(h, nw, EPS, use_triton=True) if res is None else kernels.rms_norm(
        h, nw, EPS, res, use_triton=True)[0]
    unfused = triton_gemv_fma_pair(normed_x, w1, w2, None, config=config)
    same = [int(torch.equal(a, b)) for a, b in zip((y1, y2), unfused, strict=True)]
    near = max(rel_err(a, b.double()) for a, b in zip((y1, y2), unfused, strict=True))
    assert near < tol / 8, f"fold vs the norm kernel then the pair: rel err {near} ({T=} {N1=} {N2=} {K=})"
    return {"rel_err": errs, "dispatched": routed, "unfused_rel_err": near, "unfused_bit_equal": same}


def check_plain_pair_float32_first(seed: int = 0) -> dict:
    """A plain pair whose first output is float32 (out1_dtype) stays on the tensor cores (the CUDA-core plain pair
    stores both outputs through one path, so in one dtype): triton_gemv_pair's result is its fma=False one, bit
    for bit, in the dtypes asked for; the CUDA-core launcher refuses the mix by name."""
    import pytest

    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(3, 1100, generator=g) * 2).to(torch.bfloat16)
    w1, w2 = ((torch.randn(n, 1100, generator=g) / math.sqrt(1100)).to(torch.bfloat16) for n in (9, 5))
    y1, y2 = triton_gemv_pair(x, w1, w2, out1_dtype=torch.float32)
    t1, t2 = triton_gemv_pair(x, w1, w2, out1_dtype=torch.float32, fma=False)
    assert y1.dtype == torch.float32 and y2.dtype == torch.bfloat16
    assert torch.equal(y1, t1) and torch.equal(y2, t2), "a float32-first plain pair left the tensor cores"
    with pytest.raises(AssertionError, match="a plain pair's outputs are both"):
        triton_gemv_fma_pair(x, w1, w2, None, out1_dtype=torch.float32)
    return {}


def check_gemv_fma_heads(T: int, B: int, N: int, K: int, device: str = "cpu", seed: int = 0,
                         dtype=torch.bfloat16, config: dict | None = None, w_view: bool = False) -> dict:
    """The CUDA-core GEMV per head (x [T, B, K] @ w [B, N, K]^T, MLA's W_UV) against a float64 product of the
    same inputs, every element written (output poisoned first); each head equal bit for bit to the 2-D form on
    that head alone; rows alone and in groups of 2, 4, 8 bit-identical to the whole batch (decode == verify);
    where fma_form takes the shape, triton_gemv's dispatch equal to it and the tensor-core kernel within the
    rounding. ``w_view``: w a strided per-head view (as W_UV is of kv_b_proj's weight), x a view with padding
    between heads."""
    from kernel_checks import rel_err

    g = torch.Generator(device="cpu").manual_seed(seed)
    if w_view:  # W_UV's layout: rows [nope + v] a head of one [B * (nope + v), K] weight, the v rows taken
        full = (torch.randn(B, 3 + N, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
        w = full[:, 3:]
        xs = (torch.randn(T, B, K + 5, generator=g) * 2).to(dtype).to(device)
        x = xs[:, :, :K]
    else:
        w = (torch.randn(B, N, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
        x = (torch.randn(T, B, K, generator=g) * 2).to(dtype).to(device)
    out = torch.full((T, B, N), float("nan"), dtype=dtype, device=device)
    triton_gemv_fma(x, w, out=out, config=config)
    ref = kernels.ref_gemv(x.double(), w.double())
    tol = 3e-3 if x.is_cuda else 6e-3
    err = rel_err(out, ref)
    assert err < tol, f"gemv_fma per head rel err {err} >= {tol} ({T=} {B=} {N=} {K=})"
    for b in range(B):
        alone = triton_gemv_fma(x[:, b].contiguous(), w[b].contiguous(), config=config)
        assert torch.equal(alone, out[:, b]), f"head {b} differs from the 2-D form on that head ({T=} {N=} {K=})"
    _rows_alike_in_any_batch(lambda rows: (triton_gemv_fma(x[rows], w, config=config),), (out,), f"{B=} {N=} {K=}")
    routed = fma_form(N, K, x, w, epilogue=False)
    if routed and config is None:
        assert torch.equal(triton_gemv(x, w), out), "triton_gemv's per-head CUDA-core dispatch differs"
    tc = triton_gemv(x, w, fma=False)
    apart = rel_err(tc, out)
    assert apart < 2 * tol, f"tensor-core and CUDA-core per-head GEMV apart by {apart} ({T=} {B=} {N=} {K=})"
    return {"rel_err": err, "dispatched": routed}


def check_lanes_first_knob(seed: int = 0) -> dict:
    """SGLANG_EAGLE3_GEMV_LANES_FIRST reaches both CUDA-core launches through their default configs (LF as the
    knob says: 1 and unset on, 0 off), and each order's products agree with the other's within the rounding."""
    import importlib

    from sglang_eagle3 import env

    mod = importlib.import_module("sglang_eagle3.kernels.gemv")  # (the package's attribute gemv is a function)
    launched = []

    class Spy:  # records the LF constexpr of each launch, then launches
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(kwargs["LF"])
                return self.kernel[grid](*args, **kwargs)
            return launch

    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(3, 300, generator=g).to(torch.bfloat16)
    w, w2, w2_up = ((torch.randn(n, 300, generator=g) / 17).to(torch.bfloat16) for n in (10, 6, 6))
    saved = mod.gemv_fma_kernel, mod.gemv_fma_pair_kernel
    mod.gemv_fma_kernel, mod.gemv_fma_pair_kernel = Spy(saved[0]), Spy(saved[1])
    outs = {}
    try:
        for value, want in (("1", True), ("0", False), (None, True)):
            with env.overrides({env.GEMV_LANES_FIRST.name: value}):
                outs[value] = (triton_gemv_fma(x, w), *triton_gemv_fma_pair(x, w, w2, w2_up))
            assert launched[-2:] == [want, want], f"LANES_FIRST={value}: launched with LF={launched[-2:]}"
    finally:
        mod.gemv_fma_kernel, mod.gemv_fma_pair_kernel = saved
    for a, b in zip(outs["1"], outs["0"], strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2), "the two tile orders disagree"
    return {"launched": launched}


def check_groups_inner_knob(seed: int = 0) -> dict:
    """SGLANG_EAGLE3_GEMV_GROUPS_INNER reaches all three CUDA-core launches (the plain form, per head, the gated pair):
    the row groups on grid axis 0 with GROUPS_INNER where it names the launch's form (all; pairs and unset: the
    pair only), else the weight blocks; at T = 9 (three
    row groups of 4, the last partial; partial weight-row blocks) the outputs are the same bits either way, and
    each matches the torch reference (a wrong block or row index would store another row's sums)."""
    import importlib

    from kernel_checks import rel_err

    from sglang_eagle3 import env

    mod = importlib.import_module("sglang_eagle3.kernels.gemv")
    launched = []

    class Spy:  # records each launch's grid and GROUPS_INNER, then launches
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((tuple(grid), kwargs["GROUPS_INNER"]))
                return self.kernel[grid](*args, **kwargs)
            return launch

    g = torch.Generator(device="cpu").manual_seed(seed)
    T, K = 9, 300
    x = torch.randn(T, K, generator=g).to(torch.bfloat16)
    xh = torch.randn(T, 2, K, generator=g).to(torch.bfloat16)
    w, w2, w2_up = ((torch.randn(n, K, generator=g) / 17).to(torch.bfloat16) for n in (5, 3, 3))
    wh = (torch.randn(2, 7, K, generator=g) / 17).to(torch.bfloat16)
    saved = mod.gemv_fma_kernel, mod.gemv_fma_pair_kernel
    mod.gemv_fma_kernel, mod.gemv_fma_pair_kernel = Spy(saved[0]), Spy(saved[1])
    cfg = {"BLOCK_N": 4, "LANES": 32, "num_warps": 1, "MAX_ROWS": 4, "LANES_FIRST": True}
    pair_cfg = {**cfg, "BLOCK_N": 2}
    outs = {}
    try:
        for value, wants in (("all", (True,) * 3), ("none", (False,) * 3), (None, (False, False, True))):
            with env.overrides({env.GEMV_GROUPS_INNER.name: value}):
                outs[value] = (triton_gemv_fma(x, w, config=cfg), triton_gemv_fma(xh, wh, config=cfg),
                               *triton_gemv_fma_pair(x, w, w2, w2_up, config=pair_cfg))
            grids = [grid for grid, _ in launched[-3:]]
            assert tuple(inner for _, inner in launched[-3:]) == wants, f"GROUPS_INNER={value}: {launched[-3:]}"
            blocks = (2, 2, 3 + 3)  # cdiv(5, 4); cdiv(7, 4); the pair's cdiv(5, 2) W1 + cdiv(3, 2 // 2) gated
            heads = (1, 2, 1)
            expect = [(3, b, h) if want else (b, 3, h) for b, h, want in zip(blocks, heads, wants, strict=True)]
            assert grids == expect, f"GROUPS_INNER={value}: grids {grids}, expected {expect}"
    finally:
        mod.gemv_fma_kernel, mod.gemv_fma_pair_kernel = saved
    for a, b, c in zip(outs["all"], outs["none"], outs[None], strict=True):
        assert torch.equal(a, b) and torch.equal(a, c), "the grid orders computed different bits"
    refs = (x.float() @ w.float().T, torch.einsum("tbk,bnk->tbn", xh.float(), wh.float()), x.float() @ w.float().T,
            torch.nn.functional.silu(x.float() @ w2.float().T) * (x.float() @ w2_up.float().T))
    for got, ref in zip(outs["all"], refs, strict=True):
        assert rel_err(got, ref) < 2e-2, f"rel err {rel_err(got, ref)} against the torch reference"
    return {"launched": launched}


FMA_8 = {"BLOCK_N": 8, "LANES": 16, "num_warps": 1, "MAX_ROWS": 8}
FMA_PAIR_2 = {"BLOCK_N": 2, "LANES": 16, "num_warps": 1, "MAX_ROWS": 2}
# The weight tile as [LANES, BLOCK_N, VEC] (the config key LANES_FIRST, kernels/gemv.py lanes_first): the same
# sums along other axes.
LF_4 = {"BLOCK_N": 4, "LANES": 32, "num_warps": 1, "MAX_ROWS": 4, "LANES_FIRST": True}
# The default config's tile rows first: a config without LANES_FIRST is rows first, while no config (fma_config) is
# lanes first since the thirty-sixth session, so the 4-row cases without one and their LF_4 twins ran alike.
RF_4 = {**LF_4, "LANES_FIRST": False}
LF_8 = {**FMA_8, "LANES_FIRST": True}
LF_PAIR_2 = {**FMA_PAIR_2, "LANES_FIRST": True}

CASES = {
    # Under the interpreter one warp: 32 lanes of 8 weights, 256 a step. Irregular N (a partial 4-row block) and
    # K (a masked last step); T = 7 and 16: groups of 4 rows, the last one partial at 7.
    "gemv_fma_irregular_t7": lambda: check_gemv_fma(7, 5, 300, norm=False, seed=1, config=RF_4),
    "gemv_fma_norm_t16": lambda: check_gemv_fma(16, 5, 600, norm=True, seed=2),
    "gemv_fma_norm_t2_fp16": lambda: check_gemv_fma(2, 10, 520, norm=True, seed=3, dtype=torch.float16),
    # 8-row programs (T = 13: one of 8, one of 5), 16 lanes, 8 weight rows a program.
    "gemv_fma_norm_t13_rows8": lambda: check_gemv_fma(13, 11, 400, norm=True, seed=5, config=FMA_8),
    # K >= FMA_MIN_K: triton_gemv sends it here (checked bit for bit against the direct call).
    "gemv_fma_dispatch_t3": lambda: check_gemv_fma(3, 9, 1030, norm=True, seed=4),
    # The router + shared pair: partial row blocks of W1 (5 = 4 + 1) and of the gated rows (3 activations:
    # the last gated program holds one), a masked last K step; K >= FMA_MIN_K: triton_gemv_pair dispatches it.
    "gemv_fma_pair_t5_dispatch": lambda: check_gemv_fma_pair(5, 5, 3, 1100, seed=6),
    "gemv_fma_pair_t8_fp16": lambda: check_gemv_fma_pair(8, 8, 4, 300, seed=7, dtype=torch.float16),
    # one gate and one up row a program, 2-row programs (T = 3: one of 2, one of 1)
    "gemv_fma_pair_t3_half1": lambda: check_gemv_fma_pair(3, 5, 3, 260, seed=8, config=FMA_PAIR_2),
    # Per head (MLA's W_UV): 3 heads, a partial 4-row block (N = 7), K = 300 (a masked last step) from strided
    # views; K = 512 at 2 heads dispatched by triton_gemv (K >= FMA_MIN_K_HEADS); 8-row programs at T = 11.
    "gemv_fma_heads_views_t5": lambda: check_gemv_fma_heads(5, 3, 7, 300, seed=12, w_view=True),
    "gemv_fma_heads_dispatch_t4": lambda: check_gemv_fma_heads(4, 2, 6, 512, seed=13),
    "gemv_fma_heads_t11_rows8": lambda: check_gemv_fma_heads(11, 2, 9, 200, seed=14, config=FMA_8),
    # The same shapes with the lanes-first tile: a partial weight-row block, a masked last K step, 8-row programs
    # with the norm, the pair (gated rows split across programs of 2 and of 4 rows), per head from strided views.
    "gemv_fma_irregular_t7_lanes_first": lambda: check_gemv_fma(7, 5, 300, norm=False, seed=21, config=LF_4),
    "gemv_fma_norm_t13_rows8_lanes_first": lambda: check_gemv_fma(13, 11, 400, norm=True, seed=22, config=LF_8),
    "gemv_fma_pair_t5_rows_first": lambda: check_gemv_fma_pair(5, 5, 3, 1100, seed=23, config=RF_4),
    "gemv_fma_pair_t3_half1_lanes_first": lambda: check_gemv_fma_pair(3, 5, 3, 260, seed=24, config=LF_PAIR_2),
    # A plain pair (MLA's q_a + kv_a): partial row blocks of both matrices (5 = 4 + 1 each), a masked last K step,
    # dispatched by triton_gemv_pair; 2-row programs of 2 weight rows.
    "gemv_fma_pair_plain_t5_dispatch": lambda: check_gemv_fma_pair(5, 5, 5, 1100, seed=27, gated=False),
    "gemv_fma_pair_plain_t3_fp16": lambda: check_gemv_fma_pair(3, 5, 3, 260, seed=28, dtype=torch.float16,
                                                               config=LF_PAIR_2, gated=False),
    "gemv_pair_plain_float32_first": lambda: check_plain_pair_float32_first(seed=31),
    # The input norm folded into the plain pair (NORM_POST): with the residual, dispatched by triton_gemv_pair
    # (K >= FMA_MIN_K; partial row blocks, a masked last K step); h strided without one; 8-row programs at T = 11;
    # float16 in 2-row programs.
    "gemv_fma_pair_norm_t5_dispatch": lambda: check_gemv_fma_pair_norm(5, 5, 5, 1100, seed=33),
    "gemv_fma_pair_norm_t3_strided": lambda: check_gemv_fma_pair_norm(3, 9, 6, 300, residual=False, seed=34,
                                                                      config=LF_4, strided=True),
    "gemv_fma_pair_norm_t11_rows8": lambda: check_gemv_fma_pair_norm(11, 11, 9, 300, seed=35, config=LF_8),
    "gemv_fma_pair_norm_t3_fp16": lambda: check_gemv_fma_pair_norm(3, 5, 3, 260, seed=36, dtype=torch.float16,
                                                                   config=LF_PAIR_2),
    # 8-row programs (T = 13: one of 8, one of 5; benchmarks/variants/gemv_qkv_rows8.py's form), 8 weight rows.
    "gemv_fma_pair_plain_t13_rows8": lambda: check_gemv_fma_pair(13, 11, 9, 300, seed=30, config=LF_8,
                                                                 gated=False),
    "gemv_fma_heads_views_t5_lanes_first": lambda: check_gemv_fma_heads(5, 3, 7, 300, seed=25, w_view=True,
                                                                        config=LF_4),
    "gemv_fma_lanes_first_knob": lambda: check_lanes_first_knob(seed=26),
    "gemv_fma_groups_inner_knob": lambda: check_groups_inner_knob(seed=32),
}
