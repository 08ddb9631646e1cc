"""Does programmatic dependent launch (PDL) let a kernel start before its predecessor ends, and what does
that buy a chain of decode GEMVs? Two measurements on one GPU, in one process:

1. The mechanism. A one-program kernel spins for ``--spin-us`` reading the global timer; the next kernel,
   launched with PDL, reads the timer as it starts, waits (``griddepcontrol.wait``), reads it again. Eager
   and inside a CUDA graph, with the spinner letting its dependents launch at its start or not at all. If
   PDL works, the second kernel's start is *before* the spinner's end (negative lead below).
2. The GEMV chain of a Kimi-K2.5 TP=8 rank's layer at decode/verify sizes (q_a + kv_a, q_b with its norm,
   o_proj + residual, router + shared expert, shared down), ``--layers`` distinct layers (more bytes than the
   L2) captured in one graph, timed per setting (SETTINGS): no PDL; PDL; PDL with the L2 prefetch of each
   weight slab before the wait. (At 3fa1d10 it also timed 1 / 2 K tiles of the weights loaded into registers
   before the wait and a late trigger, knobs removed since: benchmarks/results/h200/pdl_3fa1d10.json.)

    python benchmarks/bench_pdl.py --out benchmarks/results/h200/pdl.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, globaltimer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import copy_bandwidth, time_graph  # noqa: E402
from sglang_eagle3 import env  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels.gemv import triton_gemv, triton_gemv_pair  # noqa: E402

HIDDEN, Q_LORA, KV_A, Q_B, O_IN, EXPERTS, SHARED = 7168, 1536, 576, 1536, 1024, 384, 256  # Kimi TP=8 rank

# (label, environment) of the chain settings, timed in this order; the first is timed again at the end.
SETTINGS = [("no PDL", {"SGLANG_EAGLE3_PDL": "0"}),
            ("PDL", {"SGLANG_EAGLE3_PDL": "1", "SGLANG_EAGLE3_PDL_L2_PREFETCH": "0"}),
            ("PDL, L2 prefetch", {"SGLANG_EAGLE3_PDL": "1", "SGLANG_EAGLE3_PDL_L2_PREFETCH": "1"})]


@triton.jit
def spin_kernel(out_ptr, ns, TRIGGER: tl.constexpr):
    if TRIGGER:  # let the dependent grid launch now
        gdc_launch_dependents()
    t0 = globaltimer()
    t = t0
    while t - t0 < ns:
        t = globaltimer()
    tl.store(out_ptr, t)


@triton.jit
def probe_kernel(out_ptr):
    start = globaltimer()
    gdc_wait()
    tl.store(out_ptr, start)
    tl.store(out_ptr + 1, globaltimer())


def mechanism(spin_us: float) -> list[dict]:
    """Lead of the PDL kernel's start (and of its return from the wait) over the spinner's end, ns."""
    rows = []
    ts = torch.zeros(3, dtype=torch.int64, device="cuda")

    def pair(trigger: bool, pdl: bool):
        spin_kernel[(1,)](ts, int(spin_us * 1e3), TRIGGER=trigger)
        probe_kernel[(1,)](ts[1:], **({"launch_pdl": True} if pdl else {}))

    for trigger, pdl in ((True, True), (False, True), (True, False)):
        pair(trigger, pdl)  # compile
        torch.cuda.synchronize()
        for mode in ("eager", "graph"):
            leads = []
            if mode == "graph":
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
                    pair(trigger, pdl)
                torch.cuda.current_stream().wait_stream(s)
            for _ in range(20):
                g.replay() if mode == "graph" else pair(trigger, pdl)
                torch.cuda.synchronize()
                end, start, after = ts.tolist()
                leads.append((start - end, after - end))
            row = {"mode": mode, "trigger_at_start": trigger, "launch_pdl": pdl,
                   "start_minus_spin_end_ns": statistics.median(x[0] for x in leads),
                   "after_wait_minus_spin_end_ns": statistics.median(x[1] for x in leads)}
            print(f"  {mode:5s} trigger={trigger!s:5s} pdl={pdl!s:5s}: starts {row['start_minus_spin_end_ns']:9.0f} ns"
                  f" after the spinner's end, leaves the wait {row['after_wait_minus_spin_end_ns']:7.0f} ns after",
                  flush=True)
            rows.append(row)
    return rows


def make_layer(T: int, gen: torch.Generator) -> list:
    """The launches of one layer's dense projections, as thunks over fresh random weights."""
    def w(*shape):
        return (torch.randn(*shape, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)

    x = w(T, HIDDEN)
    q_a, kv_a, q_b, o = w(Q_LORA, HIDDEN), w(KV_A, HIDDEN), w(Q_B, Q_LORA), w(HIDDEN, O_IN)
    router, s_gate, s_up, s_down = w(EXPERTS, HIDDEN), w(SHARED, HIDDEN), w(SHARED, HIDDEN), w(HIDDEN, SHARED)
    norm_w = torch.ones(Q_LORA, dtype=torch.bfloat16, device="cuda")
    attn, resid = w(T, O_IN), w(T, HIDDEN)
    st = {}  # outputs passed down the chain (no copies: every launch in it is one of ours)

    def qkv_a():
        st["q_a"], _ = triton_gemv_pair(x, q_a, kv_a)

    def router_shared():
        _, st["act"] = triton_gemv_pair(x, router, s_gate, w2_up=s_up, out1_dtype=torch.float32)

    return [qkv_a,
            lambda: triton_gemv(st["q_a"], q_b, norm_weight=norm_w, eps=1e-6),
            lambda: triton_gemv(attn, o, add=resid),
            router_shared,
            lambda: triton_gemv(st["act"], s_down, add=resid)]


def time_chain(calls: list, replays: int) -> float:
    """Median ms of one replay of `calls` captured in one graph (bench_kernels.time_graph's timing)."""
    return time_graph(calls, replays) * len(calls) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spin-us", type=float, default=20.0)
    ap.add_argument("--layers", type=int, default=12, help="distinct layers in the chain (~60 MB each)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    bw = copy_bandwidth()
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_bw_gbps": bw}
    print(f"1. mechanism: a {args.spin_us} us spinner, then a probe kernel", flush=True)
    result["mechanism"] = mechanism(args.spin_us)
    print(f"2. GEMV chain: {args.layers} layers x 5 launches", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    result["chain"] = []
    for T in args.tokens:
        layers = [make_layer(T, gen) for _ in range(args.layers)]
        calls = [c for layer in layers for c in layer]
        for label, env_set in SETTINGS + SETTINGS[:1]:
            try:
                with env.overrides(env_set):
                    ms = time_chain(calls, args.replays)
                row = {"T": T, "setting": label, "env": env_set, "ms": round(ms, 4),
                       "us_per_layer": round(ms * 1e3 / args.layers, 2)}
            except Exception as e:  # a setting that fails to compile or run is reported, the rest still run
                row = {"T": T, "setting": label, "env": env_set, "error": f"{type(e).__name__}: {e}"}
            result["chain"].append(row)
            print(f"  T={T} {label:28s}: " + (f"{row['ms']:.3f} ms, {row['us_per_layer']:.2f} us a layer"
                                              if "ms" in row else row["error"]), flush=True)
        del layers, calls
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
