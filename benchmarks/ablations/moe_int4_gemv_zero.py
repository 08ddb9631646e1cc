"""The INT4 GEMV MoE's two kernels without their work (timing only: the model's numbers are wrong with them):
gate_up only waits (it stores nothing: the down stand-in reads no act), and down stores the shared experts'
output it would have added (or zeros), loading no routing, weight or act. So both launches, their grids and
down's output stores stay, and the routed experts' weight streams (8 experts, ~24.8 MB at T=1) and arithmetic
are gone: ``bench_verify_graph.py --kernels-from benchmarks/ablations/moe_int4_gemv_zero.py`` prices them in the
step. NOTE: with no routed output the hidden states and so the next layers' routing change; at T = 1 a token
still reads 8 experts a layer in the real step, and here none."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def moe_int4_gemv_gate_up_kernel(
    x_ptr, w13_ptr, s13_ptr, ids_ptr, act_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    TK, I, H_WORDS, magic,
    TOP_K: tl.constexpr, TK_PAD: tl.constexpr, GROUP_WORDS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr = False,
    PER_PAIR: tl.constexpr = True, SHIFT16: tl.constexpr = False, F16: tl.constexpr = False,
    INTERPRET: tl.constexpr = False, ACT_F16: tl.constexpr = False, ROWS: tl.constexpr = 1,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def moe_int4_gemv_down_kernel(
    act_ptr, w2_ptr, s2_ptr, ids_ptr, topk_w_ptr, add_ptr, out_ptr,
    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_addt, stride_ot,
    H, magic,
    I_WORDS: tl.constexpr, TOP_K: tl.constexpr, GROUP_WORDS: tl.constexpr, HAS_ADD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr = False,
    PRELOAD: tl.constexpr = False, SHIFT16: tl.constexpr = False, F16: tl.constexpr = False,
    INTERPRET: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    n_offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n_offs < H
    if HAS_ADD:
        y = tl.load(add_ptr + t * stride_addt + n_offs, mask=n_ok, other=0.0)
    else:
        y = tl.zeros([BLOCK_N], dtype=tl.float32)
    tl.store(out_ptr + t * stride_ot + n_offs, y.to(out_ptr.dtype.element_ty), mask=n_ok)
