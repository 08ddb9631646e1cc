"""Checks of the INT4 MoE tensor-core verify path (path="mma": moe_int4_mma_gate_up_kernel, then the GEMV
path's down kernel), under the interpreter (CASES, run by kernel_checks.py) and on the GPU
(test_moe_mma_gpu.py): against ref_fused_moe_int4 and against the GEMV path on the same inputs, and bit for
bit against exact results on integer-valued inputs.

kernel_checks.py imports this module at its end (to merge CASES), so its helpers are imported inside the
functions here.
"""

from __future__ import annotations

import torch

# Small tiles for the interpreter: several K slices (partials + last-arrival reduction), chunks of 2 groups
# (the unrolled group loop), H not a multiple of a slice (masked groups) where the case says so, and 3 expert
# slots (a program works through several experts when more are routed).
MMA_DOWN = {"BLOCK_N": 16, "BLOCK_W": 4, "num_warps": 1}
MMA_SMALL = {"gate_up": {"BLOCK_N": 16, "BLOCK_W": 8, "BLOCK_T": 8, "SPLIT": 3, "SLOTS": 3, "num_warps": 1,
                         "num_stages": 1}, "down": MMA_DOWN}
# One K slice (the kernel stores act itself: no partials, no counters), a slot per pair (most find no expert).
MMA_ONE_SLICE = {"gate_up": {**MMA_SMALL["gate_up"], "SPLIT": 1, "SLOTS": 64}, "down": MMA_DOWN}
# 16 tokens a dot (BLOCK_T), row blocks of 32 with 2 warps, 2 slots.
MMA_WIDE = {"gate_up": {"BLOCK_N": 32, "BLOCK_W": 16, "BLOCK_T": 16, "SPLIT": 2, "SLOTS": 2, "num_warps": 2,
                        "num_stages": 2}, "down": MMA_DOWN}


def _run(args, path, config, add=None):
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    return triton_fused_moe_int4(*args, 32, add, path=path, config=config)


def _counters_clear() -> None:
    """The split-K arrival counters (shared with the dense GEMV) are back at 0 after a call."""
    from sglang_eagle3.kernels.gemv import _COUNTERS

    left = {str(d): int(c.abs().sum()) for d, c in _COUNTERS.items()}
    assert not any(left.values()), f"split-K counters not reset: {left}"


