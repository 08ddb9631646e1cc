"""Eager vs CUDA-graph target decode/verify on a Kimi-K2.5-shaped slice of ONE tensor-parallel rank.

TP=8 shapes (8 of 64 heads, experts split 8 ways along the intermediate dim, vocab/8), 61 layers, random
weights, INT4 routed experts (the full 384-expert pool) unless --bf16-experts (then a reduced pool, said so
in the output). Collectives are skipped (one process stands in for rank 0), so the numbers are one rank's
compute + memory time without all-reduce cost. With --comm-gpus N (N GPUs) every GPU holds the same rank slice
and the all-reduces run over the N with NCCL: the step then carries real all-reduce traffic at TP=8's message
sizes, but an N-GPU all-reduce, not an 8-GPU one (the lm_head's all-gather stays skipped); each case adds the
all-reduce count and one all-reduce's in-graph time, so the floor can be read with and without them.

For decode (T=1) and verify (T=2..8) at each context it prints eager ms, graph ms and the bandwidth floor:
bytes that must be read (every non-expert weight, the distinct routed experts this step actually selects,
the KV cache of the context, the lm_head slice) over the copy bandwidth measured in the same run.

    python benchmarks/bench_verify_graph.py --out benchmarks/results/h200/verify_graph.json
    python benchmarks/bench_verify_graph.py --comm-gpus 2 --backends triton --out benchmarks/results/2xh200/...

With several settings (--env-variants, --overlap-variants, --kernels-from), --paired N also keeps every
setting's captured graphs and then replays them interleaved, N rounds at each shape (the settings in a rotated
order each round): each setting's median ms and, against the first setting, the median of the rounds' ratios
with a bootstrap 95% interval. A round's replays run back to back, so clock and thermal drift cancel in its
ratio; the runs of separately captured settings one after another differ by ~1-1.6% on the H200 (docs/
BENCHMARKS.md, twenty-ninth session), the size of the effects a launch or two a layer make.

    python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 --tokens 1 4 --graph-iters 5 \
        --env-variants '' SGLANG_EAGLE3_NO_FUSE= --paired 200 --out OUT.json
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import ab_tag, add_kernels_from_arg, kernels_from  # noqa: E402
from benchmarks.routing import RoutingChoice, drawn_routing, parse_routing  # noqa: E402
from sglang_eagle3 import env, kernels  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.bench.ranks import graph_all_reduce_us  # noqa: E402
from sglang_eagle3.config import ModelConfig, RopeConfig  # noqa: E402
from sglang_eagle3.distributed.parallel_state import init_tp  # noqa: E402
from sglang_eagle3.kernels.ref import ref_moe_topk  # noqa: E402
from sglang_eagle3.layers.overlap import Overlaps  # noqa: E402
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM  # noqa: E402
from sglang_eagle3.runtime.model_runner import ModelRunner  # noqa: E402

TP = 8


def kimi_config(layers: int, experts: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=163840, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=layers, num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=experts, num_experts_per_tok=8, n_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.827,
        scoring_func="sigmoid", topk_method="noaux_tc", rms_norm_eps=1e-6, max_position_embeddings=262144,
        rope=RopeConfig(theta=50000.0, kind="yarn", factor=64.0, original_max_position_embeddings=4096,
                        beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))


@torch.no_grad()
def randomize_cuda(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dtype == torch.int32:  # packed INT4: any bit pattern is 8 valid nibbles
            p.copy_(torch.randint(-2**31, 2**31 - 1, p.shape, generator=g, device="cuda", dtype=torch.int64)
                    .to(torch.int32))
        elif "norm" in name:
            p.fill_(1.0)
        elif name.endswith("weight_scale"):
            fan_in = p.shape[-1] * 32
            p.copy_(torch.rand(p.shape, generator=g, device="cuda") * (2.0 / (4.6 * math.sqrt(fan_in))))
        elif name.endswith("e_score_correction_bias"):
            p.normal_(0, 0.01, generator=g)
        else:
            p.normal_(0, 1.0 / math.sqrt(p.shape[-1]), generator=g)


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written over the median event time (GB/s)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.int16, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(2):  # warm-up
        b.copy_(a)
    torch.cuda.synchronize()
    ms = median_ms(lambda: b.copy_(a), 10)  # the 4 GiB go with the function's locals
    return 2 * n * 2 / (ms * 1e-3) / 1e9


def median_ms(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def expert_bytes(model) -> tuple[int, int]:
    """(bytes of all non-routed-expert parameters, bytes of one routed expert incl. scales) on this rank."""
    other = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                if ".experts." not in name and not name.startswith("model.embed_tokens"))  # one embed row per token
    experts = next(m for m in model.model.layers if hasattr(m.mlp, "experts")).mlp.experts
    per_expert = sum(p[0].numel() * p.element_size() for p in experts.parameters())
    return other, per_expert


def summarize_settings(cases: list[dict]) -> list[dict]:
    """One row per setting (backend, overlaps, env) and shape (context, T, batch), in the order first timed:
    the graph ms of every time it ran (--env-variants / --overlap-variants may repeat a setting, alternating,
    to see the noise), their median, and that median over the first setting's for the same shape (a ratio
    measured in one process)."""
    groups: dict[tuple, list[float]] = {}
    for c in cases:
        key = (c["backend"], c["overlaps"], c["env"], c["context"], c["T"], c["batch"])
        groups.setdefault(key, []).append(c["graph_ms"])
    rows, first = [], {}
    for (backend, overlaps, env_set, ctx, T, batch), runs in groups.items():
        med = statistics.median(runs)
        base = first.setdefault((ctx, T, batch), med)
        rows.append({"backend": backend, "overlaps": overlaps, "env": env_set, "context": ctx, "T": T,
                     "batch": batch, "graph_ms_runs": runs, "graph_ms_median": round(med, 3),
                     "vs_first_setting": round(med / base, 3)})
    return rows


def print_summary(rows: list[dict]) -> None:
    """summarize_settings' rows, where there is more than one setting or a setting ran more than once."""
    if not any(len(r["graph_ms_runs"]) > 1 for r in rows) and len(
            {(r["backend"], r["overlaps"], r["env"]) for r in rows}) < 2:
        return
    print("summary (graph ms: each run, median, median over the first setting's at the same shape):")
    for r in rows:
        setting = " ".join(x for x in (r["backend"], r["overlaps"], r["env"]) if x)
        print(f"  ctx {r['context']:5d} T={r['T']} {setting}: " + " / ".join(f"{x:.2f}" for x in r["graph_ms_runs"])
              + f"  median {r['graph_ms_median']:.2f}  x{r['vs_first_setting']:.3f}", flush=True)


