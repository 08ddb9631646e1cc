"""Where a graphed decode/verify step of the Kimi-K2.5 rank slice spends its time, kernel by kernel.

Builds the same slice as bench_verify_graph.py (fewer layers by default: the layers are identical, so the
per-layer numbers carry over), captures the decode (T=1) and verify graphs, and profiles graph replays with
torch.profiler (CUPTI reports each kernel node of a replayed graph). Prints, per T: the replay time, the sum
of kernel durations (the rest is launch gaps between graph nodes), and a table of kernels per layer with
their share. Also times the dense projections alone (cuBLAS at M = T, rotating weight copies so that the L2
holds none) as fractions of copy bandwidth, torch (cuBLAS) against our GEMV kernel (``--sweep``: and a few
GEMV configs around the heuristic's).

    python benchmarks/profile_step.py --layers 6 --tokens 1 4 --out /tmp/out/profile.json
    python benchmarks/profile_step.py --layers 6 --tokens 1 4 --batch 16 --uniform-routing --no-gemm  # 16 requests
    python benchmarks/profile_step.py --layers 3 --tokens 1 4 --no-gemm --sequence  # each launch, in order

(CUPTI serialises a replay's kernels, so each kernel's time includes what PDL would overlap: read the shares, not a
timeline.)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_kernels import read_ceiling_us, time_graph  # noqa: E402
from benchmarks.bench_verify_graph import TP, copy_bandwidth, kimi_config, median_ms, randomize_cuda  # noqa: E402
from benchmarks.routing import RoutingChoice, drawn_routing, parse_routing  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.distributed.parallel_state import init_tp  # noqa: E402
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM  # noqa: E402
from sglang_eagle3.runtime.model_runner import ModelRunner  # noqa: E402


def short(name: str) -> str:
    """Kernel names are long C++ signatures: keep what tells them apart."""
    name = name[5:] if name.startswith("void ") else name
    return name.split("(")[0][:100]


def by_t_table(steps: list[dict], layers: int, width: int = 44) -> list[str]:
    """The profiled steps side by side: each kernel's us a call at every T (its calls a layer at the first T it
    ran), then the graph and the kernels' busy time a layer; kernels in order of their time at the largest T. What
    a verify adds over a decode, kernel by kernel (read with PDL off: with it a kernel launched early counts the
    wait for its predecessor as its own)."""
    names = {k["kernel"]: k["calls_per_layer"] for s in reversed(steps) for k in s["kernels"]}  # the first T's
    last = {k["kernel"]: k["per_step_us"] for k in steps[-1]["kernels"]}
    per_call = [{k["kernel"]: k["us_per_call"] for k in s["kernels"]} for s in steps]
    rows = [f"{'us a call (calls a layer)':<{width}}" + "".join(f"{'T=' + str(s['T']):>9}" for s in steps)]
    for n in sorted(names, key=lambda n: -last.get(n, 0.0)):
        rows.append(f"{n[:width - 8]:<{width - 8}} ({names[n]:4.2f})"
                    + "".join(f"{'-' if n not in us else f'{us[n]:.2f}':>9}" for us in per_call))
    for what, key in (("graph us a layer", "graph_ms"), ("kernels busy us a layer", "kernel_busy_ms")):
        rows.append(f"{what:<{width}}" + "".join(f"{s[key] * 1e3 / layers:9.1f}" for s in steps))
    return rows


@torch.inference_mode()
def profile_T(runner: ModelRunner, T: int, ctx: int, layers: int, replays: int, batch: int = 1,
              sequence: bool = False) -> dict:
    per_req = (ctx + T) // 64 + 2  # pages a request needs (page 0 stays unused, as the runner expects)
    bt = runner.build([(list(range(100 + b, 100 + b + T)), ctx, list(range(1 + b * per_req, (b + 1) * per_req)))
                       for b in range(batch)])
    step = lambda: runner.target_uniform(bt, T, verify=T > 1)  # noqa: E731
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    graph_ms = median_ms(step, 30)
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(replays):
            step()
        torch.cuda.synchronize()
    per_name: dict[str, list[float]] = collections.defaultdict(list)
    cuda_events = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    for ev in cuda_events:
        per_name[short(ev.name)].append(ev.device_time)  # us
    rows = []
    busy = 0.0
    for name, ts in per_name.items():
        total = sum(ts) / replays
        busy += total
        rows.append({"kernel": name, "per_step_us": round(total, 1), "calls_per_step": round(len(ts) / replays, 2),
                     "calls_per_layer": round(len(ts) / replays / layers, 2),
                     "us_per_call": round(sum(ts) / len(ts), 2)})
    rows.sort(key=lambda r: -r["per_step_us"])
    launches = sum(r["calls_per_step"] for r in rows)
    out = {"T": T, "batch": batch, "context": ctx, "graph_ms": round(graph_ms, 3),
           "kernel_busy_ms": round(busy / 1e3, 3),
           "launches_per_step": launches, "launches_per_layer": round(launches / layers, 1), "kernels": rows}
    if sequence:  # the launches in the order they ran (which gemv_kernel launch is which), each position's
        # median over the replays (a replay's own times vary by ~0.1-0.5 us a launch); "us" is the last replay's.
        per_replay = len(cuda_events) // replays
        ordered = sorted(cuda_events, key=lambda ev: ev.time_range.start)[-per_replay * replays:]
        runs = [ordered[i * per_replay:(i + 1) * per_replay] for i in range(replays)]
        same = all([short(ev.name) for ev in run] == [short(ev.name) for ev in runs[-1]] for run in runs)
        out["sequence"] = [{"kernel": short(ev.name), "us": round(ev.device_time, 2),
                            **({"us_median": round(statistics.median(run[i].device_time for run in runs), 2)}
                               if same else {})}
                           for i, ev in enumerate(runs[-1])]
        out["sequence_same_order_every_replay"] = same
    return out


def wide_configs(base: dict, n: int, k: int, heads: int, mats: int, sms: int) -> list[dict]:
    """Tiles x warps x stages x split counts that fill 1, 2 or all the resident slots of the SMs once."""
    cfgs = []
    for bn, bk in ((16, 256), (32, 256), (64, 128)):
        for warps in (4, 8):
            for stages in (4,):
                stage = (bn * bk * mats + 16 * bk) * 2
                if stages * stage > 200 << 10:
                    continue
                blocks = triton.cdiv(n, bn) * heads
                slots = sms * max(1, min(8, (224 << 10) // (stages * stage)))
                splits = {max(1, triton.cdiv(sms, blocks)), max(1, 2 * triton.cdiv(sms, blocks)),
                          max(1, slots // blocks)}
                for sp in sorted(splits):
                    sp = min(sp, triton.cdiv(k, bk))
                    c = dict(base, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages, SPLIT=sp)
                    if c not in cfgs:
                        cfgs.append(c)
    return cfgs


def deep_configs(base: dict, n: int, k: int, heads: int, mats: int, sms: int) -> list[dict]:
    """--deep-sweep: narrower K tiles with deeper pipelines (more blocks a SM: ncu showed the q_a + kv_a launch
    at 2 blocks of 4 warps a SM, limited by shared memory, DRAM 50% busy), at the heuristic's split and twice it."""
    cfgs = []
    for bn in (16, 32):
        for bk in (64, 128, 256):
            for stages in (3, 4, 6, 8):
                stage = (bn * bk * mats + 16 * bk) * 2
                if stages * stage > 160 << 10 or bk > k:
                    continue
                for mult in (1, 2):
                    sp = max(1, min(triton.cdiv(k, bk), round(base["SPLIT"] * mult * base["BLOCK_N"] / bn)))
                    c = dict(base, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=stages, SPLIT=sp)
                    if c not in cfgs:
                        cfgs.append(c)
    return cfgs


