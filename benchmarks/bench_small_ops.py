"""The latency-bound launches of a decode layer, timed alone: the routing kernel (moe_topk, Kimi's 384 experts,
top-8), the RMSNorm with its residual add, the rotary launch. Each reads a few KB; what they cost is their
latency in a graph, against a read-only kernel of the same size (~1.2 us on the H200,
bench_launch_floor.py). Quick to run, so a change can be timed against the previous checkout in one call:
the script imports the package of the tree it lives in (``package`` in the output says which ran).

Also two launches of a MoE layer's tail and MLA at the step's shapes: the shared expert's down projection
[7168, 256] then the routing, as two launches and (where the package has it) as one with the routing
programs beside the GEMV; MLA's W_UK alone, after the rotary launch, and with the rotary programs in its own
launch (the rope_wuk fusion); MLA at 1k and 8k context with a page table sized for 8.4k keys (as the
verify-graph benchmark's graphs) and for 32k.

The sampler (--sampler): a round's token choice at Kimi's vocabulary (163840) for R rows (decode 1, verify of
4, batches): the argmax that greedy rounds take, the sampler's filters + Gumbel kernel (runtime/sampling.py), top_k /
top_p by the radix select and by the sort it replaced, and the Gumbel kernel alone.

    python benchmarks/bench_small_ops.py --out benchmarks/results/h200/small_ops.json [--label new]
    python benchmarks/bench_small_ops.py --out OUT.json --sampler
    python benchmarks/bench_small_ops.py --out OUT.json --select-passes   # the radix select's launches, profiled
    python benchmarks/bench_small_ops.py --out OUT.json --mla-variants '' num_warps=4 BLOCK_N=32,num_stages=3
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import (  # noqa: E402
    EXPERTS,
    HEADS,
    HIDDEN,
    INTER,
    KV_LORA,
    ROPE,
    TOP_K,
    ab_tag,
    add_kernels_from_arg,
    kernels_from,
    mla_case,
    rms_norm_case,
    rotary_case,
    time_graph,
    topk_case,
)
from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402


def shared_down_route_case(T: int, beside: bool):
    """The shared expert's down projection [HIDDEN, INTER] and the routing of T rows of router logits: two
    launches, or one with the routing programs beside the GEMV (None where the package lacks it)."""
    n_sets = 8
    act = torch.randn(n_sets, T, INTER, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n_sets, HIDDEN, INTER, device="cuda", dtype=torch.bfloat16) / INTER ** 0.5  # 3.7 MB each
    logits = torch.randn(n_sets, T, EXPERTS, device="cuda")
    bias = torch.rand(EXPERTS, device="cuda") * 0.1
    kw = dict(top_k=TOP_K, n_group=1, topk_group=1, routed_scaling_factor=2.827)
    if beside:
        if not hasattr(kernels, "Routing") or "route_logits" not in kernels.gemv.__code__.co_varnames:
            return None
        route = kernels.Routing(bias, TOP_K, routed_scaling_factor=2.827)
        return lambda: [lambda i=i: kernels.gemv(act[i], w[i], route=route, route_logits=logits[i])
                        for i in range(n_sets)]

    def both(i):
        kernels.gemv(act[i], w[i])
        kernels.moe_topk(logits[i], bias, **kw)

    return lambda: [lambda i=i: both(i) for i in range(n_sets)]


def mla_rotary_sets(T: int, n_sets: int = 8, slots: int = 8448) -> tuple[torch.Tensor, list[dict]]:
    """(q [n_sets, T, 8, 192], the rotary launch of each set as MLA's layer makes it with the kv_norm fusion, as
    kernels.apply_rotary's arguments): q_rope [T, 8, 64] rotated in place inside q, the latent c [T, 512]
    RMS-normed and k_rope [T, 64] rotated into the tokens' rows of a paged cache [slots, 576] (kv_a's output
    [T, 576] holds c and k_rope)."""
    P = 32768
    q = torch.randn(n_sets, T, HEADS, 128 + ROPE, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(n_sets, T, KV_LORA + ROPE, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(n_sets, slots, KV_LORA + ROPE, device="cuda", dtype=torch.bfloat16)
    loc = torch.stack([torch.randperm(slots, device="cuda")[:T] for _ in range(n_sets)])
    pos = torch.randint(0, P, (n_sets, T), device="cuda")
    cos, sin = torch.rand(P, ROPE // 2, device="cuda"), torch.rand(P, ROPE // 2, device="cuda")
    nw = torch.rand(KV_LORA, device="cuda", dtype=torch.bfloat16) + 0.5
    return q, [dict(q=q[i][..., 128:], k=kv[i][:, KV_LORA:], positions=pos[i], cos=cos, sin=sin, interleaved=True,
                    inplace=True, k_out=cache[i][:, KV_LORA:], k_out_rows=loc[i],
                    c_norm=(kv[i][:, :KV_LORA], nw, 1e-6, cache[i][:, :KV_LORA])) for i in range(n_sets)]


def mla_rotary_case(T: int):
    """The rotary launch as MLA's layer makes it (mla_rotary_sets)."""
    _, rotary = mla_rotary_sets(T)
    return lambda: [lambda r=r: kernels.apply_rotary(**r) for r in rotary]


