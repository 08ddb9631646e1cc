"""Cases for MLA prefill in the non-absorbed form (kernels.mla_mha_prefill: the keys and values decompressed into a
slot-indexed scratch, then the split kernel with one kv head a query head), against ref_mla_mha_prefill; and that
reference against the absorbed one (the two forms are one function of the cache). Merged into kernel_checks.CASES:
the interpreter runs them on CPU, the GPU suite at Kimi's shapes.
"""

from __future__ import annotations

import math

import torch

from sglang_eagle3 import kernels


def make_mha_prefill_inputs(B, T, H, D, Dr, Dc, page_size, seq_lens, device, dtype=torch.bfloat16, seed=0, spare=1):
    """Random q, latent cache and kv_b weight; a shuffled page table with ``spare`` unused page columns; a scratch
    full of NaN (a key the kernel did not decompress, read by the attention, poisons the output)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    P = max(1, math.ceil(max(seq_lens) / page_size)) + spare
    num_pages = B * P + 3
    perm = torch.randperm(num_pages, generator=g)[: B * P].view(B, P).to(torch.int32)
    kv = torch.randn(num_pages * page_size, Dc + Dr, generator=g)
    w = torch.randn(H * 2 * D, Dc, generator=g) / math.sqrt(Dc)
    qn = torch.randn(B * T, H, D, generator=g) * 0.3
    qr = torch.randn(B * T, H, Dr, generator=g) * 0.3
    scratch = torch.full((num_pages * page_size, kernels.mha_scratch_width(H, D, Dr, D)), float("nan"))
    return [t.to(dtype).to(device) for t in (qn, qr, kv, w, scratch)] + [perm.to(device), seq.to(device)]


def check_mha_prefill(B, T, H, D, Dr, Dc, page_size, seq_lens, device="cpu", seed=0, dtype=torch.bfloat16,
                      tol=1e-2, config=None, calls=1, spare=1, min_splits=1) -> dict:
    """Kernel vs ref_mla_mha_prefill, ``calls`` calls on one grid with new inputs and seq_lens 3 shorter each
    (graph replays); ``min_splits``: the attention must split the keys at least so many ways (the merge runs)."""
    from kernel_checks import rel_err

    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=1.0 / math.sqrt(D + Dr))
    dev = torch.device(device)
    cfg = {**tuning.DEFAULTS["mla_mha_prefill"], **(config or {})}
    if not config:
        cfg = tuning.get_config("mla_mha_prefill", dev, "tokens", T)
    errs, plan = [], {}
    for call in range(calls):
        qn, qr, kv, w, scratch, pt, seq = make_mha_prefill_inputs(B, T, H, D, Dr, Dc, page_size, seq_lens, device,
                                                                  dtype, seed + call, spare)
        seq = (seq - 3 * call).clamp_min(T)
        plan = launch_plan(B, T, 1, pt.shape[1] * page_size, tuning.sm_count(dev), cfg, H)
        if config:
            out = kernels.triton_mla_mha_prefill(qn, qr, kv, w, scratch, pt, seq, **kw, config=cfg)
        else:
            out = kernels.mla_mha_prefill(qn, qr, kv, w, scratch, pt, seq, **kw, use_triton=True)
        ref = kernels.ref_mla_mha_prefill(qn, qr, kv, w, pt, seq, **kw)
        assert out.shape == ref.shape == (B * T, H, D) and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype)
        err = rel_err(out, ref)
        assert err < tol, f"MHA prefill rel err {err} ({call=} {B=} {T=} {H=} {seq.tolist()=} {page_size=} {plan=})"
        errs.append(err)
    assert plan["splits"] >= min_splits, f"{plan=}: fewer than {min_splits=} splits, the case misses the merge"
    return {"rel_err": errs, "plan": plan}


def check_mha_equals_absorbed(B=2, T=5, H=3, D=16, Dr=8, Dc=24, Dv=12, page_size=4, seq_lens=(5, 13), seed=0) -> float:
    """The two forms of MLA are one function of the cache: in float64, ref_mla_mha_prefill equals
    ref_mla_attention on q_nope W_UK with its output taken through W_UV (D != Dv: the reference's general case)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    P = math.ceil(max(seq_lens) / page_size) + 1
    pt = torch.randperm(B * P + 2, generator=g)[: B * P].view(B, P).to(torch.int32)
    kv = torch.randn((B * P + 2) * page_size, Dc + Dr, generator=g, dtype=torch.float64)
    w = torch.randn(H, D + Dv, Dc, generator=g, dtype=torch.float64) / math.sqrt(Dc)
    qn = torch.randn(B * T, H, D, generator=g, dtype=torch.float64)
    qr = torch.randn(B * T, H, Dr, generator=g, dtype=torch.float64)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=0.37)
    mha = kernels.ref_mla_mha_prefill(qn, qr, kv, w.reshape(H * (D + Dv), Dc), pt, seq, **kw)
    q_latent = torch.einsum("thd,hdc->thc", qn, w[:, :D])
    latent_out = kernels.ref_mla_attention(q_latent, qr, kv, pt, seq, **kw)  # [B*T, H, Dc]
    absorbed = torch.einsum("thc,hvc->thv", latent_out, w[:, D:])
    err = (mha - absorbed).abs().max().item()
    assert err < 1e-10, f"MHA and absorbed references differ by {err}"
    return err


