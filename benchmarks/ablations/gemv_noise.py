"""The skinny GEMM's two kernels without their work (timing only: the model's numbers are wrong with them): after
the PDL wait, split 0 of each row block stores a pseudo-random tile (_fill.noise) into the rows and columns the real
kernel would write (out, or out2 for a pair's second matrix), loading no weight and no activation; the other splits
only wait, and no split-K handshake runs. So every dense projection's launch and grid stay (q_a + kv_a, q_b on the
CUDA cores, W_UK, W_UV, o_proj, router + shared gate/up, shared down, lm_head) and their weight streams go:
``bench_verify_graph.py --kernels-from benchmarks/ablations/gemv_noise.py`` prices the dense projections' work in
the step. Noise, not zeros: an all-zero stream runs the rest of the step faster (the thirty-first session). NOTE:
the router logits are noise too, so the routing changes (at T = 1 a token still reads 8 experts a layer)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from benchmarks.ablations._fill import noise as fill
from sglang_eagle3.kernels.triton.gemv import _block_and_rows


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
    pid_n = tl.program_id(0)
    b = tl.program_id(2)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    if tl.program_id(1) == 0:  # split 0 stores the row block; the other splits only wait
        t = tl.arange(0, M_PAD)
        t_ok = t < T
        if PAIR:
            if pid_n >= NB1:  # a row block of W2 into out2
                n = (pid_n - NB1) * BLOCK_N + tl.arange(0, BLOCK_N)
                cell = t[:, None] * s_o2t + n[None, :]
                tl.store(out2_ptr + cell, fill(cell + 7).to(out2_ptr.dtype.element_ty),
                         mask=t_ok[:, None] & (n < N2)[None, :])
            else:
                n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
                cell = t[:, None] * s_ot + n[None, :]
                tl.store(out_ptr + cell, fill(cell).to(out_ptr.dtype.element_ty), mask=t_ok[:, None] & (n < N)[None, :])
        else:  # side programs (ROUTE_SIDE / ROPE_SIDE: off by default) fall outside N and store nothing
            n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            cell = t[:, None] * s_ot + b * s_ob + n[None, :]
            tl.store(out_ptr + cell, fill(cell).to(out_ptr.dtype.element_ty), mask=t_ok[:, None] & (n < N)[None, :])


@triton.jit
def gemv_fma_kernel(x_ptr, w_ptr, out_ptr, nw_ptr, T, N, K, s_xt, s_wn, s_ot, s_xb, s_wb, s_ob, eps,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                    NSTEPS: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr = False, HEADS: tl.constexpr = False,
                    LF: tl.constexpr = False, GROUPS_INNER: tl.constexpr = False):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    blk, t0 = _block_and_rows(ROWS, GROUPS_INNER)
    n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    t = t0 + tl.arange(0, ROWS)
    cell = t[:, None] * s_ot + tl.program_id(2) * s_ob + n[None, :]
    tl.store(out_ptr + cell, fill(cell).to(out_ptr.dtype.element_ty), mask=(t < T)[:, None] & (n < N)[None, :])
