"""Does running a layer's dependent decode GEMVs inside ONE persistent launch beat separate launches?

The decode step of a Kimi-K2.5 TP=8 rank is ~3.3-3.5x its bandwidth floor, and the GEMVs are most of it: each
launch pays its own ramp-up and drain (docs/BENCHMARKS.md section 1). This times the five dense projections of
a layer (q_a + kv_a as one matrix -> q_b on its q_a columns; o_proj; router + shared gate/up as one matrix ->
shared down on the shared expert's columns), each stage reading the previous one as a real layer does, over
``--layers`` distinct layers (more bytes than the L2) captured in one CUDA graph:

- ``separate``: five triton_gemv launches a layer (the model's kernel, PDL as configured: on by default);
- ``chain/<pre>``: one gemv_chain_kernel launch a layer (kernels/chain.py), a program per SM, stages separated
  by counters; before waiting for the previous stage a program does nothing (none), asks the L2 for its
  weight slabs (l2), or loads its first weight tile into registers (regs);
- ``.../w8/s4/g2/p/b``: with 8 warps, 4 pipeline stages, 2 programs a SM (the launcher refuses a grid that
  cannot be resident at once), split stages reducing their own partials (p), splits chosen to balance the
  programs' work (b);
- ``separate/notail``, ``single<i>[/notail]``: timing only, the separate launches (all, or stage i alone) with
  split launches leaving their partials unreduced: what the split-K tail (the last split's handshake and
  reduction) costs;
- ``chain/free``: the same launch with no stage waiting (every stage reads a tensor): the persistent grid's
  own streaming ceiling for these bytes, not a result anyone could use;
- ``read``: the bytes over the copy bandwidth measured in the same run.

Every variant's outputs are compared with the separate launches' before it is timed. Partial results are
written after every row (a hung persistent launch would end the process).

    python benchmarks/bench_chain.py --out benchmarks/results/h200/chain.json [--tokens 1 4] [--layers 12]
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import copy_bandwidth, time_graph  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.chain import ChainStage, chain_output, triton_gemv_chain  # noqa: E402
from sglang_eagle3.kernels.gemv import triton_gemv  # noqa: E402

HIDDEN, Q_LORA, KV_A, O_IN, EXPERTS, SHARED = 7168, 1536, 576, 1024, 384, 256  # Kimi TP=8 rank


def make_layer(T: int, gen: torch.Generator, independent: bool = False) -> list[ChainStage]:
    def w(*shape):
        return (torch.randn(*shape, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)

    x, attn = w(T, HIDDEN), w(T, O_IN)
    qkv, q_b, o = w(Q_LORA + KV_A, HIDDEN), w(Q_LORA, Q_LORA), w(HIDDEN, O_IN)
    rs, down = w(EXPERTS + 2 * SHARED, HIDDEN), w(HIDDEN, SHARED)
    if independent:  # every stage reads a tensor and nobody waits: the grid's streaming ceiling
        return [ChainStage(qkv, x=x, wait=False), ChainStage(q_b, x=w(T, Q_LORA), wait=False),
                ChainStage(o, x=attn, wait=False), ChainStage(rs, x=x, wait=False),
                ChainStage(down, x=w(T, SHARED), wait=False)]
    return [ChainStage(qkv, x=x, wait=False), ChainStage(q_b, src=0), ChainStage(o, x=attn),
            ChainStage(rs, x=x), ChainStage(down, src=3, col0=EXPERTS)]


def separate_calls(stages: list[ChainStage], st: dict, key: int, no_tail: bool = False,
                   only: int | None = None) -> list:
    """The layer as triton_gemv launches, outputs into st[(key, i)] (``only``: stage ``only`` alone)."""
    def call(i: int, s: ChainStage):
        def run():
            x = s.x if s.x is not None else st[(key, s.src)][:, s.col0:s.col0 + s.w.shape[1]]
            st[(key, i)] = triton_gemv(x, s.w, _no_tail=no_tail)
        return run
    return [call(i, s) for i, s in enumerate(stages) if only is None or i == only]


def parse_chain(variant: str) -> dict:
    """"chain/<pre>[/w<warps>][/s<stages>][/g<programs a SM>][/p][/b]" -> triton_gemv_chain options (p: the
    producer reduces its splits, b: balanced splits; pre "free": the independent layer, timed with pre none)."""
    parts = variant.split("/")
    assert parts[0] == "chain" and len(parts) >= 2, f"bad variant {variant!r}"
    opts = {"pre": parts[1], "num_warps": 4, "num_stages": 3, "programs_per_sm": 1}
    names = {"w": "num_warps", "s": "num_stages", "g": "programs_per_sm"}
    for p in parts[2:]:
        if p == "p":
            opts["reduce"] = "producer"
        elif p == "b":
            opts["balance"] = True
        else:
            assert p[:1] in names and p[1:].isdigit(), f"bad option {p!r} in {variant!r}"
            opts[names[p[0]]] = int(p[1:])
    return opts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--variants", nargs="+", default=["separate", "chain/none", "chain/l2", "chain/regs",
                                                       "chain/free", "separate"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    bw = copy_bandwidth()
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "copy_bw_gbps": bw,
              "pdl": tuning.pdl(torch.device("cuda"), "gemv"), "rows": []}
    copy = max(bw.values()) if isinstance(bw, dict) else bw
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(result, indent=1))

    for T in args.tokens:
        gen = torch.Generator(device="cuda").manual_seed(T)
        layers = [make_layer(T, gen) for _ in range(args.layers)]
        free = [make_layer(T, gen, independent=True) for _ in range(args.layers)]
        nbytes = sum(s.w.numel() * s.w.element_size() for s in layers[0])
        read_us = nbytes / (copy * 1e3)
        result["rows"].append({"T": T, "variant": "read", "us_per_layer": round(read_us, 2), "mb": nbytes / 1e6})
        print(f"T={T}: {nbytes / 1e6:.1f} MB a layer, {read_us:.2f} us at {copy:.0f} GB/s", flush=True)
        st: dict = {}
        ref_calls = [c for i, lay in enumerate(layers) for c in separate_calls(lay, st, i)]
        for c in ref_calls:
            c()
        torch.cuda.synchronize()
        ref = {k: v.clone() for k, v in st.items()}
        for variant in args.variants:
            row = {"T": T, "variant": variant}
            try:
                if variant == "separate":
                    calls, per_layer = ref_calls, len(layers[0])
                elif variant.startswith(("separate/", "single")):  # timing only: no_tail leaves outputs unwritten
                    head, _, tail = variant.partition("/")
                    only = int(head[len("single"):]) if head.startswith("single") else None
                    calls = [c for i, lay in enumerate(layers)
                             for c in separate_calls(lay, dict(ref), i, no_tail=tail == "notail", only=only)]
                    per_layer = len(layers[0]) if only is None else 1
                else:
                    opts = parse_chain(variant)
                    row["options"] = opts
                    src = free if opts["pre"] == "free" else layers
                    chain_out: dict = {}

                    def make(i, lay, opts=opts, sink=chain_out, T=T):
                        def run():
                            sink[i] = triton_gemv_chain(lay, T, **{**opts, "pre": "none" if opts["pre"] == "free"
                                                                   else opts["pre"]})
                        return run
                    calls, per_layer = [make(i, lay) for i, lay in enumerate(src)], 1
                    if opts["pre"] != "free":  # check before timing
                        for c in calls:
                            c()
                        torch.cuda.synchronize()
                        err = 0.0
                        for i in range(args.layers):
                            for j in range(len(layers[i])):
                                got = chain_output(chain_out[i][j], T, torch.bfloat16).float()
                                want = ref[(i, j)].float()
                                err = max(err, float((got - want).abs().max() / want.abs().max().clamp_min(1e-6)))
                        row["max_rel_err"] = err
                        assert err < 2e-2, f"{variant}: outputs differ from the separate launches ({err:.3g})"
                us = time_graph(calls, args.replays) * per_layer  # time_graph: per call
                row["us_per_layer"] = round(us, 2)
                row["x_read"] = round(us / read_us, 2)
            except Exception as e:  # report, keep going
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            result["rows"].append(row)
            save()
            print(f"  T={T} {variant:12s} " + (f"{row['us_per_layer']:8.2f} us a layer ({row['x_read']:.2f}x "
                                               f"the bytes' time)" if "us_per_layer" in row else row["error"]),
                  flush=True)
        del layers, free, st, ref, ref_calls
        torch.cuda.empty_cache()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
