"""Kernel ops for decode/verify shapes. Each op has a torch reference (``ref_*`` in ref.py) and a Triton
kernel (``triton/``) behind a launcher (``moe_topk.py``, ``mla_attention.py``, ``fused_moe.py``,
``rms_norm.py``, ``rotary.py``, ``gemv.py``, ``sampling.py``).

The public entry points below dispatch: Triton for CUDA tensors, the reference elsewhere. On CPU the Triton
path runs only under the interpreter (``TRITON_INTERPRET=1``) and only when asked for, by ``use_triton=True``
or ``SGLANG_EAGLE3_TRITON_ON_CPU=1`` (tests do this). ``use_triton=False`` forces the reference on any device.
The Triton kernels have no backward: every op but moe_topk (whose outputs carry no gradient) takes the
reference whenever autograd records through its inputs, and float64 inputs (tests, references) always do.
"""

from __future__ import annotations

import torch

# NOTE: the launcher modules share their names with the functions defined below. Importing them here, before
# the functions are defined, keeps ``sglang_eagle3.kernels.moe_topk`` bound to the function: Python sets a
# package attribute only when a submodule is first imported.
from sglang_eagle3 import env
from sglang_eagle3.kernels.fused_moe import triton_fused_moe, triton_fused_moe_int4
from sglang_eagle3.kernels.gemv import GEMV_MAX_ROWS, triton_gemv, triton_gemv_pair
from sglang_eagle3.kernels.mla_attention import (
    gqa_uses_kernel,
    mha_prefill_uses_kernel,
    mha_scratch_width,  # noqa: F401 - the scratch width callers allocate (layers/mla.py)
    triton_gqa_attention,
    triton_mla_attention,
    triton_mla_mha_prefill,
)
from sglang_eagle3.kernels.moe_topk import Routing, triton_moe_topk
from sglang_eagle3.kernels.quant import pack_int4, quantize_int4, unpack_int4
from sglang_eagle3.kernels.ref import (
    ref_apply_rotary,
    ref_fused_moe,
    ref_fused_moe_int4,
    ref_gemv,
    ref_gemv_pair,
    ref_gqa_attention,
    ref_gumbel_argmax,
    ref_mla_attention,
    ref_mla_mha_prefill,
    ref_moe_topk,
    ref_rms_norm,
    ref_rotate,
    ref_top_threshold,
)
from sglang_eagle3.kernels.rms_norm import triton_rms_norm
from sglang_eagle3.kernels.rotary import triton_apply_rotary
from sglang_eagle3.kernels.sampling import triton_gumbel_argmax, triton_top_threshold

TRITON_ON_CPU_ENV = env.TRITON_ON_CPU.name


def _use_triton(t: torch.Tensor, use_triton: bool | None) -> bool:
    if use_triton is False:
        return False
    if t.is_cuda:
        return True
    interpret = env.TRITON_INTERPRET.flag()
    asked = use_triton is True or env.TRITON_ON_CPU.flag()
    if asked and not interpret:
        raise RuntimeError(f"Triton on CPU needs TRITON_INTERPRET=1 set before triton is imported "
                           f"({use_triton=}, {TRITON_ON_CPU_ENV}={env.TRITON_ON_CPU.raw()})")
    return asked


def triton_runs(t: torch.Tensor, use_triton: bool | None = None) -> bool:
    """Whether an op given tensors like ``t`` runs its Triton kernel (CUDA; on CPU when asked, under the
    interpreter), for callers whose torch path differs from the kernel's reference (the sampler's filters)."""
    return _use_triton(t, use_triton)


def _kernel_ok(use_triton: bool | None, *tensors: torch.Tensor | None) -> bool:
    """Triton for ops without a backward: not for float64, not while autograd records through them."""
    ts = [t for t in tensors if t is not None]
    if any(t.dtype == torch.float64 for t in ts):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return False
    return _use_triton(ts[0], use_triton)


