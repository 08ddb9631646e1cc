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
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sglang_eagle3.kernels.triton.sync import last_arrival

EPI_NONE, EPI_ADD, EPI_GATED = 0, 1, 2
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
def _row_rstd(x_ptr, b, T, K, s_xt, s_xb, eps, M_PAD: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x[t, b, :]^2) + eps) per row, fp32 [M_PAD] (the RMSNorm folded into this GEMV)."""
    t = tl.arange(0, M_PAD)
    ss = tl.zeros([M_PAD], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + t[:, None] * s_xt + b * s_xb + k[None, :], mask=(t[:, None] < T) & (k < K)[None, :],
                     other=0.0).to(tl.float32)
        ss += tl.sum(xt * xt, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _slab(x_ptr, w_ptr, b, n, n_ok, k_lo, k_hi, T, s_xt, s_xb, s_wb, s_wn, s_wk, rstd, nw_ptr,
          W_KMAJOR: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          INTERPRET: tl.constexpr, NORM: tl.constexpr):
    """fp32 [M_PAD, BLOCK_N]: sum over k in [k_lo, k_hi) of x[t, b, k] * W[b, n, k] (rows t >= T are 0).

    A tensor-core dot with the activation rows padded to 16: the arithmetic is free at these sizes, and the
    order of the sums is the same for every row whatever T is, so decode (T=1) and verify (T=k+1) compute
    bit-identical products for the same token."""
    t = tl.arange(0, M_PAD)
    acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_hi
        xt = tl.load(x_ptr + t[:, None] * s_xt + b * s_xb + k[None, :], mask=(t[:, None] < T) & k_ok[None, :],
                     other=0.0)
        if NORM:  # x * rstd * norm weight in fp32, rounded to x's dtype as the separate RMSNorm kernel stores it
            nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            xt = (xt.to(tl.float32) * rstd[:, None] * nw[None, :]).to(x_ptr.dtype.element_ty)
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
    return acc


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
def gemv_kernel(
    x_ptr, w_ptr, w_up_ptr, add_ptr, out_ptr, part_ptr, count_ptr, w2_ptr, out2_ptr,
    T, N, K, k_per_split, N2, NB1,
    s_xt, s_xb, s_wb, s_wn, s_wk, s_at, s_ab, s_ot, s_ob, s_w2n, s_o2t,
    W_KMAJOR: tl.constexpr, EPI: tl.constexpr, SPLIT: tl.constexpr, M_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr,
    PAIR: tl.constexpr = False, NORM: tl.constexpr = False, nw_ptr=None, eps=0.0,
    EPI2: tl.constexpr = 0, w2_up_ptr=None,
):
    """out[t, b, n] = epilogue(sum_k x[t, b, k] W[b, n, k]) over grid (N blocks, SPLIT, B).

    W[b, n, k] lives at w_ptr + b*s_wb + n*s_wn + k (W_KMAJOR) or + n + k*s_wk (N-contiguous, e.g. MLA's W_UK
    used as x @ W). part_ptr: fp32 [B, SPLIT, 2 (gate/up), M_PAD, N] scratch; count_ptr: int32 [B, N blocks],
    zero before the call and zero again after it.

    PAIR: a second K-contiguous matrix W2 [N2, K] read by the same launch from the same x (MLA's q_a and kv_a;
    the router and the shared expert's gate/up): the first NB1 row blocks are W's (epilogue EPI, none or
    gated), the rest W2's with epilogue EPI2 (none, or gated with W2_up [N2, K]) into out2 [T, N2], whose
    dtype may differ from out's (router logits float32, the shared expert's activation bf16). The partials
    plane is then N + N2 wide (W2's columns after W's). Only with B = 1.

    NORM: x is first RMS-normalised per row with weight nw_ptr [K] and eps (MLA's q_a_layernorm folded into
    q_b): every program computes the row's rstd itself (K <= a few thousand: a few KB from L2)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    b = tl.program_id(2)
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
    if PDL:  # stream the weights in while the previous kernel finishes, then wait for its outputs
        _prefetch_slab(w_e, b, pid_loc, n, n_ok, k_lo, k_hi, s_wb, s_wn_e, s_wk, W_KMAJOR, BLOCK_N)
        if gated:
            _prefetch_slab(w_up_e, b, pid_loc, n, n_ok, k_lo, k_hi, s_wb, s_wn_e, s_wk, W_KMAJOR, BLOCK_N)
        gdc_wait()
        gdc_launch_dependents()
    if NORM:
        rstd = _row_rstd(x_ptr, b, T, K, s_xt, s_xb, eps, M_PAD, BLOCK_K)
    else:
        rstd = tl.zeros([M_PAD], dtype=tl.float32)
    acc = _slab(x_ptr, w_e, b, n, n_ok, k_lo, k_hi, T, s_xt, s_xb, s_wb, s_wn_e, s_wk, rstd, nw_ptr,
                W_KMAJOR, M_PAD, BLOCK_N, BLOCK_K, INTERPRET, NORM)
    if gated:
        acc_up = _slab(x_ptr, w_up_e, b, n, n_ok, k_lo, k_hi, T, s_xt, s_xb, s_wb, s_wn_e, s_wk, rstd, nw_ptr,
                       W_KMAJOR, M_PAD, BLOCK_N, BLOCK_K, INTERPRET, NORM)
    else:
        acc_up = acc
    if SPLIT == 1:
        _store(acc, acc_up, second, add_ptr, out_ptr, out2_ptr, b, n, n_ok, T, s_at, s_ab, s_ot, s_ob, s_o2t,
               EPI, EPI2, PAIR, M_PAD)
    else:
        t = tl.arange(0, M_PAD)
        plane = M_PAD * width
        cols = col0 + n
        part = part_ptr + (b * SPLIT + pid_k) * 2 * plane + t[:, None] * width + cols[None, :]
        tl.store(part, acc, mask=n_ok[None, :])
        if gated:
            tl.store(part + plane, acc_up, mask=n_ok[None, :])
        if last_arrival(count_ptr + b * tl.num_programs(0) + pid_n, SPLIT, INTERPRET):  # reduce in split order
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
            _store(acc, acc_up, second, add_ptr, out_ptr, out2_ptr, b, n, n_ok, T, s_at, s_ab, s_ot, s_ob, s_o2t,
                   EPI, EPI2, PAIR, M_PAD)
