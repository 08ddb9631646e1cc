"""The decode projections as a GEMV on the CUDA cores (kernels/gemv.py triton_gemv_fma: lanes along K, per-lane
sums, no split-K, no shared memory) against the tensor-core GEMV (triton_gemv with fma=False: the activation rows
padded to 16, weights through a shared-memory pipeline, split-K for wide K) and the read-only ceiling of the same
bytes, at a Kimi-K2.5 TP=8 rank's shapes, T = 1..16, over a few launch configs; then q_b with its q_a norm folded
into both (as the step launches it).

Why: the eighth session put the step's GEMV launches at 1.2-2x what a kernel that only reads their bytes costs in a
graph. The twenty-second session's prototype of this form (then a kernel in this file) beat the tensor-core GEMV at
T=1 on four of five projections and at T=4 only on q_b; the twenty-third moved it into the package, where
kernels/gemv.py fma_form sends it the small matrices (q_b). Each row of x has its own accumulators and code, so a
token's products are bit-identical whatever T is: printed first (alone / in pairs / in fours == in a batch of T).

    python benchmarks/bench_gemv_fma.py --out OUT.json [--tokens 1 2 4 8 16]
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

from sglang_eagle3.kernels.gemv import fma_config, triton_gemv, triton_gemv_fma  # noqa: E402

# (name, N, K): a Kimi-K2.5 TP=8 rank's decode projections (the pair launches as one matrix of their bytes).
SHAPES = [("q_a+kv_a", 2112, 7168), ("q_b", 1536, 1536), ("o_proj", 7168, 1024), ("router+shared gate/up", 896, 7168),
          ("shared down", 7168, 256)]
NORMED = ("q_b", 1536, 1536)  # also timed with its q_a RMSNorm folded in, as the step launches it (NORM_PRE)
# Launch configs (BLOCK_N, LANES, num_warps, MAX_ROWS, LANES_FIRST): q_b's (the matrix fma_form sends here) swept,
# the others' the first four (256 lanes: all threads along K; 128; each with the weight tile either way round).
CONFIGS = ((4, 256, 8, 4, 0), (4, 256, 8, 4, 1), (4, 128, 4, 4, 0), (4, 128, 4, 4, 1), (4, 256, 8, 8, 0),
           (8, 256, 8, 8, 0), (4, 128, 4, 8, 0), (8, 128, 4, 8, 0), (8, 32, 8, 8, 0), (16, 32, 8, 8, 0),
           (16, 64, 8, 8, 0), (2, 256, 8, 8, 0))
SWEPT = ("q_b",)
# --tc-sweep: the tensor-core GEMV's launch configs on q_b (BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages); the
# first is what gemv_config picks (split-K 3, 144 programs). A config is one arithmetic for every T (rows padded to
# 16), so any of them keeps decode == verify.
TC_CONFIGS = ((32, 256, 3, 4, 3), (16, 256, 1, 4, 4), (16, 512, 1, 4, 3), (16, 512, 1, 8, 3), (16, 256, 2, 4, 3),
              (32, 512, 1, 4, 3), (16, 1024, 1, 8, 2), (16, 128, 1, 4, 8), (16, 64, 1, 4, 8), (16, 2048, 1, 8, 1))


def fma_gemv(x, w, cfg=None, norm_weight=None, eps=0.0):
    if cfg is not None:
        cfg = dict(zip(("BLOCK_N", "LANES", "num_warps", "MAX_ROWS", "LANES_FIRST"), cfg, strict=True))
    return triton_gemv_fma(x, w, config=cfg, norm_weight=norm_weight, eps=eps)


def _key(cfg) -> str:
    return "fma_bn{}_l{}_w{}_r{}{}_us".format(*cfg[:4], "_lf" if cfg[4] else "")


def identity(device: str) -> list[dict]:
    """Whether each token's products are bit-identical computed alone, in groups of 2, 4 and 8 (the kernel's 1-, 2-,
    4- and 8-row programs) and in a batch of T = 1..16, for the CUDA-core form (its default config and an 8-row
    one) and the tensor-core GEMV: what decode and verify computing the same token needs."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for name, N, K in SHAPES:
        x = torch.randn(16, K, generator=g).to(torch.bfloat16).to(device)
        w = (torch.randn(N, K, generator=g) / K ** 0.5).to(torch.bfloat16).to(device)
        kinds = {"fma": lambda a, w=w: fma_gemv(a, w), "fma 8 rows": lambda a, w=w: fma_gemv(a, w, (8, 32, 8, 8, 0)),
                 "fma lanes first": lambda a, w=w: fma_gemv(a, w, (4, 128, 4, 4, 1)),
                 "tensor cores": lambda a, w=w: triton_gemv(a, w, fma=False)}
        for kind, fn in kinds.items():
            parts = {s: torch.cat([fn(x[t:t + s]) for t in range(0, 16, s)]) for s in (1, 2, 4, 8)}
            same = all(torch.equal(fn(x[:T]), parts[s][:T]) for T in range(1, 17) for s in (1, 2, 4, 8))
            rows.append({"op": name, "kind": kind, "identical_t1_to_16": same})
            print(f"identity {name:22s} {kind:13s}: alone / in 2s / 4s / 8s == in a batch of T = 1..16: {same}",
                  flush=True)
    return rows


