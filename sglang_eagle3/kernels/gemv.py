"""Launcher for the skinny GEMM of decode/verify projections; semantics in ref_gemv.

    out[t, (b,) n] = epilogue( sum_k x[t, (b,) k] * W[(b,) n, k] )      t < T <= GEMV_MAX_ROWS (16)

W may be any view with one unit stride (K-contiguous as checkpoints store linear weights, or N-contiguous:
MLA's W_UK used as ``q_nope @ W_UK`` is passed as ``w_uk.transpose(1, 2)``); the optional leading dim b
batches heads. Epilogues: none (output in ``out_dtype``, e.g. float32 router logits), ``add`` (a residual:
rounded as a separate add would be) or ``w_up`` (a gated MLP: SiLU(x W^T) * (x W_up^T), rounded as the
unfused torch ops are). One launch, grid fixed by shapes (graph-safe); split-K is reduced inside it.

An RMSNorm of x may ride in the launch (``norm_weight``, ``eps``): triton_gemv reads the whole row in every
program first (short rows: MLA's q_a_layernorm before q_b), triton_gemv_pair scales each row's product by
its rstd afterwards, from sums of squares taken over the K-slices the programs read anyway (the decoder
layer's 7168-wide input norm, with its residual add, before q_a and kv_a); see triton/gemv.py.

triton_gemv_pair can also route a MoE layer's tokens in its launch's tail (``route``: a Routing) from the
router logits it computes: the numbers of the moe_topk op on those logits, one launch fewer per MoE layer.
"""

from __future__ import annotations

import torch
import triton

from sglang_eagle3 import env
from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.moe_topk import Routing
from sglang_eagle3.kernels.rotary import rotary_args, triton_apply_rotary
from sglang_eagle3.kernels.triton.gemv import (
    EPI_ADD,
    EPI_GATED,
    EPI_NONE,
    NORM_NONE,
    NORM_POST,
    NORM_PRE,
    gemv_fma_kernel,
    gemv_fma_pair_kernel,
    gemv_kernel,
)

GEMV_MAX_ROWS = 16  # one tensor-core tile of rows: decode/verify at small batch; above, cuBLAS

# Which matrices take the CUDA-core form (fma_form): K-contiguous, no epilogue, at most FMA_MAX_WEIGHTS weights
# and FMA_MIN_K <= K <= FMA_MAX_K. On the H200 (benchmarks/bench_gemv_fma.py) it won on q_b (1536 x 1536: 2.4M)
# at T = 1 and 4 and lost at T = 4 on every wider Kimi projection (o_proj 7168 x 1024, 7.3M; q_a + kv_a 2112 x
# 7168); short K (the shared expert's down, K = 256) leaves most lanes idle. DeepSeek-V3's TP=8 q_b (3072 x 1536,
# 4.7M) falls inside the bound: not measured. K is capped because the kernel unrolls its K steps (K / 1024 of
# them with fma_config's 128 lanes).
FMA_MAX_WEIGHTS = 5 << 20
FMA_MIN_K = 1024
FMA_MAX_K = 8192
# Per-head products (x [T, B, K] @ w [B, N, K]^T) with K-contiguous weights take the CUDA-core form from this K:
# MLA's W_UV (8 heads x 128 x 512 on a Kimi TP=8 rank). W_UK is N-contiguous and keeps the tensor cores: a
# CUDA-core form with lanes along N was built (19dda76) and measured no faster at decode, 2.1% slower at verify of 4.
FMA_MIN_K_HEADS = 256

# NOTE: NORM_POST's elementwise math runs on the dot's operand layout, where every warp holds the whole
# [16, BLOCK_K] activation tile: in fp32 at BLOCK_K = 256 that is 128 registers a thread and the kernel spills
# (tests/kernels/compile_checks.py); at 128 it sits at 255. So K tiles of 64 (~110 registers), with twice the
# stages to keep about as many weight bytes in flight (a first guess: not yet swept on a GPU).
NORM_POST_LIMITS = {"max_block_k": 64, "max_stages": 8}

