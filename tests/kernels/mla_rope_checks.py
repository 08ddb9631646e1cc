"""Checks of q's rope inside the MLA kernel (launch fusion q_rope_attn): the kernel rotates un-rotated q rows as it
loads them, and the rotary launch then writes k (and the normed latent) alone. Under the interpreter (CASES, run
by kernel_checks.py) and on the GPU (test_mla_rope_gpu.py).

What must hold: the in-kernel rotation gives the bits the rotary kernel stores, so attention with the rope in
the kernel is torch.equal to the rotary launch then the same attention kernel; both are close to the float64
reference; the k-only rotary launch writes exactly what the q + k launch writes for k and c; and a model's
logits and caches are the same with the fusion on and off.

kernel_checks imports this module at its end, to merge CASES: its helpers are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import math

import torch

from sglang_eagle3 import env, kernels

EPS = 1e-6


def rope_tables(P: int, Dr: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (cos, sin) [P, Dr/2] with a YaRN-like magnitude (mscale != 1), as layers/rotary.py builds them."""
    inv = 1.0 / (5000.0 ** (torch.arange(0, Dr, 2, dtype=torch.float64) / Dr))
    freqs = torch.outer(torch.arange(P, dtype=torch.float64), inv)
    return (freqs.cos() * 1.07).float().to(device), (freqs.sin() * 1.07).float().to(device)


def check_mla_rope(B, T, H, Dc, Dr, page_size, seq_lens, device="cpu", seed=0, dtype=torch.bfloat16, tol=1e-2,
                   config=None, splits=None, calls=1, tables=None) -> dict:
    """The split kernel with ``rope`` on un-rotated q (a strided view inside q, as MLA has it) against the rotary
    kernel then the kernel without it: torch.equal, q left as it was; both within ``tol`` of ref_mla_attention
    in float64 (which rotates exactly); and without the rope the output differs (the check can fail).
    Positions are random, unrelated to seq_lens: the kernel must read them, not derive them.
    ``config``: launch config overrides (else the op's tuned config, through kernels.mla_attention).
    ``splits``: (min, max) split count the launch must use. ``calls``: calls in a row on one grid, each on new
    inputs, positions and seq_lens 3 shorter than the call before (as graph replays have it). ``tables``: float32
    (cos, sin) [P, Dr/2] to use (else rope_tables)."""
    from kernel_checks import make_mla_inputs, rel_err

    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.mla_attention import launch_plan, triton_mla_attention

    sm_scale = 1.0 / math.sqrt(128 + Dr)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=sm_scale)
    dev = torch.device(device)
    cfg = {**tuning.DEFAULTS["mla_attention"], **config} if config else tuning.get_config(
        "mla_attention", dev, "rows", T * H)
    cos, sin = tables if tables is not None else rope_tables(4 * max(seq_lens) + 37, Dr, device)
    P = cos.shape[0]
    errs, plan = [], {}
    for call in range(calls):
        qn, qr, kv, pt, seq = make_mla_inputs(B, T, H, Dc, Dr, page_size, seq_lens, device, dtype, seed + call)
        seq = (seq - 3 * call).clamp_min(T)
        g = torch.Generator(device="cpu").manual_seed(seed + 1000 + call)
        q_full = torch.randn(B * T, H, 24 + Dr, generator=g).to(dtype).to(device)
        q_full[..., 24:] = qr * 8  # the rope part inside q, as MLA's q_b output holds it
        q_rope = q_full[..., 24:]
        pos = torch.randint(1, P, (B * T,), generator=g).to(device)
        plan = launch_plan(B, T, H, pt.shape[1] * page_size, tuning.sm_count(dev), cfg)
        before = q_full.clone()
        if config:
            fused = triton_mla_attention(qn, q_rope, kv, pt, seq, **kw, rope=(cos, sin), positions=pos, config=cfg)
        else:
            fused = kernels.mla_attention(qn, q_rope, kv, pt, seq, **kw, rope=(cos, sin), positions=pos,
                                          use_triton=True)
        assert torch.equal(q_full, before), "the kernel wrote q"
        q_rot, _ = kernels.apply_rotary(q_rope, None, pos, cos, sin, interleaved=True, use_triton=True)
        two = triton_mla_attention(qn, q_rot, kv, pt, seq, **kw, config=cfg)
        what = f"{call=} {B=} {T=} {H=} {seq.tolist()=} {page_size=} {plan=}"
        diff = (fused.double() - two.double()).abs().max().item()
        assert torch.equal(fused, two), f"rope in the kernel != rotary launch then attention: max diff {diff} ({what})"
        d = (lambda t: t.double())  # noqa: E731
        ref = kernels.ref_mla_attention(d(qn), d(q_rope), d(kv), pt, seq, **kw, rope=(d(cos), d(sin)), positions=pos)
        err = rel_err(fused, ref)
        assert err < tol, f"MLA with rope rel err {err} ({what})"
        plain = triton_mla_attention(qn, q_rope, kv, pt, seq, **kw, config=cfg)
        assert not torch.equal(plain, fused), f"the rope changed nothing: the check could not fail ({what})"
        errs.append(err)
    if splits is not None:
        assert splits[0] <= plan["splits"] <= splits[1], f"{plan=}: the case wants {splits=}"
    return {"rel_err": errs, "plan": plan}


