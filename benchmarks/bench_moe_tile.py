"""The MoE above decode sizes (batched decode/verify, prefill: the GEMV path up to GEMV_MAX_TOKENS, the tile
path above) and the prefill it serves, on one GPU.

Three parts, each optional:
  moe      the INT4 fused MoE at Kimi-K2.5 TP=8 rank shapes (384 experts, H=7168, I=256, top-8) for T tokens,
           the launcher's choice of path and, for GEMV_MAX_TOKENS < T <= --gemv-max, the GEMV path too (where
           the two cross);
           time per call (CUDA graph of 16 calls over rotated routings), bytes of the distinct experts, share of
           the copy bandwidth measured in the same run.
  sweep    (--sweep) tile configs (BLOCK_M, BLOCK_N, warps, stages) for gate_up, then down with the winner's
           BLOCK_M, at --sweep-tokens; writes sweep_tile_table.json (table buckets by token count). With --swap
           the candidates are the swap kernels' (weights as the dot's M, "SWAP"), and at each T the winner and
           the checked-in table's config are timed alternately twice; writes sweep_swap_table.json (for
           SGLANG_EAGLE3_CONFIG_TABLE).
  prefill  (--prefill N ...) prefill of one N-token prompt through the Kimi rank slice (--layers, random
           INT4 experts): median ms eager and as a prefill CUDA graph (ModelRunner.prefill, captured at the
           --prefill lengths; --no-prefill-graphs skips it), and the eager kernel time by family.

Run the same script against another checkout (copy it into that tree's benchmarks/) to compare two versions
on one machine in one call:

    python benchmarks/bench_moe_tile.py --out OUT --label new --prefill 256 2048
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import (  # noqa: E402
    EXPERTS,
    TOP_K,
    buckets_of,
    copy_bandwidth,
    make_moe_weights,
    moe_case,
    sweep_moe,
    time_graph,
)
from benchmarks.routing import DrawnRouting  # noqa: E402
from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.fused_moe import GEMV_MAX_TOKENS  # noqa: E402

# Candidates: the autotuner's (BLOCK_M, the plan both kernels share, rides on gate_up's).
TILE_GATE_UP = tuning.CANDIDATES["fused_moe_int4_gate_up"]
TILE_DOWN = tuning.CANDIDATES["fused_moe_int4_down"]
# The swap kernels' (none spills at sm_90 in an offline compile; BLOCK_M is the plan's, from gate_up).
SWAP_GATE_UP = [{"SWAP": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_W": bw, "num_warps": w, "num_stages": 1}
                for bm, bn, bw, w in ((16, 32, 16, 4), (16, 32, 8, 4), (16, 64, 8, 4), (16, 32, 4, 4), (32, 32, 8, 4),
                                      (32, 64, 8, 4), (32, 64, 8, 8), (32, 64, 16, 8), (64, 32, 8, 4), (64, 64, 8, 4),
                                      (64, 64, 4, 4), (16, 64, 8, 8), (16, 128, 8, 8), (32, 128, 8, 8))]
SWAP_DOWN = [{"BLOCK_N": bn, "BLOCK_W": bw, "num_warps": w, "num_stages": 1}
             for bn, bw, w in ((64, 8, 4), (64, 4, 4), (128, 8, 8), (128, 4, 8), (32, 8, 4), (128, 8, 4), (256, 8, 8))]


def log(msg: str) -> None:
    print(msg, flush=True)


def family(name: str) -> str:
    n = name.lower()
    for key, fam in (("moe_align", "moe tile (align)"), ("moe_gate_up", "moe tile"), ("moe_down", "moe tile"),
                     ("moe_sum", "moe tile"), ("moe_int4_swap", "moe tile"), ("moe_int4_gemv", "moe gemv"),
                     ("topk", "routing"),
                     ("gemv", "gemv (ours)"), ("gemm", "cuBLAS"), ("cutlass", "cuBLAS"), ("sm90_xmma", "cuBLAS"),
                     ("nvjet", "cuBLAS"), ("mla", "attention"), ("softmax", "attention (torch)"),
                     ("rms", "norm"), ("rotary", "rotary")):
        if key in n:
            return fam
    return "other (torch)"


def moe_part(record, copy_gbps: float, tokens: list[int], gemv_max: int, table: dict | None,
             both: bool = False) -> None:
    weights = make_moe_weights(True)
    for T in tokens:
        paths = [None] + (["gemv"] if T <= gemv_max and T > GEMV_MAX_TOKENS else [])
        if both:  # where the two paths cross (GEMV_MAX_TOKENS)
            paths = ["gemv", "tile"]
        for path in paths:
            try:
                calls, nbytes, distinct = moe_case(T, True, weights, path=path)
                cfg = None  # the checked-in table, unless this run swept the tile path
                if table and (path == "tile" or path is None and T > GEMV_MAX_TOKENS):
                    cfg = table_config(table, T)
                us = time_graph(calls(cfg), replays=10)
            except Exception:
                log(f"T={T} path={path} failed:\n" + traceback.format_exc())
                continue
            used = path or ("gemv" if T <= GEMV_MAX_TOKENS else "tile")
            gbps = nbytes / us / 1e3
            record("moe", {"T": T, "path": used, "us": round(us, 2), "bytes": nbytes,
                           "distinct_experts": round(distinct, 1), "gbps": round(gbps, 1),
                           "frac_of_copy_bw": round(gbps / copy_gbps, 3)})
            log(f"moe int4 T={T:5d} {used:5s} {us:10.1f} us  {distinct:6.1f} experts  {gbps:7.0f} GB/s "
                f"{gbps / copy_gbps:6.1%}")
    del weights
    torch.cuda.empty_cache()


def tile_table_ops(winners: dict[int, tuple[dict, dict]]) -> dict[str, list[dict]]:
    """Table ops from (gate_up, down) winners per swept T: a T takes the winner of the smallest swept T at or
    above it (the largest one's above it too); runs of equal configs become one bucket (buckets_of)."""
    swept = sorted(winners)
    per_t = {t: winners[next(T for T in swept if T >= t)] for t in range(1, swept[-1] + 1)}
    return {f"fused_moe_int4_{stage}": buckets_of({t: w[i] for t, w in per_t.items()}, "tokens")
            for i, stage in enumerate(("gate_up", "down"))}


def table_config(table: dict, T: int) -> dict:
    """The tile path's {"gate_up", "down"} configs at T in a table."""
    return {op: tuning.table_config(table, f"fused_moe_int4_{op}", "tokens", T) for op in ("gate_up", "down")}


def swap_ab(rows: list, T: int, table: dict, winner: tuple[dict, dict]) -> None:
    """The checked-in table's config and the swept winner at T, alternating twice in one process, us a call."""
    weights = make_moe_weights(True)
    calls, nbytes, distinct = moe_case(T, True, weights, path="tile")
    configs = {"table": table_config(table, T), "swap": {"gate_up": winner[0], "down": winner[1]}}
    runs: dict[str, list] = {k: [] for k in configs}
    for _ in range(2):
        for label, cfg in configs.items():
            runs[label].append(round(time_graph(calls(cfg), replays=10), 1))
    rows.append({"T": T, "distinct_experts": round(distinct, 1), "bytes": nbytes, "us_runs": runs,
                 "configs": configs})
    log(f"T={T}: table {runs['table']} us, swap {runs['swap']} us")
    del weights, calls
    torch.cuda.empty_cache()


def sweep_part(out: Path, tokens: list[int], swap: bool = False) -> dict:
    """The tile path's gate_up then down (bench_kernels.sweep_moe) at each T; runs of equal winners become one
    table bucket each (bench_kernels.buckets_of). ``swap``: the swap kernels' candidates, each T's winner then
    timed against the checked-in table's config (swap_ab)."""
    rows: dict[str, list] = {}
    winners = {}
    arch, sms, name = tuning.device_key(torch.cuda.current_device())
    checked_in = tuning._table(arch, sms)
    for T in tokens:
        winners[T] = sweep_moe(rows, "fused_moe_int4", T, "tile", SWAP_GATE_UP if swap else TILE_GATE_UP,
                               SWAP_DOWN if swap else TILE_DOWN)
        log(f"sweep T={T}: gate_up {winners[T][0]} down {winners[T][1]}")
        if swap and checked_in is not None:
            try:
                swap_ab(rows.setdefault("ab", []), T, checked_in, winners[T])
            except Exception:
                log(f"T={T} table vs swap failed:\n" + traceback.format_exc())
    kind = "swap" if swap else "tile"
    table = {"arch": arch, "sm_counts": [sms], "measured": True,
             "source": f"benchmarks/bench_moe_tile.py --sweep{' --swap' if swap else ''} on {name} (INT4 tile "
                       f"path, 384 experts, T={tokens})",
             "ops": tile_table_ops(winners)}
    (out / f"sweep_{kind}_table.json").write_text(json.dumps(table, indent=1))
    (out / f"sweep_{kind}.json").write_text(json.dumps(rows, indent=1))
    return table


@torch.inference_mode()
def prefill_part(record, lengths: list[int], layers: int, iters: int, uniform: bool, graphs: bool,
                 buckets: list[int] | None = None, batch: int = 1) -> None:
    import importlib.util

    from sglang_eagle3.distributed.parallel_state import init_tp
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.runtime.model_runner import ModelRunner

    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location("bvg", here / "bench_verify_graph.py")
    bvg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bvg)
    init_tp(0, 8, simulated=True)
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(bvg.kimi_config(layers, EXPERTS), dtype=torch.bfloat16, int4_experts=True)
    bvg.randomize_cuda(model, 0)
    page = 64
    max_ctx = max(lengths) + page
    moe_layers = len(model.moe_blocks())
    rows = sorted({*(buckets or lengths), *(n * batch for n in lengths)})  # graph buckets, eager extends
    routing = DrawnRouting(EXPERTS, TOP_K, moe_layers, shapes=[(1, r) for r in rows]) if uniform else (
        contextlib.nullcontext())
    with routing:
        # Prefill graphs at these buckets (default: exactly the lengths; ModelRunner.prefill: a replay per prompt,
        # padded to its bucket, a prompt past the largest bucket in chunks of it).
        runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=batch * (max_ctx // page + 2) + 4,
                             page_size=page, max_context=max_ctx, device=torch.device("cuda"), dtype=torch.bfloat16,
                             use_cuda_graph=graphs, cuda_graph_max_bs=batch, verify_widths=(2,),
                             attention_backend="triton", moe_backend="triton",
                             prefill_tokens=tuple(buckets or lengths) if graphs else ())
        if graphs:
            runner.capture_graphs()
            log(f"prefill graphs: {runner.graph_report()['target_prefill']}")
        for n in lengths:
            _prefill_one(record, runner, bvg, n, layers, iters, page, uniform, graphs, batch)


