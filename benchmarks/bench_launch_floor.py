"""What can a decode (or verify) step with our launch structure reach at best? The step of a Kimi-K2.5 TP=8 rank's
slice with every kernel replaced by one that only reads that kernel's bytes.

Issues 4 and 5 ask the decode graph to come within 2x and 1.5x of its bandwidth floor (bytes / copy bandwidth), and a
verify of 4 within 1.5x of its own (docs/BENCHMARKS.md section 0 has where they sit). This measures the ceiling of the
launch structure itself: the same launches a layer as the shipped decode path, in the same order, on the same streams
(the shared expert's down projection on the side stream, as the model forks and joins it), with PDL as configured, in
one CUDA graph of ``--layers`` layers plus the final norm and lm_head, each launch a read-only kernel
(``bench_kernels.stream_read_kernel`` with its PDL wait) over exactly as many bytes as the real kernel must read, in
buffers of their own (nothing stays in the L2 between uses). No kernel can read its bytes faster in a graph; so no set
of kernels with this launch structure can make a faster step, whatever they compute. Grids: the best of a few shapes
per size, each size timed alone first.

Printed and written: the launch-structure step (ms), the bandwidth floor (bytes / copy bandwidth, the issue's
definition; at decode 8 experts a MoE layer, with ``--tokens T`` the distinct experts of T uniformly routed tokens),
their ratio, and the sum of the launches timed alone.

``--prefetch-variants``: the same structure with the model's later L2 prefetch plans (layers/overlap.py), each on a
stream of its own joined at the step's end as the model does it: ``mid`` (after q_a + kv_a, a bulk prefetch of the
layer's o_proj and router + shared gate/up buffers), ``next_moe`` (after the router + shared gate/up, the next
layer's q_a + kv_a buffer), ``mid,next_moe``, ``none``; timed in turn, alternating twice, in one run: how far the
prefetch lowers the structure's own ceiling, whatever the kernels compute.

    python benchmarks/bench_launch_floor.py --out benchmarks/results/h200/launch_floor.json [--context 1024]
        [--tokens 4 | --experts 31]
        [--prefetch-variants none mid next_moe mid,next_moe]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import copy_bandwidth, stream_read_kernel, time_graph  # noqa: E402
from benchmarks.routing import uniform_distinct  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.prefetch import l2_prefetch, prefetch_table  # noqa: E402

# One Kimi-K2.5 TP=8 rank (bench_verify_graph.kimi_config / TP): bf16 dense weights, INT4 experts (g32 scales).
H, Q_LORA, KV_LORA, ROPE, HEADS, NOPE, V = 7168, 1536, 512, 64, 8, 128, 128
EXPERTS, TOP_K, MOE_I, DENSE_I, VOCAB = 384, 8, 2048 // 8, 18432 // 8, 163840 // 8
BF16, TINY = 2, 32 << 10  # a norm's, the rotary's or the routing's bytes: a few rows, ~KB
# An INT4 expert's bytes (packed nibbles + bf16 scales a group of 32): gate and up rows, and the down rows.
EXPERT_GATE_UP_WORDS = 2 * MOE_I * H // 2
EXPERT_GATE_UP = EXPERT_GATE_UP_WORDS + 2 * MOE_I * H // 32 * BF16
EXPERT_DOWN = H * MOE_I // 2 + H * MOE_I // 32 * BF16


def layer_launches(dense: bool, context: int, experts: int = TOP_K) -> list[tuple[str, int, str]]:
    """(name, bytes read, stream) of one layer's decode launches (T=1), in the order the shipped path issues
    them (default fusions: q_a norm in q_b, kv_a norm in the rotary launch, router + shared gate/up in one
    launch; the shared down on the side stream). experts: the distinct experts a MoE layer reads (top_k at
    decode; a verify's T tokens read more: uniform_experts). A verify's other launches read the same weights and
    cache (its activations are KB), so the plan of a verify differs from decode's only there."""
    attn = [("input norm", TINY, "main"), ("q_a + kv_a", (Q_LORA + KV_LORA + ROPE) * H * BF16, "main"),
            ("q_b (q_a norm)", HEADS * (NOPE + ROPE) * Q_LORA * BF16, "main"), ("rotary + kv_a norm", TINY, "main"),
            ("W_UK", HEADS * NOPE * KV_LORA * BF16, "main"),
            ("MLA split", context * (KV_LORA + ROPE) * BF16, "main"), ("MLA merge", TINY, "main"),
            ("W_UV", HEADS * V * KV_LORA * BF16, "main"), ("o_proj", H * HEADS * V * BF16, "main"),
            ("post-attention norm", TINY, "main")]
    if dense:
        return attn + [("dense gate/up", 2 * DENSE_I * H * BF16, "main"), ("dense down", H * DENSE_I * BF16, "main")]
    return attn + [("router + shared gate/up", (EXPERTS + 2 * MOE_I) * H * BF16, "main"),
                   ("shared down", H * MOE_I * BF16, "side"), ("routing", TINY, "main"),
                   ("experts gate/up", experts * EXPERT_GATE_UP, "main"),
                   ("experts down", experts * EXPERT_DOWN, "main")]


def uniform_experts(tokens: int) -> int:
    """The distinct experts T tokens read a MoE layer when each draws its top_k uniformly (a trained router's spread:
    benchmarks/routing.py), rounded: 8 at T=1, 31 at T=4, 60 at T=8."""
    if tokens < 1:
        raise SystemExit(f"--tokens must be at least 1, got {tokens}")
    return round(uniform_distinct(EXPERTS, TOP_K, tokens))


PREFETCH_PLANS = ("none", "mid", "next_moe", "mid,next_moe")


def prefetch_forks(layers: list[list[tuple[str, int, str]]], plan: str) -> dict[tuple[int, str], list[tuple[int, str]]]:
    """{(layer, launch name): [(layer, launch name) whose buffers to prefetch once that launch is queued]} for a
    PREFETCH_PLANS value, as layers/overlap.py forks them: mid after q_a + kv_a (o_proj, and the router + shared
    gate/up where the layer has one), next_moe after the router + shared gate/up (the next layer's q_a + kv_a)."""
    if plan not in PREFETCH_PLANS:
        raise SystemExit(f"--prefetch-variants: {plan!r} is not one of {', '.join(PREFETCH_PLANS)}")
    parts = plan.split(",")
    forks: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for i, lay in enumerate(layers):
        names = [name for name, _, _ in lay]
        if "mid" in parts:
            forks[(i, "q_a + kv_a")] = [(i, n) for n in ("o_proj", "router + shared gate/up") if n in names]
        if "next_moe" in parts and "router + shared gate/up" in names and i + 1 < len(layers):
            forks[(i, "router + shared gate/up")] = [(i + 1, "q_a + kv_a")]
    return forks


def launch(buf: torch.Tensor, out: torch.Tensor, grid: tuple[int, int], pdl: bool) -> None:
    per_sm_programs, block = grid
    n = buf.numel()
    per = triton.cdiv(triton.cdiv(n, per_sm_programs), block) * block
    stream_read_kernel[(triton.cdiv(n, per),)](buf, out, n, per, BLOCK=block, PDL=pdl,
                                               num_warps=8 if block > 1024 else 4, **tuning.pdl_launch(pdl))


def graph_ms(fn, replays: int) -> float:
    """Median ms of one replay of what fn issues, captured in one CUDA graph (bench_kernels.time_graph)."""
    return time_graph([fn], replays) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=1,
                    help="tokens a step (a verify's T): the MoE reads uniform_experts(T) distinct experts a layer")
    ap.add_argument("--experts", type=int, default=None,
                    help="distinct experts a MoE layer reads, instead of --tokens' uniform expectation")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--prefetch-variants", nargs="+", default=["none"], metavar="PLAN",
                    help=f"L2 prefetch plans to time the structure with, in turn: {', '.join(PREFETCH_PLANS)}")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    for plan in args.prefetch_variants:
        prefetch_forks([], plan)  # a bad name stops here, before any GPU work
    experts = uniform_experts(args.tokens) if args.experts is None else args.experts
    if not 1 <= experts <= EXPERTS:
        raise SystemExit(f"--experts must be 1..{EXPERTS}, got {experts}")
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    copy = max(bw.values())
    sms = tuning.sm_count(dev)
    pdl = tuning.pdl(dev, "gemv")
    layers = [layer_launches(i == 0, args.context, experts) for i in range(args.layers)]
    tail = [("final norm", TINY, "main"), ("lm_head", VOCAB * H * BF16, "main")]
    plan = [item for lay in layers for item in lay] + tail
    owner = [(i, name) for i, lay in enumerate(layers) for name, _, _ in lay] + [(-1, name) for name, _, _ in tail]
    total = sum(b for _, b, _ in plan)
    out = torch.empty(1 << 16, device=dev, dtype=torch.float32)
    # The grid for each size: the best of a few shapes, timed alone (12 distinct buffers a graph).
    grids, alone = {}, {}
    for size in sorted({b for _, b, _ in plan}):
        bufs = [torch.empty(size // 2, device=dev, dtype=torch.bfloat16).normal_() for _ in range(12)]
        best = None
        for per_sm in (1, 2, 4, 8, 16):
            for block in (1024, 4096):
                grid = (sms * per_sm, block)
                ms = graph_ms(lambda g=grid, bs=bufs: [launch(b, out, g, pdl) for b in bs], args.replays) / len(bufs)
                if best is None or ms < best[0]:
                    best = (ms, grid)
        alone[size], grids[size] = best
        print(f"{size / 1e6:9.3f} MB alone: {best[0] * 1e3:7.2f} us (grid {best[1][0]} programs x {best[1][1]})",
              flush=True)
        del bufs
    bufs = [torch.empty(b // 2, device=dev, dtype=torch.bfloat16) for _, b, _ in plan]
    for b in bufs:
        b.normal_()
    side, late = torch.cuda.Stream(), torch.cuda.Stream()
    buf_of = dict(zip(owner, bufs, strict=True))

    def step(tables: dict):
        main = torch.cuda.current_stream()
        forked = late_forked = False
        for key, (name, size, stream), buf in zip(owner, plan, bufs, strict=True):
            if stream == "side":
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    launch(buf, out, grids[size], pdl)
                forked = True
            else:
                if forked and name == "experts down":  # the model joins the side stream before the down kernel
                    main.wait_stream(side)
                    forked = False
                launch(buf, out, grids[size], pdl)
            if key in tables:  # a later prefetch fork, on the late stream, joined at the step's end
                late.wait_stream(main)
                with torch.cuda.stream(late):
                    l2_prefetch(tables[key])
                late_forked = True
        if late_forked:  # (joining a stream the capture never forked is a capture error)
            main.wait_stream(late)

    prefetch_ms: dict[str, list[float]] = {}
    for _ in range(2 if len(args.prefetch_variants) > 1 else 1):
        for variant in args.prefetch_variants:
            tables = {key: prefetch_table([buf_of[k] for k in keys])
                      for key, keys in prefetch_forks(layers, variant).items()}
            ms = graph_ms(lambda t=tables: step(t), args.replays)
            prefetch_ms.setdefault(variant, []).append(round(ms, 3))
            print(f"launch-structure step, prefetch {variant}: {ms:.3f} ms", flush=True)
    step_ms = min(prefetch_ms["none" if "none" in prefetch_ms else args.prefetch_variants[0]])
    floor_ms = total / (copy * 1e9) * 1e3
    alone_ms = sum(alone[b] for _, b, s in plan if s == "main")
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "copy_bw_gbps": bw, "pdl": pdl,
              "layers": args.layers, "context": args.context, "tokens": args.tokens,
              "experts_a_moe_layer": experts, "launches": len(plan),
              "launches_per_moe_layer": len(layers[-1]), "bytes": total,
              "moe_layer_bytes": sum(b for _, b, _ in layers[-1]),
              "floor_ms": round(floor_ms, 3), "launch_structure_step_ms": round(step_ms, 3),
              "step_over_floor": round(step_ms / floor_ms, 2), "sum_of_launches_alone_ms": round(alone_ms, 3),
              "sizes": [{"mb": round(s / 1e6, 4), "alone_us": round(alone[s] * 1e3, 2),
                         "grid": {"programs": grids[s][0], "block": grids[s][1]}} for s in sorted(alone)],
              "plan_of_a_moe_layer": [{"launch": n, "bytes": b, "stream": s} for n, b, s in layers[-1]],
              "prefetch_step_ms": prefetch_ms}
    print(f"{len(plan)} launches ({len(layers[-1])} a MoE layer), {total / 1e9:.3f} GB; bandwidth floor "
          f"{floor_ms:.3f} ms at {copy:.0f} GB/s; launch-structure step {step_ms:.3f} ms = {step_ms / floor_ms:.2f}x "
          f"the floor; the main stream's launches timed alone add up to {alone_ms:.3f} ms", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