def parse_env_variant(text: str) -> dict[str, str]:
    """'A=1 B=x' -> {'A': '1', 'B': 'x'} (--env-variants)."""
    pairs = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env-variants: {item!r} is not NAME=VALUE (in {text!r})")
        pairs[name] = value
    return pairs


def apply_env_settings(model: torch.nn.Module, overlaps: str | None = None) -> None:
    """What a model reads from the environment when it is built, read again under the current one (a setting of
    --env-variants, as a fresh start would see it): the launch fusions (env.NO_FUSE, every layer's
    read_fusions) and the side-stream overlaps (env.OVERLAP, or ``overlaps`` when given). Graphs captured
    before keep what they captured."""
    for module in model.modules():
        if hasattr(module, "read_fusions"):
            module.read_fusions()
    inner = getattr(model, "model", None)
    if hasattr(inner, "set_overlaps"):
        inner.set_overlaps(Overlaps.parse(overlaps) if overlaps is not None else Overlaps.from_env())


def paired_summary(times: dict[str, list[float]], resamples: int = 2000, seed: int = 0) -> dict:
    """{setting: {median_ms, vs_first: median of per-round ratios, ci95: bootstrap interval of that median}}
    for ``times`` {setting: ms of each round}, every list one entry a round (the first setting is the base)."""
    import random

    names = list(times)
    rounds = {len(v) for v in times.values()}
    assert len(rounds) == 1 and rounds != {0}, (
        f"every setting needs the same rounds, got {[len(v) for v in times.values()]}")
    base = times[names[0]]
    rng = random.Random(seed)
    out = {}
    for name in names:
        ratios = [t / b for t, b in zip(times[name], base, strict=True)]
        meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
        out[name] = {"median_ms": round(statistics.median(times[name]), 4),
                     "vs_first": round(statistics.median(ratios), 4),
                     "ci95": [round(meds[int(0.025 * (resamples - 1))], 4),
                              round(meds[int(0.975 * (resamples - 1))], 4)]}
    return out


