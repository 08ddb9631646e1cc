"""Kernel-vs-reference checks, shared by the CPU interpreter tests and the GPU tests.

Triton reads TRITON_INTERPRET when it is imported, and the rest of the test suite shares the pytest process,
so test_kernels_interpret.py runs each CPU case in a fresh subprocess: ``python kernel_checks.py NAME``.
test_kernels_gpu.py imports the same checks and runs them on CUDA tensors at real shapes.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from sglang_eagle3 import kernels  # noqa: E402


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere counts as infinite error."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_moe_topk(T: int, E: int, top_k: int, n_group: int, topk_group: int, bias: bool, renormalize: bool,
                   scale: float, device: str = "cpu", dtype=torch.float32, seed: int = 0) -> None:
    g = torch.Generator(device="cpu").manual_seed(seed)
    logits = (torch.randn(T, E, generator=g) * 2).to(dtype).to(device)
    corr = (torch.rand(E, generator=g) * 0.5).to(device) if bias else None
    w, ids = kernels.moe_topk(logits, corr, top_k=top_k, n_group=n_group, topk_group=topk_group,
                              renormalize=renormalize, routed_scaling_factor=scale, use_triton=True)
    rw, rids = kernels.ref_moe_topk(logits, corr, top_k=top_k, n_group=n_group, topk_group=topk_group,
                                    renormalize=renormalize, routed_scaling_factor=scale)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32, (w.dtype, ids.dtype)
    # Order within a row is free: compare sorted by id.
    ids_s, order = ids.long().sort(dim=1)
    rids_s, rorder = rids.long().sort(dim=1)
    assert torch.equal(ids_s, rids_s), f"ids differ: {ids_s[:2]} vs {rids_s[:2]}"
    err = rel_err(w.gather(1, order), rw.gather(1, rorder))
    assert err < 1e-6, f"weights rel err {err}"


def make_mla_inputs(B, T, H, Dc, Dr, page_size, seq_lens, device, dtype=torch.bfloat16, seed=0):
    """Random q/cache, a shuffled page table with spare (never used) pages, partially filled last pages."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    P = max(1, math.ceil(max(seq_lens) / page_size)) + 1  # one spare column: capacity > contents
    num_pages = B * P + 3
    perm = torch.randperm(num_pages, generator=g)[: B * P].view(B, P).to(torch.int32)
    kv = torch.randn(num_pages * page_size, Dc + Dr, generator=g).to(dtype)
    qn = (torch.randn(B * T, H, Dc, generator=g) * 0.05).to(dtype)
    qr = (torch.randn(B * T, H, Dr, generator=g) * 0.05).to(dtype)
    return [t.to(device) for t in (qn, qr, kv, perm, seq)]


def check_mla(B, T, H, Dc, Dr, page_size, seq_lens, device="cpu", seed=0, dtype=torch.bfloat16,
              tol=1e-2) -> float:
    qn, qr, kv, pt, seq = make_mla_inputs(B, T, H, Dc, Dr, page_size, seq_lens, device, dtype, seed)
    sm_scale = 1.0 / math.sqrt(128 + Dr)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=sm_scale)
    out = kernels.mla_attention(qn, qr, kv, pt, seq, **kw, use_triton=True)
    ref = kernels.ref_mla_attention(qn, qr, kv, pt, seq, **kw)
    err = rel_err(out, ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype)
    assert err < tol, f"MLA rel err {err} ({B=} {T=} {H=} {seq_lens=} {page_size=})"
    return err


def make_moe_inputs(T, E, H, I, top_k, device, int4: bool, dtype=torch.bfloat16, seed=0, skew=False):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / math.sqrt(H)).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / math.sqrt(I)).to(dtype)
    if skew:  # every token picks from a few experts: several pairs per expert, more than a chunk of 16
        ids = torch.stack([torch.randperm(min(E, top_k + 1), generator=g)[:top_k] for _ in range(T)])
    else:
        ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(T)])
    w = torch.rand(T, top_k, generator=g)
    w = w / w.sum(-1, keepdim=True)
    ids = ids.to(torch.int32)
    if int4:
        p13, s13 = kernels.quantize_int4(w13)
        p2, s2 = kernels.quantize_int4(w2)
        return [t.to(device) for t in (x, p13, s13, p2, s2, w, ids)]
    return [t.to(device) for t in (x, w13, w2, w, ids)]