def gemv(x, w, *, w_up=None, add=None, out_dtype=None, out=None, norm_weight=None, eps=0.0,
         route: Routing | None = None, route_logits=None, use_triton: bool | None = None, fma: bool | None = None,
         rotary: dict | None = None):
    """x [T, K] @ w [N, K]^T (or per head: x [T, B, K], w [B, N, K]) with an optional residual ``add`` or gated
    ``w_up`` epilogue, and an optional RMSNorm of x first (``norm_weight``, ``eps``); see ref_gemv. The Triton
    skinny GEMM serves T <= GEMV_MAX_ROWS rows of half-precision operands (decode and verify); everything else
    (prefill, training, float32) takes torch's GEMM, after the rms_norm op where there is a norm.

    ``route`` (a Routing) with ``route_logits`` float32 [T, E]: also routes those logits, returning (out,
    weights float32 [T, top_k], ids int32 [T, top_k]); the skinny GEMM does it in the same launch (a MoE
    layer's routing beside its shared expert's down projection), elsewhere the moe_topk op runs after.

    ``rotary`` (apply_rotary's keyword arguments, in place, for as many tokens as x has rows): that rotary's
    work too, which must write nothing this product reads; the skinny GEMM does it in the same launch (MLA's
    rotary beside W_UK, the fusion ``rope_wuk``), elsewhere apply_rotary runs first. Bit-identical either way.

    ``fma`` (the Triton path only): False keeps the skinny GEMM on its tensor-core kernel; None lets
    kernels/gemv.py fma_form send small matrices to the CUDA-core one (see triton_gemv)."""
    if norm_weight is not None and x.dim() == 3 and _kernel_ok(use_triton, x, w, w_up, add, norm_weight):
        # The skinny GEMM folds a norm into 2-D products only (per-head x raised there): the norm's own kernel first,
        # as ref_gemv norms x, then the per-head product.
        x, norm_weight = rms_norm(x, norm_weight, eps, use_triton=use_triton), None
    ok = (x.shape[0] <= GEMV_MAX_ROWS and x.dtype in (torch.bfloat16, torch.float16) and w.dtype == x.dtype
          and x.stride(-1) == 1 and (w.stride(-1) == 1 or w.stride(-2) == 1))
    if rotary is not None:
        assert route is None, "rotary and route beside one GEMV"
        assert rotary.get("inplace"), f"rotary beside a GEMV works in place: inplace=True, got {rotary.get('inplace')}"
        if ok and _kernel_ok(use_triton, x, w, w_up, add, norm_weight) and _rotary_kernel_ok(use_triton, **rotary):
            return triton_gemv(x, w, w_up=w_up, add=add, out_dtype=out_dtype, out=out, norm_weight=norm_weight,
                               eps=eps, fma=fma, rotary=rotary)
        apply_rotary(**rotary, use_triton=use_triton)
    if route is not None:
        assert route_logits is not None, "route needs route_logits"
        ok = ok and x.dim() == 2 and route_logits.dtype == torch.float32 and route_logits.stride(-1) == 1
        bias = route.bias
        if ok and _kernel_ok(use_triton, x, w, w_up, add, norm_weight, bias):
            return triton_gemv(x, w, w_up=w_up, add=add, out_dtype=out_dtype, out=out, norm_weight=norm_weight,
                               eps=eps, route=route, route_logits=route_logits)
        y = gemv(x, w, w_up=w_up, add=add, out_dtype=out_dtype, out=out, norm_weight=norm_weight, eps=eps,
                 use_triton=use_triton)
        return (y, *moe_topk(route_logits, bias, **route.topk_kwargs(), use_triton=use_triton))
    assert route_logits is None, "route_logits without route"
    if ok and _kernel_ok(use_triton, x, w, w_up, add, norm_weight):
        return triton_gemv(x, w, w_up=w_up, add=add, out_dtype=out_dtype, out=out, norm_weight=norm_weight, eps=eps,
                           fma=fma)
    if norm_weight is not None and _kernel_ok(use_triton, x, norm_weight):
        # Not a GEMV size or dtype: the norm's own kernel, as the unfused layer runs it, then torch's GEMM.
        x, norm_weight = rms_norm(x, norm_weight, eps, use_triton=use_triton), None
    return ref_gemv(x, w, w_up=w_up, add=add, out_dtype=out_dtype, out=out, norm_weight=norm_weight, eps=eps)


