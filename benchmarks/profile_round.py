"""Where a decode step / speculative round of a small model spends its time: host or GPU.

Runs the engine (the embedded pair by default) single-stream, greedy, CUDA graphs on, baseline and EAGLE-3 k,
and for each reports per step (a decode step, or a whole round for EAGLE-3): the wall time the scheduler
measured, the GPU kernel time inside it (torch.profiler / CUPTI, graph replays included), so the rest is host
time the GPU did not overlap, and the Python functions that took the host time (cProfile, by own time).

    python benchmarks/profile_round.py --out benchmarks/results/h200/profile_round.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

from benchmarks.bench_e2e import sampling_params  # noqa: E402
from sglang_eagle3 import Engine  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.engine import EMBEDDED_DIR  # noqa: E402


def profile_config(generate, stats, top: int, accept_length=None) -> dict:
    """Per step of ``generate()`` (one request, run to completion; already warmed up): the scheduler's wall time
    (a pass without any profiler attached), the GPU kernel time inside it (a pass under torch.profiler) and the
    host's Python functions by own time (a pass under cProfile). ``stats``: the scheduler's SchedulerStats,
    whose step_seconds each pass reads; ``accept_length()`` reads the accept length when given."""
    stats.step_seconds.clear()
    generate()  # timed without any profiler attached
    wall = list(stats.step_seconds)
    stats.step_seconds.clear()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        generate()
    steps_profiled = len(stats.step_seconds)
    kernel_us = sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    stats.step_seconds.clear()
    cp = cProfile.Profile()
    cp.enable()
    generate()
    cp.disable()
    steps_cprofiled = len(stats.step_seconds)
    buf = io.StringIO()
    pstats.Stats(cp, stream=buf).sort_stats("tottime").print_stats(top)
    st = pstats.Stats(cp)
    funcs = sorted(((v[2], v[3], f"{os.path.basename(k[0])}:{k[1]}({k[2]})", v[1]) for k, v in st.stats.items()),
                   reverse=True)[:top]
    return {"steps": len(wall), "step_ms_median": round(statistics.median(wall) * 1e3, 3),
            "step_ms_all": [round(x * 1e3, 3) for x in wall],
            # Prefill's kernels are in the profiled pass too; with a short prompt they are a small share.
            "gpu_kernel_ms_per_step": round(kernel_us / 1e3 / max(steps_profiled, 1), 3),
            "accept_length": accept_length() if accept_length is not None else None,
            "host_top_by_own_time": [{"function": name, "own_ms_per_step": round(own * 1e3 / steps_cprofiled, 4),
                                      "cum_ms_per_step": round(cum * 1e3 / steps_cprofiled, 4), "calls": calls}
                                     for own, cum, name, calls in funcs],
            "pstats": buf.getvalue()}


def print_profile(name: str, r: dict, lines: int = 12) -> None:
    print(f"{name}: {r['steps']} steps, {r['step_ms_median']:.3f} ms a step (median wall), GPU kernels "
          f"{r['gpu_kernel_ms_per_step']:.3f} ms a step, accept length {r['accept_length']}", flush=True)
    for f in r["host_top_by_own_time"][:lines]:
        print(f"    {f['own_ms_per_step']:8.4f} ms own  {f['cum_ms_per_step']:8.4f} cum  {f['calls']:6d}x  "
              f"{f['function']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=os.path.join(EMBEDDED_DIR, "target"))
    ap.add_argument("--draft-path", default=os.path.join(EMBEDDED_DIR, "draft"))
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompt", default="In the beginning God created the heavens and the earth. And the earth")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sampling", default="greedy", metavar="SPEC",
                    help="bench_e2e.py's --sampling syntax, e.g. 'temperature=0,json_schema=$$ANY$$' (a grammar)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cpu: a dry run of the script (no GPU kernel times)")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(), "sampling": a.sampling,
           "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
           "torch": torch.__version__, "model": a.model_path, "configs": {}}
    for name, spec in (("baseline", {}), (f"eagle3_k{a.k}", dict(
            speculative_algorithm="EAGLE3", speculative_draft_model_path=a.draft_path, speculative_num_steps=a.k))):
        engine = Engine(model_path=a.model_path, device=a.device, log_level="warning", **spec)
        params = {"max_new_tokens": a.max_new_tokens, "ignore_eos": True, **sampling_params(a.sampling)}
        engine.generate(a.prompt, {**params, "max_new_tokens": 8})  # warm-up
        r = profile_config(lambda e=engine, p=params: e.generate(a.prompt, p), engine.backend.scheduler.stats,
                           a.top, lambda e=engine: e.get_server_info().get("avg_spec_accept_length"))
        r["grammar_proposals"] = engine.get_server_info().get("grammar_proposals")  # (over every pass)
        res["configs"][name] = r
        print_profile(name, r)
        if r["grammar_proposals"] and r["grammar_proposals"]["proposed"]:
            print(f"    grammar drafts (every pass): {r['grammar_proposals']}", flush=True)
        engine.shutdown()
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