def check_mha_prefill_dispatch() -> dict:
    """Head widths the kernel cannot take (nope != v, or not powers of two >= 16) and float64 inputs go to the
    reference with use_triton=True (the same numbers as calling it)."""
    out = {}
    for D, Dr, dtype in ((16, 8, torch.float32), (24, 16, torch.float32), (16, 16, torch.float64)):
        qn, qr, kv, w, scratch, pt, seq = make_mha_prefill_inputs(2, 3, 2, D, Dr, 32, 4, [3, 9], "cpu", dtype)
        kw = dict(tokens_per_req=3, page_size=4, kv_lora_rank=32, sm_scale=0.3)
        got = kernels.mla_mha_prefill(qn, qr, kv, w, scratch, pt, seq, **kw, use_triton=True)
        assert torch.equal(got, kernels.ref_mla_mha_prefill(qn, qr, kv, w, pt, seq, **kw)), (D, Dr, dtype)
        out[f"D={D} Dr={Dr} {dtype}"] = "reference"
    return out


def check_mha_prefill_model(device="cpu", dtype=torch.float32, tol=1e-5, seed=0) -> float:
    """A tiny Kimi-shaped model (nope = v = 16, rope 16, latent 32: widths the kernel takes) through the model
    runner: a ragged prefill of three prompts (11 and 6 tokens from position 0, 9 tokens over a 7-token prefix)
    with every op on its kernel and the MHA form from 8 tokens a request, against every op on its reference and
    the absorbed form; then a decode step over those caches, which must agree too."""
    from kernel_checks import kimi_like_model, rel_err, set_kernels

    from sglang_eagle3.runtime.model_runner import ModelRunner

    model = kimi_like_model(device, dtype, layers=2, hidden=64, seed=seed)
    V, page, per_req = model.config.vocab_size, 4, 6
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    prefix = torch.randint(0, V, (7,), generator=g).tolist()
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (11, 6, 9)]
    first = [0, 0, len(prefix)]
    pages = [list(range(1 + b * per_req, 1 + (b + 1) * per_req)) for b in range(3)]
    logits = {}
    for use_triton, mha in ((False, 0), (True, 8)):
        runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=3 * per_req + 2, page_size=page,
                             max_context=per_req * page, device=torch.device(device), dtype=dtype,
                             use_cuda_graph=False, cuda_graph_max_bs=3, verify_widths=(2,), attention_backend="auto",
                             mha_prefill_tokens=mha)
        set_kernels(model, use_triton)
        runner.target_extend(runner.build([(prefix, 0, pages[2])]))  # the third request's prefix (7 < 8: absorbed)
        rows = list(zip(prompts, first, pages, strict=True))
        prefill, _ = runner.target_extend(runner.build(rows))
        bt = runner.build([([p[-1]], f + len(p), pg) for p, f, pg in rows])
        decode, _ = runner.target_uniform(bt, 1, verify=False)
        logits[use_triton] = (prefill, decode)
    model.set_mha_prefill(0)
    err = 0.0
    for name, k, r in zip(("prefill", "decode"), logits[True], logits[False], strict=True):
        e = rel_err(k, r)
        assert e < tol, f"paged {name}, MHA prefill on kernels vs absorbed on references: rel err {e} ({dtype=})"
        err = max(err, e)
    return err


