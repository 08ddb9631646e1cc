"""A chain of dependent decode GEMVs in ONE persistent launch: does overlapping the stages pay?

The decode step of a rank is a chain of ~14 dependent launches a layer, each a few microseconds of bytes plus
its own ramp-up and drain (docs/BENCHMARKS.md section 1: a kernel that only reads 1 MB costs 1.8 us in a graph,
30 MB 9.7 us, 75% of copy bandwidth). Programmatic dependent launch hides the launch itself, not the drain of a
stage's slowest program nor the ramp of the next stage's weight stream, although the weights, unlike the
activations, never depend on the previous stage.

Here a grid of about one program per SM walks S stages: y_s = x_s W_s^T. A program takes stage s's work items
(row block x K split) round robin; after its last item of stage s it arrives at stage s's counter with the
number it did, and before its first item of stage s+1 it waits until that counter holds every item of stage s
(only if stage s+1 reads stage s: WAIT[s+1]). What it may do before that wait (PRE):

  0  nothing;
  1  ask the L2 for the weight slabs of all its items of the stage (``prefetch.global.L2``);
  2  load its first item's first weight tile into registers.

A stage with SPLIT > 1 leaves fp32 partials [SPLIT, M_PAD, N]; the stage that reads them (X_PARTS = that
SPLIT) adds them in split order as it loads its x and rounds to the weights' dtype, which are the numbers of
the split GEMV's own reduction (gemv.py: the last program adds the partials in split order, then rounds).

Counters (int32 [S + 1], zero before the call): the last program to arrive at counter S, once it has finished
everything, sets all of them back to 0, so a CUDA graph replays as captured. Every program of the grid must be
resident at once (a program waits for others): the launcher sizes the grid to the SMs. Under the interpreter
programs run one after another, so it runs one program.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sglang_eagle3.kernels.triton.gemv import _prefetch_slab
from sglang_eagle3.kernels.triton.sync import fence_acq_rel, last_arrival


@triton.jit
def _arrive(count_ptr, n, INTERPRET: tl.constexpr):
    """Adds n to the counter after every thread's stores are visible GPU-wide (release); returns the old value."""
    if not INTERPRET:
        fence_acq_rel(tl.program_id(0))
    tl.debug_barrier()
    return tl.atomic_add(count_ptr, n, sem="acq_rel", scope="gpu")


@triton.jit
def _load_acquire(ptr):
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _wait_for(count_ptr, target, INTERPRET: tl.constexpr):
    """Spins until the counter reaches target (acquire loads: ~a program per SM polls one word, and atomics
    there would queue behind each other at the L2 and delay the arrivals they wait for)."""
    if INTERPRET:  # programs run one after another: the counter is final already
        seen = tl.atomic_add(count_ptr, 0)
    else:
        seen = _load_acquire(count_ptr)
        while seen < target:
            seen = _load_acquire(count_ptr)
    tl.debug_barrier()
    return seen


@triton.jit
def _x_tile(x_ptr, t, k, T, s_xt, x_plane, X_PARTS: tl.constexpr, DT: tl.constexpr):
    """x[t, k] for rows t < T (0 elsewhere) in dtype DT: a tensor's rows, or the sum of X_PARTS fp32 planes."""
    ok = (t[:, None] < T) & (k[None, :] >= 0)
    offs = t[:, None] * s_xt + k[None, :]
    if X_PARTS == 0:
        xt = tl.load(x_ptr + offs, mask=ok, other=0.0, cache_modifier=".cg").to(DT)
    else:
        acc = tl.load(x_ptr + offs, mask=ok, other=0.0, cache_modifier=".cg")
        for p in tl.static_range(1, X_PARTS):
            acc += tl.load(x_ptr + p * x_plane + offs, mask=ok, other=0.0, cache_modifier=".cg")
        xt = acc.to(DT)
    return xt


@triton.jit
def _dot(xt, w, INTERPRET: tl.constexpr):
    if INTERPRET:  # the interpreter's half-precision dot is wrong: fp32 there
        return tl.dot(xt.to(tl.float32), w.to(tl.float32))
    return tl.dot(xt, w)