def check_rotary_k_only(N, H, C, R, device="cpu", seed=0, dtype=torch.bfloat16, cache_dtype=None, norm=True,
                        heads_k=1) -> dict:
    """The rotary launch of k alone (q=None) with ``norm`` (the kv_a RMSNorm of c in the same launch) into cache
    rows writes exactly what the q + k launch writes for k and c, nothing else; k and c are only read. The
    reference with q=None equals its own q + k call. Also k alone without cache rows (``heads_k`` heads, out of
    place and in place) equals the k of a q + k launch."""
    from kernel_checks import make_latent_inputs, ulp_err

    cache_dtype = cache_dtype or dtype
    g = torch.Generator(device="cpu").manual_seed(seed)
    slots, P = 3 * N + 11, 5 * N + 17
    cos, sin = rope_tables(P, R, device)
    q, kv_a, w, loc, pos, cache0 = make_latent_inputs(N, H, C, R, slots, P, dtype, cache_dtype, device, g)

    def write(with_q: bool, use_triton: bool) -> tuple[torch.Tensor, torch.Tensor]:
        cache, qq, kv = cache0.clone(), q.clone(), kv_a.clone()
        c_norm = (kv[:, :C], w, EPS, cache[:, :C]) if norm else None
        q_out, k_out = kernels.apply_rotary(qq[..., 16:] if with_q else None, kv[:, C:], pos, cos, sin,
                                            interleaved=True, inplace=True, k_out=cache[:, C:], k_out_rows=loc,
                                            c_norm=c_norm, use_triton=use_triton)
        assert (q_out is None) != with_q and k_out.data_ptr() == cache[:, C:].data_ptr(), "returned the wrong tensors"
        assert torch.equal(kv, kv_a), "the source rows must stay as they were"
        if not with_q:
            assert torch.equal(qq, q)
        return cache, qq

    (cache_k, _), (cache_qk, q_qk) = write(False, True), write(True, True)
    assert torch.equal(cache_k, cache_qk), (
        f"k-only launch differs from the q + k launch in {(cache_k != cache_qk).sum().item()} cache values")
    assert not torch.equal(cache_qk, cache0) and not torch.equal(q_qk, q), "the launch wrote nothing"
    if not norm:
        assert torch.equal(cache_k[:, :C], cache0[:, :C]), "wrote c without c_norm"
    (cache_rk, _), (cache_rqk, _) = write(False, False), write(True, False)
    assert torch.equal(cache_rk, cache_rqk), "the reference's k-only call differs from its q + k call"
    err = ulp_err(cache_k, cache_rk)  # kernel vs reference: as check_latent_to_cache bounds it
    assert err <= (2.0 if dtype != torch.float32 else 4.0), f"k-only launch off the reference by {err} ulp"

    k = torch.randn(N, heads_k, R, generator=g).to(dtype).to(device)
    _, k_ref = kernels.apply_rotary(q[..., 16:], k, pos, cos, sin, interleaved=True, use_triton=True)
    q_none, k_alone = kernels.apply_rotary(None, k, pos, cos, sin, interleaved=True, use_triton=True)
    assert q_none is None and torch.equal(k_alone, k_ref), "k alone (out of place) differs from q + k"
    k_in = k.clone()
    kernels.apply_rotary(None, k_in, pos, cos, sin, interleaved=True, inplace=True, use_triton=True)
    assert torch.equal(k_in, k_ref), "k alone (in place) differs from q + k"
    return {"ulp_vs_reference": err}


