"""MLA for prefill chunks at a Kimi-K2.5 TP=8 rank's shapes (8 heads, latent 512, rope 64, nope / v 128): the
absorbed form (W_UK GEMV, the split kernel over the latents, W_UV GEMV) against the non-absorbed one
(kernels.triton_mla_mha_prefill: decompression into the scratch, the split kernel over per-head keys), each case
one request of T new tokens over a prefix (context = prefix + T) in a page table as wide as a 128k server's,
timed as CUDA graph replays (the prefill graphs run them so), both forms alternating in one process.

Also whole prompts: the sum over a prompt's 1024-token chunks (as the prefill graphs replay them) of each form's
time a chunk, and with --variants the MHA form at config overrides ('' is the op's table config).

    python benchmarks/bench_mla_prefill.py --out benchmarks/results/h200/mla_prefill_mha.json
    python benchmarks/bench_mla_prefill.py --out OUT.json --only-mha --variants '' BLOCK_M=128,num_warps=8
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import HEADS, KV_LORA, ROPE, time_graph  # noqa: E402
from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402

NOPE = V = 128
SM_SCALE = 1.0 / math.sqrt(NOPE + ROPE)
PAGE = 64


def case(T: int, ctx: int, slots: int):
    """Thunks for one request of T new tokens at context ctx in a table of ``slots`` slots: (absorbed, mha(config))."""
    P = slots // PAGE
    table = (torch.randperm(P, device="cuda") + 1).int()[None]
    kv = torch.randn((P + 1) * PAGE, KV_LORA + ROPE, device="cuda", dtype=torch.bfloat16)
    w_kv_b = torch.randn(HEADS * (NOPE + V), KV_LORA, device="cuda", dtype=torch.bfloat16) / KV_LORA ** 0.5
    w = w_kv_b.view(HEADS, NOPE + V, KV_LORA)
    w_uk, w_uv = w[:, :NOPE], w[:, NOPE:]
    q = torch.randn(T, HEADS, NOPE + ROPE, device="cuda", dtype=torch.bfloat16) * 0.3
    q_nope, q_rope = q.split([NOPE, ROPE], dim=-1)
    scratch = torch.empty((P + 1) * PAGE, kernels.mha_scratch_width(HEADS, NOPE, ROPE, V), device="cuda",
                          dtype=torch.bfloat16)
    seq = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    kw = dict(tokens_per_req=T, page_size=PAGE, kv_lora_rank=KV_LORA, sm_scale=SM_SCALE)

    def absorbed():
        q_latent = kernels.gemv(q_nope, w_uk.transpose(1, 2))
        out = kernels.triton_mla_attention(q_latent, q_rope, kv, table, seq, **kw)
        return kernels.gemv(out, w_uv)

    def mha(config=None):
        return kernels.triton_mla_mha_prefill(q_nope, q_rope, kv, w_kv_b, scratch, table, seq, **kw, config=config)

    return absorbed, mha


def flops(T: int, ctx: int) -> dict:
    """Multiply-adds x 2 of each form (causal: query t sees ctx - T + t + 1 keys)."""
    seen = T * (ctx - T) + T * (T + 1) // 2
    return {"absorbed": 2 * HEADS * seen * (2 * KV_LORA + ROPE) + 2 * 2 * T * HEADS * NOPE * KV_LORA,
            "mha": 2 * HEADS * seen * (NOPE + ROPE + V) + 2 * ctx * KV_LORA * HEADS * (NOPE + V)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--slots", type=int, default=131072, help="page table slots (a 128k server's graphs)")
    ap.add_argument("--cases", nargs="+", default=None, metavar="T:CTX",
                    help="chunks to time (default: T in 16..1024 over fresh prompts and 4k/16k/32k contexts)")
    ap.add_argument("--prompts", type=int, nargs="*", default=[4096, 16384, 32768],
                    help="whole prompts summed over their 1024-token chunks (none: no prompts)")
    ap.add_argument("--variants", nargs="+", default=[""],
                    help="MHA config overrides 'k=v,k=v' ('' = the op's config), alternating")
    ap.add_argument("--only-mha", action="store_true", help="skip the absorbed form (config sweeps)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    cases = ([tuple(int(x) for x in c.split(":")) for c in args.cases] if args.cases else
             [(T, ctx) for T in (16, 32, 64, 128, 256, 1024) for ctx in (T, 4096, 16384, 32768) if ctx >= T])
    dev = torch.device("cuda")
    rows = []

    def timed(fn_factory) -> list[float]:  # one timing (ms), to extend a case's list
        return [round(time_graph(fn_factory()) / 1000.0, 4)]

    def run(T: int, ctx: int) -> dict:
        absorbed, mha = case(T, ctx, args.slots)
        base = tuning.get_config("mla_mha_prefill", dev, "tokens", T)
        variants = {v: {**base, **{k: int(x) for k, x in (i.split("=") for i in v.split(",") if i)}}
                    for v in args.variants}
        times = {("absorbed" if not v else f"absorbed ({v})"): [] for v in ([""] if not args.only_mha else [])}
        times.update({f"mha {v or '(table)'}": [] for v in variants})
        for _ in range(args.repeat):
            if not args.only_mha:
                times["absorbed"] += timed(lambda: [absorbed])
            for v, cfg in variants.items():
                try:
                    times[f"mha {v or '(table)'}"] += timed(lambda cfg=cfg: [lambda: mha(cfg)])
                except Exception as exc:  # a config that does not compile or fit
                    times[f"mha {v or '(table)'}"] = f"failed: {str(exc).splitlines()[0][:120]}"
        f = flops(T, ctx)
        row = {"tokens": T, "context": ctx, "slots": args.slots, "ms": times,
               "gflop": {k: round(x / 1e9, 2) for k, x in f.items()}}
        med = {k: statistics.median(v) for k, v in times.items() if isinstance(v, list)}
        if "absorbed" in med:
            first_mha = next((k for k in med if k.startswith("mha")), None)
            if first_mha:
                row["absorbed_over_mha"] = round(med["absorbed"] / med[first_mha], 2)
        rows.append(row)
        print(f"T={T:5d} ctx={ctx:6d} " + "  ".join(
            f"{k}: {v if isinstance(v, str) else ' / '.join(f'{x:.3f}' for x in v)} ms" for k, v in times.items())
            + (f"  absorbed/mha {row['absorbed_over_mha']}" if "absorbed_over_mha" in row else ""), flush=True)
        return med

    for T, ctx in cases:
        run(T, ctx)
    prompts = []
    for n in args.prompts:
        total: dict[str, float] = {}
        for start in range(0, n, 1024):
            T = min(1024, n - start)
            for k, ms in run(T, start + T).items():
                total[k] = total.get(k, 0.0) + ms
        prompts.append({"prompt": n, "chunk": 1024, "ms_a_layer": {k: round(v, 3) for k, v in total.items()},
                        "ms_61_layers": {k: round(61 * v, 1) for k, v in total.items()}})
        print(f"prompt {n}: MLA a layer over its 1024-token chunks " + "  ".join(
            f"{k} {v:.2f} ms ({61 * v:.0f} ms x 61 layers)" for k, v in total.items()), flush=True)
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "rows": rows, "prompts": prompts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
