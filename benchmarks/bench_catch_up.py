"""A resting draft's catch-up (ModelRunner.catch_up) on the Kimi-K2.5-shaped draft, greedy and sampled, timed side by
side in one process: the forty-sixth session measured the sampled catch-up at 2.69 ms against the greedy 0.91 (H100,
16 tokens a request, batch 1), its draws made after the greedy graph by a second, eager pass of the draft head.

Paths, each at every --batch (requests of --tokens catch-up tokens each, their positions past --context):
  greedy          catch_up(rows, aux): draft_prefill's graphs, the argmax at every row
  sampled         catch_up(rows, aux, samp): draft_prefill_sampled's graphs, each row drawn inside the graph
  sampled_before  the forty-sixth session's composition: draft_prefill's graphs, then the draft head and the draw
                  over every row eagerly (draft_proposals), as catch_up ran it before `draft_prefill_sampled`
  sampled_eager   catch_up with draft_prefill_sampled off: the eager fallback (one ragged extend that draws)
Each call is timed from the host's first launch to the stream's end (synchronize on both sides, as time_rounds
prices the policy's round costs: the host's launches count); the paths alternate within every iteration; medians of
--iters after --warmup; the whole table twice (--repeat) to show the noise. With --profile, one call of greedy,
sampled and sampled_before at the first --batch under torch.profiler: the kernels' device time and the host's time,
to say where the difference goes.

The target is the Kimi rank slice's shapes with --layers layers (a catch-up reads none of the target's layers: only
its embedding, the draft's own head); random weights; sampled requests at temperature 0.8 (SAMPLED_TIMING).

    python benchmarks/bench_catch_up.py --out benchmarks/results/h100/catch_up.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's package, also when run from another tree's copy

from sglang_eagle3.bench.harness import git_commit  # noqa: E402

PATHS = ("greedy", "sampled", "sampled_before", "sampled_eager")


def build(a):
    """The slice's ModelWorker: an adaptive EAGLE-3 engine whose draft rests (its catch-ups' graphs captured)."""
    from benchmarks.bench_e2e import kimi_models
    from sglang_eagle3.distributed.parallel_state import init_tp
    from sglang_eagle3.engine import EngineArgs
    from sglang_eagle3.runtime.worker import ModelWorker

    init_tp(0, 8, simulated=True)
    _, target, draft = kimi_models(a.layers, aux_layer_ids=tuple(range(min(3, a.layers))))
    args = EngineArgs(model_path="<in-memory>", device="cuda", dtype="bfloat16", max_running_requests=max(a.batch),
                      cuda_graph_max_bs=max(a.batch), speculative_algorithm="EAGLE3",
                      speculative_draft_model_path="<in-memory>", speculative_num_steps=1,
                      speculative_num_steps_candidates=(0,), speculative_adaptive=True,
                      speculative_adaptive_probe_rounds=a.tokens, attention_backend="triton",
                      moe_runner_backend="triton", mem_fraction_static=a.mem_fraction_static)
    ctx = a.context + 2 * a.tokens + 64
    plan = {"context_length": ctx, "num_steps": 1, "verify_widths": (1, 2),
            "num_pages": max(a.batch) * (ctx // args.page_size + 4), "eos": ()}
    return ModelWorker(args, plan, torch.device("cuda"), models=(target, draft))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16, help="catch-up tokens a request (probe_rounds)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--mem-fraction-static", type=float, default=0.85)
    ap.add_argument("--out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_catch_up.py needs a CUDA device")
    from sglang_eagle3.runtime.model_runner import SAMPLED_TIMING
    from sglang_eagle3.runtime.sampling import SamplerBatch

    t0 = time.perf_counter()
    worker = build(a)
    runner = worker.runner
    print(f"built and captured in {time.perf_counter() - t0:.1f} s; graphs: "
          + ", ".join(f"{n} {g['graphs']} ({g['tokens_per_req']})" for n, g in runner.graph_report().items()
                      if n.startswith("draft_prefill")), flush=True)
    twin = runner.draft_prefill_sampled
    aux_w = 3 * runner.target.config.hidden_size

    def calls_for(B: int) -> dict:
        pages = [list(runner.allocator.alloc(-(-(a.context + a.tokens) // runner.page_size))) for _ in range(B)]
        rows = [([(31 * b + 7 * j) % 20480 for j in range(a.tokens)], a.context, pages[b]) for b in range(B)]
        g = torch.Generator(device="cuda").manual_seed(B)
        aux = torch.randn(B * a.tokens, aux_w, generator=g, device="cuda", dtype=torch.bfloat16)
        samp = runner.sampler_batch([SAMPLED_TIMING] * B, list(range(B)))

        def before():  # (as catch_up ran at `b03986d`, its per-row inputs sized on the device)
            every, hidden = runner.prefill_draft(rows, aux)
            positions = runner.to_device([first + j for toks, first, _ in rows for j in range(len(toks))])
            counts = torch.tensor([a.tokens] * B).to("cuda")
            per_row = SamplerBatch(samp.f.repeat_interleave(counts, 0), samp.i.repeat_interleave(counts, 0),
                                   samp.filters)
            return runner.draft_proposals(hidden, per_row, positions)

        def eager():
            twin.enabled, reason = False, twin.disabled_reason
            twin.disabled_reason = "bench_catch_up.py: the sampled catch-up's graphs off to time its eager fallback"
            try:
                return runner.catch_up(rows, aux, samp)[0]
            finally:
                twin.enabled, twin.disabled_reason = True, reason

        return {"greedy": lambda: runner.catch_up(rows, aux)[0], "sampled": lambda: runner.catch_up(rows, aux, samp)[0],
                "sampled_before": before, "sampled_eager": eager}

    def timed(fn) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    out = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "workload": {"draft": "Kimi-shaped EAGLE-3 (hidden 7168, draft vocab 32000), random bf16",
                        "target_layers": a.layers, "tokens_per_request": a.tokens, "context": a.context,
                        "sampled": "temperature 0.8", "timing": "host launch to stream end, median"},
           "graphs": {n: g for n, g in runner.graph_report().items() if n.startswith("draft_prefill")},
           "runs": []}
    with torch.inference_mode():
        calls = {B: calls_for(B) for B in a.batch}
        for B, c in calls.items():  # the paths agree where they must (the greedy rows; the sampled draws)
            got = {p: c[p]() for p in PATHS}
            out.setdefault("agreement", {})[B] = {p: round((got[p] == got["sampled_before"]).float().mean().item(), 4)
                                                  for p in ("sampled", "sampled_eager")}
        for rep in range(a.repeat):
            for B, c in calls.items():
                times = {p: [] for p in PATHS}
                for i in range(a.warmup + a.iters):
                    for p in PATHS:
                        dt = timed(c[p])
                        if i >= a.warmup:
                            times[p].append(dt)
                ms = {p: round(statistics.median(t) * 1e3, 4) for p, t in times.items()}
                out["runs"].append({"repeat": rep, "batch": B, "ms": ms})
                print(f"repeat {rep} batch {B}: " + ", ".join(f"{p} {v:.3f} ms" for p, v in ms.items())
                      + f"; sampled / greedy {ms['sampled'] / ms['greedy']:.3f}, before / greedy "
                      f"{ms['sampled_before'] / ms['greedy']:.3f}", flush=True)
        if a.profile:
            from torch.profiler import ProfilerActivity, profile
            out["profile"] = {}
            for p in ("sampled_before", "sampled", "greedy"):
                fn = calls[a.batch[0]][p]
                fn()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14)
                print(f"profile of {p} at batch {a.batch[0]}:\n{table}", flush=True)
                out["profile"][p] = table
    print(json.dumps(out["agreement"]))
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
