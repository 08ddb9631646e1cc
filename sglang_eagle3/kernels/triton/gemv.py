"""Skinny GEMM (T <= 16 rows of activations) over bf16/fp16 weights: the decode/verify projections.

At decode and verify sizes every dense projection of a layer is a matrix-vector product bound by reading the
weight once; cuBLAS picks split-K kernels plus a separate reduce for most of these shapes and reaches 5-52%
of copy bandwidth on a Kimi TP=8 rank's attention and MoE projections (benchmarks/profile_step.py on the
H200; docs/BENCHMARKS.md section 1). Here one launch does
the split-K and its reduction: each program streams a [BLOCK_N, k-range] slab of W, and with SPLIT > 1 it
stores its fp32 partial sums, and the last of the SPLIT programs of a row block (found with an atomic
counter, which it resets for the next call) adds the partials in split order (deterministic) and runs the
epilogue: a plain cast, a residual add, or SiLU(gate) * up for a gated MLP whose gate and up weights are
separate tensors read by the same program.

An RMSNorm of x can ride in the same launch, two ways (NORM). NORM_PRE (short rows, MLA's q_a_layernorm
before q_b): every program first reads the whole row to get its rstd. NORM_POST (the 7168-wide input norm
of a decoder layer, with its residual add, before q_a and kv_a): rstd is one scalar per row, so
rstd * sum_k bf16(x g)_k W_nk is the normed product; each program feeds its own K-slice of bf16(x g) to the
dot and sums the squares of that slice, and the epilogue (after the split reduction, which adds the slices'
sums of squares in split order too) scales by rstd. The product then differs from the unfused
norm-then-GEMV only in where x is rounded to bf16 (before the scaling by rstd instead of after). The CUDA-core
q_a + kv_a pair below takes that input norm as NORM_PRE instead (it splits no K, so every program reads its rows
whole anyway: gemv_fma_pair_kernel).

A MoE layer's routing can ride in the tail of the router + shared expert launch (ROUTE): each router row
block, once its logits are stored (by the split-K reduction, or by the program itself without split), arrives
on one more counter, and the last of the router row blocks routes every token from the stored logits with the
routing kernel's own function (moe_topk.route_row), so the results are bit-identical to that launch's.
NOTE: that one program routes the T rows one after another, where the routing launch has a program per row:
the tail saves a launch at decode, but its serial work grows with T (tests/kernels/test_fold_gpu.py times it).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sglang_eagle3.kernels.triton.moe_topk import route_bias, route_row
from sglang_eagle3.kernels.triton.rotary import rotary_token
from sglang_eagle3.kernels.triton.sync import last_arrival

EPI_NONE, EPI_ADD, EPI_GATED = 0, 1, 2
NORM_NONE, NORM_PRE, NORM_POST = 0, 1, 2
PREFETCH_LINES = tl.constexpr(16)  # 128-byte lines per row per prefetch step


@triton.jit
def _prefetch_l2(ptrs, mask, fallback):
    safe = tl.where(mask, ptrs, fallback)
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [safe], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _prefetch_slab(w_ptr, b, pid_n, n, n_ok, k_lo, k_hi, s_wb, s_wn, s_wk,
                   W_KMAJOR: tl.constexpr, BLOCK_N: tl.constexpr):
    """Asks the L2 for every 128-byte line of this program's weight slab (weights are never written by a
    kernel, so this may run before gdc_wait, while the previous kernel is still finishing)."""
    if W_KMAJOR:
        for k0 in range(k_lo, k_hi, 64 * PREFETCH_LINES):
            k = k0 + 64 * tl.arange(0, PREFETCH_LINES)
            _prefetch_l2(w_ptr + b * s_wb + n[:, None] * s_wn + k[None, :], n_ok[:, None] & (k < k_hi)[None, :],
                         w_ptr)
    else:  # one row of BLOCK_N contiguous weights per k: one line when BLOCK_N * 2 bytes <= 128
        for k0 in range(k_lo, k_hi, 64):
            k = k0 + tl.arange(0, 64)
            _prefetch_l2(w_ptr + b * s_wb + pid_n * BLOCK_N + k * s_wk, k < k_hi, w_ptr)


@triton.jit
def _rstd(ss, K, eps):
    """1 / sqrt(mean of squares + eps) from the sum of squares of K values, as the RMSNorm kernel computes it."""
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _row_rstd(x_ptr, b, T, K, s_xt, s_xb, eps, M_PAD: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x[t, b, :]^2) + eps) per row, fp32 [M_PAD]: NORM_PRE reads the whole row first."""
    t = tl.arange(0, M_PAD)
    ss = tl.zeros([M_PAD], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + t[:, None] * s_xt + b * s_xb + k[None, :], mask=(t[:, None] < T) & (k < K)[None, :],
                     other=0.0).to(tl.float32)
        ss += tl.sum(xt * xt, axis=1)
    return _rstd(ss, K, eps)


