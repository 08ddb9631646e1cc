"""Does leaving a split GEMV's reduction to its readers (kernels/split_sum.py) pay, at one Kimi-K2.5 TP=8
rank's decode/verify shapes?

``bench_chain.py`` measured the split-K tail of the skinny GEMM at 1.5-1.7 us a launch (``single<i>/notail``).
Here the tail goes away for real: the two split launches of a layer with their readers, over ``--layers``
distinct layers captured in one CUDA graph, stored (the launch reduces) against deferred (the readers add the
partials as they load):

- ``qkv``: q_a + kv_a (K = 7168) -> q_b with the q_a norm (NORM_PRE) and the rotary launch writing the normed
  latent and the rotated rope key into cache rows;
- ``moe``: router (float32 logits) + shared expert gate/up (gated) -> the routing kernel and the shared down
  GEMV with its residual add.

The readers' x loads add SPLIT fp32 planes of [16, BLOCK_K] (rows padded to the tensor-core tile), so a reader
may need a narrower K tile than its launcher picks (``--reader-block-k``); the stored variant is timed with the
same reader configs too, so the two differ only in where the reduction runs. Each deferred variant's outputs
are compared with the stored one's (bit for bit) before it is timed.

    python benchmarks/bench_split_sum.py --out benchmarks/results/h200/split_sum.json [--tokens 1 4]
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
from sglang_eagle3.kernels.gemv import gemv_config, triton_gemv, triton_gemv_pair  # noqa: E402
from sglang_eagle3.kernels.moe_topk import triton_moe_topk  # noqa: E402
from sglang_eagle3.kernels.rotary import triton_apply_rotary  # noqa: E402

HIDDEN, Q_LORA, KV_LORA, ROPE, Q_B = 7168, 1536, 512, 64, 1536
EXPERTS, SHARED, TOP_K = 384, 256, 8
EPS = 1e-6


def make_layer(T: int, gen: torch.Generator) -> dict:
    def w(*shape, scale=0.02):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    slots = 4096
    freqs = torch.outer(torch.arange(slots, device="cuda", dtype=torch.float64),
                        torch.rand(ROPE // 2, device="cuda", dtype=torch.float64, generator=gen))
    return dict(x=w(T, HIDDEN, scale=1.0), q_a=w(Q_LORA, HIDDEN), kv_a=w(KV_LORA + ROPE, HIDDEN), q_b=w(Q_B, Q_LORA),
                qa_norm=(1 + w(Q_LORA)), kv_norm=(1 + w(KV_LORA)), cache=w(slots, KV_LORA + ROPE),
                rows=torch.randperm(slots, device="cuda", generator=gen)[:T],
                positions=torch.randint(0, slots, (T,), device="cuda", generator=gen),
                cos=freqs.cos().float(), sin=freqs.sin().float(),
                router=w(EXPERTS, HIDDEN), gate=w(SHARED, HIDDEN), up=w(SHARED, HIDDEN), down=w(HIDDEN, SHARED),
                bias=torch.rand(EXPERTS, device="cuda", generator=gen) * 0.1, res=w(T, HIDDEN, scale=1.0))


def qkv_calls(L: dict, out: dict, defer: bool, qb_cfg: dict | None) -> list:
    def pair():
        out["q_a"], out["kv_a"] = triton_gemv_pair(L["x"], L["q_a"], L["kv_a"], defer=defer)

    def q_b():
        out["q"] = triton_gemv(out["q_a"], L["q_b"], norm_weight=L["qa_norm"], eps=EPS, config=qb_cfg)

    def rope():
        kv = out["kv_a"]
        c, k = (kv.columns(0, KV_LORA), kv.columns(KV_LORA, ROPE)) if defer else (kv[:, :KV_LORA], kv[:, KV_LORA:])
        cache = L["cache"]
        triton_apply_rotary(None, k, L["positions"], L["cos"], L["sin"], interleaved=True, inplace=True,
                            k_out=cache[:, KV_LORA:], k_out_rows=L["rows"], c_norm=(c, L["kv_norm"], EPS,
                                                                                   cache[:, :KV_LORA]))
    return [pair, q_b, rope]


def moe_calls(L: dict, out: dict, defer: bool, down_cfg: dict | None) -> list:
    def pair():
        out["logits"], out["act"] = triton_gemv_pair(L["x"], L["router"], L["gate"], w2_up=L["up"],
                                                     out1_dtype=torch.float32, defer=defer)

    def topk():
        out["w"], out["ids"] = triton_moe_topk(out["logits"], L["bias"], top_k=TOP_K, n_group=1, topk_group=1,
                                               renormalize=True, routed_scaling_factor=2.827)

    def down():
        out["shared"] = triton_gemv(out["act"], L["down"], add=L["res"], config=down_cfg)
    return [pair, topk, down]


def outputs(kind: str, out: dict, L: dict) -> list[torch.Tensor]:
    if kind == "qkv":
        return [out["q"], L["cache"][L["rows"]]]
    return [out["w"], out["ids"], out["shared"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--reader-block-k", type=int, nargs="+", default=[0, 128, 64],
                    help="K tile of the reader GEMVs (q_b, shared down); 0: their launcher's own")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    bw = copy_bandwidth()
    sms = tuning.sm_count(torch.device("cuda"))
    smem = tuning.smem_per_block(torch.device("cuda"))
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "copy_bw_gbps": bw,
              "pdl": tuning.pdl(torch.device("cuda"), "gemv"), "rows": []}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for T in args.tokens:
        gen = torch.Generator(device="cuda").manual_seed(T)
        layers = [make_layer(T, gen) for _ in range(args.layers)]
        for kind, make in (("qkv", qkv_calls), ("moe", moe_calls)):
            for bk in args.reader_block_k:
                if kind == "qkv":
                    cfg = gemv_config(Q_B, Q_LORA, 1, True, sms, 1, smem)
                else:
                    cfg = gemv_config(HIDDEN, SHARED, 1, True, sms, 1, smem)
                cfg = dict(cfg, BLOCK_K=bk) if bk else None
                times, outs = {}, {}
                for defer in (False, True, False):
                    row = {"T": T, "chain": kind, "reader_block_k": bk or "launcher's", "defer": defer}
                    try:
                        states = [{} for _ in layers]
                        calls = [c for L, st in zip(layers, states, strict=True) for c in make(L, st, defer, cfg)]
                        for c in calls:
                            c()
                        torch.cuda.synchronize()
                        got = [t.clone() for L, st in zip(layers, states, strict=True) for t in outputs(kind, st, L)]
                        if defer in outs:
                            pass
                        elif outs:
                            ref = next(iter(outs.values()))
                            row["bit_equal"] = all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
                            assert row["bit_equal"], f"{kind} deferred outputs differ from stored"
                        outs[defer] = got
                        us = time_graph(calls, args.replays) * len(calls) / args.layers
                        row["us_per_layer"] = round(us, 2)
                        times.setdefault(defer, []).append(us)
                    except Exception as e:  # report, keep going
                        row["error"] = f"{type(e).__name__}: {e}"
                        traceback.print_exc()
                    result["rows"].append(row)
                    out_path.write_text(json.dumps(result, indent=1))
                    print(f"T={T} {kind} reader BK={row['reader_block_k']} defer={defer}: "
                          + (f"{row['us_per_layer']:.2f} us a layer" if "us_per_layer" in row else row["error"]),
                          flush=True)
        del layers
        torch.cuda.empty_cache()
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
