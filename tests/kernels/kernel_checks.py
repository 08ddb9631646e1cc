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
import time
import traceback
from pathlib import Path

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from sglang_eagle3 import kernels  # noqa: E402


def rowwise_interpreter_dot() -> None:
    """Under TRITON_INTERPRET=1, make tl.dot compute each row of its output alone.

    The interpreter's tl.dot is numpy's matmul, i.e. the CPU's BLAS, whose float32 sums for a row can follow the
    row's position in the block (OpenBLAS's micro-kernels: on an AMD EPYC without AVX-512 a verify's token 1 came
    out 2e-8 off its decode, at rows 4-7 instead of 0-3, while another CI machine had them equal). On the GPU an
    MMA's row does not depend on its position (the decode-vs-verify GPU tests check it there); the checks here are
    about the kernels' own order of sums, so the emulated dot must not add an order of its own."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "rowwise", False):
        return
    plain = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.ndim != 2 or a.data.dtype.kind != "f" or b.data.dtype.kind != "f":
            return plain(self, a, b, d, input_precision, max_num_imprecise_acc)
        rows = [np.matmul(a.data[i:i + 1], b.data, dtype=d.data.dtype) for i in range(a.data.shape[0])]
        return interpreter.TensorHandle(np.concatenate(rows, axis=0) + d.data, d.dtype.scalar)

    create_dot.rowwise = True
    builder.create_dot = create_dot


def patch_language_once_a_launch() -> None:
    """Under TRITON_INTERPRET=1, patch triton.language once a kernel launch instead of at every @triton.jit helper
    call as well: the same interpretation, a quarter less CPU time.

    Triton 3.6's interpreter swaps triton.language's builtins for interpreted ones when a launch starts (and puts
    them back when it ends), and again at every call of a jitted helper inside it. The second time finds the
    builtins already swapped (it skips them: they are no longer builtins) but walks every member of tl, tl.tensor
    and tl.math to find that out: 25% of a case's time in a profile of mla_short_split_decode_verify_alike_fp32
    (2026-12-08), and the interpreter's run of these checks is half of the CPU suite. A helper's call is skipped
    only while a launch is running whose patches already cover the language modules the helper's globals name;
    otherwise (a helper naming a module the launch's kernel does not) it patches as before."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    if not hasattr(interpreter, "_LangPatchScope") or getattr(interpreter._patch_lang, "once_a_launch", False):
        return  # (another Triton's interpreter: left as it is, only slower)
    plain = interpreter._patch_lang
    patched: set[int] = set()  # ids of the language modules patched by the launch running now (empty: none runs)
    langs_of: dict[object, frozenset[int]] = {}  # a function's language modules (a walk of its globals each)

    def patch_lang(fn):
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                             if inspect.ismodule(v) and v in (tl, tl.core))
        if patched and langs and langs <= patched:  # (no language module: the plain patch refuses it)
            return interpreter._LangPatchScope()  # nothing to put back
        scope = plain(fn)
        if not patched:  # a launch: GridExecutor restores its scope when the grid ends
            restore = scope.restore

            def restore_and_forget():
                patched.clear()
                restore()

            scope.restore = restore_and_forget
        patched.update(langs)
        return scope

    patch_lang.once_a_launch = True
    interpreter._patch_lang = patch_lang


if os.environ.get("TRITON_INTERPRET") == "1":
    rowwise_interpreter_dot()
    patch_language_once_a_launch()


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


