"""An mla_split_kv_kernel that stores zero partials (timing only: the model's numbers are wrong with it): after the
PDL wait each program reads seq_len (for its split's active flag, as the merge needs) and stores a zero partial
and log-sum-exp (or a zero output unsplit), loading no query, page or cache row, so the split pass's dependent
chain (seq_len -> page table -> key tile -> dots -> softmax -> store) is gone but its launch, grid and stores stay.
``bench_verify_graph.py --kernels-from benchmarks/ablations/mla_split_zero.py`` prices that chain in the step
(the merge still runs, over the zeros)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from benchmarks.ablations._fill import zeros as fill  # mla_split_noise.py compiles this kernel with another fill
from sglang_eagle3.kernels.triton.mla_attention import _split_keys


@triton.jit
def mla_split_kv_kernel(
    qn_ptr, qr_ptr, kv_ptr, page_table_ptr, seq_lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
    stride_qn_tok, stride_qn_head, stride_qr_tok, stride_qr_head, stride_kv_slot, stride_pt_req,
    stride_o_tok, stride_o_head, sm_scale_log2, NUM_SPLITS,
    T: tl.constexpr, H: tl.constexpr, DC: tl.constexpr, DR: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_KV: tl.constexpr, DOT_PRECISION: tl.constexpr,
    INTERPRET: tl.constexpr, PDL: tl.constexpr = False,
    ROPE: tl.constexpr = False, pos_ptr=None, cos_ptr=None, sin_ptr=None, stride_table=0,
    GROUPS: tl.constexpr = 1, stride_kv_group=0, SEPARATE_V: tl.constexpr = False, v_ptr=None, stride_v_slot=0,
    stride_v_group=0,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    mb_all = tl.program_id(1)
    split = tl.program_id(2)
    m_idx = tl.arange(0, BLOCK_M)
    rows = (mb_all % tl.cdiv(T * H, BLOCK_M)) * BLOCK_M + m_idx
    row_ok = rows < T * H
    dc = tl.arange(0, DC)
    cell = m_idx[:, None] * DC + dc[None, :]
    if SPLIT_KV:
        seq_len = tl.load(seq_lens_ptr + b)
        _, active = _split_keys(seq_len, NUM_SPLITS, BLOCK_N)  # the active splits, as the real kernel counts them
        live = row_ok & (split < active)
        part = (b * tl.num_programs(1) + mb_all) * NUM_SPLITS + split
        tl.store(mid_o_ptr + part * BLOCK_M * DC + cell, fill(part * BLOCK_M * DC + cell), mask=live[:, None])
        tl.store(mid_lse_ptr + part * BLOCK_M + m_idx, tl.zeros([BLOCK_M], dtype=tl.float32), mask=live)
    else:
        q_tok = b * T + rows // H
        head = (mb_all // tl.cdiv(T * H, BLOCK_M)) * H + rows % H
        tl.store(out_ptr + q_tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + dc[None, :],
                 fill(q_tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + dc[None, :]).to(
                     out_ptr.dtype.element_ty), mask=row_ok[:, None])