@contextlib.contextmanager
def count_rope_in_attention():
    """Counts kernels.mla_attention calls that leave q's rope to the attention: yields a list that grows by one
    per such call."""
    calls = []
    original = kernels.mla_attention

    def spy(*args, **kw):
        if kw.get("rope") is not None:
            calls.append(1)
        return original(*args, **kw)

    kernels.mla_attention = spy
    try:
        yield calls
    finally:
        kernels.mla_attention = original


def model_step_logits(no_fuse: str, device="cpu", dtype=torch.float32, seed=0, hidden=64, layers=2, T=3, B=2,
                      ctxs=(5, 22), use_cuda_graph=False, overlap: str | None = None) -> tuple[dict, list, int]:
    """({(T, "eager"|"graph"): logits} of a decode step and a T-token verify step of a small Kimi-like model
    (kernel_checks.kimi_like_model, its Triton kernels on), the KV caches after them, calls that left the rope to
    the attention), with SGLANG_EAGLE3_NO_FUSE=no_fuse while the model is built, and overlaps ``overlap``
    (layers/overlap.py; None: none). With ``use_cuda_graph`` each step runs eagerly and then as a replayed
    graph (the caches are reset between, so both see the same state)."""
    from kernel_checks import kimi_like_model, set_kernels

    from sglang_eagle3.layers.overlap import Overlaps
    from sglang_eagle3.runtime.model_runner import ModelRunner

    page = 16
    pages_per_req = (max(ctxs) + T) // page + 2
    with env.overrides({env.NO_FUSE.name: no_fuse}):  # a rotary table that holds every position of the pool
        model = kimi_like_model(device, dtype, layers=layers, hidden=hidden, seed=seed,
                                max_positions=max(256, pages_per_req * page))
    model.model.set_overlaps(Overlaps.parse(overlap))
    runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=B * pages_per_req + 2, page_size=page,
                         max_context=pages_per_req * page, device=torch.device(device), dtype=dtype,
                         use_cuda_graph=use_cuda_graph, cuda_graph_max_bs=B, verify_widths=(T,),
                         attention_backend="triton" if use_cuda_graph else "auto",
                         moe_backend="triton" if use_cuda_graph else "auto")
    if not use_cuda_graph:
        set_kernels(model, True)
    g = torch.Generator(device="cpu").manual_seed(seed + 7)
    caches0 = [torch.randn(kv.shape, generator=g).to(kv.dtype).to(device) for kv in runner.target_kv.layers]
    if use_cuda_graph:
        runner.capture_graphs()
    vocab = model.config.vocab_size
    rows = {t: [(torch.randint(0, vocab, (t,), generator=g).tolist(), ctxs[b] + t,
                 list(range(1 + b * pages_per_req, 1 + (b + 1) * pages_per_req))) for b in range(B)] for t in (1, T)}
    out = {}
    modes = ("eager", "graph") if use_cuda_graph else ("eager",)
    with count_rope_in_attention() as calls, torch.inference_mode():
        for mode in modes:
            for kv, kv0 in zip(runner.target_kv.layers, caches0, strict=True):
                kv.copy_(kv0)
            for t in (1, T):
                bt = runner.build(rows[t])
                if mode == "graph":
                    logits = runner.target_uniform(bt, t, verify=t > 1)[0]
                else:
                    target = runner.target_verify if t > 1 else runner.target_decode
                    logits = target.fn(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table,
                                       seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc, tokens_per_req=t)[0]
                out[(t, mode)] = logits.float().clone()
    if use_cuda_graph:
        stats = runner.stats.as_dict()
        for name in ("target_decode", "target_verify"):
            assert stats[name]["eager"] == 0 and stats[name]["graph"] > 0, f"{name} did not replay a graph: {stats}"
    return out, [kv.clone() for kv in runner.target_kv.layers], len(calls)