def gemv_pair(x, w1, w2, *, w2_up=None, out1_dtype=None, norm_weight=None, eps=0.0, residual=None,
              route: Routing | None = None, use_triton: bool | None = None, fma: bool | None = None):
    """(x w1^T, x w2^T) for x [T, K] (with ``w2_up``: the second is SiLU(x w2^T) * (x w2_up^T); ``out1_dtype``:
    the first's dtype): one launch of the skinny GEMM at decode/verify sizes, torch's GEMMs otherwise. With
    ``norm_weight`` (and ``eps``, ``residual``) the products are of the RMSNorm of x + residual, folded into
    the same launch, and that stream is returned third; elsewhere the norm runs as its own op first, so those
    paths compute what rms_norm then gemv_pair do. See ref_gemv_pair.

    ``route`` (a Routing; needs ``out1_dtype=torch.float32``): the first output are a MoE layer's router
    logits, and (weights float32 [T, top_k], ids int32 [T, top_k]) of the moe_topk op on them come last. The
    skinny GEMM routes in its launch's tail (bit-identical to moe_topk on its logits); elsewhere the moe_topk
    op runs after the products, as the unfused layer runs it. ``fma``: triton_gemv_pair's (False: never the
    CUDA-core form; an engine decides it once, kernels/gemv.py fma_for_engine)."""
    assert route is None or out1_dtype == torch.float32, f"routing reads float32 router logits, got {out1_dtype=}"
    ws = [w for w in (w1, w2, w2_up) if w is not None]
    ok = (x.dim() == 2 and x.shape[0] <= GEMV_MAX_ROWS and x.dtype in (torch.bfloat16, torch.float16)
          and all(w.dtype == x.dtype and w.stride(-1) == 1 for w in ws) and x.stride(-1) == 1)
    bias = route.bias if route is not None else None
    if ok and _kernel_ok(use_triton, x, *ws, norm_weight, residual, bias):
        return triton_gemv_pair(x, w1, w2, w2_up=w2_up, out1_dtype=out1_dtype, norm_weight=norm_weight, eps=eps,
                                residual=residual, route=route, fma=fma)
    if route is not None:
        route.check(w1.shape[0], x.device)
        outs = gemv_pair(x, w1, w2, w2_up=w2_up, out1_dtype=out1_dtype, norm_weight=norm_weight, eps=eps,
                         residual=residual, use_triton=use_triton, fma=fma)
        return (*outs, *moe_topk(outs[0], bias, **route.topk_kwargs(), use_triton=use_triton))
    if norm_weight is not None and _kernel_ok(use_triton, x, norm_weight, residual):
        # Prefill-sized rows on the GPU: the norm kernel (with the residual add), then torch's GEMMs.
        if residual is None:
            normed, stream = rms_norm(x, norm_weight, eps, use_triton=use_triton), x
        else:
            normed, stream = rms_norm(x, norm_weight, eps, residual, use_triton=use_triton)
        return (*gemv_pair(normed, w1, w2, w2_up=w2_up, out1_dtype=out1_dtype, use_triton=use_triton, fma=fma),
                stream)
    return ref_gemv_pair(x, w1, w2, w2_up=w2_up, out1_dtype=out1_dtype, norm_weight=norm_weight, eps=eps,
                         residual=residual)