# Split-K arrival counters, one int32 per (head, row block) of a call, zero between calls (the last program of
# each row block resets its own). Launches on one stream run one after another, so every call shares one
# zeroed buffer per device; it is scratch, not state, and is allocated outside graph capture by the eager
# warm-up that precedes every capture. A buffer is never freed: captured graphs keep its address, so one
# outgrown by a larger call stays alive (16K counters cover every Kimi/DeepSeek shape: it does not grow there).
# Each family of kernels (``owner``) has a buffer of its own: kernels on the side stream may run beside others.
_COUNTERS: dict[tuple[torch.device, str], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []


def split_counters(device: torch.device, n: int, owner: str = "gemv") -> torch.Tensor:
    buf = _COUNTERS.get((device, owner))
    if buf is None or buf.numel() < n:
        if buf is not None:
            _OUTGROWN.append(buf)
        buf = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
        _COUNTERS[(device, owner)] = buf
    return buf


def gemv_config(N: int, K: int, B: int, k_major: bool, sms: int, mats: int = 1,
                smem_bytes: int = 96 << 10, acts: int = 1, max_block_k: int = 256, max_stages: int = 4,
                lean: bool | None = None) -> dict:
    """Launch config from the shape (chosen from the H200 sweeps of benchmarks/profile_step.py --sweep).

    Tiles of 32 K-contiguous rows x 256 (or 64 N-contiguous columns x 64); no split-K for slabs of <= 64 KB
    (the handshake costs more than it hides); otherwise ~1 program per SM, twice that while a program would
    still stream > 128 KB. As many pipeline stages (<= ``max_stages``) as ``smem_bytes`` holds (99 KB a block
    on sm_120) with ``mats`` weight tiles and ``acts`` [16, BLOCK_K] activation tiles (2: h and the residual)
    a stage. ``max_block_k`` caps the K-contiguous tile (see triton_gemv_pair's norm).

    ``lean`` (default: env GEMV_LEAN, on): a split-K launch of K tiles >= 128 keeps 3 stages, not 4, and an
    unsplit K-contiguous one with K <= 2048 takes 64-wide K tiles 8 deep. The eighth session's sweep under PDL
    (--deep-sweep, T=1, back-to-back launches; benchmarks/results/h200/deep_sweep_8973344.json): q_a + kv_a as
    one matrix 13.68 -> 11.47 us at 3 stages (less shared memory a block: ncu had it at 2 blocks of 4 warps a
    SM, DRAM half busy), o_proj 7.18 -> 5.82 us at 64 x 8 (its read-only ceiling: 5.81)."""
    if lean is None:
        lean = env.GEMV_LEAN.switch(default=True)
    short = lean and k_major and K <= 2048
    if k_major:
        block_n, block_k = 32, max(16, min(max_block_k, triton.next_power_of_2(K)))
    else:
        block_n, block_k = max(16, min(64, triton.next_power_of_2(N))), max(16, min(64, triton.next_power_of_2(K)))
    blocks = triton.cdiv(N, block_n) * B
    slab = block_n * K * 2 * mats
    split = 1
    if slab > 64 << 10:
        split = triton.cdiv(sms, blocks)
        if blocks < sms and slab // split > 128 << 10:
            split *= 2
    if short and split == 1:
        block_k, max_stages = min(block_k, 64), max(max_stages, 8)
    split = max(1, min(split, triton.cdiv(K, block_k)))
    if lean and split > 1 and block_k >= 128:
        max_stages = min(max_stages, 3)
    stage = (block_n * block_k * mats + 16 * block_k * acts) * 2
    stages = max(1, min(max_stages, smem_bytes // stage))
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT": split, "num_warps": 4, "num_stages": stages}


def fma_form(N: int, K: int, x: torch.Tensor, w: torch.Tensor, epilogue: bool) -> bool:
    """Whether triton_gemv runs x [T, K] @ w [N, K]^T (or per head, x [T, B, K] @ w [B, N, K]^T) in the CUDA-core
    form (see FMA_MAX_WEIGHTS and FMA_MIN_K_HEADS); off with SGLANG_EAGLE3_GEMV_FMA=0. One answer for every T of
    a matrix, so decode and verify compute alike."""
    if epilogue or x.dim() != w.dim() or w.stride(-1) != 1 or not env.GEMV_FMA.switch(default=True):
        return False
    if x.dim() == 2:
        return FMA_MIN_K <= K <= FMA_MAX_K and N * K <= FMA_MAX_WEIGHTS
    return x.dim() == 3 and FMA_MIN_K_HEADS <= K <= FMA_MAX_K and w.shape[0] * N * K <= FMA_MAX_WEIGHTS


def fma_for_engine(max_requests: int) -> bool:
    """Whether an engine whose forwards hold up to ``max_requests`` requests (its CUDA graphs' cuda_graph_max_bs)
    lets its layers take the CUDA-core form (the shape rules, fma_form and fma_pair_form, still decide which
    matrices: MLA's q_a + kv_a pair, q_b and W_UV; a MoE layer's router + shared gate/up pair).

    A token's products must not depend on how many rows its launch has (lossless greedy speculation: verify
    computes what decode computed), so an engine picks one form per matrix for every T. The CUDA-core form wins
    at few rows and loses at many (H200, the 61-layer step at 1k with it against without, fma_config's 128 lanes:
    -6% at T = 1, -2% at T = 4, +2% at T = 8; 256 lanes: +9% at T = 16; docs/BENCHMARKS.md, twenty-third
    session; the router + shared pair, thirty-first session, paired: -7.3% at T = 1, +0.6% at T = 4, +6.3% at
    T = 8; W_UV per head, thirty-third session, paired: -1.9% at T = 1, +0.25% at T = 4, +0.5-1.7% at T = 8; the
    q_a + kv_a pair, thirty-seventh session: -5.1 to -5.7% at T = 1, -2.1 to -2.5% at T = 4, +4.1-4.7% at T = 8), so by
    default an engine takes it only when it serves one request at a time (rows = 1 to decode, k + 1 to verify); a
    speculative engine and a plain one with the same arguments then choose alike. (An engine verifying 8 tokens a
    step pays for the pairs there: SGLANG_EAGLE3_GEMV_FMA=0, or SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 for q_a + kv_a.)
    SGLANG_EAGLE3_GEMV_FMA=1 / 0 forces it on (wherever the shape rules take a matrix) / off."""
    raw = env.GEMV_FMA.raw()
    if raw in (None, ""):
        return max_requests <= 1
    return env.GEMV_FMA.switch(default=True)


def lanes_first() -> bool:
    """Whether the CUDA-core forms hold their weight tile as [LANES, BLOCK_N, VEC] (the default;
    SGLANG_EAGLE3_GEMV_LANES_FIRST=0: [BLOCK_N, LANES, VEC], rows first). Lanes first, a thread holds one lane of
    every weight row, so x's [LANES, VEC] tile is used as loaded and each x element is widened once for all rows,
    and each product is added to the row's accumulator in turn (one FFMA); rows first, Triton lays 4 weight rows x 8
    lanes a warp, x goes through shared memory into that layout every K step and row, a thread widens the 32 x
    elements of its 4 lanes for its one row, and a lane's 8 products are summed before they are added. Offline
    (sm_90 SASS at 4 rows of x, benchmarks/sass_gemv_fma.py): the router + shared pair 2256 -> 1944 instructions
    (both kinds of program's tails counted; 110 -> 108 registers), a program of one matrix at the pair's config 2016
    -> 1432, q_b with its norm 1632 -> 1432 (144 -> 128 registers); the reductions' layouts stay the same at every
    ROWS (decode == verify). The sums go in another order than rows first's (other bits). On by default since the
    thirty-sixth session: the 61-layer step paired on the H200 (docs/BENCHMARKS.md) x0.994 / x0.996 at decode (1k /
    8k), x0.979 / x0.974 at verify of 4, x0.955 / x0.961 of 8, and every verify row still bit-identical to its
    token's decode."""
    return env.GEMV_LANES_FIRST.switch(default=True)


GROUPS_INNER_FORMS = {"none": (), "pairs": ("pair",), "all": ("pair", "single")}


def row_groups_inner(form: str) -> bool:
    """Whether a CUDA-core launch of ``form`` ("pair": triton_gemv_fma_pair, MLA's q_a + kv_a and the router +
    shared gate/up; "single": triton_gemv_fma, q_b and W_UV) puts a weight block's row-group programs side by side
    (past 4 rows of x a block has a program per 4 rows; triton/gemv.py _block_and_rows): the row groups on grid
    axis 0, so the later groups read the weights from L2 while the first streams them; else the blocks on axis 0,
    the row groups on axis 1 (every launch's order before the forty-ninth session). The same programs and
    arithmetic either way (the same bits); only when each starts differs. SGLANG_EAGLE3_GEMV_GROUPS_INNER: "pairs"
    (unset: the default), "all" or "none". The default from the 61-layer step on an H100 (docs/BENCHMARKS.md,
    forty-ninth session): the pairs (12.8 and 30 MB of weights a launch) ran 3.1 us faster a launch at T = 5 with
    the groups side by side, the single launches (4.7 MB and less) 0.4-0.6 us slower."""
    raw = env.GEMV_GROUPS_INNER.raw()
    choice = "pairs" if raw in (None, "") else raw.strip().lower()
    if choice not in GROUPS_INNER_FORMS:
        raise ValueError(f"{env.GEMV_GROUPS_INNER.name}={raw!r}: expected one of {', '.join(GROUPS_INNER_FORMS)} "
                         f"(unset: pairs)")
    assert form in ("pair", "single"), f"form must be 'pair' or 'single', got {form!r}"
    return form in GROUPS_INNER_FORMS[choice]


def _fma_grid(blocks: int, T: int, rows: int, heads: int, inner: bool) -> tuple[tuple[int, int, int], bool]:
    """(grid, GROUPS_INNER) of the CUDA-core forms for ``blocks`` weight blocks and cdiv(T, rows) row groups
    (triton/gemv.py _block_and_rows): the row groups on axis 0 with ``inner`` where there are several and the
    blocks fit grid axis 1 (65535), else the blocks on axis 0 (one row group: the same order either way, and the
    grid each launch had before the forty-ninth session)."""
    groups = triton.cdiv(T, rows)
    if inner and groups > 1 and blocks <= 65535:
        return (groups, blocks, heads), True
    return (blocks, groups, heads), False


def fma_config(N: int, K: int) -> dict:
    """The CUDA-core form's launch config, from the matrix's shape only (never T: a token's products must not
    depend on how many rows a launch has): BLOCK_N weight rows a program, LANES lanes of 8 weights along K over
    num_warps warps, up to MAX_ROWS rows of x a program. H200, q_b with its norm (bench_gemv_fma.py, then the
    61-layer step): 4 rows of W, 128 lanes over 4 warps, 4 rows of x; 256 lanes over 8 warps was 0.16 us faster
    alone at T=1 and 1.7 us slower at T=4 (the step at 1k: 4.37 / 6.07 ms at T = 1 / 4 against 4.41 / 5.85)."""
    raw = env.GEMV_FMA_CONFIG.raw()
    if raw:
        return _parse_fma_config(raw)
    warps = max(1, min(4, triton.next_power_of_2(triton.cdiv(K, 8 * 32))))
    return {"BLOCK_N": 4, "LANES": 32 * warps, "num_warps": warps, "MAX_ROWS": 4, "LANES_FIRST": lanes_first()}


def fma_pair_form(K: int, gated: bool, epilogue: bool) -> bool:
    """Whether triton_gemv_pair runs in the CUDA-core form (triton_gemv_fma_pair): a pair (its second matrix
    ``gated``: a MoE layer's router and its shared expert's gate/up; or plain: MLA's q_a and kv_a) with K in the
    form's range and no routing tail or norm the form cannot take (``epilogue``: a routing tail, or a norm before a
    gated pair; a plain pair folds the input norm itself); off with SGLANG_EAGLE3_GEMV_FMA=0. One answer for
    every T of a pair (decode and verify compute alike). On the H200 (Kimi TP=8 rank: 384 router rows, 256 + 256
    gated, K = 7168; thirty-first session, bench_gemv_launches.py, benchmarks/results/h200/
    gemv_launches_fma_391ae14.json) the gated pair took 5.5 / 8.0 / 10.3 / 17.9 us at T = 1 / 2 / 4 / 8, the
    tensor-core pair 10.1-10.4 at every T (its gated row blocks hold two weight tiles a stage: 120 KB of shared
    memory a block, one block a SM); in the 61-layer step (paired, 1k and 8k) decode 7.3% faster, verify of 4
    0.6-0.7% slower. MLA's q_a + kv_a pair takes the form too since the thirty-seventh session (rows first it had
    lost at T = 4: 17-20 against the tensor cores' 11.6 us): lanes first at fma_pair_config's 128 lanes the step
    ran x0.943-0.949 at decode, x0.953-0.960 at verify of 2, x0.975-0.979 of 4 and x1.041-1.047 of 8, paired in
    two runs (docs/BENCHMARKS.md); SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 keeps it on the tensor cores."""
    if epilogue or not FMA_MIN_K <= K <= FMA_MAX_K or not env.GEMV_FMA.switch(default=True):
        return False
    return gated or env.GEMV_FMA_PLAIN_PAIR.switch(default=True)


def fma_pair_config(N1: int, N2: int, K: int, gated: bool = True) -> dict:
    """triton_gemv_fma_pair's launch config, from the shapes only (never T): 4 weight rows a program (a gated
    program: the gate and up rows of two activations), up to 4 rows of x a program; 256 lanes over 8 warps for a
    gated pair, 128 over 4 for a plain one. The plain pair (MLA's q_a + kv_a, 528 programs at Kimi's TP=8 rank)
    was paired in the 61-layer step on the H200 at both (thirty-seventh session): 128 lanes x0.943-0.949 at
    decode, x0.975-0.979 at verify of 4, 256 lanes x0.959-0.964 / x1.001-1.006, though alone 256 lanes is the
    faster launch at T = 1 (9.0 against 10.8 us)."""
    if gated:
        return {"BLOCK_N": 4, "LANES": 256, "num_warps": 8, "MAX_ROWS": 4, "LANES_FIRST": lanes_first()}
    return {"BLOCK_N": 4, "LANES": 128, "num_warps": 4, "MAX_ROWS": 4, "LANES_FIRST": lanes_first()}


def _parse_fma_config(raw: str) -> dict:
    """SGLANG_EAGLE3_GEMV_FMA_CONFIG's 'KEY=VALUE,...' (every key of fma_config, powers of two, except LANES_FIRST:
    0 or 1, lanes_first()'s when left out) as a config."""
    keys = ("BLOCK_N", "LANES", "num_warps", "MAX_ROWS")
    where = f"{env.GEMV_FMA_CONFIG.name}={raw!r}"
    cfg = {}
    for item in raw.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or name not in (*keys, "LANES_FIRST") or not value.strip().isdigit():
            raise ValueError(f"{where}: expected KEY=INTEGER items, KEY one of {', '.join(keys)}, LANES_FIRST; "
                             f"got {item!r}")
        cfg[name] = int(value)
    first = cfg.pop("LANES_FIRST", int(lanes_first()))
    bad = [f"{k}={v}" for k, v in cfg.items() if v < 1 or v & (v - 1)] + (
        [f"LANES_FIRST={first}"] if first not in (0, 1) else [])
    if set(cfg) != set(keys) or bad or cfg["MAX_ROWS"] > 8 or cfg["num_warps"] > 8:
        raise ValueError(f"{where}: needs each of {', '.join(keys)} once, powers of two (num_warps, MAX_ROWS "
                         f"<= 8), LANES_FIRST 0 or 1{'; not: ' + ', '.join(bad) if bad else ''}")
    return {**cfg, "LANES_FIRST": bool(first)}


def triton_gemv_fma(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None,
                    norm_weight: torch.Tensor | None = None, eps: float = 0.0, config: dict | None = None
                    ) -> torch.Tensor:
    """x [T, K] (T <= GEMV_MAX_ROWS) @ w [N, K]^T -> [T, N], or per head x [T, B, K] @ w [B, N, K]^T -> [T, B, N],
    in x's dtype on the CUDA cores (triton/gemv.py, gemv_fma_kernel), optionally of RMSNorm(x) (2-D only;
    ``norm_weight`` [K], ``eps``: x normed and rounded to its dtype first, as ref_gemv). ``config``: as
    fma_config's (its default). Rows of x go 1, 2, 4 or 8 (up to MAX_ROWS) to a program by T; each row's sums are
    the same code whatever T is."""
    batched = x.dim() == 3
    assert x.dim() == w.dim() and x.dim() in (2, 3), (
        f"x {tuple(x.shape)} and w {tuple(w.shape)} must be both 2-D, or 3-D per head")
    T, K = x.shape[0], x.shape[-1]
    B = x.shape[1] if batched else 1
    N = w.shape[-2]
    assert w.shape[-1] == K and (not batched or w.shape[0] == B), (
        f"w {tuple(w.shape)} does not match x {tuple(x.shape)} (K={K}{f', B={B}' if batched else ''})")
    assert 0 <= T <= GEMV_MAX_ROWS, f"{T=} rows: the GEMV path takes at most {GEMV_MAX_ROWS} (use a GEMM)"
    assert x.dtype in (torch.bfloat16, torch.float16) and w.dtype == x.dtype, f"{x.dtype=} {w.dtype=}"
    assert x.stride(-1) == 1 and w.stride(-1) == 1, f"x {x.stride()} and w {w.stride()} need a unit stride along K"
    if norm_weight is not None:
        assert not batched, "the CUDA-core form folds a norm into 2-D products only"
        assert norm_weight.shape == (K,) and norm_weight.is_contiguous(), (
            f"norm_weight must be contiguous [{K}], got {tuple(norm_weight.shape)}")
    out_shape = (T, B, N) if batched else (T, N)
    if out is None:
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    assert tuple(out.shape) == out_shape and out.stride(-1) == 1 and out.dtype == x.dtype, (
        f"out must be {list(out_shape)} {x.dtype} with unit inner stride, got {tuple(out.shape)} {out.dtype} "
        f"{out.stride()}")
    if T == 0 or N == 0:
        return out
    interpret = tuning.interpreting()
    cfg = config or fma_config(N, K)
    if interpret and config is None:
        cfg = {**cfg, "LANES": 32}  # (one warp under the interpreter: keep its steps few)
    assert cfg["MAX_ROWS"] in (1, 2, 4, 8), f"MAX_ROWS must be 1, 2, 4 or 8, got {cfg}"
    rows = min(cfg["MAX_ROWS"], triton.next_power_of_2(T))
    lanes = cfg["LANES"]
    heads = (x.stride(1), w.stride(0), out.stride(1)) if batched else (0, 0, 0)
    pdl = tuning.pdl(x.device, "gemv")
    grid, inner = _fma_grid(triton.cdiv(N, cfg["BLOCK_N"]), T, rows, B, row_groups_inner("single"))
    gemv_fma_kernel[grid](
        x, w, out, norm_weight if norm_weight is not None else w, T, N, K, x.stride(0), w.stride(-2), out.stride(0),
        *heads, float(eps), ROWS=rows, BLOCK_N=cfg["BLOCK_N"], LANES=lanes, VEC=8, NSTEPS=triton.cdiv(K, lanes * 8),
        NORM=NORM_PRE if norm_weight is not None else NORM_NONE, PDL=pdl, HEADS=batched,
        LF=bool(cfg.get("LANES_FIRST", False)), GROUPS_INNER=inner, num_warps=1 if interpret else cfg["num_warps"],
        **tuning.pdl_launch(pdl))
    return out


def triton_gemv_fma_pair(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w2_up: torch.Tensor | None, *,
                         out1_dtype: torch.dtype | None = None, config: dict | None = None,
                         norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                         residual: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """(x w1^T in ``out1_dtype``, SiLU(x w2^T) * (x w2_up^T) in x's dtype) on the CUDA cores in one launch
    (triton/gemv.py gemv_fma_pair_kernel): x [T, K] (T <= GEMV_MAX_ROWS), w1 [N1, K], w2 and w2_up [N2, K],
    K-contiguous, x's dtype; without ``w2_up`` the second output is x w2^T (MLA's q_a and kv_a). Rounded as
    triton_gemv_pair rounds (each product to its output dtype, then the SiLU and the product); each token's sums
    are the same code whatever T is. ``config``: as fma_pair_config's.

    ``norm_weight`` (plain pairs: a decoder layer's input norm before q_a and kv_a): the products are of the RMSNorm
    of the stream s = x + ``residual`` (rounded to x's dtype; s = x without one) and (y1, y2, s) is returned, s a
    new [T, K] tensor with a residual, else x itself. Every program reads its rows of s whole for their rstd
    first, then normalises them as the RMSNorm kernel rounds them (bf16(s * rstd * weight)) into the products: the
    unfused norm's numbers but for the order of the sum of squares (where the tensor-core fold rounds bf16(s *
    weight) and scales the sums by rstd). The norm's arguments are checked by triton_gemv_pair."""
    assert x.dim() == 2 and x.stride(1) == 1, f"x must be [T, K] with unit inner stride, got {tuple(x.shape)}"
    T, K = x.shape
    assert 0 <= T <= GEMV_MAX_ROWS, f"{T=} rows: the GEMV path takes at most {GEMV_MAX_ROWS} (use a GEMM)"
    assert x.dtype in (torch.bfloat16, torch.float16), f"{x.dtype=}"
    gated = w2_up is not None
    for name, w in (("w1", w1), ("w2", w2)) + ((("w2_up", w2_up),) if gated else ()):
        assert w.dim() == 2 and w.shape[1] == K and w.stride(1) == 1 and w.dtype == x.dtype, (
            f"{name} must be [N, {K}] {x.dtype}, K-contiguous; got {tuple(w.shape)} {w.stride()} {w.dtype}")
    assert not gated or (w2_up.shape == w2.shape and w2_up.stride() == w2.stride()), (
        f"w2_up {tuple(w2_up.shape)} {w2_up.stride()} must match w2 {tuple(w2.shape)} {w2.stride()}")
    # (a plain pair's programs store through one path, tl.where of the two outputs' pointers: one dtype)
    assert gated or out1_dtype in (None, x.dtype), f"a plain pair's outputs are both {x.dtype}, got {out1_dtype=}"
    norm = norm_weight is not None
    assert not (norm and gated), "the CUDA-core pair folds a norm into plain pairs only (MLA's q_a and kv_a)"
    assert norm or residual is None, "residual is added before the norm: it needs norm_weight"
    N1, N2 = w1.shape[0], w2.shape[0]
    y1 = torch.empty(T, N1, dtype=out1_dtype or x.dtype, device=x.device)
    y2 = torch.empty(T, N2, dtype=x.dtype, device=x.device)
    stream = x if residual is None else torch.empty(T, K, dtype=x.dtype, device=x.device)
    outs = (y1, y2, stream) if norm else (y1, y2)
    if T == 0:
        return outs
    interpret = tuning.interpreting()
    cfg = config or fma_pair_config(N1, N2, K, gated)
    if interpret and config is None:
        cfg = {**cfg, "LANES": 32}  # (one warp under the interpreter: keep its steps few)
    bn = cfg["BLOCK_N"]
    assert bn >= 2 and bn & (bn - 1) == 0, f"BLOCK_N must be a power of two >= 2 (gate and up rows), got {cfg}"
    assert cfg["MAX_ROWS"] in (1, 2, 4, 8), f"MAX_ROWS must be 1, 2, 4 or 8, got {cfg}"
    rows = min(cfg["MAX_ROWS"], triton.next_power_of_2(T))
    nb1 = triton.cdiv(N1, bn)
    pdl = tuning.pdl(x.device, "gemv")
    grid, inner = _fma_grid(nb1 + triton.cdiv(N2, bn // 2 if gated else bn), T, rows, 1,
                           row_groups_inner("pair"))
    gemv_fma_pair_kernel[grid](
        x, w1, w2, w2_up if gated else w2, y1, y2, T, N1, N2, nb1, K, x.stride(0), w1.stride(0), w2.stride(0),
        y1.stride(0), y2.stride(0), ROWS=rows, BLOCK_N=bn, LANES=cfg["LANES"], VEC=8,
        NSTEPS=triton.cdiv(K, cfg["LANES"] * 8), PDL=pdl, LF=bool(cfg.get("LANES_FIRST", False)), GATED=gated,
        GROUPS_INNER=inner, num_warps=1 if interpret else cfg["num_warps"],
        NORM=NORM_PRE if norm else NORM_NONE, HAS_RES=residual is not None,
        nw_ptr=norm_weight if norm else x, res_ptr=x if residual is None else residual, res_out_ptr=stream,
        s_rt=0 if residual is None else residual.stride(0), s_rot=stream.stride(0), eps=float(eps),
        **tuning.pdl_launch(pdl))
    return outs


def _as3(t: torch.Tensor, name: str) -> torch.Tensor:
    assert t.dim() in (2, 3), f"{name} must be 2-D or 3-D, got {tuple(t.shape)}"
    return t[:, None, :] if t.dim() == 2 else t


def _split_plan(K: int, T: int, cols: int, B: int, blocks: int, cfg: dict, device: torch.device,
                row_sums: bool = False):
    """(k_per_split, split, m_pad, partials, counters) for a launch: the split count is rounded so every split
    holds whole BLOCK_K tiles; the fp32 partials [B, split, 2, m_pad, cols] (with ``row_sums``, followed by
    the sums of squares [B, blocks, split, m_pad] of NORM_POST) and the counters exist only with split-K (else
    any tensor stands in: the kernel never touches them)."""
    block_k = cfg["BLOCK_K"]
    assert cfg["BLOCK_N"] >= 16 and block_k >= 16, f"tl.dot needs 16 <= BLOCK_N, BLOCK_K: {cfg}"
    k_per_split = triton.cdiv(triton.cdiv(K, cfg["SPLIT"]), block_k) * block_k
    split = triton.cdiv(K, k_per_split)
    m_pad = max(16, triton.next_power_of_2(T))
    if split == 1:
        return k_per_split, split, m_pad, None, None
    sums = B * blocks * split * m_pad if row_sums else 0
    part = torch.empty(B * split * 2 * m_pad * cols + sums, dtype=torch.float32, device=device)
    return k_per_split, split, m_pad, part, split_counters(device, B * blocks)


def _routing_outputs(route: Routing, T: int, E: int, logits: torch.Tensor) -> tuple[tuple, dict]:
    """((weights float32 [T, top_k], ids int32 [T, top_k]), gemv_kernel's routing arguments for them) for
    routing ``E`` experts' logits (``logits`` stands in for an absent bias: the kernel never reads it then)."""
    route.check(E, logits.device)
    weights = torch.empty(T, route.top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(T, route.top_k, dtype=torch.int32, device=logits.device)
    return (weights, ids), dict(
        bias_ptr=route.bias if route.bias is not None else logits, topk_w_ptr=weights, topk_id_ptr=ids,
        s_twt=weights.stride(0), s_tit=ids.stride(0), routed_scaling_factor=float(route.routed_scaling_factor),
        **route.constexprs(E))


def triton_gemv(x: torch.Tensor, w: torch.Tensor, *, w_up: torch.Tensor | None = None,
                add: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                out: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                route: Routing | None = None, route_logits: torch.Tensor | None = None,
                config: dict | None = None, fma: bool | None = None, rotary: dict | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, K] with w [N, K] -> [T, N]; or x [T, B, K] with w [B, N, K] -> [T, B, N]. See module doc.
    ``norm_weight`` [K]: x is RMS-normalised first (weight, eps), inside the same launch.

    ``route`` with ``route_logits`` float32 [T, E] (2-D x only): the same launch also routes those logits
    (programs beside the GEMV's: the shared expert's down projection and the MoE routing, which read only
    what the launch before wrote), and (out, weights float32 [T, top_k], ids int32 [T, top_k]) is returned,
    the routing bit-identical to triton_moe_topk's.

    ``rotary``: triton_apply_rotary's keyword arguments (q, k, positions, cos, sin, interleaved, inplace=True,
    ...), whose work programs of this launch do beside the GEMV's (ROPE_SIDE; not with ``route``): MLA's
    rotary of q's rope columns and of k into the cache beside W_UK, which reads q's other columns. In place
    only (nothing more is returned), and it must write nothing the GEMV reads (the caller's promise: the two
    run concurrently); its results are bit-identical to the rotary launch's (the same code, also compiled
    without fp fusion). Where the product takes the CUDA-core form (which has no side programs) the rotary
    launch runs first instead: the product's bits never depend on ``rotary``.

    ``fma``: True runs the CUDA-core form (triton_gemv_fma: no epilogue, K-contiguous w), False the tensor-core kernel;
    None lets fma_form decide (small K-contiguous matrices without an epilogue, unless ``config`` is given)."""
    batched = w.dim() == 3
    assert w.dim() in (2, 3) and x.dim() == w.dim(), f"x {tuple(x.shape)} and w {tuple(w.shape)}: 2-D/2-D or 3-D/3-D"
    T, K = x.shape[0], x.shape[-1]
    w3 = w[None] if not batched else w
    B, N = w3.shape[0], w3.shape[1]
    assert w3.shape[2] == K, f"w {tuple(w.shape)} does not match x {tuple(x.shape)} (K={K})"
    assert not batched or x.shape[1] == B, f"x heads {x.shape[1]} != w heads {B}"
    assert 0 <= T <= GEMV_MAX_ROWS, f"{T=} rows: the GEMV path takes at most {GEMV_MAX_ROWS} (use a GEMM)"
    assert x.dtype in (torch.bfloat16, torch.float16) and w.dtype == x.dtype, f"{x.dtype=} {w.dtype=}"
    assert x.stride(-1) == 1, f"x must have unit inner stride, got {x.stride()}"
    k_major = w3.stride(2) == 1
    assert k_major or w3.stride(1) == 1, f"w needs a unit stride along K or N, got strides {w.stride()}"
    gated = w_up is not None
    if gated:
        assert w_up.shape == w.shape and w_up.stride() == w.stride() and w_up.dtype == w.dtype, (
            f"w_up {tuple(w_up.shape)} {w_up.stride()} must match w {tuple(w.shape)} {w.stride()}")
        assert add is None, "w_up (gated) and add are exclusive"
    if norm_weight is not None:
        assert not batched, f"norm_weight folds into 2-D products only, got per-head x {tuple(x.shape)} (norm first)"
        assert norm_weight.shape == (K,) and norm_weight.is_contiguous(), (
            f"norm_weight must be contiguous [{K}], got {tuple(norm_weight.shape)} {norm_weight.stride()}")
    out_shape = (T, B, N) if batched else (T, N)
    if out is None:
        out = torch.empty(out_shape, dtype=out_dtype or x.dtype, device=x.device)
    assert tuple(out.shape) == out_shape and out.stride(-1) == 1, (
        f"out must be {out_shape} with unit inner stride, got {tuple(out.shape)} {out.stride()}")
    # (an integer out took the kernel's float sums truncated, and ref_gemv an integer product: no number to match)
    assert out.dtype.is_floating_point, f"out must be a float tensor, got {out.dtype}"
    assert out_dtype is None or out.dtype == out_dtype, f"{out.dtype=} != {out_dtype=}"
    if add is not None:
        assert tuple(add.shape) == out_shape and add.stride(-1) == 1 and add.dtype == out.dtype, (
            f"add must be {out_shape} {out.dtype} with unit inner stride, got {tuple(add.shape)} {add.dtype}")
    route_kw, extra, routed = {}, 0, ()
    if route is not None:
        assert not batched, "routing beside a GEMV: 2-D x only"
        assert route_logits is not None and route_logits.dtype == torch.float32 and route_logits.dim() == 2, (
            f"route needs float32 router logits [T, E], got {None if route_logits is None else route_logits.dtype}")
        assert route_logits.shape[0] == T and route_logits.stride(1) == 1, (
            f"route_logits must be [{T}, E] with unit inner stride, got {tuple(route_logits.shape)} "
            f"{route_logits.stride()}")
        routed, route_kw = _routing_outputs(route, T, route_logits.shape[1], route_logits)
        route_kw.update(ROUTE_SIDE=True, logits_ptr=route_logits, s_lt=route_logits.stride(0))
        extra = T
    else:
        assert route_logits is None, "route_logits without route"
    epilogue = gated or add is not None or route is not None or out.dtype != x.dtype
    if fma is None:
        fma = config is None and fma_form(N, K, x, w, epilogue)
    rope_kw = {}
    if rotary is not None:
        assert route is None, "rotary and route beside one GEMV: one kind of side programs a launch"
        assert rotary.get("inplace"), f"rotary beside a GEMV works in place: inplace=True, got {rotary.get('inplace')}"
        assert rotary["positions"].shape[0] == T, (
            f"one rotary program a GEMV row: {rotary['positions'].shape[0]} positions for {T=} rows")
        if fma:  # the CUDA-core form has no side programs: the rotary launch first, the product as without it
            triton_apply_rotary(**rotary)
        else:
            _, _, rargs = rotary_args(**rotary)
            rope_kw = {"ROPE_SIDE": True, **{f"rp_{name}": value for name, value in rargs.items()}}
            extra = T  # a rotary program a row
    if T == 0 or (N == 0 and not extra):
        return (out, *routed) if routed else out
    if fma:
        assert not epilogue, "the CUDA-core form has no epilogue"
        return triton_gemv_fma(x, w, out=out, norm_weight=norm_weight, eps=eps, config=config)
    x3, o3 = _as3(x, "x"), _as3(out, "out")
    a3 = _as3(add, "add") if add is not None else o3
    cfg = config or gemv_config(N, K, B, k_major, tuning.sm_count(x.device), 2 if gated else 1,
                                tuning.smem_per_block(x.device))
    blocks = triton.cdiv(N, cfg["BLOCK_N"])
    k_per_split, split, m_pad, part, count = _split_plan(K, T, N, B, blocks, cfg, x.device)
    if part is None:
        part = count = o3
    interpret = tuning.interpreting()
    pdl = tuning.pdl(x.device, "gemv")
    gemv_kernel[(blocks + extra, split, B)](
        x3, w3, w_up if gated else w3, a3, o3, part, count, w3, o3,
        T, N, K, k_per_split, 0, blocks,
        x3.stride(0), x3.stride(1), w3.stride(0), w3.stride(1), w3.stride(2),
        a3.stride(0), a3.stride(1), o3.stride(0), o3.stride(1), 0, 0,
        NORM=NORM_PRE if norm_weight is not None else NORM_NONE,
        nw_ptr=norm_weight if norm_weight is not None else w3, eps=float(eps),
        W_KMAJOR=k_major, EPI=EPI_GATED if gated else (EPI_ADD if add is not None else EPI_NONE),
        SPLIT=split, M_PAD=m_pad, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], INTERPRET=interpret, PDL=pdl,
        num_warps=1 if interpret else cfg["num_warps"], num_stages=cfg.get("num_stages", 2),
        PREFETCH_L2=pdl and tuning.pdl_l2_prefetch(), **route_kw, **rope_kw, **tuning.pdl_launch(pdl),
        **({"enable_fp_fusion": False} if rope_kw else {}),
    )
    return (out, *routed) if routed else out


def triton_gemv_pair(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, *, w2_up: torch.Tensor | None = None,
                     out1_dtype: torch.dtype | None = None, norm_weight: torch.Tensor | None = None,
                     eps: float = 0.0, residual: torch.Tensor | None = None, route: Routing | None = None,
                     config: dict | None = None, fma: bool | None = None) -> tuple[torch.Tensor, ...]:
    """(x w1^T, x w2^T) from one launch: x [T, K]; w1 [N1, K], w2 [N2, K] K-contiguous, same dtype as x (MLA's
    q_a and kv_a projections read the same normed hidden state). With ``w2_up`` the second output is the
    gated SiLU(x w2^T) * (x w2_up^T) (a shared expert's activation); ``out1_dtype`` (e.g. float32 router
    logits) sets the first's dtype. Each output as triton_gemv's would be.

    With ``norm_weight`` [K] the products are of RMSNorm(s) (weight, eps) for the stream s = x + ``residual``
    (rounded to x's dtype as torch's add is; s = x without a residual), and s is returned third:
    (y1, y2, s), s a new [T, K] tensor with a residual, else x itself. The rstd scales the fp32 products
    (module doc), so the outputs differ from ref_rms_norm then the GEMVs by where x is rounded.

    With ``route`` the first output are router logits (``out1_dtype=torch.float32``) [T, E = N1], and the
    launch's tail routes them: (weights float32 [T, top_k], ids int32 [T, top_k]) follow the other outputs,
    bit-identical to triton_moe_topk on the returned logits (the same function computes them).

    ``fma``: False keeps the tensor-core kernel; None lets fma_pair_form decide (a pair without routing, and a norm
    only before a plain pair, unless ``config`` is given): then the CUDA-core form, triton_gemv_fma_pair, runs it."""
    T, K = x.shape
    assert x.dim() == 2 and x.stride(-1) == 1, f"x must be [T, K] with unit inner stride, got {tuple(x.shape)}"
    assert 0 <= T <= GEMV_MAX_ROWS, f"{T=} rows: the GEMV path takes at most {GEMV_MAX_ROWS} (use a GEMM)"
    mats = [("w1", w1), ("w2", w2)] + ([("w2_up", w2_up)] if w2_up is not None else [])
    for name, w in mats:
        assert w.dim() == 2 and w.shape[1] == K and w.stride(1) == 1 and w.dtype == x.dtype, (
            f"{name} must be [N, {K}] {x.dtype}, K-contiguous; got {tuple(w.shape)} {w.stride()} {w.dtype}")
    if w2_up is not None:
        assert w2_up.shape == w2.shape and w2_up.stride() == w2.stride(), (
            f"w2_up {tuple(w2_up.shape)} {w2_up.stride()} must match w2 {tuple(w2.shape)} {w2.stride()}")
    assert x.dtype in (torch.bfloat16, torch.float16), f"{x.dtype=}"
    norm = norm_weight is not None
    assert norm or residual is None, "residual is added before the norm: it needs norm_weight"
    stream = x
    if norm:
        assert norm_weight.shape == (K,) and norm_weight.is_contiguous() and norm_weight.is_floating_point(), (
            f"norm_weight must be a contiguous float [{K}], got {tuple(norm_weight.shape)} {norm_weight.dtype} "
            f"{norm_weight.stride()}")
        assert norm_weight.device == x.device, f"{norm_weight.device=} != {x.device=}"
        if residual is not None:
            assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(-1) == 1, (
                f"residual must be [{T}, {K}] {x.dtype} with unit inner stride, got {tuple(residual.shape)} "
                f"{residual.dtype} {residual.stride()}")
            stream = torch.empty(T, K, dtype=x.dtype, device=x.device)
    N1, N2 = w1.shape[0], w2.shape[0]
    assert not norm or N1 > 0, f"{N1=}: the first matrix's row block 0 writes the new residual"
    y1 = torch.empty(T, N1, dtype=out1_dtype or x.dtype, device=x.device)
    y2 = torch.empty(T, N2, dtype=x.dtype, device=x.device)
    outs = (y1, y2, stream) if norm else (y1, y2)
    route_args = {}
    if route is not None:
        assert out1_dtype == torch.float32, f"routing reads float32 router logits, got {out1_dtype=}"
        routed, route_args = _routing_outputs(route, T, N1, y1)
        route_args["ROUTE"] = True
        outs = (*outs, *routed)
    if T == 0:
        return outs
    plain_mixed = w2_up is None and out1_dtype not in (None, x.dtype)  # the plain form stores one dtype
    if (fma is not False and config is None and not plain_mixed
            and fma_pair_form(K, w2_up is not None, route is not None or (norm and w2_up is not None))):
        return triton_gemv_fma_pair(x, w1, w2, w2_up, out1_dtype=out1_dtype, norm_weight=norm_weight, eps=eps,
                                    residual=residual)
    mats2 = 2 if w2_up is not None else 1
    limits = NORM_POST_LIMITS if norm else {}
    cfg = config or gemv_config(N1 + mats2 * N2, K, 1, True, tuning.sm_count(x.device), mats2,
                                tuning.smem_per_block(x.device), acts=2 if residual is not None else 1, **limits)
    bn = cfg["BLOCK_N"]
    nb1 = triton.cdiv(N1, bn)
    blocks = nb1 + triton.cdiv(N2, bn)
    k_per_split, split, m_pad, part, count = _split_plan(K, T, N1 + N2, 1, blocks, cfg, x.device, row_sums=norm)
    if route is not None:
        count = split_counters(x.device, blocks + 1)  # the tail's arrival counter follows the split-K counters
    if part is None:
        part = y2
    if count is None:
        count = y2
    res = residual if residual is not None else x
    interpret = tuning.interpreting()
    pdl = tuning.pdl(x.device, "gemv")
    gemv_kernel[(blocks, split, 1)](
        x, w1, w1, y1, y1, part, count, w2, y2,
        T, N1, K, k_per_split, N2, nb1,
        x.stride(0), 0, 0, w1.stride(0), 1, 0, 0, y1.stride(0), 0, w2.stride(0), y2.stride(0),
        W_KMAJOR=True, EPI=EPI_NONE, SPLIT=split, M_PAD=m_pad, BLOCK_N=bn, BLOCK_K=cfg["BLOCK_K"], INTERPRET=interpret,
        PDL=pdl, PAIR=True, EPI2=EPI_GATED if w2_up is not None else EPI_NONE,
        w2_up_ptr=w2_up if w2_up is not None else w2,
        NORM=NORM_POST if norm else NORM_NONE, nw_ptr=norm_weight if norm else w1, eps=float(eps),
        HAS_RES=residual is not None, res_ptr=res, res_out_ptr=stream, s_rt=res.stride(0), s_rot=stream.stride(0),
        num_warps=1 if interpret else cfg["num_warps"], num_stages=cfg.get("num_stages", 2),
        PREFETCH_L2=pdl and tuning.pdl_l2_prefetch(), **route_args, **tuning.pdl_launch(pdl),
    )
    return outs