# The dense projections of one Kimi TP=8 rank layer: (name, N, K, heads, epilogue). Heads > 1: per-head
# products of MLA's absorbed form (W_UK read N-contiguous, W_UV K-contiguous).
PROJECTIONS = [("q_a_proj", 1536, 7168, 1, None), ("kv_a_proj", 576, 7168, 1, None),
               ("q_b_proj", 1536, 1536, 1, None), ("w_uk (8 heads)", 512, 128, 8, "kn"),
               ("w_uv (8 heads)", 128, 512, 8, None), ("o_proj", 7168, 1024, 1, None),
               ("router (fp32 out)", 384, 7168, 1, "f32"), ("shared gate_up (gated)", 256, 7168, 1, "gated"),
               ("shared down", 7168, 256, 1, None), ("dense gate_up (gated)", 2304, 7168, 1, "gated"),
               ("dense down", 7168, 2304, 1, None), ("lm_head", 20480, 7168, 1, None),
               ("q_a+kv_a as one matrix", 2112, 7168, 1, None)]
# With --wide-sweep: the launches that carry most of a layer's dense bytes (the q_a/kv_a pair as one matrix of
# the same bytes, o_proj, q_b, the router + shared gate/up pair's gated part).
WIDE = ("q_a+kv_a as one matrix", "o_proj", "q_b_proj", "shared gate_up (gated)")