def rms_norm(x, weight, eps, residual=None, *, out=None, out_rows=None, use_triton: bool | None = None):
    """RMSNorm in float32 (float64 stays float64) -> [..., D] in x.dtype, or (normed, x + residual) with a
    residual; ``out`` receives the result (may alias x), at rows ``out_rows`` if given. See ref_rms_norm."""
    fn = triton_rms_norm if _kernel_ok(use_triton, x, weight, residual, out) else ref_rms_norm
    return fn(x, weight, eps, residual, out=out, out_rows=out_rows)


def _rotary_kernel_ok(use_triton, q, k, positions, *, k_out=None, c_norm=None, **_) -> bool:
    """Whether apply_rotary with these arguments runs the Triton kernel."""
    c_args = c_norm[:2] if c_norm is not None else ()
    return _kernel_ok(use_triton, q, k, k_out, *c_args) and positions.dim() == 1


def apply_rotary(q, k, positions, cos, sin, *, interleaved: bool, inplace: bool = False, k_out=None,
                 k_out_rows=None, c_norm=None, use_triton: bool | None = None):
    """Rotary embedding of q [N, Hq, D] (or [N, D]) and k, either None, at positions [N] -> (q', k'); cos/sin
    [P, D/2]; k may go to rows ``k_out_rows`` of ``k_out`` instead, and ``c_norm`` adds an RMSNorm of MLA's
    latent into those rows of another tensor. The Triton path needs float32 tables; the reference casts
    whatever it is given. See ref_apply_rotary."""
    assert q is not None or k is not None, "apply_rotary: nothing to rotate (q and k are both None)"
    ok = _rotary_kernel_ok(use_triton, q, k, positions, k_out=k_out, c_norm=c_norm)
    fn = triton_apply_rotary if ok else ref_apply_rotary
    return fn(q, k, positions, cos, sin, interleaved=interleaved, inplace=inplace, k_out=k_out,
              k_out_rows=k_out_rows, c_norm=c_norm)


def moe_topk(router_logits, correction_bias, *, top_k, n_group, topk_group, renormalize=True,
             routed_scaling_factor=1.0, use_triton: bool | None = None):
    """noaux_tc routing: (weights float32 [T, top_k], ids int32 [T, top_k]); see ref_moe_topk."""
    if _use_triton(router_logits, use_triton):
        fn = triton_moe_topk  # its launcher checks the routing as below
    else:
        # The reference would route an impossible configuration anyway (top_k past the kept groups' experts, 0
        # groups): the same checks as the kernel's launcher, on every path.
        assert router_logits.dim() == 2, f"router_logits must be [T, E], got shape {tuple(router_logits.shape)}"
        Routing(correction_bias, top_k, n_group, topk_group, renormalize, routed_scaling_factor).check(
            router_logits.shape[1], router_logits.device)
        fn = ref_moe_topk
    return fn(router_logits, correction_bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
              renormalize=renormalize, routed_scaling_factor=routed_scaling_factor)


def gumbel_argmax(scores, keys, positions, *, token_ids=None, use_triton: bool | None = None):
    """A Gumbel-max sample of softmax(scores[r]) per row with noise hashed from (keys[r], positions[r], token)
    -> int64 [R] (column indices; ``token_ids`` [V]: the token each column's noise belongs to); see
    ref_gumbel_argmax."""
    fn = triton_gumbel_argmax if _use_triton(scores, use_triton) else ref_gumbel_argmax
    return fn(scores, keys, positions, token_ids)


def top_threshold(z, lo, target, zmax=None, *, use_triton: bool | None = None):
    """The top_p (with ``zmax``, each row's maximum) or top_k (``target`` = k as float32) threshold of each row of
    z float32 [R, V] over its candidates z >= lo -> float32 [R]; see ref_top_threshold. The kernel selects by
    radix passes instead of sorting the rows."""
    fn = triton_top_threshold if _use_triton(z, use_triton) else ref_top_threshold
    return fn(z, lo, target, zmax)


