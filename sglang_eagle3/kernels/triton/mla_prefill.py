"""MLA's keys and values decompressed from the paged latent cache, for prefill in the non-absorbed (MHA) form.

The absorbed form (mla_attention.py) scores every query head against the 512-wide latent and the 64-wide rope
key: ~1088 multiply-adds a (query, head, key). For decode and verify that is right (the cache is read once and
nothing is written), but a prefill chunk of T tokens pays it T times over the whole context. Decompressed once,
each head's key is 128 + 64 wide and its value 128: ~320 multiply-adds a (query, head, key), plus one
[keys, 512] x [512, heads * 256] GEMM that every query of the chunk shares. From a few dozen tokens a request
on, that is the cheaper form (SGLang runs DeepSeek's prefill the same way).

mla_decompress_kernel writes, for every key of every request (the page table's slots up to seq_len), per head
[k_nope (D) | k_rope (DR) | v (D)] into a scratch indexed by cache slot, so the split attention kernel reads it
through the same page table as the cache: GROUPS = heads kv heads of one query head each, separate values.
The grid is sized from the page table's capacity and the SM count (graph-safe), and its programs stride over the
key tiles the request has: a grid of one program a capacity tile (2048 tiles at a 128k table) cost ~35 us of
programs exiting at once, which a fresh short prompt's whole MLA (~25 us absorbed) cannot carry.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def mla_decompress_kernel(
    kv_ptr, page_table_ptr, seq_lens_ptr, w_ptr, out_ptr,
    stride_kv_slot, stride_pt_req, stride_w_row, stride_out_slot, stride_out_head,
    DC: tl.constexpr, DR: tl.constexpr, D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid (request b, G, head x 2): program (b, g, 2h + part) computes, for key tiles g, g + G, ... of the
    request's keys, the [BLOCK_N, D] product of the tile's latents c [BLOCK_N, DC] with W_UK[h] (part 0) or W_UV[h]
    (part 1), w_ptr being kv_b_proj's weight [heads * 2D, DC] (per head D key rows, then D value rows), and stores
    it in the cache's dtype (fp32 accumulation) at out[slot, h, 0:D] (keys) or out[slot, h, D + DR:] (values);
    part 0 also copies the cached rope key to out[slot, h, D:D + DR]."""
    if PDL:  # see tuning.pdl: wait for the previous kernel (the latents' write), let the next one start
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    head = tl.program_id(2) // 2
    part = tl.program_id(2) % 2
    seq_len = tl.load(seq_lens_ptr + b)
    d = tl.arange(0, D)
    k_idx = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + ((2 * head + part) * D + d).to(tl.int64)[:, None] * stride_w_row  # [D, 1]: this program's
    col = tl.where(part == 0, 0, D + DR)  # where its product goes in a head's [k_nope | k_rope | v]
    for tile in range(tl.program_id(1), tl.cdiv(seq_len, BLOCK_N), tl.num_programs(1)):
        n0 = tile * BLOCK_N
        pos = n0 + tl.arange(0, BLOCK_N)
        key_ok = pos < seq_len
        page = tl.load(page_table_ptr + b * stride_pt_req + pos // PAGE_SIZE, mask=key_ok, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE  # [N]
        c_rows = kv_ptr + slot[:, None] * stride_kv_slot  # [N, 1]
        acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        for k0 in range(0, DC, BLOCK_K):
            c = tl.load(c_rows + (k0 + k_idx)[None, :], mask=key_ok[:, None], other=0.0)  # [N, K]
            w = tl.load(w_rows + (k0 + k_idx)[None, :])  # [D, K]
            if INTERPRET:  # the interpreter's bf16 dots are wrong (see tuning.interpreting)
                c = c.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(c, tl.trans(w), input_precision=DOT_PRECISION)
        out_rows = out_ptr + slot[:, None] * stride_out_slot + head * stride_out_head  # [N, 1]
        tl.store(out_rows + col + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=key_ok[:, None])
        if part == 0:
            dr = tl.arange(0, DR)
            k_rope = tl.load(c_rows + DC + dr[None, :], mask=key_ok[:, None], other=0.0)
            tl.store(out_rows + D + dr[None, :], k_rope, mask=key_ok[:, None])
