"""Checks of MLA's W_UV folded into the merge launch (launch fusion merge_uv: mla_merge_uv_kernel): the attention op
with ``w_uv`` returns the heads' outputs [B*T, H, Dv] = latent W_UV[h]^T. Under the interpreter (CASES, run by
kernel_checks.py) and on the GPU (test_kernels_gpu.py).

What must hold: the folded op is within rounding of the float64 reference (the latents of ref_mla_attention times
W_UV), and within rounding of the unfolded op (the merge launch, then the skinny GEMM); a verify of T tokens gives
every row bit for bit what the decode of that token alone gives (lossless greedy speculation); one split (no merge
launch) takes the GEMM after the split pass; value rows split over programs (merge_uv_block_v) change nothing.

kernel_checks imports this module at its end, to merge CASES: its helpers are imported inside the functions.
"""

from __future__ import annotations

import math

import torch

from sglang_eagle3 import kernels


def _w_uv(H: int, Dv: int, Dc: int, dtype, device, seed: int) -> torch.Tensor:
    """W_UV as the MLA layer views kv_b's weight: [H, Dv, Dc] inside [H, nope + Dv, Dc] (a strided view)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    kv_b = (torch.randn(H, 24 + Dv, Dc, generator=g) / math.sqrt(Dc)).to(dtype).to(device)
    return kv_b[:, 24:]


def check_mla_merge_uv(B, T, H, Dc, Dr, Dv, page_size, seq_lens, device="cpu", seed=0, dtype=torch.bfloat16,
                       tol=1e-2, config=None, merge="separate", spare=1, calls=1) -> dict:
    """triton_mla_attention(..., w_uv) against ref_mla_attention times W_UV in float64 (rel err < ``tol``) and
    against the op without w_uv then triton_gemv (rel err < ``tol``: another order of the same sums); the launch
    must take the ``merge`` the case is about. ``calls``: calls in a row on one grid, seq_lens 3 shorter each."""
    from kernel_checks import make_mla_inputs, rel_err

    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=1.0 / math.sqrt(128 + Dr))
    dev = torch.device(device)
    cfg = {**tuning.DEFAULTS["mla_attention"], **(config or {})}
    w_uv = _w_uv(H, Dv, Dc, dtype, device, seed + 100)
    errs = []
    for call in range(calls):
        qn, qr, kv, pt, seq = make_mla_inputs(B, T, H, Dc, Dr, page_size, seq_lens, device, dtype, seed + call,
                                              spare)
        seq = (seq - 3 * call).clamp_min(T)
        plan = launch_plan(B, T, H, pt.shape[1] * page_size, tuning.sm_count(dev), cfg)
        assert plan["merge"] == merge, f"{plan=}: the case is about merge {merge!r}"
        out = kernels.triton_mla_attention(qn, qr, kv, pt, seq, **kw, w_uv=w_uv, config=cfg)
        latent = kernels.ref_mla_attention(qn.double(), qr.double(), kv.double(), pt, seq, **kw)
        ref = torch.einsum("thc,hvc->thv", latent, w_uv.double())
        unfolded = kernels.triton_gemv(kernels.triton_mla_attention(qn, qr, kv, pt, seq, **kw, config=cfg), w_uv) \
            if dtype != torch.float32 else None
        assert out.shape == (B * T, H, Dv) and out.dtype == dtype, (out.shape, out.dtype)
        err = rel_err(out, ref)
        assert err < tol, f"folded W_UV rel err {err} ({call=} {plan=})"
        if unfolded is not None:
            assert rel_err(out, unfolded) < tol, rel_err(out, unfolded)
        assert rel_err(out, torch.einsum("thc,hvc->thv", latent, w_uv.double().flip(1))) > 10 * tol, (
            "the check cannot tell W_UV's rows apart")
        errs.append(err)
    return {"rel_err": errs, "plan": plan}


def check_mla_merge_uv_decode_verify_alike(T, H, Dc, Dr, Dv, page_size, ctx, device="cpu", dtype=torch.float32,
                                           config=None, spare=1, seed=0) -> dict:
    """A verify of T tokens at positions ctx .. ctx+T-1 with W_UV folded in against each token decoded alone at
    its position: every row bit for bit."""
    from kernel_checks import make_mla_inputs

    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    qn, qr, kv, pt, _ = make_mla_inputs(1, T, H, Dc, Dr, page_size, [ctx + T], device, dtype, seed, spare)
    w_uv = _w_uv(H, Dv, Dc, dtype, device, seed + 100)
    kw = dict(page_size=page_size, kv_lora_rank=Dc, sm_scale=1.0 / math.sqrt(128 + Dr), w_uv=w_uv)
    dev = torch.device(device)
    cfg = {**tuning.DEFAULTS["mla_attention"], **(config or {})}

    def run(q, r, n, seq_len):
        seq = torch.tensor([seq_len], dtype=torch.int32, device=dev)
        return kernels.triton_mla_attention(q, r, kv, pt, seq, tokens_per_req=n, **kw, config=cfg)

    plan = launch_plan(1, T, H, pt.shape[1] * page_size, tuning.sm_count(dev), cfg)
    assert plan["merge"] == "separate", plan
    verify = run(qn, qr, T, ctx + T)
    for t in range(T):
        alone = run(qn[t:t + 1], qr[t:t + 1], 1, ctx + t + 1)
        assert torch.equal(alone[0], verify[t]), (
            f"token {t} of a verify of {T} at {ctx=} differs from its decode by "
            f"{(alone[0].float() - verify[t].float()).abs().max().item()} ({plan})")
    return {"splits": plan["splits"]}


# Small splits so that short contexts still take the merge launch; 16-column chunks (merge_uv_tile 256 over 16
# padded splits) so that the chunk loop runs several times.
UV_SPLIT = {"BLOCK_N": 16, "min_keys_per_split": 16, "merge_uv_tile": 256}

CASES = {
    "mla_merge_uv_decode": lambda: check_mla_merge_uv(2, 1, 3, 64, 16, 32, 4, [40, 131], seed=71, config=UV_SPLIT,
                                                      calls=2),
    "mla_merge_uv_verify_value_blocks": lambda: check_mla_merge_uv(
        2, 3, 2, 32, 16, 64, 8, [9, 77], seed=72, config={**UV_SPLIT, "merge_uv_block_v": 16}, spare=12),
    "mla_merge_uv_fp32_exact": lambda: check_mla_merge_uv(1, 2, 4, 32, 16, 16, 4, [90], seed=73,
                                                          dtype=torch.float32, tol=1e-5, config=UV_SPLIT),
    # 40 keys and a page table of 48 slots: one split of 64 keys, no merge launch; W_UV runs as the skinny GEMM.
    "mla_merge_uv_one_split": lambda: check_mla_merge_uv(1, 2, 3, 32, 16, 32, 8, [40], seed=74,
                                                         merge="none"),
    "mla_merge_uv_decode_verify_alike_fp32": lambda: check_mla_merge_uv_decode_verify_alike(
        4, 4, 32, 16, 32, 16, 300, seed=75, spare=5,
        config={**UV_SPLIT, "BLOCK_M": 16, "ctas_per_sm": 1, "num_warps": 4, "num_stages": 2}),
}