def rope_wuk_case(T: int, mode: str):
    """MLA's W_UK launch (q_nope [T, 8, 128] of q [T, 8, 192] @ the N-contiguous [8, 512, 128] view of kv_b) with
    the layer's rotary launch (mla_rotary_sets'): ``mode`` "wuk" W_UK alone, "two" the rotary launch then
    W_UK's, "one" W_UK's launch with the rotary programs beside it (the rope_wuk fusion; None where the package
    lacks it)."""
    if mode == "one" and "rotary" not in kernels.gemv.__code__.co_varnames:
        return None
    q, rotary = mla_rotary_sets(T)
    w_uk = torch.randn(len(rotary), HEADS, 128, KV_LORA, device="cuda", dtype=torch.bfloat16) / 128 ** 0.5  # 1 MB

    def call(i):
        if mode == "two":
            kernels.apply_rotary(**rotary[i])
        extra = {"rotary": rotary[i]} if mode == "one" else {}
        kernels.gemv(q[i][..., :128], w_uk[i].transpose(1, 2), **extra)

    return lambda: [lambda i=i: call(i) for i in range(len(rotary))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--repeat", type=int, default=3, help="times each case is timed (median of replays each)")
    ap.add_argument("--mla-variants", nargs="+", default=None,
                    help="only the MLA cases, each at the table's config with these overrides, alternating: e.g. "
                         "'' num_warps=4 BLOCK_N=32,num_stages=3 ('' for the table's config as it is)")
    ap.add_argument("--mla-cases", nargs="+", default=None, metavar="T:CTX:SLOTS",
                    help="with --mla-variants: these MLA cases (new tokens, context, page table slots) instead of "
                         "the defaults, e.g. 1:32768:131072 for a long context in a 128k server's table")
    ap.add_argument("--mla-prefill", type=int, nargs="+", default=None, metavar="TOKENS",
                    help="only: MLA as the eager (ragged) prefill runs it, one prompt of TOKENS tokens in a page table "
                         "of --mla-prefill-slots, the torch reference against the kernel (eager, peak memory too)")
    ap.add_argument("--mla-prefill-ref-max", type=int, default=4096,
                    help="--mla-prefill: time the torch reference only up to this many tokens (its scratch is the "
                         "whole page table x the prompt: 48 GiB at 4096 tokens in 131072 slots)")
    ap.add_argument("--mla-prefill-slots", type=int, default=131072)
    ap.add_argument("--sampler", action="store_true", help="only: the sampler's cases (module doc)")
    ap.add_argument("--select-passes", action="store_true",
                    help="only: the top_p radix select's launches one by one (torch profiler), 4 and 64 rows")
    add_kernels_from_arg(ap, "the routing, norm, rotary and MLA cases are timed with each too, alternating")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    if args.sampler:
        return sampler(args)
    if args.select_passes:
        return select_passes(args)
    if args.mla_variants is not None:
        return mla_variants(args)
    if args.mla_prefill is not None:
        return mla_prefill(args)
    cases = {}
    for T in (1, 4, 8, 64):
        cases[f"moe_topk T={T}"] = topk_case(T)[0]
    cases["rms_norm T=1 D=7168 +res"] = rms_norm_case(1, 7168, False, True)[0]
    cases["rotary T=1"] = rotary_case(1)[0]
    for T in (1, 4):
        cases[f"rotary MLA T={T} (kv norm, cache rows)"] = mla_rotary_case(T)
    for T in (1, 4):
        for beside in (False, True):
            case = shared_down_route_case(T, beside)
            if case is not None:
                cases[f"shared down + routing T={T} {'one launch' if beside else 'two launches'}"] = case
    for T in (1, 4):
        for mode, what in (("wuk", "W_UK alone"), ("two", "rotary then W_UK"), ("one", "W_UK + rotary one launch")):
            case = rope_wuk_case(T, mode)
            if case is not None:
                cases[f"{what} T={T}"] = case
    for T, ctx, cap in MLA_CASES:
        cases[f"mla T={T} ctx={ctx} table={cap}"] = mla_case(1, T, ctx, capacity=cap)[0]
    # The other files' kernels (--kernels-from) time every case beside this checkout's, alternating each repeat.
    swaps = {"": None} | {ab_tag(paths): kernels_from(paths) for paths in args.kernels_from}
    rows = []
    for name, calls in cases.items():
        us = {tag: [] for tag in swaps}
        for _ in range(args.repeat):
            for tag, swapped in swaps.items():
                with swapped() if swapped else contextlib.nullcontext():
                    us[tag].append(round(time_graph(calls()), 3))
        for tag, times in us.items():
            rows.append({"case": name + tag, "us": times})
            print(f"{args.label:>6s} {name + tag:44s} " + " / ".join(f"{u:.2f}" for u in times) + " us", flush=True)
    write_result(args, rows)


def sampler(args, vocab: int = 163840) -> None:
    """The sampler's cost at Kimi's vocabulary, graph-timed: argmax, the whole sampler (every filter on), the
    Gumbel kernel alone; rows of float32 logits (the lm_head's output). top_k / top_p both ways: the radix select
    (kernels.top_threshold, what CUDA runs) and the sort the sampler ran before (filtered_scores' torch path)."""
    from sglang_eagle3.runtime.sampling import ALL_FILTERS, UNRANKED, Filters, filtered_scores, sample_tokens

    def sorting(x, filters):
        logits, f, i, pos = x
        z = filtered_scores(logits, f[:, 0], f[:, 1], i[:, 0], f[:, 2], filters, use_triton=False)
        return kernels.gumbel_argmax(z, i[:, 1], pos)

    top_p_only = Filters(top_k=False, min_p=False)
    rows = []
    for R in (1, 4, 16, 64, 256):
        logits = torch.randn(R, vocab, device="cuda") * 3
        samp_f = torch.tensor([[0.7, 0.95, 0.01]] * R, device="cuda")
        samp_i = torch.tensor([[40, 12345 + r] for r in range(R)], device="cuda")
        pos = torch.arange(R, device="cuda") + 1000
        x = (logits, samp_f, samp_i, pos)
        cases = {"argmax": lambda x=x: x[0].argmax(-1),
                 "sampler, temperature only": lambda x=x: sample_tokens(*x, Filters(False, False, False)),
                 "sampler, min_p (unranked round graphs)": lambda x=x: sample_tokens(*x, UNRANKED),
                 "sampler, top_p": lambda x=x: sample_tokens(*x, top_p_only),
                 "sampler, top_p (sort)": lambda x=x: sorting(x, top_p_only),
                 "sampler, top_k + min_p + top_p": lambda x=x: sample_tokens(*x, ALL_FILTERS),
                 "sampler, top_k + min_p + top_p (sort)": lambda x=x: sorting(x, ALL_FILTERS),
                 "top_p threshold alone (radix select)": lambda x=x: kernels.top_threshold(
                     x[0], torch.full_like(x[1][:, 0], float("-inf")), x[1][:, 1], x[0].amax(-1)),
                 "gumbel kernel alone": lambda x=x: kernels.gumbel_argmax(x[0], x[2][:, 1], x[3])}
        for name, fn in cases.items():
            us = [round(time_graph([fn]), 2) for _ in range(args.repeat)]
            rows.append({"case": f"{name} R={R}", "rows": R, "vocab": vocab, "us": us})
            print(f"{name:44s} R={R:3d} " + " / ".join(f"{u:.2f}" for u in us) + " us", flush=True)
    write_result(args, rows)


def select_passes(args, vocab: int = 163840) -> None:
    """Each launch of kernels.top_threshold (top_p 0.95 at temperature 0.7 over randn * 3 logits, as --sampler),
    its device time from the torch profiler (eager: the launches' own durations, not a graph's)."""
    rows = []
    for R in (4, 64):
        z = torch.randn(R, vocab, device="cuda") * 3 / 0.7
        lo = torch.full((R,), float("-inf"), device="cuda")
        p = torch.full((R,), 0.95, device="cuda")
        zmax = z.amax(-1)
        for _ in range(3):
            kernels.top_threshold(z, lo, p, zmax)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            kernels.top_threshold(z, lo, p, zmax)
            torch.cuda.synchronize()
        us = [round(e.device_time, 2) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        rows.append({"rows": R, "vocab": vocab, "launch_us": us})
        print(f"top_p select R={R:3d}: " + " ".join(f"{u:.1f}" for u in us) + f" us (sum {sum(us):.1f})", flush=True)
    write_result(args, rows)


# (T, context, page table slots a request): the step benchmark's graphs hold 8448 slots.
MLA_CASES = ((1, 1024, 8448), (1, 1024, 32768), (4, 1024, 8448), (1, 8192, 8448))


def write_result(args, rows: list[dict]) -> None:
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent), "label": args.label,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


def mla_variants(args) -> None:
    """The MLA cases (and T=4 at 8k) at the table's config with each of args.mla_variants' overrides
    ('key=value,key=value'), the variants alternating args.repeat times."""
    from sglang_eagle3.kernels import tuning

    rows = []
    cases = (MLA_CASES + ((4, 8192, 8448),) if args.mla_cases is None
             else [tuple(int(x) for x in c.split(":")) for c in args.mla_cases])
    for T, ctx, cap in cases:
        base = tuning.get_config("mla_attention", torch.device("cuda"), "rows", T * 8)
        variants = {v: {**base, **{k: int(x) for k, x in (item.split("=") for item in v.split(",") if item)}}
                    for v in args.mla_variants}
        calls = mla_case(1, T, ctx, capacity=cap)[0]
        times = {v: [] for v in variants}
        for _ in range(args.repeat):
            for v, cfg in variants.items():
                times[v].append(round(time_graph(calls(config=cfg)), 3))
        for v, us in times.items():
            rows.append({"case": f"mla T={T} ctx={ctx} table={cap}", "variant": v, "config": variants[v], "us": us})
            print(f"{args.label:>6s} mla T={T} ctx={ctx:6d} table={cap:6d} {v or '(table)':28s} "
                  + " / ".join(f"{u:.2f}" for u in us) + " us", flush=True)
    write_result(args, rows)


def mla_prefill(args) -> None:
    """Eager MLA over one fresh prompt (T = context) in a wide page table: ms (median of 5 after 2 warm-ups) and
    the peak memory the call allocates, reference and kernel."""
    from benchmarks.bench_verify_graph import median_ms
    from sglang_eagle3 import kernels

    rows = []
    page = 64
    for T in args.mla_prefill:
        pages = args.mla_prefill_slots // page
        table = (torch.randperm(pages, device="cuda") + 1).int()[None]
        kv = torch.randn((pages + 1) * page, KV_LORA + ROPE, device="cuda", dtype=torch.bfloat16)
        qn = torch.randn(T, HEADS, KV_LORA, device="cuda", dtype=torch.bfloat16) * 0.05
        qr = torch.randn(T, HEADS, ROPE, device="cuda", dtype=torch.bfloat16) * 0.05
        seq = torch.tensor([T], dtype=torch.int32, device="cuda")
        kw = dict(tokens_per_req=T, page_size=page, kv_lora_rank=KV_LORA, sm_scale=0.1352)
        row = {"tokens": T, "slots": args.mla_prefill_slots}
        for name, fn in (("torch", kernels.ref_mla_attention), ("triton", kernels.triton_mla_attention)):
            if name == "torch" and T > args.mla_prefill_ref_max:
                row[name] = {"skipped": f"prompt over --mla-prefill-ref-max {args.mla_prefill_ref_max}"}
                continue
            try:
                for _ in range(2):
                    fn(qn, qr, kv, table, seq, **kw)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                ms = median_ms(functools.partial(fn, qn, qr, kv, table, seq, **kw), 5)
                row[name] = {"ms": round(ms, 3),
                             "peak_gib": round((torch.cuda.max_memory_allocated() - base) / (1 << 30), 3)}
            except torch.OutOfMemoryError as exc:
                row[name] = {"error": f"out of memory: {str(exc)[:160]}"}
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"{args.label:>6s} mla prefill T={T:5d} in {args.mla_prefill_slots} slots: torch {row['torch']}  "
              f"triton {row['triton']}", flush=True)
    write_result(args, rows)


if __name__ == "__main__":
    main()