@torch.inference_mode()
def paired_times(kept: list[tuple[str, ModelRunner]], ctx: int, T: int, pages: list[list[int]], rounds: int,
                 warmup: int = 3) -> dict[str, list[float]]:
    """{setting: graph ms of each round} at one shape: every kept runner's graph replayed once a round, the
    settings in an order rotated by one each round (none always first), each replay timed with events."""
    steps = {}
    for label, runner in kept:
        bt = uniform_batch(runner, ctx, T, pages)
        steps[label] = (lambda runner=runner, bt=bt: runner.target_uniform(bt, T, verify=T > 1))
        for _ in range(warmup):
            steps[label]()
    torch.cuda.synchronize()
    labels = list(steps)
    times = {label: [] for label in labels}
    eager_before = {label: _eager_forwards(runner) for label, runner in kept}
    for i in range(rounds):
        for label in labels[i % len(labels):] + labels[: i % len(labels)]:
            times[label].append(median_ms(steps[label], 1))
    for label, runner in kept:  # an eager forward would run the layers as the last setting left them
        if _eager_forwards(runner) != eager_before[label]:
            raise RuntimeError(f"--paired: setting {label!r} ran eager at ctx {ctx} T={T} instead of replaying its "
                               "graph; its times would be of another setting")
    return times


def _eager_forwards(runner: ModelRunner) -> int:
    """Target decode/verify forwards the runner has run eagerly (not as a graph replay) so far."""
    return sum(sum(r.stats.eager.values()) for r in (runner.target_decode, runner.target_verify))


def uniform_batch(runner: ModelRunner, ctx: int, T: int, pages: list[list[int]]):
    """The batch of len(pages) requests (each its own page list), each with `ctx` cached tokens and T new ones."""
    return runner.build([(list(range(100 + b, 100 + b + T)), ctx, p) for b, p in enumerate(pages)])


def request_pages(batch: int, max_ctx: int, page_size: int) -> list[list[int]]:
    """Each of ``batch`` requests' own pages, enough for ``max_ctx`` tokens (page 0 is the pool's scratch)."""
    per_req = max_ctx // page_size
    return [list(range(1 + b * per_req, 1 + (b + 1) * per_req)) for b in range(batch)]