def _prefill_one(record, runner, bvg, n: int, layers: int, iters: int, page: int, uniform: bool,
                 graphs: bool, batch: int) -> None:
    """``batch`` prompts of n tokens admitted together: median ms of eager prefills (one ragged extend; and, with
    graphs, of prefill graph replays as the scheduler makes them: inputs built, replayed, real rows copied out;
    with batch > 1 also a replay a prompt; eager and graph alternating twice), and the profiler's kernel ms of
    an eager prefill by family."""
    per = -(-n // page) + 1  # the prompt's pages and one more, within the context's page table
    rows = [([(7 * i + 3 + 11 * b) % 20000 for i in range(n)], 0, list(range(1 + b * per, 1 + (b + 1) * per)))
            for b in range(batch)]
    bt = runner.build(rows)
    runner.target_extend(bt)  # compile / tune
    torch.cuda.synchronize()
    eager, graph, one_by_one = [], [], []
    for _ in range(2 if graphs else 1):
        eager.append(round(bvg.median_ms(lambda bt=bt: runner.target_extend(bt), iters), 2))
        if graphs:
            graph.append(round(bvg.median_ms(lambda: runner.prefill(rows), iters), 2))
            if batch > 1:
                one_by_one.append(round(bvg.median_ms(lambda: [runner.prefill([r]) for r in rows], iters), 2))
    ms = min(eager)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        runner.target_extend(bt)
        torch.cuda.synchronize()
    fams: dict[str, float] = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            fams[family(ev.name)] += ev.device_time / 1e3  # ms
    fams = {k: round(v, 2) for k, v in sorted(fams.items(), key=lambda kv: -kv[1])}
    row_out = {"tokens": n, "batch": batch, "layers": layers, "ms": round(ms, 2),
               "tok_per_s": round(batch * n / ms * 1e3, 1),
               "routing": "uniform" if uniform else "the random router's own", "kernel_ms_by_family": fams}
    if graphs:
        row_out.update(eager_ms_runs=eager, graph_ms_runs=graph, graph_ms=min(graph),
                       replays=len(runner._prefill_plan(runner.target_prefill, rows)[0]))
        if batch > 1:
            row_out["graph_one_request_at_a_time_ms_runs"] = one_by_one
        counts = runner.stats.as_dict().get("target_prefill", {})
        assert counts.get("eager", 0) == 0, counts  # every graph timing above was a replay
    record("prefill", row_out)
    log(f"prefill {batch} x {n:5d} tokens, {layers} layers: eager {eager} ms, graph {graph} ms"
        + (f" ({row_out['replays']} replays), a request at a time {one_by_one} ms" if batch > 1 else "")
        + f"; eager kernels {fams}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="", help="names this run in the output file (e.g. the checkout)")
    ap.add_argument("--tokens", type=int, nargs="*", default=[8, 16, 32, 64, 128, 256, 512, 2048])
    ap.add_argument("--gemv-max", type=int, default=32, help="also time the GEMV path up to this T")
    ap.add_argument("--both-paths", action="store_true", help="time the GEMV and the tile path at every --tokens T")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-tokens", type=int, nargs="+", default=[16, 64, 256, 2048])
    ap.add_argument("--swap", action="store_true", help="--sweep the swap kernels' configs (see the doc above)")
    ap.add_argument("--prefill", type=int, nargs="*", default=[])
    ap.add_argument("--uniform-routing", action="store_true",
                    help="prefill with experts drawn uniformly (benchmarks/routing.py DrawnRouting)")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--prefill-iters", type=int, default=5)
    ap.add_argument("--prefill-buckets", type=int, nargs="+",
                    help="prefill graph token buckets (default: the --prefill lengths); longer prompts go in chunks")
    ap.add_argument("--prefill-batch", type=int, default=1, help="prompts admitted together (each --prefill long)")
    ap.add_argument("--no-prefill-graphs", action="store_true",
                    help="time only the eager prefill (by default prefill graphs of the --prefill lengths too)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    args.out.mkdir(parents=True, exist_ok=True)
    ways = copy_bandwidth()
    copy_gbps = max(ways.values())
    arch, sms, name = tuning.device_key(torch.cuda.current_device())
    result = {"command": "python " + " ".join(sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent),
              "label": args.label,
              "gpu": name, "arch": arch, "torch": torch.__version__, "triton": __import__("triton").__version__,
              "copy_gbps": round(copy_gbps, 1),
              "method": "MoE: CUDA graph of 16 calls over rotated routings (weights 1.2 GB, past the L2), median of "
                        "10 replays / 16; bytes = distinct experts' packed weights + scales + x + out. Prefill: "
                        "eager target_extend of one prompt and its prefill graph replay (ModelRunner.prefill), CUDA "
                        "events around each call (host work included), median",
              "kernel_report": kernels.kernel_report(),
              "moe": [], "prefill": []}
    out_file = args.out / f"moe_tile{('_' + args.label) if args.label else ''}.json"

    def record(part: str, row: dict) -> None:
        result[part].append(row)
        out_file.write_text(json.dumps(result, indent=1))

    log(f"{name} ({arch}), copy bandwidth {copy_gbps:.0f} GB/s, commit {result['git_commit']} {args.label}")
    t0 = time.time()
    table = None
    if args.sweep:
        try:
            table = sweep_part(args.out, args.sweep_tokens, args.swap)
            result["swept_table"] = table["ops"]
        except Exception:
            log("sweep failed:\n" + traceback.format_exc())
        log(f"sweep done at {time.time() - t0:.0f}s")
    if args.tokens:
        moe_part(record, copy_gbps, args.tokens, args.gemv_max, table, args.both_paths)
        log(f"moe done at {time.time() - t0:.0f}s")
    if args.prefill:
        try:
            prefill_part(record, args.prefill, args.layers, args.prefill_iters, args.uniform_routing,
                         not args.no_prefill_graphs, args.prefill_buckets, args.prefill_batch)
        except Exception:
            log("prefill failed:\n" + traceback.format_exc())
        log(f"prefill done at {time.time() - t0:.0f}s")
    out_file.write_text(json.dumps(result, indent=1))
    if result["moe"]:
        med = statistics.median(r["frac_of_copy_bw"] for r in result["moe"])
        log(f"median share of copy bandwidth over the MoE cases: {med:.1%}")


if __name__ == "__main__":
    main()