def check_moe_topk_pruned(T: int, E: int, top_k: int, n_group: int, topk_group: int, pruned: int,
                          device: str = "cpu", seed: int = 0) -> None:
    """Experts pruned by a -inf bias leave fewer finite choices than top_k in the kept groups: the kernel must
    still return top_k distinct real experts (a padded slot of a group whose size is not a power of two tied
    the -inf ones and decoded to the next group's expert), the ones the reference picks."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(T, E, generator=g).to(device)
    corr = torch.zeros(E)
    corr[torch.randperm(E, generator=g)[:pruned]] = float("-inf")
    corr = corr.to(device)
    kw = dict(top_k=top_k, n_group=n_group, topk_group=topk_group)
    w, ids = kernels.moe_topk(logits, corr, **kw, use_triton=True)
    rw, rids = kernels.ref_moe_topk(logits, corr, **kw)
    for t in range(T):
        assert len(set(ids[t].tolist())) == top_k, f"row {t}: duplicate ids {ids[t].tolist()}"
    assert torch.equal(ids.long().sort(1).values, rids.long().sort(1).values), (ids[:2], rids[:2])


def check_moe_topk_order(T: int, E: int, top_k: int, bias: bool, classes: int, device: str = "cpu",
                         seed: int = 0) -> dict:
    """The routing kernel's picks in order, ties included: experts fall into ``classes`` groups sharing the same
    logit (and bias: exact ties, whatever the sigmoid's last bit), the classes' choices far apart (the bias, <
    0.002, never reorders them); the kernel must return the top_k by descending choice, the lowest expert id
    first among equals (its documented order), and each pick's weight as the reference computes it."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    cls = torch.randint(0, classes, (T, E), generator=g)
    levels = torch.randperm(classes, generator=g).float() * 0.25 - classes * 0.125
    logits = levels[cls].to(device)
    corr = None
    if bias:  # a bias per expert that keeps each class's members tied holds for one row's classes: T = 1
        assert T == 1, "a per-expert bias ties a class's members in one row only"
        corr = (torch.rand(classes, generator=g) * 0.002)[cls[0]].to(device)
    kw = dict(top_k=top_k, n_group=1, topk_group=1, renormalize=True, routed_scaling_factor=2.5)
    w, ids = kernels.moe_topk(logits, corr, **kw, use_triton=True)
    choice = logits.float().sigmoid() + (corr.float() if corr is not None else 0.0)
    for t in range(T):
        expect = sorted(range(E), key=lambda i, t=t: (-choice[t, i].item(), i))[:top_k]
        assert ids[t].tolist() == expect, f"row {t}: picks {ids[t].tolist()} != {expect} (ties: lowest id first)"
    picked = logits.float().sigmoid().gather(1, ids.long())
    err = rel_err(w, picked / (picked.sum(-1, keepdim=True) + 1e-20) * 2.5)
    assert err < 1e-6, f"weights rel err {err}"
    return {"tied_experts_per_row": E - classes}


def make_mla_inputs(B, T, H, Dc, Dr, page_size, seq_lens, device, dtype=torch.bfloat16, seed=0, spare=1):
    """Random q/cache, a shuffled page table with ``spare`` (never used) page columns, partially filled last
    pages."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    P = max(1, math.ceil(max(seq_lens) / page_size)) + spare  # capacity > contents
    num_pages = B * P + 3
    perm = torch.randperm(num_pages, generator=g)[: B * P].view(B, P).to(torch.int32)
    kv = torch.randn(num_pages * page_size, Dc + Dr, generator=g).to(dtype)
    qn = (torch.randn(B * T, H, Dc, generator=g) * 0.05).to(dtype)
    qr = (torch.randn(B * T, H, Dr, generator=g) * 0.05).to(dtype)
    return [t.to(device) for t in (qn, qr, kv, perm, seq)]


def check_mla(B, T, H, Dc, Dr, page_size, seq_lens, device="cpu", seed=0, dtype=torch.bfloat16,
              tol=1e-2, config=None, min_splits=1, calls=1, spare=1) -> dict:
    """Kernel vs ref_mla_attention. ``config``: launch config overrides (else the op's tuned config).
    ``min_splits``: the launch must split the keys at least this many ways (so the merge launch runs).
    ``calls``: calls in a row, each on new inputs and seq_lens 3 shorter than the call before (same page
    table shape, so the same grid, as a graph replay has it); every one must match. ``spare``: page table
    columns past the longest request (a server's graphs hold the page table of the longest context they
    serve: most splits then hold no key)."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    sm_scale = 1.0 / math.sqrt(128 + Dr)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=sm_scale)
    dev = torch.device(device)
    cfg = {**tuning.DEFAULTS["mla_attention"], **config} if config else tuning.get_config(
        "mla_attention", dev, "rows", T * H)
    errs, plan = [], {}
    for call in range(calls):
        qn, qr, kv, pt, seq = make_mla_inputs(B, T, H, Dc, Dr, page_size, seq_lens, device, dtype, seed + call,
                                              spare)
        seq = (seq - 3 * call).clamp_min(T)
        plan = launch_plan(B, T, H, pt.shape[1] * page_size, tuning.sm_count(dev), cfg)
        if config:
            out = kernels.triton_mla_attention(qn, qr, kv, pt, seq, **kw, config=cfg)
        else:
            out = kernels.mla_attention(qn, qr, kv, pt, seq, **kw, use_triton=True)
        ref = kernels.ref_mla_attention(qn, qr, kv, pt, seq, **kw)
        err = rel_err(out, ref)
        assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype)
        assert err < tol, f"MLA rel err {err} ({call=} {B=} {T=} {H=} {seq.tolist()=} {page_size=} {plan=})"
        errs.append(err)
    assert plan["splits"] >= min_splits, f"{plan=}: fewer than {min_splits=} splits, the case misses the merge"
    return {"rel_err": errs, "plan": plan}


def check_mla_decode_verify_alike(T, H, Dc, Dr, page_size, ctx, device="cpu", dtype=torch.float32, config=None,
                                  spare=1, seed=0) -> dict:
    """A verify of T tokens at positions ctx .. ctx+T-1 (one request) against each token decoded alone at its
    position, over the same cache and page table: every row bit for bit (the launch plan's split count does not
    follow T, and the split kernel's row sums do not follow BLOCK_M or the warps). ``config``: launch config
    overrides (else the op's tuned config, per T as the engine picks it)."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    qn, qr, kv, pt, _ = make_mla_inputs(1, T, H, Dc, Dr, page_size, [ctx + T], device, dtype, seed, spare)
    kw = dict(page_size=page_size, kv_lora_rank=Dc, sm_scale=1.0 / math.sqrt(128 + Dr))
    dev = torch.device(device)

    def run(q, r, n, seq_len):
        cfg = {**tuning.DEFAULTS["mla_attention"], **config} if config else tuning.get_config(
            "mla_attention", dev, "rows", n * H)
        plan = launch_plan(1, n, H, pt.shape[1] * page_size, tuning.sm_count(dev), cfg)
        seq = torch.tensor([seq_len], dtype=torch.int32, device=dev)
        return kernels.triton_mla_attention(q, r, kv, pt, seq, tokens_per_req=n, **kw, config=cfg), plan

    verify, vplan = run(qn, qr, T, ctx + T)
    ref = kernels.ref_mla_attention(qn, qr, kv, pt, torch.tensor([ctx + T], dtype=torch.int32, device=dev),
                                    tokens_per_req=T, **kw)
    assert rel_err(verify, ref) < (1e-5 if dtype == torch.float32 else 1e-2), rel_err(verify, ref)
    plans = {"verify": vplan}
    for t in range(T):
        alone, plans[f"decode {t}"] = run(qn[t:t + 1], qr[t:t + 1], 1, ctx + t + 1)
        assert torch.equal(alone[0], verify[t]), (
            f"token {t} of a verify of {T} at {ctx=} differs from its decode by "
            f"{(alone[0].float() - verify[t].float()).abs().max().item()} ({plans})")
    return {name: (plan["splits"], plan["BLOCK_M"]) for name, plan in plans.items()}


def check_mla_page_layouts(B, T, H, Dc, Dr, seq_lens, pages, config, device="cpu", dtype=torch.float32, seed=0,
                           capacity=None) -> dict:
    """The same keys stored in pages of each size in ``pages`` (random page tables of the same capacity in keys,
    so the same splits and key tiles): the same bits from every layout, and near ref_mla_attention. With the
    config's BLOCK_N dividing a page size the split pass addresses each tile from one page (its in-page form),
    below it a page id per key: the two forms must agree bit for bit."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    g = torch.Generator(device="cpu").manual_seed(seed)
    cap = capacity or max(pages) * math.ceil(max(seq_lens) / max(pages))
    assert all(cap % ps == 0 for ps in pages), f"capacity {cap} must be whole pages of each size {pages}"
    keys = torch.randn(B, cap, Dc + Dr, generator=g).to(dtype)  # request b's key at position i
    qn = (torch.randn(B * T, H, Dc, generator=g) * 0.05).to(dtype).to(device)
    qr = (torch.randn(B * T, H, Dr, generator=g) * 0.05).to(dtype).to(device)
    seq = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    kw = dict(tokens_per_req=T, kv_lora_rank=Dc, sm_scale=1.0 / math.sqrt(128 + Dr))
    cfg = {**tuning.DEFAULTS["mla_attention"], **config}
    outs, plans = {}, {}
    for ps in pages:
        P = cap // ps
        table = torch.randperm(B * P + 2, generator=g)[: B * P].view(B, P).to(torch.int32)
        kv = torch.randn((B * P + 2) * ps, Dc + Dr, generator=g).to(dtype)  # pages no request uses: noise
        slots = (table.long()[:, :, None] * ps + torch.arange(ps)).view(B, cap)
        kv[slots.view(-1)] = keys.view(B * cap, -1)
        kv, table = kv.to(device), table.to(device)
        plans[ps] = launch_plan(B, T, H, cap, tuning.sm_count(torch.device(device)), cfg)
        outs[ps] = kernels.triton_mla_attention(qn, qr, kv, table, seq, page_size=ps, **kw, config=cfg)
        ref = kernels.ref_mla_attention(qn, qr, kv, table, seq, page_size=ps, **kw)
        err = rel_err(outs[ps], ref)
        tol = (1e-6 if device == "cpu" else 1e-5) if dtype == torch.float32 else 1e-2
        assert err < tol, f"pages of {ps}: rel err {err} ({plans[ps]})"
    first = pages[0]
    for ps in pages[1:]:
        assert torch.equal(outs[ps], outs[first]), (
            f"pages of {ps} and of {first} differ by {(outs[ps].float() - outs[first].float()).abs().max().item()} "
            f"({plans})")
    return {"plans": {str(k): v for k, v in plans.items()}}


def check_mla_short_split(B, T, H, Dc, Dr, page_size, seq_lens, config, spare, device="cpu", dtype=torch.float32,
                          seed=0) -> dict:
    """``config`` with its short_split (16-row blocks, another depth) against the same config without it, one call
    each on the same inputs: where the page table's capacity gives every split at most max_tiles key tiles the
    plans differ (short_split's BLOCK_M and num_stages) and the outputs are the same bits (same splits and key
    tiles; the row sums follow neither BLOCK_M nor the depth), and both are near ref_mla_attention."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    qn, qr, kv, pt, seq = make_mla_inputs(B, T, H, Dc, Dr, page_size, seq_lens, device, dtype, seed, spare)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=1.0 / math.sqrt(128 + Dr))
    cfgs = {"short": {**tuning.DEFAULTS["mla_attention"], **config},
            "long": {**tuning.DEFAULTS["mla_attention"], **config, "short_split": None}}
    cap = pt.shape[1] * page_size
    plans = {k: launch_plan(B, T, H, cap, tuning.sm_count(torch.device(device)), c) for k, c in cfgs.items()}
    short = cfgs["short"]["short_split"]
    assert (plans["short"]["BLOCK_M"], plans["short"]["num_stages"]) == (short["BLOCK_M"], short["num_stages"]), plans
    assert plans["short"]["splits"] == plans["long"]["splits"] and plans["short"] != plans["long"], plans
    outs = {k: kernels.triton_mla_attention(qn, qr, kv, pt, seq, **kw, config=c) for k, c in cfgs.items()}
    ref = kernels.ref_mla_attention(qn, qr, kv, pt, seq, **kw)
    for k, out in outs.items():
        err = rel_err(out, ref)
        assert err < (1e-5 if dtype == torch.float32 else 1e-2), f"{k}: rel err {err} ({plans[k]})"
    assert torch.equal(outs["short"], outs["long"]), (
        f"short_split changed the bits by {(outs['short'].float() - outs['long'].float()).abs().max().item()} "
        f"({plans})")
    return {k: (p["BLOCK_M"], p["num_stages"], p["splits"]) for k, p in plans.items()}


def check_mla_launch_plan() -> dict:
    """The launch launch_plan picks at Kimi TP=8 shapes (8 heads, 132 SMs, a page table the size of the
    context): with one split the split pass writes the output (no merge launch), with more a merge launch."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    cfg = tuning.DEFAULTS["mla_attention"]
    plans = {}
    for B, T, ctx in ((1, 1, 64), (1, 1, 1024), (1, 1, 8192), (1, 4, 8192), (64, 1, 8192)):
        plan = plans[f"B={B} T={T} ctx={ctx}"] = launch_plan(B, T, 8, ctx, 132, cfg)
        assert plan["BLOCK_M"] == 16 and plan["row_blocks"] == math.ceil(T * 8 / 16), plan
        assert plan["merge"] == ("none" if plan["splits"] == 1 else "separate"), plan
    assert plans["B=1 T=1 ctx=64"]["splits"] == 1, plans  # 64 keys: one split of min_keys_per_split
    assert plans["B=1 T=1 ctx=1024"]["splits"] == 16, plans  # 1024 / 64 keys, under 2 x 132 programs
    assert plans["B=1 T=1 ctx=8192"]["splits"] == 128 and plans["B=1 T=4 ctx=8192"]["splits"] == 128, plans
    assert plans["B=64 T=1 ctx=8192"]["splits"] == 5, plans  # ceil(2 x 132 / 64)
    for B, ctx in ((1, 8192), (1, 32768), (16, 8192)):  # decode and verify widths split alike; a prefill chunk not
        counts = {T: launch_plan(B, T, 8, ctx, 132, cfg)["splits"] for T in (1, 2, 4, 8, 16, 64)}
        assert len({counts[T] for T in (1, 2, 4, 8, 16)}) == 1 and counts[64] < counts[1], (B, ctx, counts)
    return {name: f"{p['splits']} splits: merge {p['merge']}" for name, p in plans.items()}


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
                    tol=1e-2, path=None, config=None, with_add=False) -> float:
    """Kernel vs reference; with_add also passes a random [T, H] ``add`` (the shared experts' output)."""
    args = make_moe_inputs(T, E, H, I, top_k, device, int4, dtype, seed, skew)
    add = None
    if with_add:
        g = torch.Generator(device="cpu").manual_seed(seed + 1000)
        add = (torch.randn(T, H, generator=g) * 0.5).to(dtype).to(device)
    if int4:
        from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

        out = triton_fused_moe_int4(*args, 32, add, path=path, config=config)
        ref = kernels.ref_fused_moe_int4(*args, 32, add)
    else:
        out = kernels.fused_moe(*args, add, use_triton=True)
        ref = kernels.ref_fused_moe(*args, add)
    err = rel_err(out, ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape)
    assert err < tol, f"fused MoE rel err {err} ({T=} {E=} {H=} {I=} {top_k=} {int4=} {skew=} {path=} {with_add=})"
    return err