def gate_up_acts(args, config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mma, GEMV) gate_up outputs act [T*k, 8, I/8] fp32 for kernel args [x, p13, s13, p2, s2, topk_w, ids]:
    the two paths' numbers before anything rounds them (the down stage is the same kernel). ``config``: the
    mma path's {"gate_up": ...} (else its tuned/default one); the GEMV gate_up takes its own."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.fused_moe import launch_int4_gate_up

    x, p13, s13, _, _, _, ids = args
    I = p13.shape[1] // 2
    acts = []
    for mma, op in ((True, "fused_moe_int4_mma_gate_up"), (False, "fused_moe_int4_gemv_gate_up")):
        cfg = config["gate_up"] if mma and config else tuning.get_config(op, x.device, "tokens", x.shape[0])
        act = torch.full((ids.numel(), 8, I // 8), float("nan"), dtype=torch.float32, device=x.device)
        launch_int4_gate_up(x, p13, s13, ids, act, I=I, group=32, cfg=cfg, mma=mma)
        acts.append(act)
    return acts[0], acts[1]


def _gemv_down(args, act, add):
    """The GEMV path's output from its gate_up's act (its down kernel with its table/default config)."""
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.fused_moe import launch_int4_down

    x, _, _, p2, s2, topk_w, ids = args
    out = torch.empty_like(x)
    cfg = tuning.get_config("fused_moe_int4_gemv_down", x.device, "tokens", x.shape[0])
    launch_int4_down(act, p2, s2, ids, topk_w, add, out, group=32, cfg=cfg)
    return out


def check_mma_vs_gemv(T, E, H, I, top_k, device="cpu", seed=0, skew=False, dtype=torch.float32, tol=1e-5,
                      config=None, with_add=False, calls=2, act_tol=1e-5) -> dict:
    """The mma path against ref_fused_moe_int4 and against the GEMV path (default configs) on quantized
    random weights (every nibble value occurs), ``calls`` times in a row with new inputs and routing on the
    same shapes (as graph replays run it: the arrival counters must be back at 0 each time). Returns the
    relative errors: mma_vs_gemv compares the outputs (rounded to dtype), act_mma_vs_gemv the fp32 gate_up
    outputs of the two paths (every element written: they start as NaN), within act_tol."""
    from kernel_checks import make_moe_inputs, rel_err

    from sglang_eagle3 import kernels

    errs = {"mma_vs_ref": [], "gemv_vs_ref": [], "mma_vs_gemv": [], "act_mma_vs_gemv": []}
    for call in range(calls):
        args = make_moe_inputs(T, E, H, I, top_k, device, True, dtype, seed + 100 * call, skew)
        add = None
        if with_add:
            g = torch.Generator(device="cpu").manual_seed(seed + 1000 + call)
            add = (torch.randn(T, H, generator=g) * 0.5).to(dtype).to(device)
        mma = _run(args, "mma", config, add)
        _counters_clear()
        act_mma, act_gemv = gate_up_acts(args, config)
        _counters_clear()
        gemv = _gemv_down(args, act_gemv, add)  # the GEMV path's output from its gate_up's act
        ref = kernels.ref_fused_moe_int4(*args, 32, add)
        assert mma.shape == ref.shape and mma.dtype == ref.dtype, (mma.shape, ref.shape, mma.dtype)
        e = {"mma_vs_ref": rel_err(mma, ref), "gemv_vs_ref": rel_err(gemv, ref), "mma_vs_gemv": rel_err(mma, gemv),
             "act_mma_vs_gemv": rel_err(act_mma, act_gemv)}
        what = f"({call=} {T=} {E=} {H=} {I=} {top_k=} {skew=} {dtype=} {with_add=} {config=})"
        assert e["mma_vs_ref"] < tol, f"mma path rel err {e['mma_vs_ref']} >= {tol} {what}"
        assert e["mma_vs_gemv"] < tol, f"mma vs GEMV path rel diff {e['mma_vs_gemv']} >= {tol} {what}"
        assert e["act_mma_vs_gemv"] < act_tol, f"gate_up act rel diff {e['act_mma_vs_gemv']} >= {act_tol} {what}"
        for k, v in e.items():
            errs[k].append(v)
    return errs


def exact_int4_moe_inputs(T, E, H, I, top_k, seed, skew, dtype):
    """(kernel args [x, p13, s13, p2, s2, topk_w, ids], float64 result) on inputs whose sums are exact in
    float32 in any order (kernel_checks.check_fused_moe_int4_gemv_exact's construction, with the up and down
    scales varying too, so that a scale taken from the wrong group shows): x in {1, 2};
    gate nibbles q - 8 in {1, 2} at group scales 1/2 or 1, so every gate pre-activation is >= H/2 >= 17 and
    silu(g) = g in float32; up and down nibbles in {-1, 0, 1} at scales 1 or 2; routing weights 1/2 or 1. Every
    value is a multiple of 1/4 below 2^22 (asserted), so any slip in the K order of the decoded tiles, in the
    gathering of an expert's tokens, in the K slices or in the act layout changes the output."""
    from sglang_eagle3.kernels.quant import pack_int4, unpack_int4

    g = torch.Generator(device="cpu").manual_seed(seed)

    def ints(lo, hi, *shape):
        return torch.randint(lo, hi + 1, shape, generator=g)

    x = ints(1, 2, T, H).to(dtype)
    p13 = pack_int4(torch.cat([ints(1, 2, E, I, H), ints(-1, 1, E, I, H)], dim=1))  # [E, 2I, H/8]: gate, up
    s13 = torch.cat([ints(1, 2, E, I, H // 32) / 2, ints(1, 2, E, I, H // 32)], dim=1).to(torch.bfloat16)
    p2, s2 = pack_int4(ints(-1, 1, E, H, I)), ints(1, 2, E, H, I // 32).to(torch.bfloat16)
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
    return [x, p13, s13, p2, s2, w, ids], ref


def check_mma_exact(T, E, H, I, top_k, device="cpu", seed=0, skew=False, dtype=torch.float32, config=None) -> dict:
    """The mma path bit for bit against the exact result (one rounding to dtype, as the kernel's final store;
    the GEMV path's exact checks hold it to the same, so the two paths agree bit for bit here). dtype: float32
    under the interpreter (it truncates float32 -> bfloat16 instead of rounding); bfloat16 on the GPU (x in
    {1, 2} and the integer weights are exact in bfloat16)."""
    args, ref = exact_int4_moe_inputs(T, E, H, I, top_k, seed, skew, dtype)
    args = [t.to(device) for t in args]
    expected = ref.to(dtype)
    assert torch.isfinite(expected).all(), f"outputs overflow {dtype}"
    what = f"({T=} {E=} {H=} {I=} {top_k=} {skew=} {dtype=} {config=})"
    mma = _run(args, "mma", config).cpu()
    _counters_clear()
    bad = (mma != expected).sum().item()
    assert bad == 0, (f"{bad} of {mma.numel()} mma outputs differ from the exact result, max diff "
                      f"{(mma.double() - ref).abs().max().item()} {what}")
    return {"outputs": mma.numel(), "distinct_experts": len(set(args[-1].flatten().tolist()))}


def check_mma_min_tokens_switch() -> dict:
    """path=None routes MMA_MIN_TOKENS <= T <= GEMV_MAX_TOKENS to the mma gate_up once MMA_MIN_TOKENS is set,
    and nothing to it while it is None (the default)."""
    import importlib

    from kernel_checks import make_moe_inputs

    # NOTE: the package attribute sglang_eagle3.kernels.fused_moe is the function of that name, not the module
    fm = importlib.import_module("sglang_eagle3.kernels.fused_moe")

    seen = []
    launch = fm.launch_int4_gate_up

    def spy(*a, **kw):
        seen.append(kw["mma"])
        return launch(*a, **kw)

    saved = fm.MMA_MIN_TOKENS
    chosen = {}
    try:
        fm.launch_int4_gate_up = spy
        for setting in (None, 3):
            fm.MMA_MIN_TOKENS = setting
            for T in (1, 2, 3, fm.GEMV_MAX_TOKENS, fm.GEMV_MAX_TOKENS + 1):
                seen.clear()
                args = make_moe_inputs(T, 3, 32, 32, 1, "cpu", True, torch.float32, T, False)
                fm.triton_fused_moe_int4(*args, 32)
                chosen[f"{setting=} {T=}"] = "tile" if not seen else ("mma" if seen[0] else "gemv")
    finally:
        fm.launch_int4_gate_up = launch
        fm.MMA_MIN_TOKENS = saved
    top = fm.GEMV_MAX_TOKENS
    expected = {f"setting=None T={t}": "gemv" for t in (1, 2, 3, top)}
    expected |= {"setting=3 T=1": "gemv", "setting=3 T=2": "gemv", "setting=3 T=3": "mma", f"setting=3 T={top}": "mma"}
    expected |= {f"setting={s} T={top + 1}": "tile" for s in (None, 3)}
    assert chosen == expected, f"{chosen=} != {expected=}"
    return chosen


CASES: dict = {
    # Exact: T = 2, 3, 5, 8 over many experts (few shared) and over a pool of top_k + 1 (all shared); K slices
    # with a masked last one (H=160: 20 words in slices of 8), unmasked (H=256, I=32: EVEN), one slice, and
    # more pairs on an expert than a chunk of BLOCK_T = 8 (T=12 over 5 experts: two chunks).
    "moe_int4_mma_exact_t2_uniform_masked": lambda: check_mma_exact(2, 12, 160, 32, 3, seed=60, config=MMA_SMALL),
    "moe_int4_mma_exact_t3_one_slice": lambda: check_mma_exact(3, 9, 96, 64, 2, seed=61, config=MMA_ONE_SLICE),
    "moe_int4_mma_exact_t5_unmasked": lambda: check_mma_exact(5, 7, 256, 32, 2, seed=62, config=MMA_SMALL),
    "moe_int4_mma_exact_t8_shared_experts": lambda: check_mma_exact(8, 12, 160, 32, 4, seed=63, skew=True,
                                                                    config=MMA_SMALL),
    "moe_int4_mma_exact_t12_two_chunks": lambda: check_mma_exact(12, 5, 64, 32, 4, seed=64, skew=True,
                                                                 config=MMA_SMALL),
    "moe_int4_mma_exact_t4_wide_tiles": lambda: check_mma_exact(4, 10, 128, 96, 3, seed=65, skew=True,
                                                                config=MMA_WIDE),
    # Quantized random weights (all 16 nibble values), fp32: within float32 rounding of the reference and of
    # the GEMV path, twice in a row (counters reset); bf16 and fp16 with the shared experts' output added in
    # the down kernel's store.
    "moe_int4_mma_fp32_vs_gemv_t3_twice": lambda: check_mma_vs_gemv(3, 7, 96, 64, 3, seed=66, config=MMA_SMALL),
    "moe_int4_mma_fp32_vs_gemv_t8_shared_add": lambda: check_mma_vs_gemv(8, 12, 160, 32, 4, seed=67, skew=True,
                                                                         config=MMA_SMALL, with_add=True, calls=1),
    "moe_int4_mma_bf16_t5_shared_add": lambda: check_mma_vs_gemv(5, 6, 128, 64, 2, seed=68, skew=True,
                                                                 dtype=torch.bfloat16, tol=1e-2, config=MMA_WIDE,
                                                                 with_add=True, calls=1),
    "moe_int4_mma_fp16_t2_one_slice": lambda: check_mma_vs_gemv(2, 16, 64, 96, 4, seed=69, dtype=torch.float16,
                                                                tol=1e-2, config=MMA_ONE_SLICE, calls=1),
    # The default config (BLOCK_W capped at H's words, 2 slices at H=512) and the path switch.
    "moe_int4_mma_default_config_t2": lambda: check_mma_vs_gemv(2, 8, 512, 32, 4, seed=70, calls=1),
    "moe_int4_mma_min_tokens_switch": check_mma_min_tokens_switch,
}