def check_fused_moe(T, E, H, I, top_k, int4: bool, device="cpu", seed=0, skew=False, dtype=torch.bfloat16,
                    tol=1e-2, path=None, config=None) -> float:
    args = make_moe_inputs(T, E, H, I, top_k, device, int4, dtype, seed, skew)
    if int4 and (path or config):
        from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

        out = triton_fused_moe_int4(*args, path=path, config=config)
        ref = kernels.ref_fused_moe_int4(*args)
    elif int4:
        out = kernels.fused_moe_int4(*args, use_triton=True)
        ref = kernels.ref_fused_moe_int4(*args)
    else:
        out = kernels.fused_moe(*args, use_triton=True)
        ref = kernels.ref_fused_moe(*args)
    err = rel_err(out, ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape)
    assert err < tol, f"fused MoE rel err {err} ({T=} {E=} {H=} {I=} {top_k=} {int4=} {skew=})"
    return err


def ulp_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |out - ref| in units of ref's last place (out's dtype); 0 means bit-identical."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype, ref.dtype)
    if torch.equal(out, ref):
        return 0.0
    o, r = out.double(), ref.double()
    ulp = torch.finfo(out.dtype).eps * r.abs().clamp_min(torch.finfo(out.dtype).tiny)
    return ((o - r).abs() / ulp).max().item()


def check_rms_norm(shape, dtype=torch.bfloat16, residual=False, strided=False, inplace=False, device="cpu",
                   seed=0, max_ulp=2.0) -> float:
    """Kernel vs ref_rms_norm: outputs within max_ulp of the reference (the sums' order differs); with a
    residual the new residual (one rounding of x + r) is bit-identical."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    D = shape[-1]
    base = (torch.randn(*shape[:-1], D + 24, generator=g) * 3).to(dtype).to(device)
    x = base[..., 5:5 + D] if strided else base[..., :D].contiguous()
    w = (torch.rand(D, generator=g) + 0.5).to(dtype).to(device)
    res = (torch.randn(*shape, generator=g) * 3).to(dtype).to(device) if residual else None
    ref = kernels.ref_rms_norm(x, w, 1e-6, res)
    if inplace:
        assert not residual
        before = base.clone()
        out = kernels.rms_norm(x, w, 1e-6, out=x, use_triton=True)
        assert out.data_ptr() == x.data_ptr()
        outside = torch.ones(base.shape[-1], dtype=torch.bool)
        outside[5:5 + D] = False
        assert torch.equal(base[..., outside], before[..., outside]), "wrote outside the view"
    else:
        out = kernels.rms_norm(x, w, 1e-6, res, use_triton=True)
    if residual:
        (out, new_res), (ref, ref_res) = out, ref
        assert torch.equal(new_res, ref_res), "fused residual sum differs from x + residual"
    err = ulp_err(out, ref)
    assert err <= max_ulp, f"rms_norm off by {err} ulp ({shape=} {dtype=} {residual=} {strided=})"
    return err


def check_rotary(N, Hq, Hk, D, interleaved, dtype=torch.bfloat16, inplace=False, device="cpu", seed=0,
                 max_ulp=0.0) -> float:
    """Kernel vs ref_apply_rotary on strided views (q_rope inside q, k_rope inside kv_a, as MLA has them).
    fp32 is bit-identical (no fma); half types within max_ulp (the interpreter truncates fp32->bf16)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    P = 3 * N + 5
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(P, dtype=torch.float64), inv)
    cos, sin = (freqs.cos() * 1.3).float().to(device), (freqs.sin() * 1.3).float().to(device)
    q_full = torch.randn(N, Hq, 16 + D, generator=g).to(dtype).to(device)
    kv = torch.randn(N, 40 + Hk * D, generator=g).to(dtype).to(device)
    q = q_full[..., 16:]
    k = kv[:, 40:].view(N, Hk, D) if Hk > 1 else kv[:, 40:]
    pos = torch.randint(0, P, (N,), generator=g).to(device)
    qr, kr = kernels.ref_apply_rotary(q, k, pos, cos, sin, interleaved=interleaved)
    q_nope, kv_head = q_full[..., :16].clone(), kv[:, :40].clone()
    qo, ko = kernels.apply_rotary(q, k, pos, cos, sin, interleaved=interleaved, inplace=inplace, use_triton=True)
    if inplace:
        assert qo.data_ptr() == q.data_ptr() and ko.data_ptr() == k.data_ptr()
        assert torch.equal(q_full[..., :16], q_nope) and torch.equal(kv[:, :40], kv_head), "wrote outside the view"
    err = max(ulp_err(qo, qr), ulp_err(ko, kr))
    assert err <= max_ulp, f"rotary off by {err} ulp ({N=} {Hq=} {Hk=} {D=} {interleaved=} {dtype=})"
    return err