def tc_sweep(tokens: list[int]) -> list[dict]:
    """q_b on the tensor-core GEMV over TC_CONFIGS (and the CUDA-core form's default), with and without its norm:
    us per T, and whether each config's rows are bit-identical across T (alone == in the batch)."""
    from benchmarks.bench_kernels import time_graph

    name, N, K = NORMED
    rows = []
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(32)]
    nw = torch.rand(K, device="cuda", dtype=torch.bfloat16) + 0.5
    x16 = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
    for norm in (True, False):
        kw = {"norm_weight": nw, "eps": 1e-6} if norm else {}
        variants = {"fma default": lambda x, w, kw=kw: triton_gemv_fma(x, w, **kw)}
        for bn, bk, split, warps, stages in TC_CONFIGS:
            cfg = {"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT": split, "num_warps": warps, "num_stages": stages}
            variants[f"tc bn{bn}_bk{bk}_s{split}_w{warps}_st{stages}"] = (
                lambda x, w, kw=kw, cfg=cfg: triton_gemv(x, w, config=cfg, fma=False, **kw))
        for label, fn in variants.items():
            full = fn(x16, ws[0])
            same = all(torch.equal(fn(x16[:T], ws[0]), full[:T]) for T in (1, 2, 4, 8))
            row = {"op": name + (" + q_a norm" if norm else ""), "variant": label, "identical_across_T": same}
            for T in tokens:
                x = x16[:T].contiguous()
                row[f"T{T}_us"] = round(time_graph([lambda w=w, x=x, fn=fn: fn(x, w) for w in ws]), 2)
            rows.append(row)
            print(f"{row['op']:16s} {label:28s} identical {same}: " + "  ".join(
                f"T={T} {row[f'T{T}_us']:6.2f}" for T in tokens), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--tc-sweep", action="store_true",
                    help="only: the tensor-core GEMV over TC_CONFIGS on q_b (with and without its norm)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU (the kernels' correctness on CPU: tests/kernels)"
    from benchmarks.bench_kernels import read_ceiling_us, time_graph
    from sglang_eagle3.kernels import tuning

    sms = tuning.sm_count(torch.device("cuda"))
    pdl = tuning.pdl(torch.device("cuda"), "gemv")
    if args.tc_sweep:
        return write_out(args.out, tc_sweep(args.tokens), pdl)
    rows = identity("cuda")
    cases = [(name, N, K, False) for name, N, K in SHAPES] + [(NORMED[0], *NORMED[1:], True)]
    for name, N, K, norm in cases:
        nbytes = N * K * 2
        copies = max(2, min(32, (256 << 20) // nbytes))  # rotate past the L2
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(copies)]
        nw = (torch.rand(K, device="cuda", dtype=torch.bfloat16) + 0.5) if norm else None
        kw = {"norm_weight": nw, "eps": 1e-6} if norm else {}
        read = read_ceiling_us(ws, sms)
        label = name + (" + q_a norm" if norm else "")
        for T in args.tokens:
            x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
            xr = torch.nn.functional.rms_norm(x.float(), (K,), nw.float(), 1e-6) if norm else x.float()
            ref = xr @ ws[0].float().t()
            row = {"op": label, "N": N, "K": K, "T": T, "bytes": nbytes, "read_us": round(read, 2),
                   "tensor_core_us": round(time_graph([lambda w=w, x=x, kw=kw: triton_gemv(x, w, fma=False, **kw)
                                                       for w in ws]), 2),
                   "default_config": fma_config(N, K)}
            for cfg in CONFIGS if name in SWEPT else CONFIGS[:4]:
                got = fma_gemv(x, ws[0], cfg, **kw).float()
                err = ((got - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (label, T, cfg, err)
                us = time_graph([lambda w=w, x=x, cfg=cfg, kw=kw: fma_gemv(x, w, cfg, **kw) for w in ws])
                row[_key(cfg)] = round(us, 2)
            best = min((v, k) for k, v in row.items() if k.startswith("fma_"))
            row["fma_best"] = best[1]
            rows.append(row)
            print(f"{label:22s} T={T:2d}: read {read:6.2f} us  tensor cores {row['tensor_core_us']:6.2f}  fma best "
                  f"{best[0]:6.2f} ({best[1][4:-3]})  all: " + " ".join(
                      f"{k[4:-3]} {v}" for k, v in row.items() if k.startswith("fma_") and k != "fma_best"),
                  flush=True)
        del ws
    write_out(args.out, rows, pdl)


def write_out(path: str | None, rows: list[dict], pdl: bool) -> None:
    from sglang_eagle3.bench.harness import git_commit

    if path:
        Path(path).write_text(json.dumps({"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
                                          "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "triton": triton.__version__, "pdl": pdl, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