def check_mha_prefill_padded_rope_in_kernel(device="cpu", dtype=torch.float32, tol=1e-5, seed=0) -> dict:
    """The prefill graphs' uniform PREFILL forward (prompts padded to a 16-token bucket, one over a prefix) with
    every launch fusion on, q_rope_attn included: the MHA form receives q's rope un-rotated and the kernel rotates
    it (the rotary launch writes only k). Its real rows' hidden states against the ragged prefill of the same
    prompts with the default fusions, every op on its reference, the absorbed form."""
    from kernel_checks import kimi_like_model, rel_err, set_kernels

    from sglang_eagle3 import env
    from sglang_eagle3.core import ForwardMode
    from sglang_eagle3.runtime.model_runner import ModelRunner

    page, per_req, bucket = 4, 8, 16
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    hidden, calls = {}, []
    for fused in (False, True):
        with env.overrides({env.NO_FUSE.name: "" if fused else None}):  # the layers read it while built
            model = kimi_like_model(device, dtype, layers=2, hidden=64, seed=seed)
        V = model.config.vocab_size
        if not fused:
            prefix = torch.randint(0, V, (7,), generator=g).tolist()
            prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (11, 9)]
        runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=2 * per_req + 2, page_size=page,
                             max_context=per_req * page, device=torch.device(device), dtype=dtype,
                             use_cuda_graph=False, cuda_graph_max_bs=2, verify_widths=(2,), attention_backend="auto",
                             mha_prefill_tokens=8 if fused else 0)
        set_kernels(model, fused)
        pages = [list(range(1 + b * per_req, 1 + (b + 1) * per_req)) for b in range(2)]
        runner.target_extend(runner.build([(prefix, 0, pages[1])]))  # request 1's prefix, absorbed (7 tokens)
        rows = [(prompts[0], 0, pages[0]), (prompts[1], len(prefix), pages[1])]
        with torch.inference_mode():
            if fused:
                bt = runner.build(rows, width=runner.max_pages, pad_to=bucket)
                original = kernels.mla_mha_prefill

                def recording(*args, original=original, **kw):
                    calls.append(kw.get("rope") is not None)
                    return original(*args, **kw)

                kernels.mla_mha_prefill = recording
                try:
                    out = runner._prefill_fn(ForwardMode.PREFILL)(
                        bt.input_ids, bt.positions, bt.page_table, bt.seq_lens, bt.out_cache_loc,
                        runner.to_device([bucket - 1, 2 * bucket - 1]), bucket)
                finally:
                    kernels.mla_mha_prefill = original
                h = out[1].view(2, bucket, -1)
                hidden[fused] = torch.cat([h[0, :len(prompts[0])], h[1, :len(prompts[1])]])
            else:
                bt = runner.build(rows)
                fb = runner._fb(runner.target_kv, ForwardMode.EXTEND, bt.page_table, bt.seq_lens, bt.out_cache_loc, 1,
                                bt.extend_lens)
                hidden[fused] = model.model(bt.input_ids, bt.positions, fb, ())[0]
        model.set_mha_prefill(0)
    assert calls and all(calls), f"the MHA form ran {len(calls)} times, with q's rope left to it: {calls}"
    err = rel_err(hidden[True], hidden[False])
    assert err < tol, f"padded PREFILL, MHA with rope in the kernel vs ragged absorbed references: rel err {err}"
    return {"rel_err": err, "mha_calls": len(calls)}


SMALL = dict(H=2, D=16, Dr=16, Dc=32)
CASES = {
    "mha_prefill_equals_absorbed_float64": check_mha_equals_absorbed,
    "mha_prefill_dispatch": check_mha_prefill_dispatch,
    # A padded prefill chunk over a prefix (keys before the chunk), pages partially filled, capacity above it.
    "mha_prefill_chunk_over_prefix": lambda: check_mha_prefill(2, 20, **SMALL, page_size=8, seq_lens=[20, 57],
                                                               seed=3, config=dict(BLOCK_M=16, decompress_block_n=16)),
    "mha_prefill_fp32_split_merge": lambda: check_mha_prefill(
        1, 6, **SMALL, page_size=4, seq_lens=[90], seed=5, dtype=torch.float32, tol=1e-5, calls=2,
        config=dict(BLOCK_M=16, BLOCK_N=16, min_keys_per_split=16, ctas_per_sm=4, decompress_block_n=32), min_splits=3),
    "mha_prefill_default_config_rope_in_kernel": lambda: check_mha_prefill_rope(seed=7),
    # 16-key tiles in pages of 16: the split kernel's in-page addressing over the decompressed scratch.
    "mha_prefill_in_page_tiles_fp32": lambda: check_mha_prefill(
        1, 6, **SMALL, page_size=16, seq_lens=[90], seed=13, dtype=torch.float32, tol=1e-5, calls=2,
        config=dict(BLOCK_M=16, BLOCK_N=16, min_keys_per_split=16, ctas_per_sm=4, decompress_block_n=32), min_splits=3),
    "mha_prefill_model_kernels_fp32": lambda: check_mha_prefill_model(seed=9),
    "mha_prefill_padded_rope_in_kernel_fp32": lambda: check_mha_prefill_padded_rope_in_kernel(seed=11),
}


def check_mha_prefill_rope(seed=0) -> float:
    """With rope = (cos, sin) the kernel rotates q's rope columns as it loads them: equal to the reference
    rotating them first."""
    from kernel_checks import rel_err

    B, T, H, D, Dr, Dc, page_size, seq_lens = 2, 9, 2, 16, 16, 32, 4, [9, 30]
    qn, qr, kv, w, scratch, pt, seq = make_mha_prefill_inputs(B, T, H, D, Dr, Dc, page_size, seq_lens, "cpu",
                                                              torch.float32, seed)
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(64, Dr // 2, generator=g) * 6.0
    rope = (angles.cos(), angles.sin())
    positions = (seq.long()[:, None] - T + torch.arange(T)[None, :]).reshape(-1)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=0.25, rope=rope, positions=positions)
    out = kernels.mla_mha_prefill(qn, qr, kv, w, scratch, pt, seq, **kw, use_triton=True)
    ref = kernels.ref_mla_mha_prefill(qn, qr, kv, w, pt, seq, **kw)
    err = rel_err(out, ref)
    assert err < 1e-5, f"MHA prefill with rope in the kernel: rel err {err}"
    return err