@triton.jit
def _slab(x_ptr, w_ptr, b, n, n_ok, k_lo, k_hi, T, s_xt, s_xb, s_wb, s_wn, s_wk, rstd, nw_ptr,
          res_ptr, res_out_ptr, s_rt, s_rot, first_block,
          W_KMAJOR: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          INTERPRET: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr, STORE_RES: tl.constexpr):
    """(fp32 [M_PAD, BLOCK_N] sum over k in [k_lo, k_hi) of x[t, b, k] * W[b, n, k], fp32 [M_PAD] sum of
    squares of the slice of x for NORM_POST, else 0); rows t >= T are 0.

    A tensor-core dot with the activation rows padded to 16: the arithmetic is free at these sizes, and the
    order of the sums is the same for every row whatever T is, so decode (T=1) and verify (T=k+1) compute
    bit-identical products for the same token.

    NORM_POST with HAS_RES: x is h + residual rounded to x's dtype (as torch's add rounds it), and with
    STORE_RES programs with ``first_block`` store it to res_out (the new residual stream: the programs of one
    row block cover K once between them)."""
    t = tl.arange(0, M_PAD)
    acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([M_PAD], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_hi
        rows_ok = (t[:, None] < T) & k_ok[None, :]
        xt = tl.load(x_ptr + t[:, None] * s_xt + b * s_xb + k[None, :], mask=rows_ok, other=0.0)
        if NORM == 1:  # x * rstd * norm weight in fp32, rounded to x's dtype as the separate RMSNorm kernel stores it
            nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            xt = (xt.to(tl.float32) * rstd[:, None] * nw[None, :]).to(x_ptr.dtype.element_ty)
        elif NORM == 2:  # x * norm weight rounded to x's dtype; rstd scales the product in the epilogue
            if HAS_RES:
                r = tl.load(res_ptr + t[:, None] * s_rt + k[None, :], mask=rows_ok, other=0.0)
                xt = (xt.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
                if STORE_RES:
                    tl.store(res_out_ptr + t[:, None] * s_rot + k[None, :], xt, mask=rows_ok & first_block)
            xf = xt.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
            nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            xt = (xf * nw[None, :]).to(x_ptr.dtype.element_ty)
        if W_KMAJOR:  # [BLOCK_K, BLOCK_N] view of a K-contiguous tile
            w = tl.load(w_ptr + b * s_wb + n[None, :] * s_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None],
                        other=0.0)
        else:
            w = tl.load(w_ptr + b * s_wb + n[None, :] + k[:, None] * s_wk, mask=n_ok[None, :] & k_ok[:, None],
                        other=0.0)
        if INTERPRET:  # the interpreter's half-precision dot is wrong: do it in fp32 there
            acc += tl.dot(xt.to(tl.float32), w.to(tl.float32))
        else:
            acc += tl.dot(xt, w)
    return acc, ss


@triton.jit
def _epilogue(acc, acc_up, add_ptr, out_ptr, b, n, n_ok, T, s_at, s_ab, s_ot, s_ob,
              EPI: tl.constexpr, M_PAD: tl.constexpr):
    """Rounds as the unfused torch ops would: the product to the output dtype first, then the add or the
    SiLU (fp32 math, rounded) and the product of the two rounded halves."""
    t = tl.arange(0, M_PAD)
    ok = (t[:, None] < T) & n_ok[None, :]
    ty = out_ptr.dtype.element_ty
    y = acc.to(ty)
    if EPI == 1:
        r = tl.load(add_ptr + t[:, None] * s_at + b * s_ab + n[None, :], mask=ok, other=0.0)
        y = (y.to(tl.float32) + r.to(tl.float32)).to(ty)
    elif EPI == 2:
        g = y.to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
        y = (s * acc_up.to(ty).to(tl.float32)).to(ty)
    tl.store(out_ptr + t[:, None] * s_ot + b * s_ob + n[None, :], y, mask=ok)


@triton.jit
def _store(acc, acc_up, second, add_ptr, out_ptr, out2_ptr, b, n, n_ok, T, s_at, s_ab, s_ot, s_ob, s_o2t,
           EPI: tl.constexpr, EPI2: tl.constexpr, PAIR: tl.constexpr, M_PAD: tl.constexpr):
    """The epilogue of this program's matrix (out and out2 may differ in dtype: one branch each)."""
    if PAIR:
        if second:
            _epilogue(acc, acc_up, add_ptr, out2_ptr, b, n, n_ok, T, s_at, s_ab, s_o2t, s_ob, EPI2, M_PAD)
        else:
            _epilogue(acc, acc_up, add_ptr, out_ptr, b, n, n_ok, T, s_at, s_ab, s_ot, s_ob, EPI, M_PAD)
    else:
        _epilogue(acc, acc_up, add_ptr, out_ptr, b, n, n_ok, T, s_at, s_ab, s_ot, s_ob, EPI, M_PAD)


@triton.jit
def _route_tail(out_ptr, s_ot, T, count_ptr, NB1, bias_ptr, topk_w_ptr, topk_id_ptr, s_twt, s_tit,
                routed_scaling_factor, INTERPRET: tl.constexpr,
                PER_GROUP: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
                G_PAD: tl.constexpr, PG_PAD: tl.constexpr, K_PAD: tl.constexpr, HAS_BIAS: tl.constexpr,
                RENORMALIZE: tl.constexpr):
    """Run by a router row block after its logits are stored: the last of the NB1 to arrive at ``count_ptr``
    routes rows t < T of the logits out[t, :] (read through L2: other programs wrote them) into
    topk_w [t, :TOP_K] (fp32) and topk_id [t, :TOP_K] (int32), as moe_topk_kernel stores them."""
    if last_arrival(count_ptr, NB1, INTERPRET):
        kk = tl.arange(0, K_PAD)
        bias = route_bias(bias_ptr, PER_GROUP, N_GROUP, G_PAD, PG_PAD, HAS_BIAS)
        for t in range(0, T):
            out_w, out_i = route_row(out_ptr + t * s_ot, bias, routed_scaling_factor, PER_GROUP, N_GROUP,
                                     TOPK_GROUP, TOP_K, G_PAD, PG_PAD, K_PAD, HAS_BIAS, RENORMALIZE, CG=True)
            tl.store(topk_w_ptr + t * s_twt + kk, out_w, mask=kk < TOP_K)
            tl.store(topk_id_ptr + t * s_tit + kk, out_i, mask=kk < TOP_K)


@triton.jit
def gemv_kernel(
    x_ptr, w_ptr, w_up_ptr, add_ptr, out_ptr, part_ptr, count_ptr, w2_ptr, out2_ptr,
    T, N, K, k_per_split, N2, NB1,
    s_xt, s_xb, s_wb, s_wn, s_wk, s_at, s_ab, s_ot, s_ob, s_w2n, s_o2t,
    W_KMAJOR: tl.constexpr, EPI: tl.constexpr, SPLIT: tl.constexpr, M_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr,
    PAIR: tl.constexpr = False, NORM: tl.constexpr = 0, nw_ptr=None, eps=0.0,
    EPI2: tl.constexpr = 0, w2_up_ptr=None,
    HAS_RES: tl.constexpr = False, res_ptr=None, res_out_ptr=None, s_rt=0, s_rot=0,
    ROUTE: tl.constexpr = False, bias_ptr=None, topk_w_ptr=None, topk_id_ptr=None, s_twt=0, s_tit=0,
    routed_scaling_factor=1.0, PER_GROUP: tl.constexpr = 1, N_GROUP: tl.constexpr = 1,
    TOPK_GROUP: tl.constexpr = 1, TOP_K: tl.constexpr = 1, G_PAD: tl.constexpr = 1, PG_PAD: tl.constexpr = 1,
    K_PAD: tl.constexpr = 1, HAS_BIAS: tl.constexpr = False, RENORMALIZE: tl.constexpr = False,
    PREFETCH_L2: tl.constexpr = False, ROUTE_SIDE: tl.constexpr = False, logits_ptr=None, s_lt=0,
    ROPE_SIDE: tl.constexpr = False, rp_pos_ptr=None, rp_cos_ptr=None, rp_sin_ptr=None, rp_q_ptr=None,
    rp_q_out_ptr=None, rp_k_ptr=None, rp_k_out_ptr=None, rp_k_out_rows_ptr=None, rp_stride_qt=0, rp_stride_qh=0,
    rp_stride_qot=0, rp_stride_qoh=0, rp_stride_kt=0, rp_stride_kh=0, rp_stride_kot=0, rp_stride_koh=0,
    rp_stride_table=0, rp_HQ=0, rp_HK=0, rp_HAS_K: tl.constexpr = False, rp_K_OUT_ROWS: tl.constexpr = False,
    rp_INTERLEAVED: tl.constexpr = False, rp_HALF: tl.constexpr = 1, rp_HALF_PAD: tl.constexpr = 1,
    rp_BLOCK_H: tl.constexpr = 1, rp_NORM_C: tl.constexpr = False, rp_c_ptr=None, rp_nw_ptr=None,
    rp_c_out_ptr=None, rp_stride_ct=0, rp_stride_cot=0, rp_C=0, rp_eps=0.0, rp_BLOCK_C: tl.constexpr = 16,
    rp_HAS_Q: tl.constexpr = True, rp_ONE_BLOCK: tl.constexpr = False,
):
    """out[t, b, n] = epilogue(sum_k x[t, b, k] W[b, n, k]) over grid (N blocks, SPLIT, B).

    W[b, n, k] lives at w_ptr + b*s_wb + n*s_wn + k (W_KMAJOR) or + n + k*s_wk (N-contiguous, e.g. MLA's W_UK
    used as x @ W). part_ptr: fp32 [B, SPLIT, 2 (gate/up), M_PAD, N] scratch (for NORM_POST followed by the
    slices' sums of squares, fp32 [B, N blocks, SPLIT, M_PAD]); count_ptr: int32 [B, N blocks], zero before
    the call and zero again after it.

    PAIR: a second K-contiguous matrix W2 [N2, K] read by the same launch from the same x (MLA's q_a and kv_a;
    the router and the shared expert's gate/up): the first NB1 row blocks are W's (epilogue EPI, none or
    gated), the rest W2's with epilogue EPI2 (none, or gated with W2_up [N2, K]) into out2 [T, N2], whose
    dtype may differ from out's (router logits float32, the shared expert's activation bf16). The partials
    plane is then N + N2 wide (W2's columns after W's). Only with B = 1.

    NORM: x is first RMS-normalised per row with weight nw_ptr [K] and eps (module doc). NORM_PRE (1): every
    program computes the row's rstd itself (K <= a few thousand: a few KB from L2). NORM_POST (2): rstd from
    the slices' sums of squares, applied in the epilogue; with HAS_RES x is h (x_ptr) + residual (res_ptr
    [T, K], row stride s_rt), and the programs of row block 0 store that sum to res_out_ptr [T, K] (row
    stride s_rot). Only with B = 1.

    ROUTE (with PAIR): out are router logits [T, N = E]; the NB1 row blocks of W arrive at one more counter,
    count_ptr[N blocks] (zero before and after, like the others), and the last routes every row as
    moe_topk_kernel does (same arguments: bias_ptr [E] with HAS_BIAS, routed_scaling_factor, the constexprs
    from PER_GROUP on) into topk_w_ptr fp32 [T, TOP_K] (row stride s_twt) and topk_id_ptr int32 (s_tit).

    ROUTE_SIDE (without PAIR; takes ROUTE's routing arguments): the grid has T more programs along its first
    axis, past the NB1 row blocks of W; program NB1 + t (of split 0, head 0) routes the router logits row t of
    logits_ptr fp32 [T, E] (row stride s_lt; written by an earlier launch) as moe_topk_kernel does. Independent
    work side by side in one launch: the shared expert's down projection and the routing both read only
    what the router + shared launch wrote.

    ROPE_SIDE (without PAIR and ROUTE_SIDE): likewise T more programs past the NB1 row blocks, program NB1 + t
    (of split 0, head 0) running the rotary launch's work for token t (rotary_kernel's arguments, each prefixed
    rp_; kernels/rotary.py rotary_args builds them): MLA's q rope in place, kv_a norm and k rope into the
    cache, beside W_UK, which reads other columns of q (q_nope). The launch must then be compiled without fp
    fusion, as the rotary launch is: the rotation's products are rounded as the reference rounds them (this
    kernel's own epilogues have no product-add to contract without a norm or a gated epilogue).

    PREFETCH_L2 (with PDL): before the grid-dependency wait, ask the L2 for the program's whole weight slab."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    b = tl.program_id(2)
    if ROPE_SIDE:
        if pid_n >= NB1:  # a rotary program, not a row block of W (it waits for the previous kernel itself)
            if (pid_k == 0) & (b == 0):
                rotary_token((pid_n - NB1).to(tl.int64), rp_pos_ptr, rp_cos_ptr, rp_sin_ptr, rp_q_ptr,
                             rp_q_out_ptr, rp_k_ptr, rp_k_out_ptr, rp_k_out_rows_ptr, rp_stride_qt, rp_stride_qh,
                             rp_stride_qot, rp_stride_qoh, rp_stride_kt, rp_stride_kh, rp_stride_kot,
                             rp_stride_koh, rp_stride_table, rp_HQ, rp_HK, rp_HAS_K, rp_K_OUT_ROWS,
                             rp_INTERLEAVED, rp_HALF, rp_HALF_PAD, rp_BLOCK_H, PDL, rp_NORM_C, rp_c_ptr, rp_nw_ptr,
                             rp_c_out_ptr, rp_stride_ct, rp_stride_cot, rp_C, rp_eps, rp_BLOCK_C, rp_HAS_Q,
                             rp_ONE_BLOCK)
            return
    if PAIR:
        second = pid_n >= NB1
        pid_loc = tl.where(second, pid_n - NB1, pid_n)
        w_e = tl.where(second, w2_ptr, w_ptr)
        n_lim = tl.where(second, N2, N)
        s_wn_e = tl.where(second, s_w2n, s_wn)
        col0 = tl.where(second, N, 0)
        width = N + N2
        if EPI2 == 2:
            gated = second
            w_up_e = tl.where(second, w2_up_ptr, w_up_ptr)
        else:
            gated = EPI == 2
            w_up_e = w_up_ptr
    else:
        second = False
        pid_loc = pid_n
        w_e = w_ptr
        n_lim = N
        s_wn_e = s_wn
        col0 = 0
        width = N
        gated = EPI == 2
        w_up_e = w_up_ptr
    n = pid_loc * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_lim
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        if PREFETCH_L2:  # first ask the L2 for the whole weight slab (weights: no kernel writes them)
            _prefetch_slab(w_e, b, pid_loc, n, n_ok, k_lo, k_hi, s_wb, s_wn_e, s_wk, W_KMAJOR, BLOCK_N)
            if gated:
                _prefetch_slab(w_up_e, b, pid_loc, n, n_ok, k_lo, k_hi, s_wb, s_wn_e, s_wk, W_KMAJOR, BLOCK_N)
        gdc_wait()
        gdc_launch_dependents()
    if ROUTE_SIDE:
        if pid_n >= NB1:  # a routing program, not a row block of W
            if (pid_k == 0) & (b == 0):
                t = pid_n - NB1
                kk = tl.arange(0, K_PAD)
                bias = route_bias(bias_ptr, PER_GROUP, N_GROUP, G_PAD, PG_PAD, HAS_BIAS)
                out_w, out_i = route_row(logits_ptr + t * s_lt, bias, routed_scaling_factor, PER_GROUP,
                                         N_GROUP, TOPK_GROUP, TOP_K, G_PAD, PG_PAD, K_PAD, HAS_BIAS, RENORMALIZE)
                tl.store(topk_w_ptr + t * s_twt + kk, out_w, mask=kk < TOP_K)
                tl.store(topk_id_ptr + t * s_tit + kk, out_i, mask=kk < TOP_K)
            return
    if NORM == 1:
        rstd = _row_rstd(x_ptr, b, T, K, s_xt, s_xb, eps, M_PAD, BLOCK_K)
    else:
        rstd = tl.zeros([M_PAD], dtype=tl.float32)
    first_block = pid_n == 0
    acc, ss = _slab(x_ptr, w_e, b, n, n_ok, k_lo, k_hi, T, s_xt, s_xb, s_wb, s_wn_e, s_wk, rstd, nw_ptr,
                    res_ptr, res_out_ptr, s_rt, s_rot, first_block,
                    W_KMAJOR, M_PAD, BLOCK_N, BLOCK_K, INTERPRET, NORM, HAS_RES, True)
    if gated:
        acc_up, _ = _slab(x_ptr, w_up_e, b, n, n_ok, k_lo, k_hi, T, s_xt, s_xb, s_wb, s_wn_e, s_wk, rstd, nw_ptr,
                          res_ptr, res_out_ptr, s_rt, s_rot, first_block,
                          W_KMAJOR, M_PAD, BLOCK_N, BLOCK_K, INTERPRET, NORM, HAS_RES, False)
    else:
        acc_up = acc
    if SPLIT == 1:
        if NORM == 2:  # this program summed the whole row
            scale = _rstd(ss, K, eps)[:, None]
            acc = acc * scale
            acc_up = acc_up * scale
        _store(acc, acc_up, second, add_ptr, out_ptr, out2_ptr, b, n, n_ok, T, s_at, s_ab, s_ot, s_ob, s_o2t,
               EPI, EPI2, PAIR, M_PAD)
        stored = True
    else:
        t = tl.arange(0, M_PAD)
        plane = M_PAD * width
        cols = col0 + n
        part = part_ptr + (b * SPLIT + pid_k) * 2 * plane + t[:, None] * width + cols[None, :]
        tl.store(part, acc, mask=n_ok[None, :])
        if gated:
            tl.store(part + plane, acc_up, mask=n_ok[None, :])
        # NORM_POST: this row block's SPLIT sums of squares, after every partials plane
        ss_first = (part_ptr + tl.num_programs(2) * SPLIT * 2 * plane
                    + (b * tl.num_programs(0) + pid_n) * SPLIT * M_PAD + t)
        if NORM == 2:
            tl.store(ss_first + pid_k * M_PAD, ss)
        stored = last_arrival(count_ptr + b * tl.num_programs(0) + pid_n, SPLIT, INTERPRET)
        if stored:  # the last of the row block's splits reduces them, in split order
            first = part_ptr + b * SPLIT * 2 * plane + t[:, None] * width + cols[None, :]
            acc = tl.load(first, mask=n_ok[None, :], other=0.0, cache_modifier=".cg")
            for s in range(1, SPLIT):
                acc += tl.load(first + s * 2 * plane, mask=n_ok[None, :], other=0.0, cache_modifier=".cg")
            if gated:
                acc_up = tl.load(first + plane, mask=n_ok[None, :], other=0.0, cache_modifier=".cg")
                for s in range(1, SPLIT):
                    acc_up += tl.load(first + s * 2 * plane + plane, mask=n_ok[None, :], other=0.0,
                                      cache_modifier=".cg")
            else:
                acc_up = acc
            if NORM == 2:
                ss = tl.load(ss_first, cache_modifier=".cg")
                for s in range(1, SPLIT):
                    ss += tl.load(ss_first + s * M_PAD, cache_modifier=".cg")
                scale = _rstd(ss, K, eps)[:, None]
                acc = acc * scale
                acc_up = acc_up * scale
            _store(acc, acc_up, second, add_ptr, out_ptr, out2_ptr, b, n, n_ok, T, s_at, s_ab, s_ot, s_ob, s_o2t,
                   EPI, EPI2, PAIR, M_PAD)
    if ROUTE:  # this row block's output is stored (by this program): the routing tail
        if stored:
            if pid_n < NB1:
                _route_tail(out_ptr, s_ot, T, count_ptr + tl.num_programs(0), NB1, bias_ptr, topk_w_ptr,
                            topk_id_ptr, s_twt, s_tit, routed_scaling_factor, INTERPRET, PER_GROUP, N_GROUP,
                            TOPK_GROUP, TOP_K, G_PAD, PG_PAD, K_PAD, HAS_BIAS, RENORMALIZE)


# The CUDA-core form (gemv_fma_kernel). gemv_kernel pads the activation rows to a 16-row tensor-core tile and
# streams W through a shared-memory pipeline with split-K for wide K: right for the wide projections, but for a
# small matrix such as MLA's q_b (1536 x 1536 on a Kimi TP=8 rank) its split-K handshake and the pipeline's fill
# are most of the launch, and NORM_PRE reads the whole x row in every program before its first dot. Here each
# program holds a [BLOCK_N, LANES, VEC] tile of W in registers (BLOCK_N rows, LANES lanes along K with VEC
# contiguous weights a lane: 16-byte loads), keeps per-lane partial sums for each of its ROWS activation rows and
# reduces them across the lanes once at the end: no shared-memory staging, no split. A program serves ROWS <= 8
# rows of x (a grid axis covers the rest), each row with its own accumulators and the same code, so a token's
# products are bit-identical whatever T is (decode == verify; tests/kernels check it on the GPU for T = 1..16).
# The launch config must therefore not depend on T (kernels/gemv.py fma_config takes the matrix's shape only).
# LF puts the tile's axes in the order [LANES, BLOCK_N, VEC]: Triton then gives each thread one lane of every
# weight row, where [BLOCK_N, LANES, VEC] becomes 4 weight rows x 8 lanes a warp and a thread holds one weight row,
# so x's [LANES, VEC] tile goes through shared memory into that layout every K step and row and each thread widens
# the 32 x elements of its 4 lanes a row. LF also adds each product to its accumulator in turn (_fma8) where rows
# first sums a lane's 8 products before adding them. The two forms sum in different orders (other bits), each the
# same at every ROWS (tests/kernels/compile_checks.py checks the reductions' layouts).


@triton.jit
def _lanes_x(x_ptr, row, T, k, k_ok, s_xt, res, HAS_RES: tl.constexpr):
    """Row ``row`` of x at this K step's [LANES, VEC] offsets k (0 where masked): with HAS_RES the stream x +
    residual rounded to x's dtype (as torch's add rounds it); ``res``: (res_ptr, s_rt, ...) (see _lanes_dot)."""
    ok = k_ok & (row < T)
    xr = tl.load(x_ptr + row * s_xt + k, mask=ok, other=0.0)
    if HAS_RES:
        hr = tl.load(res[0] + row * res[1] + k, mask=ok, other=0.0)
        xr = (xr.to(tl.float32) + hr.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return xr


@triton.jit
def _lanes_rstd(x_ptr, row, T, K, s_xt, eps, kk, res, STEP: tl.constexpr, NSTEPS: tl.constexpr,
                HAS_RES: tl.constexpr):
    """NORM_PRE's 1 / sqrt(mean(x[row]^2) + eps) (x: the stream of _lanes_x), the squares summed in the lanes'
    [LANES, VEC] layout."""
    ss = tl.zeros(kk.shape, tl.float32)
    for i in tl.static_range(NSTEPS):
        k = i * STEP + kk
        x = _lanes_x(x_ptr, row, T, k, k < K, s_xt, res, HAS_RES).to(tl.float32)
        ss += x * x
    return _rstd(tl.sum(tl.sum(ss, axis=1), axis=0), K, eps)


@triton.jit
def _lanes_rstd4(x_ptr, t, T, K, s_xt, eps, kk, res, STEP: tl.constexpr, NSTEPS: tl.constexpr, R: tl.constexpr,
                 HAS_RES: tl.constexpr = False):
    """_lanes_rstd of rows t .. t + R - 1 (R = 1, 2 or 4; 1.0 for the rest)."""
    r0 = _lanes_rstd(x_ptr, t, T, K, s_xt, eps, kk, res, STEP, NSTEPS, HAS_RES)
    r1 = 1.0
    r2 = 1.0
    r3 = 1.0
    if R > 1:
        r1 = _lanes_rstd(x_ptr, t + 1, T, K, s_xt, eps, kk, res, STEP, NSTEPS, HAS_RES)
    if R > 2:
        r2 = _lanes_rstd(x_ptr, t + 2, T, K, s_xt, eps, kk, res, STEP, NSTEPS, HAS_RES)
        r3 = _lanes_rstd(x_ptr, t + 3, T, K, s_xt, eps, kk, res, STEP, NSTEPS, HAS_RES)
    return r0, r1, r2, r3


@triton.jit
def _by_row(v, LF: tl.constexpr):
    """A program's [BLOCK_N] weight-row vector shaped to broadcast over its weight tile ([LANES, BLOCK_N, VEC] with
    LF, else [BLOCK_N, LANES, VEC])."""
    if LF:
        r = v[None, :, None]
    else:
        r = v[:, None, None]
    return r


@triton.jit
def _by_lane(v, LF: tl.constexpr):
    """A [LANES, VEC] tile (K offsets, their mask) shaped to broadcast over the weight tile (see _by_row)."""
    if LF:
        r = v[:, None, :]
    else:
        r = v[None, :, :]
    return r


@triton.jit
def _across_lanes(acc, LF: tl.constexpr):
    """Per-lane sums ([LANES, BLOCK_N] with LF, else [BLOCK_N, LANES]) reduced across the lanes: [BLOCK_N]."""
    if LF:
        r = tl.sum(acc, axis=0)
    else:
        r = tl.sum(acc, axis=1)
    return r


@triton.jit
def _halves(v):
    """v [..., 2m] -> (v[..., 0::2], v[..., 1::2]), each [..., m] (register moves where the last axis is a thread's)."""
    return tl.split(tl.reshape(v, v.shape[:-1] + [v.shape[-1] // 2, 2]))


@triton.jit
def _fma8(acc, w, x):
    """acc + w[:, :, 0] x[:, 0] + ... + w[:, :, 7] x[:, 7] (acc [LANES, BLOCK_N], w [LANES, BLOCK_N, 8], x
    [LANES, 8]), the products added to acc one at a time in that order: one FFMA each."""
    tl.static_assert(w.shape[2] == 8 and x.shape[1] == 8, "lanes first takes VEC = 8 weights a lane")
    w0246, w1357 = _halves(w)
    x0246, x1357 = _halves(x)
    w04, w26 = _halves(w0246)
    w15, w37 = _halves(w1357)
    x04, x26 = _halves(x0246)
    x15, x37 = _halves(x1357)
    w0, w4 = _halves(w04)
    w2, w6 = _halves(w26)
    w1, w5 = _halves(w15)
    w3, w7 = _halves(w37)
    x0, x4 = _halves(x04)
    x2, x6 = _halves(x26)
    x1, x5 = _halves(x15)
    x3, x7 = _halves(x37)
    acc = acc + tl.reshape(w0, acc.shape) * x0
    acc = acc + tl.reshape(w1, acc.shape) * x1
    acc = acc + tl.reshape(w2, acc.shape) * x2
    acc = acc + tl.reshape(w3, acc.shape) * x3
    acc = acc + tl.reshape(w4, acc.shape) * x4
    acc = acc + tl.reshape(w5, acc.shape) * x5
    acc = acc + tl.reshape(w6, acc.shape) * x6
    acc = acc + tl.reshape(w7, acc.shape) * x7
    return acc


@triton.jit
def _lanes_dot(acc, w, x_ptr, row, T, k, k_ok, s_xt, rstd, nw, res, NORM: tl.constexpr, HAS_RES: tl.constexpr,
               LF: tl.constexpr):
    """acc plus the per-lane products of W's tile (see _by_row) with row ``row`` of x over this K step (with NORM,
    x * rstd * the norm weight rounded to x's dtype first, as the RMSNorm kernel stores it; with HAS_RES, x is
    the stream x + residual of _lanes_x, stored as the new residual where ``res`` = (res_ptr, s_rt, res_out_ptr,
    s_rot, store_res) says so). Rows first: a lane's 8 products summed, then added; lanes first (VEC = 8): each
    product added to acc in turn (_fma8: no FMUL and no FADD a step and row, the accumulator in the FFMA chain)."""
    xr = _lanes_x(x_ptr, row, T, k, k_ok, s_xt, res, HAS_RES)  # [LANES, VEC]
    if HAS_RES:
        tl.store(res[2] + row * res[3] + k, xr, mask=k_ok & (row < T) & res[4])
    if NORM:
        xr = (xr.to(tl.float32) * rstd * nw).to(x_ptr.dtype.element_ty)
    if LF:
        r = _fma8(acc, w, xr.to(tl.float32))
    else:
        r = acc + tl.sum(w * xr.to(tl.float32)[None, :, :], axis=2)
    return r


@triton.jit
def _lanes_dot4(a0, a1, a2, a3, w, x_ptr, t, T, k, k_ok, s_xt, r0, r1, r2, r3, nw, res, NORM: tl.constexpr,
                HAS_RES: tl.constexpr, R: tl.constexpr, LF: tl.constexpr):
    """_lanes_dot for the accumulators of rows t .. t + R - 1 (R = 1, 2 or 4)."""
    a0 = _lanes_dot(a0, w, x_ptr, t, T, k, k_ok, s_xt, r0, nw, res, NORM, HAS_RES, LF)
    if R > 1:
        a1 = _lanes_dot(a1, w, x_ptr, t + 1, T, k, k_ok, s_xt, r1, nw, res, NORM, HAS_RES, LF)
    if R > 2:
        a2 = _lanes_dot(a2, w, x_ptr, t + 2, T, k, k_ok, s_xt, r2, nw, res, NORM, HAS_RES, LF)
        a3 = _lanes_dot(a3, w, x_ptr, t + 3, T, k, k_ok, s_xt, r3, nw, res, NORM, HAS_RES, LF)
    return a0, a1, a2, a3


@triton.jit
def _lanes_sums(w, w_rows, n_ok, kk, x_ptr, t0, T, K, s_xt, nw_ptr, r0, r1, r2, r3, r4, r5, r6, r7, res,
                NORM: tl.constexpr, HAS_RES: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                LANES: tl.constexpr, STEP: tl.constexpr, NSTEPS: tl.constexpr, LF: tl.constexpr):
    """The CUDA-core forms' K loop: per-lane sums of the program's weight rows (w_rows pointers and n_ok their
    mask, shaped by _by_row; w the first step's tile, loaded by the caller before its PDL wait) with rows
    t0 .. t0 + ROWS - 1 of x (with NORM: normed by rstd r_i and the norm weight at nw_ptr; with HAS_RES: the
    stream x + residual, ``res`` as _lanes_dot takes it), unrolled over NSTEPS steps of STEP weights a row. Eight
    accumulators, those past ROWS unused."""
    R0: tl.constexpr = ROWS if ROWS < 4 else 4
    if LF:
        a0 = tl.zeros([LANES, BLOCK_N], tl.float32)
    else:
        a0 = tl.zeros([BLOCK_N, LANES], tl.float32)
    a1, a2, a3, a4, a5, a6, a7 = a0, a0, a0, a0, a0, a0, a0
    for i in tl.static_range(NSTEPS):
        k = i * STEP + kk
        k_ok = k < K
        if i > 0:
            w = tl.load(w_rows + _by_lane(k, LF), mask=n_ok & _by_lane(k_ok, LF), other=0.0).to(tl.float32)
        nw = 1.0
        if NORM:
            nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        a0, a1, a2, a3 = _lanes_dot4(a0, a1, a2, a3, w, x_ptr, t0, T, k, k_ok, s_xt, r0, r1, r2, r3, nw, res, NORM,
                                     HAS_RES, R0, LF)
        if ROWS > 4:
            a4, a5, a6, a7 = _lanes_dot4(a4, a5, a6, a7, w, x_ptr, t0 + 4, T, k, k_ok, s_xt, r4, r5, r6, r7, nw, res,
                                         NORM, HAS_RES, 4, LF)
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _lanes_store4(out_ptr, t, T, s_ot, n, N, a0, a1, a2, a3, R: tl.constexpr, LF: tl.constexpr):
    """Each row's per-lane sums reduced across the lanes and stored (rows t .. t + R - 1, those below T)."""
    _lanes_store4_at(out_ptr + n, n < N, t, T, s_ot, a0, a1, a2, a3, R, LF)


@triton.jit
def _lanes_store4_at(ptrs, ok, t, T, s_ot, a0, a1, a2, a3, R: tl.constexpr, LF: tl.constexpr):
    """_lanes_store4 at row 0's [BLOCK_N] output pointers ``ptrs`` (masked by ``ok``), row t's s_ot * t further."""
    ty = ptrs.dtype.element_ty
    tl.store(ptrs + t * s_ot, _across_lanes(a0, LF).to(ty), mask=ok & (t < T))
    if R > 1:
        tl.store(ptrs + (t + 1) * s_ot, _across_lanes(a1, LF).to(ty), mask=ok & (t + 1 < T))
    if R > 2:
        tl.store(ptrs + (t + 2) * s_ot, _across_lanes(a2, LF).to(ty), mask=ok & (t + 2 < T))
        tl.store(ptrs + (t + 3) * s_ot, _across_lanes(a3, LF).to(ty), mask=ok & (t + 3 < T))


@triton.jit
def _block_and_rows(ROWS: tl.constexpr, GROUPS_INNER: tl.constexpr):
    """(weight block, first row of x) of this program. Past ROWS rows of x a weight block has several programs, one
    a row group, reading the same weights. GROUPS_INNER: grid axis 0 holds the row groups and axis 1 the blocks, so
    a block's programs are adjacent in the order the GPU starts them and the later ones find the weights in L2
    while the first still streams them; else axis 0 holds the blocks and axis 1 the row groups, and a second
    group's programs start only once the first group's have filled the SMs (past one wave: after they finish, the
    weights partly gone from L2). At T <= ROWS both orders are the same one. (The axes, not a 1-D grid split by a
    division: a division by the runtime group count put a stack frame in the sm_120 build.)"""
    if GROUPS_INNER:
        blk = tl.program_id(1)
        t0 = tl.program_id(0) * ROWS
    else:
        blk = tl.program_id(0)
        t0 = tl.program_id(1) * ROWS
    return blk, t0


@triton.jit
def gemv_fma_kernel(x_ptr, w_ptr, out_ptr, nw_ptr, T, N, K, s_xt, s_wn, s_ot, s_xb, s_wb, s_ob, eps,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                    NSTEPS: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr = False, HEADS: tl.constexpr = False,
                    LF: tl.constexpr = False, GROUPS_INNER: tl.constexpr = False):
    """out[t, (b,) n] = sum_k x'[t, (b,) k] W[(b,) n, k] on the CUDA cores (x' = x, or with NORM its RMSNorm by nw
    and eps) for BLOCK_N rows n of head b = program_id(2) (with HEADS; strides s_xb, s_wb, s_ob) and rows
    t0 .. t0 + ROWS - 1 of x a program (ROWS = 1, 2, 4 or 8; the program's weight block and row group from
    _block_and_rows); W K-contiguous, NSTEPS = cdiv(K, LANES * VEC) steps (unrolled) of LANES x VEC weights a row;
    LF: the weight tile's axes in the order [LANES, BLOCK_N, VEC] (see the note above)."""
    STEP: tl.constexpr = LANES * VEC
    R0: tl.constexpr = ROWS if ROWS < 4 else 4  # rows of the first four accumulators
    if HEADS:  # (a constexpr, so that one head's launches compile to the code they had before heads existed)
        b = tl.program_id(2).to(tl.int64)
        x_ptr += b * s_xb
        w_ptr += b * s_wb
        out_ptr += b * s_ob
    blk, t0 = _block_and_rows(ROWS, GROUPS_INNER)
    n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :]  # [LANES, VEC]: lane l's weights
    n_ok = _by_row(n < N, LF)
    w_rows = w_ptr + _by_row(n.to(tl.int64) * s_wn, LF)
    w = tl.load(w_rows + _by_lane(kk, LF), mask=n_ok & _by_lane(kk < K, LF), other=0.0).to(tl.float32)
    if PDL:  # the first tile above needs no wait: weights are never written
        gdc_wait()
        gdc_launch_dependents()
    r0, r1, r2, r3 = 1.0, 1.0, 1.0, 1.0
    r4, r5, r6, r7 = 1.0, 1.0, 1.0, 1.0
    res = (x_ptr, 0, out_ptr, 0, False)  # (no residual here)
    if NORM:
        r0, r1, r2, r3 = _lanes_rstd4(x_ptr, t0, T, K, s_xt, eps, kk, res, STEP, NSTEPS, R0)
        if ROWS > 4:
            r4, r5, r6, r7 = _lanes_rstd4(x_ptr, t0 + 4, T, K, s_xt, eps, kk, res, STEP, NSTEPS, 4)
    a0, a1, a2, a3, a4, a5, a6, a7 = _lanes_sums(w, w_rows, n_ok, kk, x_ptr, t0, T, K, s_xt, nw_ptr,
                                                 r0, r1, r2, r3, r4, r5, r6, r7, res, NORM, False, ROWS, BLOCK_N,
                                                 LANES, STEP, NSTEPS, LF)
    _lanes_store4(out_ptr, t0, T, s_ot, n, N, a0, a1, a2, a3, R0, LF)
    if ROWS > 4:
        _lanes_store4(out_ptr, t0 + 4, T, s_ot, n, N, a4, a5, a6, a7, 4, LF)


@triton.jit
def _lanes_pair_store4(out_ptr, out2_ptr, second, t, T, s_ot, s_o2t, n, N, j, N2, a0, a1, a2, a3,
                       HALF: tl.constexpr, R: tl.constexpr, LF: tl.constexpr):
    """gemv_fma_pair_kernel's stores of rows t .. t + R - 1: a W1 program's sums to out (its dtype), a gated
    program's SiLU(gate) * up to out2 (_gated_row). (Each branch sums across the lanes itself: done once before
    the branch, the sums of all rows stay live at once and a program takes more registers: 185 against 110 a
    thread at 4 rows, one block a SM where the grid needs two.)"""
    if second:
        _gated_row(out2_ptr, t, T, s_o2t, j, N2, _across_lanes(a0, LF), HALF)
        if R > 1:
            _gated_row(out2_ptr, t + 1, T, s_o2t, j, N2, _across_lanes(a1, LF), HALF)
        if R > 2:
            _gated_row(out2_ptr, t + 2, T, s_o2t, j, N2, _across_lanes(a2, LF), HALF)
            _gated_row(out2_ptr, t + 3, T, s_o2t, j, N2, _across_lanes(a3, LF), HALF)
    else:
        _lanes_store4(out_ptr, t, T, s_ot, n, N, a0, a1, a2, a3, R, LF)


@triton.jit
def _gated_row(out2_ptr, t, T, s_o2t, j, N2, sums, HALF: tl.constexpr):
    """One row of a gated program: sums [BLOCK_N] holds gate row j0 + i at 2i and up row j0 + i at 2i + 1; split
    into the two halves and rounded as the tensor-core kernel's _epilogue rounds (each product to the output
    dtype, SiLU in fp32 rounded, then the product of the two)."""
    ty = out2_ptr.dtype.element_ty
    g, u = tl.split(tl.reshape(sums, [HALF, 2]))
    g = g.to(ty).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
    y = (s * u.to(ty).to(tl.float32)).to(ty)
    tl.store(out2_ptr + t * s_o2t + j, y, mask=(j < N2) & (t < T))


@triton.jit
def gemv_fma_pair_kernel(x_ptr, w1_ptr, w2_ptr, w2_up_ptr, out_ptr, out2_ptr, T, N, N2, NB1, K, s_xt, s_w1n, s_w2n,
                         s_ot, s_o2t, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, LANES: tl.constexpr,
                         VEC: tl.constexpr, NSTEPS: tl.constexpr, PDL: tl.constexpr = False, LF: tl.constexpr = False,
                         GATED: tl.constexpr = True, GROUPS_INNER: tl.constexpr = False, NORM: tl.constexpr = 0,
                         HAS_RES: tl.constexpr = False, nw_ptr=None, res_ptr=None, res_out_ptr=None, s_rt=0, s_rot=0,
                         eps=0.0):
    """gemv_fma_kernel's form for a pair launch of one x: weight blocks (_block_and_rows) 0 .. NB1 - 1 take BLOCK_N
    rows of W1 [N, K] into out [T, N] (its dtype: float32 router logits for a MoE layer's router). With GATED (the
    router's shared expert gate/up), block NB1 + p takes gate rows and up rows j = p * HALF .. + HALF - 1 of W2 /
    W2_up [N2, K], interleaved (row 2i gate j0 + i, row 2i + 1 up j0 + i), and stores SiLU(x W2^T) * (x W2_up^T)
    into out2 [T, N2] (its dtype): the gate and up rows of one activation share a program. Without it (MLA's q_a and
    kv_a), block NB1 + p takes BLOCK_N rows of W2 into out2 as the first blocks do (w2_up_ptr unused). Each weight
    row's sums are gemv_fma_kernel's (the same lanes, steps and order), so a token's products do not depend on T
    either.

    NORM (plain pairs only: a decoder layer's input RMSNorm before q_a and kv_a, NORM_PRE as gemv_fma_kernel's):
    the products are of the RMSNorm by nw_ptr [K] and eps of the stream x (with HAS_RES, x + res rounded to x's
    dtype; block 0 of each row group stores it to res_out). Every program first reads its rows of the stream
    whole for their rstd (from L2: the previous launch just wrote them), then normalises them as the RMSNorm
    kernel does (bf16(x rstd g)) on the way into the products. (Summing the squares in the product loop and
    scaling the sums after, the tensor-core kernel's NORM_POST, was built first: the rstd's cross-warp sum at
    the end kept 164-255 registers live where the plain pair takes 58-96, spilling at 2 and 4 rows.)"""
    tl.static_assert(NORM == 0 or (NORM == 1 and not GATED), "the CUDA-core pair folds a norm into plain pairs")
    HALF: tl.constexpr = BLOCK_N // 2
    STEP: tl.constexpr = LANES * VEC
    R0: tl.constexpr = ROWS if ROWS < 4 else 4
    pid, t0 = _block_and_rows(ROWS, GROUPS_INNER)
    second = pid >= NB1
    r = tl.arange(0, BLOCK_N)
    n = pid * BLOCK_N + r  # W1's rows (first programs)
    j = (pid - NB1) * HALF + tl.arange(0, HALF)  # the activations a gated program stores
    if GATED:
        jr = (pid - NB1) * HALF + r // 2  # W2 / W2_up row of each of its BLOCK_N rows
        w2_rows = tl.where(r % 2 == 0, w2_ptr, w2_up_ptr) + jr.to(tl.int64) * s_w2n
    else:
        jr = (pid - NB1) * BLOCK_N + r
        w2_rows = w2_ptr + jr.to(tl.int64) * s_w2n
    row_ok = tl.where(second, jr < N2, n < N)
    w_rows = _by_row(tl.where(second, w2_rows, w1_ptr + n.to(tl.int64) * s_w1n), LF)
    kk = tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :]  # [LANES, VEC]: lane l's weights
    n_ok = _by_row(row_ok, LF)
    w = tl.load(w_rows + _by_lane(kk, LF), mask=n_ok & _by_lane(kk < K, LF), other=0.0).to(tl.float32)
    if PDL:  # the first tile above needs no wait: weights are never written
        gdc_wait()
        gdc_launch_dependents()
    res = (res_ptr, s_rt, res_out_ptr, s_rot, pid == 0)
    r0, r1, r2, r3 = 1.0, 1.0, 1.0, 1.0
    r4, r5, r6, r7 = 1.0, 1.0, 1.0, 1.0
    if NORM:
        r0, r1, r2, r3 = _lanes_rstd4(x_ptr, t0, T, K, s_xt, eps, kk, res, STEP, NSTEPS, R0, HAS_RES)
        if ROWS > 4:
            r4, r5, r6, r7 = _lanes_rstd4(x_ptr, t0 + 4, T, K, s_xt, eps, kk, res, STEP, NSTEPS, 4, HAS_RES)
    a0, a1, a2, a3, a4, a5, a6, a7 = _lanes_sums(w, w_rows, n_ok, kk, x_ptr, t0, T, K, s_xt, nw_ptr,
                                                 r0, r1, r2, r3, r4, r5, r6, r7, res, NORM, HAS_RES, ROWS, BLOCK_N,
                                                 LANES, STEP, NSTEPS, LF)
    if GATED:
        _lanes_pair_store4(out_ptr, out2_ptr, second, t0, T, s_ot, s_o2t, n, N, j, N2, a0, a1, a2, a3, HALF, R0,
                           LF)
        if ROWS > 4:
            _lanes_pair_store4(out_ptr, out2_ptr, second, t0 + 4, T, s_ot, s_o2t, n, N, j, N2, a4, a5, a6, a7, HALF,
                               4, LF)
    else:  # one store path for both matrices (their outputs share a dtype): a branch each kept more registers live
        ptrs = tl.where(second, out2_ptr + jr, out_ptr + n)
        s_t = tl.where(second, s_o2t, s_ot)
        _lanes_store4_at(ptrs, row_ok, t0, T, s_t, a0, a1, a2, a3, R0, LF)
        if ROWS > 4:
            _lanes_store4_at(ptrs, row_ok, t0 + 4, T, s_t, a4, a5, a6, a7, 4, LF)