@torch.inference_mode()
def time_case(runner: ModelRunner, ctx: int, T: int, pages: list[list[int]], eager_iters: int, graph_iters: int):
    """(eager ms, graph ms) of len(pages) requests (each its own page list), each with `ctx` cached tokens and T
    new ones."""
    bt = uniform_batch(runner, ctx, T, pages)
    graph_runner = runner.target_verify if T > 1 else runner.target_decode
    inputs = dict(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table,
                  seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc)
    graph_runner.fn(**inputs, tokens_per_req=T)  # warm-up (and the routing the floor is computed from)
    torch.cuda.synchronize()
    eager = median_ms(lambda: graph_runner.fn(**inputs, tokens_per_req=T), eager_iters)
    graph = median_ms(lambda: runner.target_uniform(bt, T, verify=T > 1), graph_iters)
    return eager, graph


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--bf16-experts", action="store_true", help="bf16 experts (use with a reduced --experts)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--max-tokens", type=int, default=8, help="verify widths 2..N")
    ap.add_argument("--tokens", type=int, nargs="+", default=None,
                    help="time only these T (default 1..--max-tokens); graphs are captured for all")
    ap.add_argument("--overlap-variants", nargs="+", default=None,
                    help="side-stream overlap settings to time one after another in this process, each a "
                         "SGLANG_EAGLE3_OVERLAP value ('none', 'shared_down,prefetch_attn', ...); default: "
                         "the knob's own setting only")
    ap.add_argument("--env-variants", nargs="+", default=None,
                    help="environment settings to time one after another in this process (each crossed with the "
                         "overlap variants), each a space-separated list of NAME=VALUE, '' for the environment "
                         "as it is: e.g. '' 'SGLANG_EAGLE3_PDL=0' 'SGLANG_EAGLE3_PDL_SKIP=moe,gemv'")
    ap.add_argument("--backends", nargs="+", default=["triton", "torch"],
                    help="kernel paths to time: triton (ours) and/or torch (references)")
    ap.add_argument("--batch", type=int, default=1,
                    help="requests a step (each with the context and T new tokens): MoE batches of batch x T tokens")
    ap.add_argument("--routing", default="own", metavar="own|uniform|reuse:P|trace:PATH",
                    help="the MoE layers' expert ids: the random router's own (which routes a batch to nearly the "
                         "same few experts), or drawn before capture (benchmarks/routing.py): uniform (a trained "
                         "model's load-balanced spread), reuse:P (each token keeps each expert of the token before "
                         "it with probability P), trace:PATH (a real checkpoint's, recorded under "
                         "SGLANG_EAGLE3_ROUTING_TRACE)")
    ap.add_argument("--uniform-routing", action="store_true", help="--routing uniform")
    ap.add_argument("--eager-iters", type=int, default=5)
    ap.add_argument("--graph-iters", type=int, default=30)
    ap.add_argument("--comm-gpus", type=int, default=1,
                    help="N > 1: the same rank slice on each of N GPUs, all-reduces run over the N (NCCL), so the "
                         "step carries real all-reduce traffic of TP=8's message sizes (N GPUs' all-reduce, not 8's)")
    add_kernels_from_arg(ap, "every setting is timed again with each, in the same process")
    ap.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                    help="keep every setting's graphs and replay them interleaved ROUNDS times a shape (module doc)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        parse_routing(args.routing)
    except ValueError as e:
        ap.error(str(e))
    if args.paired and args.comm_gpus > 1:
        raise SystemExit("--paired runs on one GPU (--comm-gpus 1)")
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    if args.comm_gpus > 1:
        from sglang_eagle3.bench.ranks import run_ranks

        results = run_ranks(args.comm_gpus, run, args)[0]
    else:
        results = run(0, 1, args)
    results["summary"] = summarize_settings(results["cases"])
    print_summary(results["summary"])
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


class CountAllReduces:
    """Counts torch.distributed.all_reduce calls (and their element counts) while active: what the layers'
    tp_all_reduce issues in one forward."""

    def __init__(self):
        self.numels: list[int] = []

    def __enter__(self):
        import torch.distributed as dist

        self._orig = dist.all_reduce

        def counted(t, *a, **kw):
            self.numels.append(t.numel())
            return self._orig(t, *a, **kw)

        dist.all_reduce = counted
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        dist.all_reduce = self._orig