def check_model_q_rope_attn(dtype=torch.bfloat16, seed=0, T=3, B=2, ctxs=(5, 22)) -> dict:
    """A small Kimi-like model's decode and verify logits and KV caches with q_rope_attn on equal those with it
    off (the same weights), through the Triton kernels (the interpreter on CPU); on, every layer's attention
    took the rope, off none did. ``ctxs``: the requests' cached tokens (long ones give MLA several splits)."""
    layers = 2
    on, cache_on, calls_on = model_step_logits("", dtype=dtype, seed=seed, layers=layers, T=T, B=B, ctxs=ctxs)
    off, cache_off, calls_off = model_step_logits("q_rope_attn", dtype=dtype, seed=seed, layers=layers, T=T, B=B,
                                                  ctxs=ctxs)
    assert calls_on == 2 * layers and calls_off == 0, f"rope left to the attention in {calls_on=} / {calls_off=} calls"
    for key, ref in off.items():
        assert torch.equal(on[key], ref), (key, (on[key] - ref).abs().max().item())
    for a, b in zip(cache_on, cache_off, strict=True):
        assert torch.equal(a, b), "KV caches differ"
    return {"logits": {str(k): list(v.shape) for k, v in on.items()}}


# Many short splits (the interpreter stays quick), as kernel_checks.MLA_SPLIT.
SPLIT = {"BLOCK_N": 16, "min_keys_per_split": 16}

CASES = {
    # One split (the split pass writes the output): T=1 B=3 over partial pages, H=3; T=3 B=1, rows spanning two
    # row blocks (3 x 7 = 21 > 16).
    "mla_rope_decode_one_split": lambda: check_mla_rope(3, 1, 3, 64, 16, 16, [1, 9, 14], seed=60, splits=(1, 1),
                                                        config={"min_keys_per_split": 64}),
    "mla_rope_verify_rows_span_blocks": lambda: check_mla_rope(1, 3, 7, 32, 32, 8, [29], seed=61, splits=(1, 1),
                                                               config={"min_keys_per_split": 64}),
    # Several splits and the merge launch, calls in a row on one grid; request 0 shorter than the splits.
    "mla_rope_verify_split_repeated": lambda: check_mla_rope(3, 3, 5, 64, 16, 4, [4, 70, 133], seed=62,
                                                             config=SPLIT, splits=(5, 256), calls=2),
    "mla_rope_decode_split_default_config": lambda: check_mla_rope(1, 1, 5, 64, 32, 16, [203], seed=63),
    "mla_rope_fp32_split": lambda: check_mla_rope(2, 3, 3, 32, 16, 4, [6, 50], seed=64, dtype=torch.float32,
                                                  tol=1e-5, config=SPLIT, splits=(2, 256)),
    "rotary_k_only_norm_into_cache": lambda: check_rotary_k_only(5, 3, 48, 16, seed=65, heads_k=2),
    "rotary_k_only_fp32_into_bf16_cache_no_norm": lambda: check_rotary_k_only(
        4, 2, 32, 32, seed=66, dtype=torch.float32, cache_dtype=torch.bfloat16, norm=False),
    "model_q_rope_attn_equals_unfused": lambda: check_model_q_rope_attn(seed=67),
    # Contexts of 200 and 600 (several MLA splits, positions past the short cases' table): the GPU model test's
    # failure came from positions outside its model's rotary table; inside it, fused == unfused here.
    "model_q_rope_attn_long_contexts": lambda: check_model_q_rope_attn(seed=68, T=4, ctxs=(200, 600)),
}