def mla_uses_kernel(rope_dim: int, kv_lora_rank: int, *queries: torch.Tensor, use_triton: bool | None = None) -> bool:
    """Whether mla_attention runs the Triton kernel for queries like ``queries`` (their dtype, device and
    autograd state: the queries themselves, or tensors that share those), so a caller can plan around it
    before the queries exist.

    NOTE: the kernel's tl.dot needs rope and latent widths that are powers of two >= 16 (every real DeepSeek/Kimi
    config: 64 and 512); toy configs otherwise take the reference."""
    # gqa_uses_kernel's rule (tl.dot: a power of two of at least 16), for each of the two widths.
    return gqa_uses_kernel(rope_dim) and gqa_uses_kernel(kv_lora_rank) and _kernel_ok(use_triton, *queries)


def mla_attention(q_nope_latent, q_rope, kv_cache, page_table, seq_lens, *, tokens_per_req, page_size,
                  kv_lora_rank, sm_scale, rope=None, positions=None, use_triton: bool | None = None):
    """Absorbed paged MLA attention for decode/verify -> [B*T, H, Dc]; see ref_mla_attention. With ``rope`` =
    (cos, sin) [P, Dr/2] and ``positions`` [B*T], q_rope is un-rotated and the op rotates it first (the kernel
    as it loads it, float32 tables only; the reference with ref_rotate)."""
    use_kernel = mla_uses_kernel(q_rope.shape[-1], kv_lora_rank, q_rope, q_nope_latent, use_triton=use_triton)
    fn = triton_mla_attention if use_kernel else ref_mla_attention
    return fn(q_nope_latent, q_rope, kv_cache, page_table, seq_lens, tokens_per_req=tokens_per_req,
              page_size=page_size, kv_lora_rank=kv_lora_rank, sm_scale=sm_scale, rope=rope, positions=positions)


def mla_mha_prefill(q_nope, q_rope, kv_cache, kv_b_weight, scratch, page_table, seq_lens, *, tokens_per_req,
                    page_size, kv_lora_rank, sm_scale, rope=None, positions=None, use_triton: bool | None = None):
    """Paged MLA for prefill in the non-absorbed form -> [B*T, H, Dv] (the heads' outputs before o_proj); see
    ref_mla_mha_prefill. The kernel decompresses the requests' keys and values into ``scratch`` [slots,
    mha_scratch_width(...)] (the reference ignores it). Head widths the kernel cannot take (mha_prefill_uses_kernel)
    go to the reference."""
    D, Dr, Dv = q_nope.shape[-1], q_rope.shape[-1], kv_b_weight.shape[0] // q_nope.shape[1] - q_nope.shape[-1]
    use_kernel = mha_prefill_uses_kernel(D, Dr, Dv) and _kernel_ok(use_triton, q_nope, q_rope)
    kw = dict(tokens_per_req=tokens_per_req, page_size=page_size, kv_lora_rank=kv_lora_rank, sm_scale=sm_scale,
              rope=rope, positions=positions)
    if use_kernel:
        return triton_mla_mha_prefill(q_nope, q_rope, kv_cache, kv_b_weight, scratch, page_table, seq_lens, **kw)
    return ref_mla_mha_prefill(q_nope, q_rope, kv_cache, kv_b_weight, page_table, seq_lens, **kw)


def gqa_attention(q, kv_cache, page_table, seq_lens, *, tokens_per_req, page_size, sm_scale,
                  use_triton: bool | None = None):
    """Paged grouped-query attention (the EAGLE-3 draft's) -> [B*T, Hq, D]; see ref_gqa_attention. The Triton
    kernel reads only each request's keys; the reference gathers the whole page table (fine for tests, not for
    a server's graphs, whose page tables are as wide as the context limit)."""
    use_kernel = gqa_uses_kernel(q.shape[-1]) and _kernel_ok(use_triton, q, kv_cache)
    fn = triton_gqa_attention if use_kernel else ref_gqa_attention
    return fn(q, kv_cache, page_table, seq_lens, tokens_per_req=tokens_per_req, page_size=page_size,
              sm_scale=sm_scale)