@torch.inference_mode()
def gemm_ceiling(bw_gbps: float, Ts: list[int], sweep: bool, wide: bool = False, deep: bool = False,
                 only: tuple[str, ...] = ()) -> list[dict]:
    """cuBLAS (what torch runs) vs our GEMV kernel at M = T for each dense projection of the rank slice,
    weights rotated past the L2, both timed in the same graph-replay way; with ``sweep``, a few configs of
    the GEMV around the heuristic's."""
    from sglang_eagle3.kernels.gemv import gemv_config, triton_gemv
    from sglang_eagle3.kernels.tuning import sm_count, smem_per_block

    sms = sm_count(torch.device("cuda"))
    out = []
    for name, n, k, heads, epi in PROJECTIONS:
        if only and name not in only:
            continue
        mats = 2 if epi == "gated" else 1
        nbytes = heads * n * k * 2 * mats
        copies = max(2, min(32, (256 << 20) // nbytes))
        if epi == "kn":  # stored [h, K, N]: pass the [h, N, K] view
            ws = [torch.randn(heads, k, n, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(copies)]
        elif heads > 1:
            ws = [torch.randn(heads, n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        else:
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        ups = [torch.randn_like(w) for w in ws] if epi == "gated" else [None] * copies
        for T in Ts:
            x = torch.randn(T, heads, k, device="cuda", dtype=torch.bfloat16) if heads > 1 else \
                torch.randn(T, k, device="cuda", dtype=torch.bfloat16)
            kw = {"out_dtype": torch.float32} if epi == "f32" else {}

            def torch_call(w, u, x=x, heads=heads, epi=epi):
                if heads > 1:
                    return torch.bmm(x.transpose(0, 1), w.transpose(1, 2))
                if epi == "f32":
                    return torch.mm(x, w.t(), out_dtype=torch.float32)
                if epi == "gated":
                    return torch.nn.functional.silu(x @ w.t()) * (x @ u.t())
                return x @ w.t()

            def ours(w, u, cfg=None, x=x, kw=kw):
                return triton_gemv(x, w, w_up=u, config=cfg, **kw)

            t_us = time_graph([lambda w=w, u=u: torch_call(w, u) for w, u in zip(ws, ups, strict=True)])
            if T == Ts[0]:  # bytes, not T, set the ceiling
                read_us = read_ceiling_us(ws + [u for u in ups if u is not None], sms) * (2 if epi == "gated" else 1)
            base = gemv_config(n, k, heads, epi != "kn", sms, mats, smem_per_block(torch.device("cuda")))
            cfgs = [base]
            if wide and name in WIDE and T == Ts[0]:
                cfgs += [c for c in wide_configs(base, n, k, heads, mats, sms) if c not in cfgs]
            if deep and name in WIDE and T == Ts[0]:
                cfgs += [c for c in deep_configs(base, n, k, heads, mats, sms) if c not in cfgs]
            if sweep and T == Ts[0]:  # configs are per shape, not per T: sweep at the first T only
                for bn in (16, 32):
                    for mult in (0.5, 1, 2):
                        for stages in (2, 4):
                            c = dict(base, BLOCK_N=bn, num_stages=stages,
                                     SPLIT=max(1, round(base["SPLIT"] * mult * base["BLOCK_N"] / bn)))
                            if c not in cfgs:
                                cfgs.append(c)
            best = None
            for cfg in cfgs:
                try:
                    us = time_graph([lambda w=w, u=u, cfg=cfg: ours(w, u, cfg) for w, u in zip(ws, ups, strict=True)])
                except Exception as e:  # a config the GPU rejects (shared memory) is skipped, said so
                    print(f"    config {cfg} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                if best is None or us < best[0]:
                    best = (us, cfg)
                if cfg is base:
                    base_us = us
            row = {"op": name, "N": n, "K": k, "heads": heads, "T": T, "bytes": nbytes, "torch_us": round(t_us, 2),
                   "read_us": round(read_us, 2),
                   "gemv_us": round(base_us, 2), "gemv_config": base, "best_us": round(best[0], 2),
                   "best_config": best[1]}
            for key in ("torch", "gemv", "best", "read"):
                row[f"{key}_frac_of_copy_bw"] = round(nbytes / (row[f"{key}_us"] * 1e-6) / 1e9 / bw_gbps, 3)
            out.append(row)
            print(f"  {name:24s} [{heads}x{n}x{k}] T={T:2d}: read {read_us:6.2f} us "
                  f"({row['read_frac_of_copy_bw']:5.1%})"
                  f"  torch {t_us:7.2f} us ({row['torch_frac_of_copy_bw']:5.1%})"
                  f"  gemv {base_us:7.2f} us ({row['gemv_frac_of_copy_bw']:5.1%})  best {best[0]:7.2f} us "
                  f"({row['best_frac_of_copy_bw']:5.1%}) {best[1] if sweep else ''}", flush=True)
        del ws, ups
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1,
                    help="requests a step, each with --context cached tokens and T new ones (graphs captured up to it)")
    ap.add_argument("--routing", default="own", metavar="own|uniform|reuse:P|trace:PATH",
                    help="the MoE layers' expert ids (benchmarks/routing.py): the random router's own, or drawn "
                         "before capture: uniform (a trained router's spread over a batch, where the random "
                         "weights' router concentrates it), reuse:P, trace:PATH")
    ap.add_argument("--uniform-routing", action="store_true", help="--routing uniform")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--sequence", action="store_true",
                    help="also list one replay's launches in order with their times (tells the GEMV launches apart)")
    ap.add_argument("--gemm-only", action="store_true", help="only the projection table (no model)")
    ap.add_argument("--sweep", action="store_true", help="also time GEMV configs around the heuristic's")
    ap.add_argument("--wide-sweep", action="store_true",
                    help="with --sweep: a wider config grid on the launches that carry most bytes")
    ap.add_argument("--deep-sweep", action="store_true",
                    help="with --sweep: narrower K tiles, deeper pipelines on the launches that carry most bytes")
    ap.add_argument("--only", nargs="+", default=[], help="only these projections (names as printed)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        choice = RoutingChoice("uniform") if args.uniform_routing else parse_routing(args.routing)
    except ValueError as e:
        ap.error(str(e))
    bw = copy_bandwidth()
    if args.gemm_only:
        res = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
               "gpu": torch.cuda.get_device_name(), "copy_bw_gbps": round(bw, 1),
               "gemm": gemm_ceiling(bw, sorted(set(args.tokens)), args.sweep, args.wide_sweep, args.deep_sweep,
                                    tuple(args.only))}
        if args.out:
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
        return
    init_tp(0, TP, simulated=True)
    cfg = kimi_config(args.layers, 384)
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(cfg, dtype=torch.bfloat16, int4_experts=True)
    randomize_cuda(model, 0)
    max_ctx = args.context + max(args.tokens) + 128
    verify = tuple(t for t in args.tokens if t > 1)
    moe_layers = len(model.moe_blocks())
    widths = sorted({1, *(verify or (2,))})  # every captured graph's tokens a request
    drawn = drawn_routing(choice, cfg.n_routed_experts, cfg.num_experts_per_tok, moe_layers,
                          shapes=[(b, T) for b in (args.batch, *range(1, args.batch)) for T in widths])
    if drawn:  # left in place: the process ends with the run
        drawn.__enter__()
    runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=args.batch * (max_ctx // 64 + 4), page_size=64,
                         max_context=max_ctx, device=torch.device("cuda"), dtype=torch.bfloat16,
                         use_cuda_graph=True, cuda_graph_max_bs=args.batch, verify_widths=verify or (2,),
                         attention_backend="triton", moe_backend="triton")
    for kv in runner.target_kv.layers:
        kv.normal_()
    runner.capture_graphs()
    res = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bw_gbps": round(bw, 1),
           "layers": args.layers, "batch": args.batch,
           "routing": choice.label(), "steps": []}
    for T in args.tokens:
        r = profile_T(runner, T, args.context, args.layers, args.replays, args.batch, args.sequence)
        res["steps"].append(r)
        print(f"\nbatch={args.batch} T={T} ctx={args.context} ({res['routing']} routing): "
              f"graph {r['graph_ms']:.3f} ms for {args.layers} layers "
              f"({r['graph_ms'] / args.layers * 1e3:.1f} us/layer), kernels busy {r['kernel_busy_ms']:.3f} ms, "
              f"{r['launches_per_layer']} launches/layer", flush=True)
        for k in r["kernels"][:30]:
            print(f"  {k['per_step_us'] / args.layers:8.2f} us/layer  {k['calls_per_layer']:5.2f}x  "
                  f"{k['us_per_call']:7.2f} us/call  {k['kernel']}", flush=True)
        if args.sequence:
            print(f"  {len(r['sequence'])} launches a replay in order (us: the median over the replays where every "
                  "replay ran them in one order, else the last replay's):", flush=True)
            for i, k in enumerate(r["sequence"]):
                print(f"    {i:4d} {k.get('us_median', k['us']):8.2f} us  {k['kernel']}", flush=True)
    if len(res["steps"]) > 1:
        print("\n" + "\n".join(by_t_table(res["steps"], args.layers)), flush=True)
    if not args.no_gemm:
        print("\nprojections at M=T, torch (cuBLAS) vs our GEMV (weights rotated past L2):", flush=True)
        res["gemm"] = gemm_ceiling(bw, sorted(set(args.tokens)), args.sweep, args.wide_sweep, args.deep_sweep,
                                   tuple(args.only))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