def check_moe_down_preload(T, E, H, I, top_k, seed=0, dtype=torch.bfloat16) -> float:
    """The INT4 GEMV MoE with the down kernel's PRELOAD tile against its slot loop on random inputs: one order of
    the sums (kernels/triton/exact.py) in two code shapes, so bit for bit, and both near the reference. (float32
    outputs show an order that differs in their last place; bf16 outputs mostly round it away.)"""
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    args = make_moe_inputs(T, E, H, I, top_k, "cpu", True, dtype, seed, False)
    outs = [triton_fused_moe_int4(*args, 32, None, path="gemv",
                                  config={"gate_up": GEMV_MID["gate_up"], "down": {**GEMV_DOWN_MASKED, "PRELOAD": pre}})
            for pre in (True, False)]
    ref = kernels.ref_fused_moe_int4(*args, 32, None)
    for out in outs:
        assert rel_err(out, ref) < 1e-2, f"{rel_err(out, ref)=}"
    assert torch.equal(outs[0], outs[1]), f"PRELOAD vs slot loop: {ulp_err(outs[0], outs[1])} ulps apart"
    return rel_err(outs[0], ref)


def check_moe_gemv_f16(T, E, H, I, top_k, seed=0, device="cpu", kernel="gate_up") -> dict:
    """The GEMV path with one kernel in packed fp16 (its config's F16; `kernel` "gate_up" or "down", the other in
    the fp32 form) against the fp32 form (same tiles) and a float64 reference, tokens sharing experts, bf16 inputs
    at scales 1 and 1/64 of x (|x| mostly 2^-8..2^-5, where an x scaled by much more than F16_X_SCALE would be
    subnormal) and, for down, 256 (act then ~2^16 times larger: past fp16's range unless each word of act is
    scaled). gate_up's products are exact (only the 4-product sums round), down rounds act to fp16 after a
    power-of-two scale per word: either way no further from the reference than the fp32 form plus half a bf16 ulp
    of the outputs' scale, and a token computed alone bit-identical to the same token in the batch (decode vs
    verify); for down also PRELOAD (every slot's weights as one tile) bit for bit equal to the slot loop. float32
    inputs: the launcher keeps the fp32 form (bit-identical to F16 off). (fp16 inputs: the exact cases.)"""
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    # (the other kernel in 32-row blocks: half GEMV_MID's programs under the interpreter, its paths the same)
    def run(args, f16, preload=False):
        if kernel == "gate_up":
            config = {"gate_up": {**GEMV_MID["gate_up"], "F16": f16}, "down": {**GEMV_MID["down"], "BLOCK_N": 32}}
        else:  # (I/8 words in one chunk, as PRELOAD needs)
            config = {"gate_up": {**GEMV_MID["gate_up"], "BLOCK_N": 32},
                      "down": {**GEMV_MID["down"], "BLOCK_W": I // 8, "PRELOAD": preload, "F16": f16}}
        return triton_fused_moe_int4(*args, 32, None, path="gemv", config=config)

    errs = {}
    scales = (1.0, 1 / 64) + ((256.0,) if kernel == "down" else ())
    for dtype, x_scale in [(torch.bfloat16, sc) for sc in scales] + [(torch.float32, 1.0)]:
        what = f"{kernel} {dtype} x{x_scale:g}"
        x, p13, s13, p2, s2, topk_w, ids = make_moe_inputs(T, E, H, I, top_k, device, True, dtype, seed, True)
        x = (x * x_scale).to(dtype)
        args = (x, p13, s13, p2, s2, topk_w, ids)
        ref = kernels.ref_fused_moe_int4(x.double(), p13, s13, p2, s2, topk_w.double(), ids, 32, None)
        f16, f32 = run(args, True), run(args, False)
        e16, e32 = (((out.double() - ref).abs().max() / ref.abs().max()).item() for out in (f16, f32))
        errs[what] = (e16, e32)
        if dtype == torch.float32:
            assert torch.equal(f16, f32), "float32 activations must keep the fp32 form"
            continue
        assert torch.isfinite(f16).all(), f"{what}: F16 overflowed"
        assert e16 <= e32 + 2**-9, f"{what}: F16 {e16} vs fp32 form {e32} of the outputs' scale off"
        if kernel == "down":
            pre = run(args, True, preload=True)
            assert torch.equal(pre, f16), f"{what}: F16 PRELOAD vs slot loop {ulp_err(pre, f16)} ulps apart"
        one = run((x[1:2], p13, s13, p2, s2, topk_w[1:2], ids[1:2]), True)
        assert torch.equal(one[0], f16[1]), f"{what}: a token alone differs from the same token in the batch"
    return errs


def check_fused_moe_int4_gemv_exact(T, E, H, I, top_k, device="cpu", seed=0, skew=False, dtype=torch.float32,
                                    config=None, path="gemv", small_act=False) -> float:
    """An INT4 MoE path (the GEMV path unless ``path`` says) bit for bit against a float64 re-implementation,
    on inputs whose sums are exact in float32 in any order: x in {1, 2}; gate nibbles q - 8 in {1, 2} at group
    scales 1/2 or 1, so every gate
    pre-activation is >= H/2 >= 17 and silu(g) = g * sigmoid(g) = g in float32; up and down nibbles in
    {-1, 0, 1} at scale 1; routing weights 1/2 or 1. Every value is then a multiple of 1/4, and the check
    asserts that the sums stay below 2^22. So any slip in the nibble order, in the 16^-(j % 5) pre-scaling of
    x or act, or in how x is split into nibble columns, changes the output.
    dtype: float32 under the interpreter (it truncates float32 -> bfloat16 instead of rounding).
    small_act (for down's packed fp16 form, which rounds act to fp16 after a power-of-two scale per word of 8):
    gate nibbles q - 8 = 1 at scale 1 (gate = sum of x, H..2H) and one nonzero up nibble (+-1) a row (up = +-1
    or +-2), so act is an integer of at most 4H < 512. A word whose largest |act| is in [2^a, 2^(a+1)) is
    scaled by 2^(9 - a) (a <= 8): its values become multiples of 2^(9 - a) under 2^10, and a lane's sum of 4 of
    them, under 2^12, keeps at most a + 3 <= 11 significant bits: exact in fp16, every step."""
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4
    from sglang_eagle3.kernels.quant import pack_int4, unpack_int4

    g = torch.Generator(device="cpu").manual_seed(seed)

    def ints(lo, hi, *shape):
        return torch.randint(lo, hi + 1, shape, generator=g)

    x = ints(1, 2, T, H).to(dtype)
    if small_act:
        assert 17 <= H < 128, f"{H=}: gate = sum of x must saturate the sigmoid and keep act < 512"
        up_q = torch.zeros(E, I, H, dtype=torch.int64).scatter_(2, ints(0, H - 1, E, I, 1), ints(0, 1, E, I, 1) * 2 - 1)
        p13 = pack_int4(torch.cat([torch.ones(E, I, H, dtype=torch.int64), up_q], dim=1))
        s13 = torch.ones(E, 2 * I, H // 32, dtype=torch.bfloat16)
    else:
        p13 = pack_int4(torch.cat([ints(1, 2, E, I, H), ints(-1, 1, E, I, H)], dim=1))  # [E, 2I, H/8]: gate, up
        s13 = torch.cat([ints(1, 2, E, I, H // 32) / 2, torch.ones(E, I, H // 32)], dim=1).to(torch.bfloat16)
    p2, s2 = pack_int4(ints(-1, 1, E, H, I)), torch.ones(E, H, I // 32, dtype=torch.bfloat16)
    pool = min(E, top_k + 1) if skew else E  # skew: tokens share experts
    ids = torch.stack([torch.randperm(pool, generator=g)[:top_k] for _ in range(T)]).to(torch.int32)
    w = ints(1, 2, T, top_k) / 2

    sel = ids.long()
    w13 = unpack_int4(p13, s13, 32).double()[sel]  # [T, k, 2I, H]
    gate, up = (w13 @ x.double()[:, None, :, None]).squeeze(-1).chunk(2, dim=-1)  # [T, k, I] each
    assert gate.min() >= 17, f"{gate.min()=}: the sigmoid must saturate (silu(g) = g in float32)"
    act = gate * up
    w2 = unpack_int4(p2, s2, 32).double()[sel]  # [T, k, H, I]
    ref = ((w2 @ act[..., None]).squeeze(-1) * w.double()[..., None]).sum(1)  # [T, H]
    bound = ((w2.abs() @ act.abs()[..., None]).squeeze(-1) * w.double()[..., None]).sum(1)
    assert max(bound.max(), act.abs().max()) < 2**22, f"{bound.max()=}: float32 sums of multiples of 1/4 could round"
    assert not small_act or act.abs().max() < 512, f"{act.abs().max()=}"

    args = [t.to(device) for t in (x, p13, s13, p2, s2, w, ids)]
    out = triton_fused_moe_int4(*args, 32, None, path=path, config=config)
    expected = ref.to(dtype)  # one rounding of the exact value, as the kernel's final store
    assert torch.isfinite(expected).all(), f"outputs overflow {dtype}"
    bad = (out.cpu() != expected).sum().item()
    assert bad == 0, (f"{bad} of {out.numel()} outputs differ from the exact result, max diff "
                      f"{(out.cpu().double() - ref).abs().max().item()} ({T=} {E=} {H=} {I=} {top_k=} {skew=})")
    return rel_err(out.cpu(), expected)


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


def set_kernels(model: torch.nn.Module, use_triton: bool | None) -> None:
    """use_triton on every module that has the switch (norms, rotary, attention, MoE)."""
    for m in model.modules():
        if hasattr(m, "use_triton"):
            m.use_triton = use_triton


def check_model_forward(device="cpu", dtype=torch.float32, tol=1e-5, B=2, S=5, seed=0, hidden=64) -> float:
    """A tiny Kimi-shaped model (q_lora, YaRN, MoE + shared expert, INT4 experts), every switchable op on its
    kernel vs every op on its reference: forward_dense with autograd off (MLA's in-place norm/rope path, fused
    MoE with T = B*S tokens), then the paged path (prefill, decode, verify of 3) through the model runner."""
    model = kimi_like_model(device, dtype, layers=2, hidden=hidden, seed=seed)
    cfg = model.config
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (B, S), generator=g).to(device)
    with torch.no_grad():
        set_kernels(model, False)
        ref, _ = model.forward_dense(ids)
        set_kernels(model, True)
        out, _ = model.forward_dense(ids)
    err = rel_err(out, ref)
    assert err < tol, f"model forward with kernels vs references: rel err {err} ({dtype=} {B=} {S=})"

    # The paged path: prefill of the B prompts, then one decode step and one verify of 3 tokens per request
    # (latents scattered into the cache by the norm/rope kernels, MLA and MoE kernels), eager.
    from sglang_eagle3.runtime.model_runner import ModelRunner

    page = 4
    pages_per_req = (S + 8) // page + 1
    runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=B * pages_per_req + 2, page_size=page,
                         max_context=pages_per_req * page, device=torch.device(device), dtype=dtype,
                         use_cuda_graph=False, cuda_graph_max_bs=B, verify_widths=(3,), attention_backend="auto")
    pages = [list(range(1 + b * pages_per_req, 1 + (b + 1) * pages_per_req)) for b in range(B)]
    logits = {}
    for use_triton in (False, True):
        set_kernels(model, use_triton)
        for kv in runner.target_kv.layers:
            kv.zero_()
        prompts = ids.tolist()
        bt = runner.build([(prompts[b], 0, pages[b]) for b in range(B)])
        prefill, _ = runner.target_extend(bt)
        bt = runner.build([([prompts[b][-1]], S, pages[b]) for b in range(B)])
        decode, _ = runner.target_uniform(bt, 1, verify=False)
        bt = runner.build([((prompts[b] * 3)[:3], S + 1, pages[b]) for b in range(B)])
        verify, _ = runner.target_uniform(bt, 3, verify=True)
        logits[use_triton] = (prefill, decode, verify)
    for name, k, r in zip(("prefill", "decode", "verify"), logits[True], logits[False], strict=True):
        e = rel_err(k, r)
        assert e < tol, f"paged {name} with kernels vs references: rel err {e} ({dtype=} {B=} {S=})"
        err = max(err, e)
    return err


def check_gemv_out_dtype(seed: int = 0) -> dict:
    """gemv into an ``out`` of another dtype than x's, without out_dtype: the kernel and the torch path give the
    same output (the products rounded once, into out's dtype; the reference once rounded them to x's dtype
    first, then copied)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(3, 300, generator=g).to(torch.bfloat16)
    w = (torch.randn(37, 300, generator=g) / math.sqrt(300)).to(torch.bfloat16)
    outs = [torch.full((3, 37), float("nan")) for _ in range(2)]
    kernels.gemv(x, w, out=outs[0], use_triton=True)
    kernels.gemv(x, w, out=outs[1], use_triton=False)
    exact = kernels.ref_gemv(x.double(), w.double())
    errs = [rel_err(o, exact) for o in outs]
    assert max(errs) < 1e-5, f"float32 out of a bf16 product: kernel {errs[0]}, torch path {errs[1]} from exact"
    return {"rel_err": errs}


def check_gemv(T, N, K, heads=1, layout="nk", epi=None, dtype=torch.bfloat16, config=None, device="cpu",
               seed=0, norm=False) -> dict:
    """The skinny GEMM against ref_gemv in float64 on the same inputs (outputs agree to their rounding), every
    element written (output poisoned first), rows independent of T (decode == verify for one token) and
    the split-K counters back at zero."""
    from sglang_eagle3.kernels.gemv import _COUNTERS, triton_gemv

    g = torch.Generator(device="cpu").manual_seed(seed)
    xs = (T, heads, K) if heads > 1 else (T, K)
    x = torch.randn(*xs, generator=g).to(dtype).to(device)
    if heads > 1 and layout == "kn":  # stored [h, K, N], used through its [h, N, K] view
        w = (torch.randn(heads, K, N, generator=g) / math.sqrt(K)).to(dtype).to(device).transpose(1, 2)
    else:
        w = (torch.randn(*((heads,) if heads > 1 else ()), N, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    w_up = (torch.randn(w.shape, generator=g) / math.sqrt(K)).to(dtype).to(device) if epi == "gated" else None
    if w_up is not None and heads > 1 and layout == "kn":
        w_up = w_up.transpose(1, 2).contiguous().transpose(1, 2)
    out_shape = (T, heads, N) if heads > 1 else (T, N)
    add = torch.randn(out_shape, generator=g).to(dtype).to(device) if epi == "add" else None
    out_dtype = torch.float32 if epi == "f32" else dtype
    out = torch.full(out_shape, float("nan"), dtype=out_dtype, device=device)
    nw = (1 + 0.3 * torch.randn(K, generator=g)).to(dtype).to(device) if norm else None
    kw = dict(norm_weight=nw, eps=1e-6) if norm else {}
    triton_gemv(x, w, w_up=w_up, add=add, out_dtype=out_dtype, out=out, config=config, **kw)
    d = (lambda t: None if t is None else t.double())  # noqa: E731
    # The normed x is rounded to x's dtype (as the RMSNorm kernel stores it) before the product.
    xr = kernels.ref_rms_norm(x, nw, 1e-6) if norm else x
    ref = kernels.ref_gemv(xr.double(), w.double(), w_up=d(w_up), add=d(add))
    # float32 out: sums of exact products; half out: one rounding (plus the rounded intermediates of the
    # gated SiLU * up, which the float64 reference does not round).
    # (Triton's interpreter casts float32 to bfloat16 by truncation, not to nearest: twice the error on CPU.)
    tol = {"f32": 1e-5, "gated": 2e-2}.get(epi, 3e-3 if x.is_cuda else (1e-2 if norm else 6e-3))
    err = rel_err(out, ref)
    assert out.dtype == out_dtype and err < tol, f"gemv rel err {err} >= {tol} ({T=} {N=} {K=} {heads=} {epi=})"
    one = triton_gemv(x[:1].contiguous(), w, w_up=w_up, add=None if add is None else add[:1].contiguous(),
                      out_dtype=out_dtype, config=config, **kw)
    assert torch.equal(one, out[:1]), "row 0 differs between T=1 and T>1"
    left = {str(d): int(c.abs().sum()) for d, c in _COUNTERS.items()}
    assert not any(left.values()), f"split-K counters not reset: {left}"
    return {"rel_err": err}


def check_gemv_pair(T, N1, N2, K, dtype=torch.bfloat16, config=None, device="cpu", seed=0, router=False) -> dict:
    """Two projections of one x from one launch (MLA's q_a and kv_a; with ``router``: float32 router logits and
    a gated shared-expert activation) equal the single-matrix GEMVs bit for bit when both run the same config,
    and match float64 products; counters reset."""
    from sglang_eagle3.kernels.gemv import _COUNTERS, triton_gemv, triton_gemv_pair

    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(dtype).to(device)
    w1 = (torch.randn(N1, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    w2 = (torch.randn(N2, K, generator=g) / math.sqrt(K)).to(dtype).to(device)
    w2_up = (torch.randn(N2, K, generator=g) / math.sqrt(K)).to(dtype).to(device) if router else None
    out1_dtype = torch.float32 if router else None
    y1, y2 = triton_gemv_pair(x, w1, w2, w2_up=w2_up, out1_dtype=out1_dtype, config=config)
    half_tol = 3e-3 if x.is_cuda else 6e-3
    checks = ((y1, w1, None, out1_dtype, 1e-5 if router else half_tol),
              (y2, w2, w2_up, None, 2e-2 if router else half_tol))
    errs = []
    for y, w, up, odt, tol in checks:
        ref = kernels.ref_gemv(x.double(), w.double(), w_up=None if up is None else up.double())
        err = rel_err(y, ref)
        assert err < tol, f"gemv pair rel err {err} >= {tol} ({T=} {N1=} {N2=} {K=} {router=})"
        if config is not None:
            single = triton_gemv(x, w, w_up=up, out_dtype=odt, config=config)
            assert torch.equal(y, single), "pair output != single GEMV with the same config"
        errs.append(err)
    assert y1.dtype == (out1_dtype or dtype) and y2.dtype == dtype, (y1.dtype, y2.dtype)
    left = {str(d): int(c.abs().sum()) for d, c in _COUNTERS.items()}
    assert not any(left.values()), f"split-K counters not reset: {left}"
    return {"rel_err": errs}


def check_padded_batch_rows(layers: int = 2, T: int = 4, bs: int = 3, pad_to: int = 8, seed: int = 0) -> float:
    """What a graph replay relies on: a verify step's real rows come out the same when the batch is padded to
    its bucket (padded requests attend to page 0, write slot 0) and the page table is as wide as the graph's,
    through every Triton kernel of the layer. Also no cache row outside slot 0 may differ."""
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.testing import randomize, tiny_config, verify_batch_on_cpu

    cfg = tiny_config(vocab=256, hidden=64, heads=4, layers=layers, q_lora=32, kv_lora=32, nope=16, rope=16, v=16,
                      experts=8, top_k=2, n_group=2, topk_group=1, moe_inter=32, inter=96, yarn=True, max_pos=512)
    model = DeepseekV3ForCausalLM(cfg, dtype=torch.float32)
    randomize(model, seed)
    runner, rows = verify_batch_on_cpu(model, T=T, bs=bs, dtype=torch.float32, backend="triton", num_pages=32,
                                       page_size=16, max_context=128, min_ctx=5, max_ctx=40, pages_per_req=4,
                                       seed=seed)

    def run(width, pad):
        saved = [kv.clone() for kv in runner.target_kv.layers]
        bt = runner.build(rows, width=width)
        ins = dict(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table, seq_lens=bt.seq_lens,
                   out_cache_loc=bt.out_cache_loc)
        n = pad - bs
        if n:
            z = torch.zeros(n * T, dtype=torch.int64)
            ins = dict(input_ids=torch.cat([ins["input_ids"], z]), positions=torch.cat([ins["positions"], z]),
                       out_cache_loc=torch.cat([ins["out_cache_loc"], z]),
                       page_table=torch.cat([ins["page_table"], torch.zeros(n, ins["page_table"].shape[1],
                                                                            dtype=torch.int32)]),
                       seq_lens=torch.cat([ins["seq_lens"], torch.full((n,), T, dtype=torch.int32)]))
        with torch.inference_mode():
            logits = runner.target_verify.fn(**ins, tokens_per_req=T)[0][: bs * T].clone()
        after = [kv.clone() for kv in runner.target_kv.layers]
        for kv, s0 in zip(runner.target_kv.layers, saved, strict=True):
            kv.copy_(s0)
        return logits, after

    before = [kv.clone() for kv in runner.target_kv.layers]
    exact, cache_e = run(None, bs)
    padded, cache_p = run(runner.max_pages, pad_to)
    # float32 torch GEMMs (the projections' reference path on CPU) block differently at another row count:
    # agreement to float32 rounding, not bit for bit.
    err = rel_err(padded, exact)
    assert err < 1e-5, f"padding changed the real rows' logits: rel err {err}"
    page = runner.page_size
    for b0, a, b in zip(before, cache_e, cache_p, strict=True):
        written_e = (a != b0).any(1)
        written_p = (b != b0).any(1)
        written_p[:page] = False  # the dummy page takes the padded tokens' writes
        assert torch.equal(written_p, written_e), "padding wrote cache rows outside the dummy page"
        assert rel_err(b[written_e], a[written_e]) < 1e-5, "padding changed the real tokens' cache rows"
    return err


def make_latent_inputs(N, H, C, R, slots, P, dtype, cache_dtype, device, g):
    """MLA's latent write inputs: q [N, H, 16 + R], kv_a [N, C + R], the kv_a norm weight [C], N distinct cache
    slots of `slots`, positions in [0, P), and a random cache [slots, C + R] in cache_dtype."""
    q = torch.randn(N, H, 16 + R, generator=g).to(dtype).to(device)
    kv_a = torch.randn(N, C + R, generator=g).to(dtype).to(device)
    w = (torch.rand(C, generator=g) + 0.5).to(dtype).to(device)
    loc = torch.randperm(slots, generator=g)[:N].to(device)
    pos = torch.randint(0, P, (N,), generator=g).to(device)
    cache0 = torch.randn(slots, C + R, generator=g).to(cache_dtype).to(device)
    return q, kv_a, w, loc, pos, cache0


def check_latent_to_cache(N, H, C, R, dtype=torch.bfloat16, cache_dtype=None, device="cpu", seed=0,
                          one_launch=False) -> float:
    """MLA's cache write: the kv_a norm scatters c into cache rows out_rows and the rope scatters k into the
    same rows (q rotated in place in the same launch); equals ref and leaves every other slot untouched.
    ``one_launch``: the norm runs inside the rotary launch (c_norm), as the MLA layer now calls it."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    cache_dtype = cache_dtype or dtype
    slots = 4 * N + 3
    P = 64
    freqs = torch.outer(torch.arange(P, dtype=torch.float64), 1.0 / 1000 ** (torch.arange(0, R, 2) / R))
    cos, sin = freqs.cos().float().to(device), freqs.sin().float().to(device)
    q, kv_a, w, loc, pos, cache0 = make_latent_inputs(N, H, C, R, slots, P, dtype, cache_dtype, device, g)
    outs = []
    for use_triton in (True, False):
        cache, qq, kv = cache0.clone(), q.clone(), kv_a.clone()
        c_norm = (kv[:, :C], w, 1e-6, cache[:, :C]) if one_launch and use_triton else None
        if c_norm is None:
            kernels.rms_norm(kv[:, :C], w, 1e-6, out=cache[:, :C], out_rows=loc, use_triton=use_triton)
        kernels.apply_rotary(qq[..., 16:], kv[:, C:], pos, cos, sin, interleaved=True, inplace=True,
                             k_out=cache[:, C:], k_out_rows=loc, c_norm=c_norm, use_triton=use_triton)
        assert torch.equal(kv, kv_a), "the source rows must stay as they were"
        outs.append((cache, qq))
    (cache_k, q_k), (cache_r, q_r) = outs
    others = torch.ones(slots, dtype=torch.bool)
    others[loc.cpu()] = False
    assert torch.equal(cache_k[others.to(device)], cache0[others.to(device)]), "wrote outside the given rows"
    # bf16 c within one rounding under the interpreter (it truncates), the rotated parts as in check_rotary.
    err = max(ulp_err(cache_k, cache_r), ulp_err(q_k, q_r))
    assert err <= (2.0 if dtype != torch.float32 else 4.0), f"latent to cache off by {err} ulp"
    return err


def kimi_like_model(device, dtype=torch.bfloat16, layers=2, hidden=256, seed=0, max_positions=256):
    """A small Kimi-shaped model (q_lora, YaRN, first layer dense, then MoE + shared expert, INT4 experts)
    with random weights, for wiring checks and launch counts; ``max_positions`` rows of rotary table (a pool
    longer than that is refused by ModelRunner)."""
    from sglang_eagle3.config import ModelConfig, RopeConfig
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.testing import randomize

    rope = RopeConfig(theta=50000.0, kind="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=32.0,
                      beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    cfg = ModelConfig(vocab_size=64, hidden_size=hidden, intermediate_size=96, moe_intermediate_size=32,
                      num_hidden_layers=layers, num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32,
                      qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=6,
                      num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                      norm_topk_prob=True, routed_scaling_factor=2.5, scoring_func="sigmoid", topk_method="noaux_tc",
                      rms_norm_eps=1e-6, max_position_embeddings=max_positions, rope=rope)
    torch.manual_seed(seed)
    with torch.device(device):
        model = DeepseekV3ForCausalLM(cfg, dtype=dtype, int4_experts=True)
    randomize(model, seed, 2.0)
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype == torch.int32:
                p.copy_(torch.randint(-2**31, 2**31 - 1, p.shape, generator=g, dtype=torch.int64).to(torch.int32))
            elif name.endswith("weight_scale"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.05)
    return model


def cuda_kernels_per_moe_layer(T: int = 1) -> dict:
    """CUDA kernels one eager decode (T=1) or verify step launches per MoE decoder layer, from the profiler:
    the step of a 5-layer model minus that of a 3-layer one, halved (both: 1 dense layer, then MoE)."""
    from torch.profiler import ProfilerActivity, profile

    from sglang_eagle3.runtime.model_runner import ModelRunner

    counts, names = {}, {}
    for layers in (3, 5):
        model = kimi_like_model("cuda", layers=layers)
        runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=8, page_size=16, max_context=96,
                             device=torch.device("cuda"), dtype=torch.bfloat16, use_cuda_graph=False,
                             cuda_graph_max_bs=1, verify_widths=(max(T, 2),), attention_backend="auto")
        bt = runner.build([(list(range(3, 3 + T)), 40, [1, 2, 3, 4])])
        runner.target_uniform(bt, T, verify=T > 1)  # compile outside the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner.target_uniform(bt, T, verify=T > 1)
            torch.cuda.synchronize()
        kernels_ = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        counts[layers] = len(kernels_)
        names[layers] = kernels_
    extra = list(names[5])
    for n in names[3]:
        if n in extra:
            extra.remove(n)
    return {"per_moe_layer": (counts[5] - counts[3]) / 2, "step_3_layers": counts[3], "step_5_layers": counts[5],
            "kernels_of_two_moe_layers": extra}


# GEMV-path configs small enough that the interpreter's loops run several partial steps.
GEMV_SMALL = {"gate_up": {"BLOCK_N": 4, "BLOCK_W": 8, "num_warps": 1},
              "down": {"BLOCK_N": 16, "BLOCK_W": 4, "num_warps": 1}}
# gate_up chunks of 16 words (H=160: one full chunk, then a partial one), in fewer programs than GEMV_SMALL.
GEMV_MID = {"gate_up": {"BLOCK_N": 16, "BLOCK_W": 16, "num_warps": 1}, "down": GEMV_SMALL["down"]}
GEMV_DOWN_MASKED = {"BLOCK_N": 64, "BLOCK_W": 4, "num_warps": 2, "PRELOAD": True}
# The dot path's gate_up at small tiles (16 rows of gate and of up, 8-word chunks), exact weights, 3 splits.
DOT_SMALL = {"gate_up": {"BLOCK_N": 16, "BLOCK_W": 8, "num_warps": 4, "EXACT": True, "SPLIT": 3},
             "down": GEMV_SMALL["down"]}

# Small irregular shapes for the interpreter: name -> thunk.
GEMV_SPLIT = {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT": 4, "num_warps": 4}
# Many short splits (the interpreter stays quick).
MLA_SPLIT = {"BLOCK_N": 16, "min_keys_per_split": 16}
MLA_FP32_SPLIT = {**MLA_SPLIT, "min_keys_per_split": 32}
# a table-like verify config (32-row blocks, 3 stages) with a short_split of 16-row blocks at 2 stages
MLA_SHORT = {**MLA_SPLIT, "BLOCK_M": 32, "ctas_per_sm": 1, "num_warps": 4, "num_stages": 3,
             "short_split": {"max_tiles": 2, "BLOCK_M": 16, "num_stages": 2}}

CASES = {
    "topk_kimi_like": lambda: check_moe_topk(5, 48, 8, 1, 1, True, True, 2.5, seed=1),
    "topk_order_ties": lambda: check_moe_topk_order(4, 40, 8, False, 9, seed=5),
    "topk_order_ties_bias_kimi": lambda: check_moe_topk_order(1, 384, 8, True, 23, seed=6),
    "topk_grouped": lambda: check_moe_topk(7, 64, 6, 8, 3, True, True, 1.0, seed=2),
    "topk_pruned_uneven_groups": lambda: check_moe_topk_pruned(5, 12, 6, 4, 2, 9, seed=int(time.time())),
    "topk_no_bias_no_renorm_bf16": lambda: check_moe_topk(3, 40, 4, 4, 2, False, False, 1.5,
                                                          dtype=torch.bfloat16, seed=3),
    "mla_decode": lambda: check_mla(3, 1, 3, 64, 16, 16, [1, 37, 70], seed=4),
    "mla_verify": lambda: check_mla(2, 4, 2, 64, 16, 8, [4, 53], seed=5),
    "mla_verify_rows_span_blocks": lambda: check_mla(1, 5, 5, 32, 16, 4, [29], seed=6),
    # float32: IEEE products (tuning.dot_precision), so within float32 rounding of the float32 reference.
    "mla_fp32_exact": lambda: check_mla(2, 3, 4, 64, 16, 4, [3, 45], seed=11, dtype=torch.float32, tol=1e-6),
    # Keys split over several programs and merged by the merge launch, calls in a row on one grid. Request 0
    # has fewer keys than splits (every split but the first is empty); 2 row blocks a request in the fp32 case.
    "mla_decode_split_kv_repeated": lambda: check_mla(3, 1, 3, 64, 16, 2, [1, 150, 333], seed=41, min_splits=5,
                                                      calls=3),
    "mla_verify_split_kv_more_splits_than_keys": lambda: check_mla(2, 4, 3, 64, 16, 4, [5, 260], seed=42,
                                                                   config=MLA_SPLIT, min_splits=16, calls=2),
    "mla_verify_split_kv_rows_span_blocks_fp32_exact": lambda: check_mla(
        2, 5, 5, 32, 16, 1, [7, 200], seed=43, dtype=torch.float32, tol=1e-6, config=MLA_FP32_SPLIT,
        min_splits=6, calls=2),
    # A page table far larger than the contexts (as a server's captured graphs have it): most of the splits
    # hold no key, store nothing, and the merge counts only the active ones (seq_lens shrinking between calls).
    "mla_split_kv_capacity_far_above_context": lambda: check_mla(
        3, 2, 3, 64, 16, 4, [2, 9, 41], seed=44, config=MLA_SPLIT, min_splits=8, calls=3, spare=40),
    # The merge's tile from the config (merge_tile values a program, merge_warps): 64 values over 16 padded splits
    # give 16-column blocks, four merge programs a row where the default tile has one.
    "mla_split_kv_merge_tile_config": lambda: check_mla(
        3, 2, 3, 64, 16, 4, [2, 9, 41], seed=46, config={**MLA_SPLIT, "merge_tile": 64, "merge_warps": 1},
        min_splits=8, calls=2, spare=40),
    # A prefill chunk (40 new tokens after 30 cached, 5 row blocks): each block's loop stops at its last row's
    # position, so the early blocks' later splits hold no visible key and store lse = -inf (fp32, exact).
    "mla_prefill_chunk_causal_fp32_exact": lambda: check_mla(
        2, 40, 2, 32, 16, 4, [70, 45], seed=47, dtype=torch.float32, tol=1e-6, config=MLA_FP32_SPLIT,
        min_splits=2, calls=2),
    "mla_launch_plan": check_mla_launch_plan,
    # A verify of 5 tokens (two 16-row blocks of 4 heads) splits a 1.2k context as the decode of each token does
    # (132 splits of 16 keys, with a 2240-key page table; when the split count followed the row blocks: 66 of 32).
    "mla_decode_verify_alike_fp32": lambda: check_mla_decode_verify_alike(
        5, 4, 32, 16, 16, 1150, dtype=torch.float32, spare=67, seed=61,
        config={"BLOCK_M": 16, "BLOCK_N": 16, "min_keys_per_split": 16, "ctas_per_sm": 1, "num_warps": 4,
                "num_stages": 2}),
    # short_split: a verify of 5 tokens of 4 heads (20 rows: one 32-row block, or two of 16 at another depth) in a
    # 2112-key table (132 splits of one 16-key tile at batch 1, 66 of two at batch 2): the same bits either way, and
    # decode == verify with it.
    "mla_short_split_same_bits_fp32": lambda: check_mla_short_split(
        2, 5, 4, 32, 16, 16, [1150, 300], MLA_SHORT, spare=59, seed=62),
    "mla_short_split_same_bits_bf16": lambda: check_mla_short_split(
        1, 5, 4, 32, 16, 16, [1150], MLA_SHORT, spare=59, dtype=torch.bfloat16, seed=63),
    "mla_short_split_decode_verify_alike_fp32": lambda: check_mla_decode_verify_alike(
        5, 4, 32, 16, 16, 1150, dtype=torch.float32, spare=59, seed=64, config=MLA_SHORT),
    # 16-key tiles over pages of 4 (a page id per key), of 16 and of 64 (the in-page form: a tile in one page), the
    # same keys: the same bits. Decode and a verify of 4 with splits (the verify's new rows straddle two tiles),
    # a prefill chunk, and a capacity far above the contexts.
    "mla_page_layouts_decode_split_fp32": lambda: check_mla_page_layouts(
        2, 1, 4, 64, 16, [77, 200], [4, 16, 64], MLA_SPLIT, seed=81),
    "mla_page_layouts_verify_split_bf16": lambda: check_mla_page_layouts(
        2, 4, 3, 32, 16, [57, 130], [4, 16, 64], MLA_SPLIT, dtype=torch.bfloat16, seed=82),
    "mla_page_layouts_prefill_chunk_fp32": lambda: check_mla_page_layouts(
        1, 40, 2, 32, 16, [70], [4, 16, 32], MLA_FP32_SPLIT, seed=83),
    "mla_page_layouts_capacity_far_above_context_fp32": lambda: check_mla_page_layouts(
        3, 2, 3, 32, 16, [2, 9, 41], [8, 16, 64], MLA_SPLIT, seed=84, capacity=256),
    "moe_bf16": lambda: check_fused_moe(3, 7, 96, 48, 3, int4=False, seed=7),
    "moe_bf16_shared_experts_add": lambda: check_fused_moe(9, 6, 64, 32, 2, int4=False, seed=8, skew=True,
                                                           with_add=True),
    "moe_int4": lambda: check_fused_moe(3, 7, 160, 96, 3, int4=True, seed=9),
    "moe_int4_over_one_chunk_add": lambda: check_fused_moe(20, 5, 128, 64, 2, int4=True, seed=10, skew=True,
                                                           with_add=True),
    "moe_fp32_exact": lambda: check_fused_moe(11, 5, 128, 64, 2, int4=False, seed=12, skew=True,
                                              dtype=torch.float32, tol=1e-5),
    "moe_int4_tile_fp32_exact": lambda: check_fused_moe(4, 9, 96, 160, 4, int4=True, seed=13,
                                                        dtype=torch.float32, tol=1e-5, path="tile"),
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
    # 20 q heads of 256 (16 a block of the launcher's 2048 elements): the head loop past the first block, in place.
    "rotary_neox_fp32_two_head_blocks": lambda: check_rotary(3, 20, 17, 256, False, torch.float32, inplace=True,
                                                             seed=42),
    # INT4 GEMV path (T <= GEMV_MAX_TOKENS): the default for decode/verify; fp32 checks the arithmetic tightly.
    "moe_int4_gemv_fp32_exact": lambda: check_fused_moe(3, 7, 96, 64, 3, int4=True, seed=22, dtype=torch.float32,
                                                        tol=1e-5, path="gemv", config=GEMV_SMALL),
    "moe_int4_gemv_bf16_shared_experts_add": lambda: check_fused_moe(6, 5, 64, 96, 2, int4=True, seed=23,
                                                                     skew=True, path="gemv", config=GEMV_SMALL,
                                                                     with_add=True),
    "moe_int4_gemv_default_config": lambda: check_fused_moe(2, 6, 64, 32, 4, int4=True, seed=24),
    # gate_up builds its nibble-major x from x itself (no prep launch): T from 1 to 8, experts shared by
    # several tokens, top-8 over many experts, H not a multiple of the x chunk (12 words in one 16-word chunk,
    # 20 in two), and the unmasked path over two chunks (EVEN: the prefetch past the end re-reads the last).
    "moe_int4_gemv_t1_fp16_top8_partial_chunk": lambda: check_fused_moe(1, 33, 96, 32, 8, int4=True, seed=44,
                                                                        dtype=torch.float16, path="gemv"),
    "moe_int4_gemv_t8_top8_shared_experts_add": lambda: check_fused_moe(8, 12, 160, 32, 8, int4=True, seed=45,
                                                                        skew=True, path="gemv", config=GEMV_MID,
                                                                        with_add=True),
    "moe_int4_gemv_exact_t1_top8_many_experts": lambda: check_fused_moe_int4_gemv_exact(1, 64, 96, 32, 8,
                                                                                       seed=46),
    "moe_int4_gemv_exact_t8_shared_experts": lambda: check_fused_moe_int4_gemv_exact(8, 12, 160, 32, 4, seed=47,
                                                                                    skew=True, config=GEMV_MID),
    "moe_int4_gemv_exact_t5_unmasked": lambda: check_fused_moe_int4_gemv_exact(5, 7, 256, 32, 2, seed=48,
                                                                              config=GEMV_MID),
    "moe_int4_gemv_exact_t3_fp16_unmasked": lambda: check_fused_moe_int4_gemv_exact(3, 9, 128, 32, 3, seed=49,
                                                                                   dtype=torch.float16,
                                                                                   config=GEMV_SMALL),
    # gate_up with the expert's first pair working for all its pairs (PER_PAIR=False), tokens sharing experts.
    "moe_int4_gemv_exact_t6_first_pair_works": lambda: check_fused_moe_int4_gemv_exact(
        6, 8, 160, 32, 3, seed=50, skew=True,
        config={"gate_up": {**GEMV_MID["gate_up"], "PER_PAIR": False}, "down": GEMV_MID["down"]}),
    # gate_up in packed fp16 (F16, a config key, for 16-bit activations; under the interpreter its emulation in
    # plain ops): bit for bit on exact fp16 inputs (a partial chunk, several unmasked chunks, the expert's first
    # pair working for all), and on random inputs near the reference and within a few fp16 roundings of the fp32
    # form (float32 activations use the fp32 form whatever the config says: checked there too).
    "moe_int4_gemv_exact_t3_f16_partial_chunk": lambda: check_fused_moe_int4_gemv_exact(
        3, 9, 96, 32, 4, seed=53, dtype=torch.float16,
        config={"gate_up": {**GEMV_MID["gate_up"], "F16": True}, "down": GEMV_MID["down"]}),
    "moe_int4_gemv_exact_t7_f16_unmasked": lambda: check_fused_moe_int4_gemv_exact(
        7, 10, 128, 32, 2, seed=54, skew=True, dtype=torch.float16,
        config={"gate_up": {**GEMV_SMALL["gate_up"], "F16": True}, "down": GEMV_SMALL["down"]}),
    "moe_int4_gemv_exact_t5_f16_first_pair_works": lambda: check_fused_moe_int4_gemv_exact(
        5, 8, 96, 32, 3, seed=55, skew=True, dtype=torch.float16,
        config={"gate_up": {**GEMV_MID["gate_up"], "PER_PAIR": False, "F16": True}, "down": GEMV_MID["down"]}),
    "moe_int4_gemv_f16_vs_fp32_form": lambda: check_moe_gemv_f16(3, 8, 160, 32, 3, seed=56),
    # down in packed fp16 (F16 in the down config; gate_up stores act for it, a power-of-two scale per word):
    # bit for bit on act values exact in that form (the slot loop and PRELOAD, with gate_up's F16 too), and on
    # random inputs near the reference at three scales of x, and within a few fp16 roundings of the fp32 form.
    "moe_int4_gemv_exact_t4_f16_down_slot_loop": lambda: check_fused_moe_int4_gemv_exact(
        4, 9, 96, 64, 4, seed=57, skew=True, dtype=torch.float16, small_act=True,
        config={"gate_up": GEMV_MID["gate_up"], "down": {**GEMV_SMALL["down"], "F16": True}}),
    "moe_int4_gemv_exact_t3_f16_gate_up_and_down_preload": lambda: check_fused_moe_int4_gemv_exact(
        3, 20, 96, 32, 8, seed=58, skew=True, dtype=torch.float16, small_act=True,
        config={"gate_up": {**GEMV_MID["gate_up"], "F16": True}, "down": {**GEMV_DOWN_MASKED, "F16": True}}),
    "moe_int4_gemv_f16_down_vs_fp32_form": lambda: check_moe_gemv_f16(3, 8, 96, 64, 2, seed=59, kernel="down"),
    # down with every slot's weights loaded as one tile (PRELOAD, a config key: top_k a power of two and I/8 in
    # one chunk) against the slot loop, on rows past H (BLOCK_N 64 over H=96: the masked path).
    "moe_int4_gemv_exact_t4_top8_down_preload_masked": lambda: check_fused_moe_int4_gemv_exact(
        4, 20, 96, 32, 8, seed=51, skew=True, config={"gate_up": GEMV_MID["gate_up"], "down": GEMV_DOWN_MASKED}),
    "moe_int4_gemv_exact_t4_top8_down_slot_loop": lambda: check_fused_moe_int4_gemv_exact(
        4, 20, 96, 32, 8, seed=51, skew=True,
        config={"gate_up": GEMV_MID["gate_up"], "down": {**GEMV_DOWN_MASKED, "PRELOAD": False}}),
    "moe_int4_gemv_t2_bf16_top4_down_preload_vs_slot_loop": lambda: check_moe_down_preload(2, 9, 224, 32, 4, seed=52),
    "moe_int4_gemv_t3_fp32_top8_down_preload_vs_slot_loop": lambda: check_moe_down_preload(3, 11, 160, 32, 8, seed=60,
                                                                                          dtype=torch.float32),
    # The dot path (gate_up as tl.dot over each expert's pairs, the GEMV down): bit for bit on exact sums, with
    # tokens sharing experts (more pairs on an expert than a 16-row block at T=20: the block loop), H split
    # over programs (3 splits of 8, 8 and 4 words: masked; 2 of 16: unmasked), the weights exact (fp32) or bf16.
    "moe_int4_dot_exact_t6_split3_masked": lambda: check_fused_moe_int4_gemv_exact(
        6, 8, 160, 32, 3, seed=60, skew=True, path="dot", config=DOT_SMALL),
    "moe_int4_dot_exact_t20_row_blocks_split2_bf16": lambda: check_fused_moe_int4_gemv_exact(
        20, 8, 256, 32, 3, seed=61, skew=True, path="dot",
        config={"gate_up": {**DOT_SMALL["gate_up"], "SPLIT": 2, "BLOCK_M": 16, "EXACT": False},
                "down": {**DOT_SMALL["down"], "BLOCK_N": 64}}),  # (down in 4 programs a token, not 16: still EVEN)
    "moe_int4_dot_bf16_vs_reference_add": lambda: check_fused_moe(5, 9, 160, 64, 4, int4=True, seed=62, path="dot",
                                                                  config=DOT_SMALL, with_add=True),
    "latent_to_cache_bf16": lambda: check_latent_to_cache(5, 3, 64, 16, seed=26),
    "latent_to_cache_one_launch_bf16": lambda: check_latent_to_cache(4, 3, 48, 16, seed=39, one_launch=True),
    "latent_to_cache_fp32_into_bf16_cache": lambda: check_latent_to_cache(3, 2, 32, 8, torch.float32,
                                                                          torch.bfloat16, seed=27),
    # Skinny GEMM of the dense projections: split-K in one launch, every epilogue, both weight layouts.
    "gemv_plain_split": lambda: check_gemv(3, 37, 300, config=GEMV_SPLIT, seed=28),
    "gemv_out_dtype_from_out": lambda: check_gemv_out_dtype(seed=29),
    "gemv_residual_add_default_config": lambda: check_gemv(1, 50, 96, epi="add", seed=29),
    "gemv_gated_fp16_split": lambda: check_gemv(5, 24, 200, epi="gated", dtype=torch.float16, config=GEMV_SPLIT,
                                                seed=30),
    "gemv_fp32_out_t16": lambda: check_gemv(16, 40, 130, epi="f32", config=GEMV_SPLIT, seed=31),
    "gemv_heads_n_contiguous": lambda: check_gemv(2, 48, 40, heads=3, layout="kn", config=GEMV_SPLIT, seed=32),
    "gemv_heads_k_contiguous": lambda: check_gemv(4, 20, 72, heads=2, seed=33),
    "gemv_rmsnorm_prologue_split": lambda: check_gemv(3, 40, 96, config=GEMV_SPLIT, seed=36, norm=True),
    "gemv_pair_split": lambda: check_gemv_pair(3, 40, 24, 130, config=GEMV_SPLIT, seed=34),
    "gemv_pair_default_config": lambda: check_gemv_pair(1, 33, 17, 64, seed=35),
    "gemv_pair_router_shared_split": lambda: check_gemv_pair(4, 48, 20, 100, config=GEMV_SPLIT, seed=37,
                                                             router=True),
    "gemv_pair_router_shared_default": lambda: check_gemv_pair(2, 30, 24, 80, seed=38, router=True),
    # What graph replays rely on: padding a batch to its bucket leaves the real rows alone, every kernel.
    "padded_batch_rows_unchanged": lambda: check_padded_batch_rows(seed=40),
    # The layers' wiring: norms in place in kv_a, q+k rope in one launch, MoE kernels, all vs references.
    "model_forward_kernels_fp32": lambda: check_model_forward(B=1, S=3, seed=25),
}

# Cases of newer kernels live in modules of their own (one per area), merged here so that the interpreter run and
# the GPU suite see one table.
# (imported by path from here, so that `tests.kernels.kernel_checks` imported as a package module finds them too)
sys.path.insert(0, str(Path(__file__).resolve().parent))
for _module in ("fold_checks", "gemv_fma_checks", "gqa_checks", "mla_prefill_checks", "mla_rope_checks",
                "moe_rows_checks", "moe_tile_checks", "sampling_checks"):
    CASES.update(__import__(_module).CASES)

if __name__ == "__main__":
    # One JSON line per case: {"case", "ok", "detail"}; a failing case does not stop the others.
    # "seconds": the case's own time, so the slow ones can be found (the interpreter is most of the CPU suite).
    for name in sys.argv[1:] or list(CASES):
        t0 = time.perf_counter()
        try:
            result = CASES[name]()
            row = {"case": name, "ok": True, "detail": result}
        except Exception:
            row = {"case": name, "ok": False, "detail": traceback.format_exc()}
        print(json.dumps({**row, "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