@triton.jit
def _stage(x_ptr, w_ptr, out_ptr, part_ptr, rb_count_ptr, s_xt, x_plane, s_w, N, K, kps, count_ptr, prev_items,
           pid, G, T, X_PARTS: tl.constexpr, SPLIT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           WAIT: tl.constexpr, M_PAD: tl.constexpr, PRE: tl.constexpr, REDUCE: tl.constexpr,
           INTERPRET: tl.constexpr):
    """This program's items of one stage (see gemv_chain_kernel), then its arrival at the stage's counter.
    WAIT: 0 start at once, 1 wait for the previous stage's counter, 2 wait for the previous kernel (PDL)."""
    DT = w_ptr.dtype.element_ty
    t = tl.arange(0, M_PAD)
    blocks = tl.cdiv(N, BN)
    items = blocks * SPLIT
    # What a program may do before the previous stage is complete: touch weights, never activations.
    n0 = (pid % blocks) * BN + tl.arange(0, BN)
    k0 = (pid // blocks) * kps + tl.arange(0, BK)
    if PRE == 2 and WAIT > 0:  # its first item's first tile, into registers
        w_first = tl.load(w_ptr + n0[None, :] * s_w + k0[:, None],
                          mask=(n0 < N)[None, :] & (k0 < K)[:, None] & (pid < items), other=0.0)
    else:
        w_first = tl.zeros([BK, BN], dtype=DT)
    if WAIT > 0:
        if PRE == 1 and not INTERPRET:  # its items' slabs, into the L2 (no inline asm when interpreting)
            for it in range(pid, items, G):
                pn = it % blocks
                n = pn * BN + tl.arange(0, BN)
                k_lo = (it // blocks) * kps
                _prefetch_slab(w_ptr, 0, pn, n, n < N, k_lo, tl.minimum(k_lo + kps, K), 0, s_w, 1, True, BN)
        if WAIT == 2:  # the kernel before this launch (programmatic dependent launch)
            gdc_wait()
            gdc_launch_dependents()
        elif pid < items:
            _wait_for(count_ptr - 1, prev_items, INTERPRET)
    # One flat loop over this program's (item, K tile) pairs, so the software pipeline runs across its items
    # instead of draining and refilling at each (a stage gives a program only a few short items). Every item
    # takes TILES = kps / BK tiles; the tiles of the last split past K are masked (zeros).
    TILES = tl.cdiv(kps, BK)
    mine = tl.cdiv(tl.maximum(items - pid, 0), G)
    acc = tl.zeros([M_PAD, BN], dtype=tl.float32)
    for j in range(0, mine * TILES):
        it = pid + (j // TILES) * G
        kt = j % TILES
        pn = it % blocks
        pk = it // blocks
        n = pn * BN + tl.arange(0, BN)
        n_ok = n < N
        k_hi = tl.minimum(pk * kps + kps, K)
        k = pk * kps + kt * BK + tl.arange(0, BK)
        k_ok = k < k_hi
        xt = _x_tile(x_ptr, t, k, T, s_xt, x_plane, X_PARTS, DT)
        xt = tl.where(k_ok[None, :], xt, 0.0).to(DT)
        if PRE == 2 and WAIT > 0:  # the first tile was loaded before the wait
            w = tl.load(w_ptr + n[None, :] * s_w + k[:, None], mask=n_ok[None, :] & k_ok[:, None] & (j > 0),
                        other=0.0)
            w = tl.where(j == 0, w_first, w)
        else:
            w = tl.load(w_ptr + n[None, :] * s_w + k[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        acc += _dot(xt, w, INTERPRET)
        if kt == TILES - 1:
            ok = (t[:, None] < T) & n_ok[None, :]
            if SPLIT == 1:
                tl.store(out_ptr + t[:, None] * N + n[None, :], acc.to(DT), mask=ok)
            elif REDUCE:  # the row block's last split adds the partials in split order and stores the output
                tl.store(part_ptr + (pk * M_PAD + t[:, None]) * N + n[None, :], acc, mask=ok)
                if last_arrival(rb_count_ptr + pn, SPLIT, INTERPRET):
                    red = tl.load(part_ptr + t[:, None] * N + n[None, :], mask=ok, other=0.0, cache_modifier=".cg")
                    for p in tl.static_range(1, SPLIT):
                        red += tl.load(part_ptr + (p * M_PAD + t[:, None]) * N + n[None, :], mask=ok, other=0.0,
                                       cache_modifier=".cg")
                    tl.store(out_ptr + t[:, None] * N + n[None, :], red.to(DT), mask=ok)
            else:  # the partials are the output: the stages that read it add them
                tl.store(out_ptr + (pk * M_PAD + t[:, None]) * N + n[None, :], acc, mask=ok)
            acc = tl.zeros([M_PAD, BN], dtype=tl.float32)
    if mine > 0:
        _arrive(count_ptr, mine, INTERPRET)


@triton.jit
def gemv_chain_kernel(xs, ws, outs, parts, s_xts, x_planes, s_ws, Ns, Ks, KPSs, rb_offs, count_ptr, T,
                      S: tl.constexpr, X_PARTS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, WAIT: tl.constexpr, M_PAD: tl.constexpr, PRE: tl.constexpr,
                      INTERPRET: tl.constexpr, PDL: tl.constexpr = False, REDUCE: tl.constexpr = False):
    """Stage s (tuples indexed by s): x xs[s] ([T, K] rows of stride s_xts[s], or X_PARTS[s] fp32 planes
    x_planes[s] apart), W ws[s] [N, K] K-contiguous with row stride s_ws[s], out outs[s] ([T, N] in W's dtype
    with SPLIT[s] == 1 or REDUCE, else fp32 partials [SPLIT, M_PAD, N]); K split in KPSs[s]-wide ranges. REDUCE:
    a split stage stores its partials in parts[s] and the last split of each row block (its counter at
    count_ptr + rb_offs[s] + row block, after the S + 1 stage counters) reduces them into outs[s]. With PDL the
    launch may start while the previous kernel runs: stage 0 waits for it (its weights may be touched first)."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    for s in tl.static_range(S):
        if s == 0:
            prev_items = 0
        else:
            prev_items = tl.cdiv(Ns[s - 1], BLOCK_N[s - 1]) * SPLIT[s - 1]
        _stage(xs[s], ws[s], outs[s], parts[s], count_ptr + rb_offs[s], s_xts[s], x_planes[s], s_ws[s], Ns[s],
               Ks[s], KPSs[s], count_ptr + s, prev_items, pid, G, T, X_PARTS[s], SPLIT[s], BLOCK_N[s], BLOCK_K[s],
               (2 if PDL else 0) if s == 0 else (1 if WAIT[s] else 0), M_PAD, PRE, REDUCE, INTERPRET)
    # Every program is past all of its waits: the last one to get here resets the counters for the next call.
    last = _arrive(count_ptr + S, 1, INTERPRET) == G - 1
    if last:
        for s in tl.static_range(S + 1):
            tl.store(count_ptr + s, 0)