def fused_moe(x, w13, w2, topk_weights, topk_ids, add=None, *, use_triton: bool | None = None):
    """Routed-expert MLP, bf16 weights -> [T, H] (+ add, e.g. the shared experts); see ref_fused_moe."""
    fn = triton_fused_moe if _kernel_ok(use_triton, x, w13, add) else ref_fused_moe
    return fn(x, w13, w2, topk_weights, topk_ids, add)


def fused_moe_int4(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, group_size=32,
                   add=None, *, use_triton: bool | None = None):
    """Routed-expert MLP over pack-quantized INT4 weights (W4A16) -> [T, H] (+ add); see ref_fused_moe_int4."""
    fn = triton_fused_moe_int4 if _kernel_ok(use_triton, x, add) else ref_fused_moe_int4
    return fn(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, group_size, add)


def kernel_report(device: torch.device | str | None = None) -> dict:
    """What the kernel layer runs with on ``device`` (default: the current CUDA device, else the CPU), for
    provenance: two step times are comparable only under the same report. Triton's version, the GPU's arch and
    SM count and whether its config table was measured there, the kernel families launched with PDL, the
    launch fusions and side-stream overlaps on. Read from this process's environment, which TP workers inherit
    (the engine's worker_env reports show theirs). A bad knob value is reported, not raised."""
    import dataclasses

    import triton

    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.layers.overlap import Overlaps

    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    report: dict = {"triton": triton.__version__, "device": str(device), "interpreter": tuning.interpreting()}
    if device.type == "cuda":
        try:
            arch, sms, name = tuning.device_key(device.index if device.index is not None
                                                else torch.cuda.current_device())
        except ValueError as e:  # SGLANG_EAGLE3_EMULATE_GPU names no GPU this one can stand in for
            arch = sms = None
            name = f"error: {e}"
        try:
            table = None if arch is None else tuning._table(arch, sms)
            config_table = None if table is None else {"arch": table.get("arch"), "measured": table.get("measured"),
                                                       "override": env.CONFIG_TABLE.raw() or None}
        except ValueError as e:  # SGLANG_EAGLE3_CONFIG_TABLE names a bad file: the launches will raise it
            config_table = f"error: {e}"
        report.update(gpu=name, arch=arch, sm_count=sms, config_table=config_table)
    for key, read in (("pdl", lambda: sorted(k for k in tuning.PDL_KERNELS if tuning.pdl(device, k))),
                      ("pdl_l2_prefetch", tuning.pdl_l2_prefetch),
                      ("moe_down_preload", tuning.moe_down_preload),
                      ("fusions", lambda: sorted(f for f in env.FUSIONS if env.fusion_on(f))),
                      ("overlaps", lambda: dataclasses.asdict(Overlaps.from_env()))):
        try:
            report[key] = read()
        except ValueError as e:  # a knob with a bad value: say so here, the launch that reads it raises
            report[key] = f"error: {e}"
    return report


__all__ = [
    "kernel_report",
    "Routing",
    "gemv",
    "gemv_pair",
    "rms_norm",
    "apply_rotary",
    "moe_topk",
    "gumbel_argmax",
    "top_threshold",
    "mla_attention",
    "mla_uses_kernel",
    "fused_moe",
    "fused_moe_int4",
    "ref_gemv",
    "ref_gemv_pair",
    "ref_rms_norm",
    "ref_apply_rotary",
    "ref_rotate",
    "ref_moe_topk",
    "ref_gumbel_argmax",
    "ref_top_threshold",
    "ref_mla_attention",
    "ref_fused_moe",
    "ref_fused_moe_int4",
    "pack_int4",
    "unpack_int4",
    "quantize_int4",
]