def run(rank: int, world: int, args) -> dict:
    """The whole benchmark in one process; with world > 1 every rank runs it in lockstep (they meet in each
    all-reduce) and rank 0's results are kept."""
    print = builtins.print if rank == 0 else (lambda *a, **kw: None)  # noqa: A001 - one rank speaks
    bw = copy_bandwidth()
    init_tp(0, TP, simulated=True, simulated_all_reduce=world > 1)
    cfg = kimi_config(args.layers, args.experts)
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(cfg, dtype=torch.bfloat16, int4_experts=not args.bf16_experts)
    randomize_cuda(model, 0)
    other_bytes, one_expert = expert_bytes(model)
    # The routing of each step, for the floor: each MoE block's input is kept (no kernel runs in the hook: it
    # also fires while graphs are captured) and the router logits are recomputed from it afterwards (the router
    # itself may run fused with the shared expert, outside MoEGate.forward).
    moe_inputs = []
    hooks = [block.register_forward_pre_hook(lambda m, args: moe_inputs.append((m, args[0])))
             for block in model.moe_blocks()]
    page_size = 64
    max_ctx = max(args.contexts) + args.max_tokens + page_size
    Ts = list(range(1, args.max_tokens + 1))
    results = {"command": " ".join([sys.executable.split("/")[-1]] + sys.argv), "git_commit": git_commit(),
               "package": os.path.dirname(sglang_eagle3.__file__),  # what ran (GIT_COMMIT: what was sent)
               "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "python": platform.python_version(),
               "copy_bw_gbps": round(bw, 1), "layers": args.layers, "experts": args.experts,
               "experts_dtype": "bf16" if args.bf16_experts else "int4 (compressed-tensors pack-quantized, g32)",
               "note": ("one TP=8 rank's slice, collectives skipped" if world == 1 else
                        f"one TP=8 rank's slice on each of {world} GPUs, all-reduces over the {world} (NCCL), the "
                        "lm_head all-gather skipped") + "; floor = bytes that must be read / copy bw",
               "comm_gpus": world,
               "non_expert_bytes": other_bytes, "bytes_per_expert": one_expert, "cases": []}
    print(f"copy bandwidth {bw:.0f} GB/s; non-expert bytes {other_bytes / 1e9:.2f} GB; "
          f"{one_expert / 1e6:.2f} MB per expert; experts {results['experts_dtype']}", flush=True)
    variants = args.overlap_variants or [None]
    timed_Ts = args.tokens or Ts
    env_variants = args.env_variants or [""]
    choice = RoutingChoice("uniform") if args.uniform_routing else parse_routing(args.routing)
    # drawn before capture for every graph's rows (batch buckets up to --batch), the timed batch's first
    drawn = drawn_routing(choice, args.experts, cfg.num_experts_per_tok, len(hooks),
                          shapes=[(b, T) for b in (args.batch, *range(1, args.batch)) for T in Ts])
    if drawn:
        missing = [T for T in timed_Ts if args.batch * T not in drawn.pool]
        if missing:
            raise SystemExit(f"--routing {args.routing}: no forward of {[args.batch * T for T in missing]} rows in "
                             f"the trace (it has {sorted(drawn.traced or ())}); time other --tokens")
        drawn.__enter__()
    ar_us: dict[int, float] = {}  # tokens -> in-graph all-reduce us (world > 1)
    results["routing"] = choice.label()
    swaps = {"": None} | {ab_tag(paths): kernels_from(paths) for paths in args.kernels_from}
    kept: list[tuple[str, ModelRunner]] = []  # --paired: (setting, its runner), the first of each setting
    for backend, variant, env_set, tag in [(b, v, e, t) for b in args.backends for v in variants for e in env_variants
                                           for t in swaps]:
        runner = None
        label = backend if variant is None else f"{backend} overlap={variant}"
        label += f" {env_set}" if env_set else ""
        label += tag
        overrides = contextlib.ExitStack()
        try:
            overrides.enter_context(env.overrides(parse_env_variant(env_set)))  # left in `finally`
            if swaps[tag]:  # graphs captured inside keep the other file's kernels
                overrides.enter_context(swaps[tag]())
            apply_env_settings(model, variant)  # fusions and overlaps are read when the model is built
            torch.cuda.empty_cache()
            runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=args.batch * (max_ctx // page_size) + 4,
                                 page_size=page_size, max_context=max_ctx, device=torch.device("cuda"),
                                 dtype=torch.bfloat16, use_cuda_graph=True, cuda_graph_max_bs=args.batch,
                                 verify_widths=tuple(Ts[1:]), attention_backend=backend, moe_backend=backend)
            for kv in runner.target_kv.layers:
                kv.normal_()
            t0 = time.perf_counter()
            runner.capture_graphs()
            capture_s = time.perf_counter() - t0
            graph_mib = sum(r["capture_mib"] for r in runner.graph_report().values())
            print(f"[{label}] captured {len(Ts)} graphs in {capture_s:.1f} s ({graph_mib:.0f} MiB)", flush=True)
            pages = request_pages(args.batch, max_ctx, page_size)
            for ctx in args.contexts:
                for T in timed_Ts:
                    moe_inputs.clear()
                    with CountAllReduces() if world > 1 else contextlib.nullcontext() as counted:
                        eager, graph = time_case(runner, ctx, T, pages, args.eager_iters, args.graph_iters)
                    if drawn:  # expert loads of the drawn routing (every forward of these rows reads it)
                        distinct = drawn.distinct_experts(args.batch * T)
                    else:  # expert loads of this step, from the first (eager) run's routing
                        distinct = sum(
                            len(set(ref_moe_topk(lg, None, top_k=8, n_group=1, topk_group=1)[1].flatten().tolist()))
                            for lg in (x.reshape(-1, x.shape[-1]).float() @ m.gate.weight.float().t()
                                       for m, x in moe_inputs[: len(hooks)]))
                    kv_bytes = args.batch * (ctx + T) * cfg.kv_cache_dim * 2 * cfg.num_hidden_layers
                    floor_bytes = other_bytes + distinct * one_expert + kv_bytes
                    floor = floor_bytes / (bw * 1e9) * 1e3
                    case = {"backend": backend, "overlaps": variant or str(model.model.overlaps),
                            "env": env_set + tag,
                            "context": ctx, "T": T, "batch": args.batch,
                            "eager_ms": round(eager, 3),
                            "graph_ms": round(graph, 3), "floor_ms": round(floor, 3),
                            "graph_over_floor": round(graph / floor, 2), "eager_over_graph": round(eager / graph, 1),
                            "distinct_experts": distinct, "floor_gb": round(floor_bytes / 1e9, 3)}
                    if world > 1:  # the floor plus what this step's all-reduces cost on their own, in a graph
                        n_ar = len(counted.numels) // (1 + args.eager_iters)  # warm-up + timed eager forwards
                        if (args.batch * T) not in ar_us:
                            ar_us[args.batch * T] = graph_all_reduce_us(args.batch * T, cfg.hidden_size)[1]
                        case.update(all_reduces=n_ar, all_reduce_graph_us=round(ar_us[args.batch * T], 2),
                                    floor_plus_ar_ms=round(floor + n_ar * ar_us[args.batch * T] / 1e3, 3))
                    results["cases"].append(case)
                    print(f"[{label}] B={args.batch} ctx {ctx:5d} T={T}: eager {eager:8.2f} ms  graph {graph:7.2f} ms  "
                          f"floor {floor:5.2f} ms  graph/floor {graph / floor:5.2f}  eager/graph {eager / graph:5.1f}"
                          f"  ({distinct} expert loads)" + (
                              f"  + {case['all_reduces']} all-reduces x {case['all_reduce_graph_us']:.1f} us: "
                              f"floor+ar {case['floor_plus_ar_ms']:.2f} ms" if world > 1 else ""), flush=True)
            results.setdefault("capture", {})[label] = {"seconds": round(capture_s, 2), "graph_mib": graph_mib}
            results.setdefault("kernel_reports", {})[label] = kernels.kernel_report()  # what this setting ran
            if args.paired and label not in dict(kept):  # its graphs hold what it captured: replayed later
                kept.append((label, runner))
        except Exception as e:  # a broken backend is reported, the other still runs
            results.setdefault("errors", {})[label] = f"{type(e).__name__}: {e}"
            print(f"[{label}] FAILED: {type(e).__name__}: {e}", flush=True)
        finally:
            runner = None
            overrides.close()  # the next variant starts from the environment as it was
    for h in hooks:
        h.remove()
    if drawn:
        drawn.__exit__(None, None, None)
    if len(kept) > 1:
        pages = request_pages(args.batch, max_ctx, page_size)
        print(f"paired: {len(kept)} settings replayed interleaved, {args.paired} rounds a shape", flush=True)
        for ctx in args.contexts:
            for T in timed_Ts:
                summary = paired_summary(paired_times(kept, ctx, T, pages, args.paired))
                results.setdefault("paired", []).append({"context": ctx, "T": T, "rounds": args.paired,
                                                         "settings": summary})
                for label, row in summary.items():
                    print(f"  paired ctx {ctx:5d} T={T} {label}: median {row['median_ms']:.3f} ms  "
                          f"x{row['vs_first']:.4f} [{row['ci95'][0]:.4f}, {row['ci95'][1]:.4f}]", flush=True)
    elif args.paired:
        print("--paired: fewer than two settings captured, nothing to pair", flush=True)
    kept.clear()
    return results


if __name__ == "__main__":
    main()
