"""Cases for the paged grouped-query attention (the EAGLE-3 draft's; the MLA split kernel with separate value
rows), checked against ref_gqa_attention. Merged into kernel_checks.CASES: the interpreter runs them on CPU,
the GPU suite at the draft's real shapes.
"""

from __future__ import annotations

import math

import torch

from sglang_eagle3 import kernels


def make_gqa_inputs(B, T, Hq, Hkv, D, page_size, seq_lens, device, dtype=torch.bfloat16, seed=0, spare=1):
    """Random q and draft KV pool [slots, 2, Hkv, D], a shuffled page table with ``spare`` unused page columns
    (capacity above the contents, as a server's graphs have it), partially filled last pages. The pool holds
    pages no request owns, filled with large values: a kernel reading past a request's keys shows up."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    P = max(1, math.ceil(max(seq_lens) / page_size)) + spare
    num_pages = B * P + 3
    perm = torch.randperm(num_pages, generator=g)[: B * P].view(B, P).to(torch.int32)
    kv = torch.randn(num_pages * page_size, 2, Hkv, D, generator=g)
    owned = torch.zeros(num_pages, dtype=torch.bool)
    for b, n in enumerate(seq_lens):
        owned[perm[b, : math.ceil(n / page_size)].long()] = True
    kv.view(num_pages, page_size, 2, Hkv, D)[~owned] = 1e4  # never visible to any query
    q = torch.randn(B * T, Hq, D, generator=g) * 0.3
    return [t.to(device) for t in (q.to(dtype), kv.to(dtype), perm, seq)]


def check_gqa(B, T, Hq, Hkv, D, page_size, seq_lens, device="cpu", seed=0, dtype=torch.bfloat16, tol=1e-2,
              config=None, min_splits=1, calls=1, spare=1) -> dict:
    """Kernel vs ref_gqa_attention. ``config``: launch overrides (else the op's config); ``min_splits``: the launch
    must split the keys at least this many ways (so the merge runs); ``calls``: calls in a row on one grid, each on
    new inputs with seq_lens 3 shorter (as graph replays have it); every one must match."""
    from kernel_checks import rel_err

    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan

    kw = dict(tokens_per_req=T, page_size=page_size, sm_scale=1.0 / math.sqrt(D))
    dev = torch.device(device)
    cfg = {**tuning.DEFAULTS["gqa_attention"], **config} if config else tuning.get_config(
        "gqa_attention", dev, "rows", T * Hq // Hkv)
    errs, plan = [], {}
    for call in range(calls):
        q, kv, pt, seq = make_gqa_inputs(B, T, Hq, Hkv, D, page_size, seq_lens, device, dtype, seed + call, spare)
        seq = (seq - 3 * call).clamp_min(T)
        plan = launch_plan(B, T, Hq // Hkv, pt.shape[1] * page_size, tuning.sm_count(dev), cfg, Hkv)
        if config:
            out = kernels.triton_gqa_attention(q, kv, pt, seq, **kw, config=cfg)
        else:
            out = kernels.gqa_attention(q, kv, pt, seq, **kw, use_triton=True)
        ref = kernels.ref_gqa_attention(q, kv, pt, seq, **kw)
        assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype)
        err = rel_err(out, ref)
        assert err < tol, f"GQA rel err {err} ({call=} {B=} {T=} {Hq=} {Hkv=} {seq.tolist()=} {page_size=} {plan=})"
        errs.append(err)
    assert plan["splits"] >= min_splits, f"{plan=}: fewer than {min_splits=} splits, the case misses the merge"
    return {"rel_err": errs, "plan": plan}


def check_gqa_dispatch() -> dict:
    """The op's dispatch: head dims tl.dot cannot take (not a power of two, or < 16) go to the reference
    (same numbers as calling it), as do float64 inputs; use_triton=False forces the reference."""
    out = {}
    for D, dtype, use in ((24, torch.float32, True), (8, torch.float32, True), (32, torch.float64, True),
                          (32, torch.float32, False)):
        q, kv, pt, seq = make_gqa_inputs(2, 2, 4, 2, D, 4, [5, 11], "cpu", dtype, seed=D)
        kw = dict(tokens_per_req=2, page_size=4, sm_scale=0.3)
        got = kernels.gqa_attention(q, kv, pt, seq, **kw, use_triton=use)
        assert torch.equal(got, kernels.ref_gqa_attention(q, kv, pt, seq, **kw)), (D, dtype, use)
        out[f"D={D} {dtype} use_triton={use}"] = "reference"
    return out


def check_draft_forward(device="cpu", dtype=torch.float32, tol=1e-5, B=2, S=5, seed=0) -> float:
    """A tiny EAGLE-3 draft (4 query heads on 2 kv heads, head_dim 16) on a tiny Kimi-shaped target, through the
    model runner's paged draft forwards (graphs off): the ragged extend over the prompts, a decode step, an extend
    of 3 a request; its kernels (attention, norms, rotary, GEMVs: draft.set_kernel_backends("triton")) against
    its references ("torch"), from the same cache contents."""
    from kernel_checks import kimi_like_model, rel_err

    from sglang_eagle3.models.eagle3 import Eagle3Draft
    from sglang_eagle3.runtime.model_runner import ModelRunner
    from sglang_eagle3.testing import randomize, tiny_draft_config

    target = kimi_like_model(device, dtype, layers=2, hidden=64, seed=seed)
    draft = randomize(Eagle3Draft(tiny_draft_config(target.config, heads=4, kv_heads=2), dtype=dtype), seed + 1)
    draft = draft.to(device)
    hd = target.config.hidden_size
    page = 4
    pages_per_req = (S + 8) // page + 1
    runner = ModelRunner(target, draft, aux_layer_ids=(0, 1, 1), num_pages=B * pages_per_req + 2, page_size=page,
                         max_context=pages_per_req * page, device=torch.device(device), dtype=dtype,
                         use_cuda_graph=False, cuda_graph_max_bs=B, verify_widths=(3,), attention_backend="auto")
    g = torch.Generator(device="cpu").manual_seed(seed + 2)
    prompts = torch.randint(0, target.config.vocab_size, (B, S), generator=g).tolist()
    aux = (torch.randn(B * S, 3 * hd, generator=g) * 0.5).to(dtype).to(device)  # the target's three aux states
    pages = [list(range(1 + b * pages_per_req, 1 + (b + 1) * pages_per_req)) for b in range(B)]
    outs = {}
    for backend in ("torch", "triton"):
        draft.set_kernel_backends(backend)
        runner.draft_kv.layers[0].zero_()
        with torch.no_grad():
            bt = runner.build([(prompts[b], 0, pages[b]) for b in range(B)])
            ext_logits, ext_hidden = runner.draft_extend_ragged(bt, aux)
            last = ext_hidden.view(B, S, hd)[:, -1]
            bt = runner.build([([prompts[b][-1]], S, pages[b]) for b in range(B)])
            dec_logits, dec_hidden = runner.draft_decode(B, 1, input_ids=bt.input_ids, hidden=last,
                                                         positions=bt.positions, page_table=bt.page_table,
                                                         seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc)
            bt = runner.build([((prompts[b] * 3)[:3], S + 1, pages[b]) for b in range(B)])
            ver_aux = aux[: B * 3]
            ver_logits, _ = runner.draft_extend(B, 3, input_ids=bt.input_ids, hidden=ver_aux, positions=bt.positions,
                                                page_table=bt.page_table, seq_lens=bt.seq_lens,
                                                out_cache_loc=bt.out_cache_loc)
        outs[backend] = (ext_logits.clone(), dec_logits.clone(), dec_hidden.clone(), ver_logits.clone())
    draft.set_kernel_backends("auto")
    err = 0.0
    for name, k, r in zip(("extend", "decode", "decode hidden", "extend of 3"), outs["triton"], outs["torch"],
                          strict=True):
        e = rel_err(k, r)
        assert e < tol, f"draft {name} with kernels vs references: rel err {e} ({dtype=} {B=} {S=})"
        err = max(err, e)
    return err


GQA_SPLIT = {"BLOCK_N": 16, "min_keys_per_split": 16}

CASES = {
    # The Kimi draft's rank shape in miniature: 8 query heads on one kv head.
    "gqa_decode_one_kv_head": lambda: check_gqa(3, 1, 8, 1, 32, 16, [1, 37, 70], seed=51),
    # Several kv heads: each kv head's programs read their own key/value rows (groups x row blocks axis).
    "gqa_verify_three_kv_heads": lambda: check_gqa(2, 4, 6, 3, 32, 8, [4, 53], seed=52),
    "gqa_verify_rows_span_blocks_fp32_exact": lambda: check_gqa(2, 5, 10, 2, 16, 4, [7, 61], seed=53,
                                                                dtype=torch.float32, tol=1e-6),
    # Split keys merged by the merge launch, calls in a row on one grid, a page table far wider than the contexts
    # (a server's graph; the pool's unowned pages hold 1e4, so a read past a request's keys shows).
    "gqa_split_kv_capacity_far_above_context": lambda: check_gqa(3, 2, 4, 2, 32, 4, [2, 9, 41], seed=54,
                                                                 config=GQA_SPLIT, min_splits=8, calls=3, spare=40),
    "gqa_split_kv_fp32_exact": lambda: check_gqa(2, 3, 4, 4, 16, 2, [5, 150], seed=55, dtype=torch.float32,
                                                 tol=1e-6, config=GQA_SPLIT, min_splits=4, calls=2),
    # A padded prefill chunk: many query tokens a request, causal among them.
    "gqa_prefill_chunk": lambda: check_gqa(2, 19, 4, 1, 32, 8, [19, 40], seed=56, config=GQA_SPLIT),
    # 16-key tiles in pages of 32: each tile in one page (the split kernel's in-page addressing), values too.
    "gqa_in_page_tiles_split_fp32_exact": lambda: check_gqa(2, 3, 4, 2, 16, 32, [5, 150], seed=58,
                                                            dtype=torch.float32, tol=1e-6, config=GQA_SPLIT,
                                                            min_splits=3, calls=2),
    "gqa_dispatch": check_gqa_dispatch,
    # The draft model's paged forwards on kernels vs on references (float32: the products are exact enough).
    "draft_forward_kernels_fp32": lambda: check_draft_forward(seed=57),
}