# GEMV-path configs small enough that the interpreter's loops run several partial steps.
GEMV_SMALL = {"gate_up": {"BLOCK_N": 4, "BLOCK_W": 8, "num_warps": 1, "num_stages": 1},
              "down": {"BLOCK_N": 16, "BLOCK_W": 4, "num_warps": 1, "num_stages": 1}}

# Small irregular shapes for the interpreter: name -> thunk.
CASES = {
    "topk_kimi_like": lambda: check_moe_topk(5, 48, 8, 1, 1, True, True, 2.5, seed=1),
    "topk_grouped": lambda: check_moe_topk(7, 64, 6, 8, 3, True, True, 1.0, seed=2),
    "topk_no_bias_no_renorm_bf16": lambda: check_moe_topk(3, 40, 4, 4, 2, False, False, 1.5,
                                                          dtype=torch.bfloat16, seed=3),
    "mla_decode": lambda: check_mla(3, 1, 3, 64, 16, 16, [1, 37, 70], seed=4),
    "mla_verify": lambda: check_mla(2, 4, 2, 64, 16, 8, [4, 53], seed=5),
    "mla_verify_rows_span_blocks": lambda: check_mla(1, 5, 5, 32, 16, 4, [29], seed=6),
    "mla_fp32_exact": lambda: check_mla(2, 3, 4, 64, 16, 4, [3, 45], seed=11, dtype=torch.float32, tol=1e-5),
    "moe_bf16": lambda: check_fused_moe(3, 7, 96, 48, 3, int4=False, seed=7),
    "moe_bf16_shared_experts": lambda: check_fused_moe(9, 6, 64, 32, 2, int4=False, seed=8, skew=True),
    "moe_int4": lambda: check_fused_moe(3, 7, 160, 96, 3, int4=True, seed=9),
    "moe_int4_over_one_chunk": lambda: check_fused_moe(20, 5, 128, 64, 2, int4=True, seed=10, skew=True),
    "moe_fp32_exact": lambda: check_fused_moe(11, 5, 128, 64, 2, int4=False, seed=12, skew=True,
                                              dtype=torch.float32, tol=1e-5),
    "moe_int4_fp32_exact": lambda: check_fused_moe(4, 9, 96, 160, 4, int4=True, seed=13, dtype=torch.float32,
                                                   tol=1e-5),
    "rms_norm_bf16": lambda: check_rms_norm((3, 5, 200), seed=14),
    "rms_norm_fp32_strided": lambda: check_rms_norm((7, 96), torch.float32, strided=True, seed=15, max_ulp=4),
    "rms_norm_fp16_residual": lambda: check_rms_norm((6, 130), torch.float16, residual=True, seed=16),
    "rms_norm_bf16_inplace_view": lambda: check_rms_norm((9, 64), strided=True, inplace=True, seed=17),
    "rotary_interleaved_fp32_exact": lambda: check_rotary(5, 3, 1, 16, True, torch.float32, seed=18),
    "rotary_interleaved_bf16_inplace": lambda: check_rotary(6, 5, 1, 24, True, inplace=True, seed=19,
                                                            max_ulp=1.0),
    "rotary_neox_fp32_exact_inplace": lambda: check_rotary(4, 6, 2, 32, False, torch.float32, inplace=True,
                                                           seed=20),
    "rotary_neox_fp16": lambda: check_rotary(3, 2, 2, 12, False, torch.float16, seed=21),
    # INT4 GEMV path (T <= 8): the default for decode/verify; fp32 checks the arithmetic tightly.
    "moe_int4_gemv_fp32_exact": lambda: check_fused_moe(3, 7, 96, 64, 3, int4=True, seed=22, dtype=torch.float32,
                                                        tol=1e-5, path="gemv", config=GEMV_SMALL),
    "moe_int4_gemv_bf16_shared_experts": lambda: check_fused_moe(6, 5, 64, 96, 2, int4=True, seed=23, skew=True,
                                                                 path="gemv", config=GEMV_SMALL),
    "moe_int4_gemv_default_config": lambda: check_fused_moe(2, 6, 64, 32, 4, int4=True, seed=24),
}

if __name__ == "__main__":
    # One JSON line per case: {"case", "ok", "detail"}; a failing case does not stop the others.
    for name in sys.argv[1:] or list(CASES):
        try:
            result = CASES[name]()
            print(json.dumps({"case": name, "ok": True, "detail": result}), flush=True)
        except Exception:
            print(json.dumps({"case": name, "ok": False, "detail": traceback.format_exc()}), flush=True)
