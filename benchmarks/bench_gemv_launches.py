"""The skinny GEMM's wide launches as the step makes them, at the shipped config (kernels/gemv.py gemv_config) and
at explicit variants of it, at a Kimi-K2.5 TP=8 rank's shapes: the q_a + kv_a pair, the router (fp32 logits) +
shared expert gate/up pair (gated: two weight tiles a stage), the lm_head slice and the dense layer's gate/up.

Why: the router + shared launch has 200 programs of 120 KB of shared memory each at 3 stages, one a SM, so 68
wait for a second wave on the H200's 132 SMs. The thirty-first session tried a rule that cut the stages where
that fits all programs at once (2 stages, two blocks a SM; bench_gemv_wave.py at 0982baf): slower alone (10.3
-> 12.1 us) and in the step (2-3%), removed; this script keeps the variants' timings measurable. Each case is
timed in graph replays with the weights rotated past the L2 (bench_kernels.time_graph: back-to-back launches of
the same kernel, which under PDL may overlap one launch's tail with the next one's start; the 61-layer step,
bench_verify_graph.py --paired, decides). Since `391ae14` the router + shared pair ships on the CUDA cores
(kernels/gemv.py triton_gemv_fma_pair): "shipped" is that form there, "tensor cores" the previous one, and "fma ..."
other CUDA-core configs. The q_a + kv_a pair ships on the tensor cores; its "fma ..." settings are the CUDA-core
form of a plain pair (SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR, thirty-seventh session). Each variant's products are
compared bit for bit with the shipped config's (equal where only the pipeline depth differs, which does not change
the arithmetic), and row 0 of every T with T=1 (decode == verify).

    python benchmarks/bench_gemv_launches.py --out OUT.json [--tokens 1 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import read_ceiling_us, time_graph  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.gemv import (  # noqa: E402
    fma_pair_config,
    gemv_config,
    triton_gemv,
    triton_gemv_fma_pair,
    triton_gemv_pair,
)

H = 7168
# (name, kind, matrices' rows): "pair" = triton_gemv_pair(w1, w2); "route" = the router (fp32) + gated shared pair;
# "single" / "gated" = triton_gemv.
CASES = [("q_a+kv_a", "pair", (1536, 576)), ("router+shared gate/up", "route", (384, 256)),
         ("lm_head slice", "single", (20480,)), ("dense gate/up (layer 0)", "gated", (2304,))]
# Explicit configs tried on top of the shipped one (keys replace gemv_config's): (label, overrides).
VARIANTS = [("stages 2", {"num_stages": 2}), ("stages 3", {"num_stages": 3}), ("stages 4", {"num_stages": 4}),
            ("BLOCK_N 16", {"BLOCK_N": 16}), ("BLOCK_K 128 x 4", {"BLOCK_K": 128, "num_stages": 4}),
            ("SPLIT 3", {"SPLIT": 3}), ("SPLIT 5", {"SPLIT": 5}), ("SPLIT 7", {"SPLIT": 7}),
            ("SPLIT 14", {"SPLIT": 14})]


def weights(kind: str, rows: tuple[int, ...], copies: int) -> list[tuple]:
    mk = lambda n: torch.randn(n, H, device="cuda", dtype=torch.bfloat16) * 0.02  # noqa: E731
    if kind == "route":
        return [(mk(rows[0]), mk(rows[1]), mk(rows[1])) for _ in range(copies)]
    if kind == "pair":
        return [(mk(rows[0]), mk(rows[1])) for _ in range(copies)]
    if kind == "gated":
        return [(mk(rows[0]), mk(rows[0])) for _ in range(copies)]
    return [(mk(rows[0]),) for _ in range(copies)]


def call(kind: str, x: torch.Tensor, ws: tuple, cfg: dict | None):
    if kind in ("route", "pair") and cfg is not None and "LANES" in cfg:  # a CUDA-core config
        gated = kind == "route"
        return triton_gemv_fma_pair(x, ws[0], ws[1], ws[2] if gated else None,
                                    out1_dtype=torch.float32 if gated else None, config=cfg)
    if kind == "route":
        return triton_gemv_pair(x, ws[0], ws[1], w2_up=ws[2], out1_dtype=torch.float32, config=cfg)
    if kind == "pair":
        return triton_gemv_pair(x, ws[0], ws[1], config=cfg)
    if kind == "gated":
        return (triton_gemv(x, ws[0], w_up=ws[1], config=cfg),)
    return (triton_gemv(x, ws[0], config=cfg),)


def shipped_config(kind: str, rows: tuple[int, ...]) -> dict:
    """gemv_config as the launcher calls it."""
    dev = torch.device("cuda")
    sms, smem = tuning.sm_count(dev), tuning.smem_per_block(dev)
    if kind == "route":
        return gemv_config(rows[0] + 2 * rows[1], H, 1, True, sms, 2, smem)
    if kind == "pair":
        return gemv_config(sum(rows), H, 1, True, sms, 1, smem)
    return gemv_config(rows[0], H, 1, True, sms, 2 if kind == "gated" else 1, smem)


# The CUDA-core pair's configs tried on top of fma_pair_config (the router + shared case).
FMA_VARIANTS = [("rows 2", {"MAX_ROWS": 2}), ("128 lanes", {"LANES": 128, "num_warps": 4}),
                ("2 weight rows", {"BLOCK_N": 2}), ("8 weight rows, rows 2", {"BLOCK_N": 8, "MAX_ROWS": 2}),
                ("rows 1", {"MAX_ROWS": 1}), ("rows 8", {"MAX_ROWS": 8}), ("lanes first", {"LANES_FIRST": True}),
                ("lanes first, 128 lanes", {"LANES_FIRST": True, "LANES": 128, "num_warps": 4}),
                ("lanes first, rows 2", {"LANES_FIRST": True, "MAX_ROWS": 2}),
                ("lanes first, 2 weight rows", {"LANES_FIRST": True, "BLOCK_N": 2})]

# The q_a + kv_a pair's CUDA-core configs (fma_pair_config's, 256 lanes over 8 warps, first).
PLAIN_VARIANTS = [("128 lanes", {"LANES": 128, "num_warps": 4}), ("rows 2", {"MAX_ROWS": 2}),
                  ("128 lanes, rows 2", {"LANES": 128, "num_warps": 4, "MAX_ROWS": 2}),
                  ("2 weight rows", {"BLOCK_N": 2}), ("8 weight rows", {"BLOCK_N": 8}),
                  ("64 lanes", {"LANES": 64, "num_warps": 2})]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeat", type=int, default=2, help="alternations of the settings (the spread is the noise)")
    ap.add_argument("--only", nargs="+", default=[], help="only these cases (names as printed, e.g. router+shared)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    sms = tuning.sm_count(torch.device("cuda"))
    result = {"command": " ".join(["python", *sys.argv]), "git_commit": git_commit(),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "sm_count": sms,
              "cases": []}
    for name, kind, rows in CASES:
        if args.only and not any(name.startswith(o) for o in args.only):
            continue
        nbytes = sum(rows) * H * 2 * (2 if kind == "gated" else 1) + (rows[1] * H * 2 if kind == "route" else 0)
        copies = max(2, min(16, (400 << 20) // nbytes))
        wss = weights(kind, rows, copies)
        # one contiguous buffer of the case's bytes a copy: the read-only kernel streams them in one launch
        read_us = read_ceiling_us([torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16).normal_()
                                   for _ in wss], sms)
        base = shipped_config(kind, rows)
        settings = [("shipped", None)] + [(label, dict(base, **over)) for label, over in VARIANTS]
        if kind == "route":  # the shipped pair runs on the CUDA cores (fma_pair_form): its tensor-core form too
            fma = fma_pair_config(*rows, H)
            settings = [("shipped", None), ("tensor cores", base)] + [
                (label, dict(base, **over)) for label, over in VARIANTS[:5]] + [
                (f"fma {label}", dict(fma, **over)) for label, over in FMA_VARIANTS]
        if kind == "pair":  # the q_a + kv_a pair on the CUDA cores (SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR)
            fma = fma_pair_config(*rows, H, gated=False)
            settings += [(f"fma {label}", dict(fma, **over)) for label, over in [("256 lanes", {})] + PLAIN_VARIANTS]
        ref = {}
        x_all = torch.randn(max(args.tokens), H, device="cuda", dtype=torch.bfloat16)
        for T in args.tokens:
            x = x_all[:T]  # the same first row at every T
            row = {"case": name, "T": T, "bytes": nbytes, "read_us": round(read_us, 2), "shipped_config": base}
            for rep in range(args.repeat):
                for label, cfg in settings:
                    try:
                        outs = call(kind, x, wss[0], cfg)
                        us = time_graph([lambda ws=ws, cfg=cfg, kind=kind, x=x: call(kind, x, ws, cfg) for ws in wss])
                    except Exception as e:  # a config the GPU rejects (shared memory) is reported, not fatal
                        row[label] = f"failed: {type(e).__name__}: {str(e)[:100]}"
                        continue
                    row.setdefault(label, []).append(round(us, 2))
                    if rep == 0:  # the same bits as the shipped config; row 0 as at T=1
                        if label == "shipped":
                            ref[T] = outs
                        same = all(torch.equal(a, b) for a, b in zip(outs, ref[T], strict=True))
                        row.setdefault("bit_identical_to_shipped", {})[label] = same
                        if T == args.tokens[0]:
                            ref.setdefault(("t1", label), outs)
                        else:
                            t1 = ref.get(("t1", label))
                            row.setdefault("row0_equals_T1", {})[label] = t1 is not None and all(
                                torch.equal(a[:1], b[:1]) for a, b in zip(outs, t1, strict=True))
            result["cases"].append(row)
            timings = "  ".join(f"{label} {'/'.join(map(str, v)) if isinstance(v, list) else v}"
                                for label, v in row.items() if label in dict((s[0], 0) for s in settings))
            print(f"{name:24s} T={T:2d} read {read_us:6.2f} us | {timings}", flush=True)
            print(f"    bits as shipped: {row['bit_identical_to_shipped']}"
                  + (f"; row 0 as T=1: {row['row0_equals_T1']}" if "row0_equals_T1" in row else ""), flush=True)
        del wss
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
