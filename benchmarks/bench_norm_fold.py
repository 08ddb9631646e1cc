"""The decoder layer's input RMSNorm (with its residual add) folded into MLA's q_a + kv_a launch (the input_norm
fusion), timed alone at a Kimi-K2.5 TP=8 rank's shape (q_a 1536 + kv_a 576 rows, K = 7168) against the two
launches it replaces (the norm kernel, then the plain gemv_pair) and the plain launch alone, at the launcher's
choice and at the tensor-core configs given: what the fold costs the GEMV, config by config. The launcher's choice
is the CUDA-core pair's fold (NORM_PRE with the residual, fifty-fourth session) where fma_pair_form takes the
shape, as it does the plain pair; a config given keeps the tensor-core kernel's fold (NORM_POST, split over K).

Each case's calls run over 4 weight sets (30 MB each: the L2 holds none between uses), captured in one CUDA
graph (bench_kernels.time_graph: median replay / calls).

    python benchmarks/bench_norm_fold.py --out OUT.json [--configs 64:4:8 128:4:4:2 ...]  # BLOCK_K:SPLIT:STAGES[:WARPS]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import HIDDEN, time_graph  # noqa: E402
from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels.gemv import triton_gemv_pair  # noqa: E402

Q_LORA, KV_A = 1536, 576
DEFAULT_CONFIGS = ["64:4:8", "64:4:4", "64:2:8", "64:8:4", "128:4:4", "128:4:2", "128:2:3", "32:4:8"]


def parse_config(text: str) -> dict:
    """'BLOCK_K:SPLIT:STAGES[:WARPS]' -> a gemv_pair config (BLOCK_N 32; 4 warps unless given)."""
    try:
        bk, split, stages, *warps = (int(v) for v in text.split(":"))
        assert len(warps) <= 1
    except (ValueError, AssertionError):
        raise SystemExit(f"--configs: {text!r} is not BLOCK_K:SPLIT:STAGES[:WARPS]") from None
    return {"BLOCK_N": 32, "BLOCK_K": bk, "SPLIT": split, "num_warps": warps[0] if warps else 4,
            "num_stages": stages}


def fold_cases(h, res, w1, w2, nw, configs: dict) -> dict:
    """{name: () -> thunks over the weight sets} for activations h and residuals res [sets, T, HIDDEN]."""
    sets = range(h.shape[0])

    def unfused(i):
        normed, _ = kernels.rms_norm(h[i], nw, 1e-6, res[i])
        kernels.gemv_pair(normed, w1[i], w2[i])

    def fold(i, cfg=None):
        triton_gemv_pair(h[i], w1[i], w2[i], norm_weight=nw, eps=1e-6, residual=res[i], config=cfg)

    cases = {"norm, then q_a + kv_a (two launches)": lambda: [lambda i=i: unfused(i) for i in sets],
             "q_a + kv_a alone (no norm)": lambda: [lambda i=i: kernels.gemv_pair(h[i], w1[i], w2[i]) for i in sets],
             "fold, launcher's config": lambda: [lambda i=i: fold(i) for i in sets]}
    for name, cfg in configs.items():
        cases[f"fold BLOCK_K:SPLIT:STAGES[:WARPS]={name}"] = lambda cfg=cfg: [lambda i=i: fold(i, cfg) for i in sets]
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    configs = {c: parse_config(c) for c in args.configs}
    n_sets = 4
    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = torch.randn(n_sets, Q_LORA, HIDDEN, device="cuda", generator=g).bfloat16() / HIDDEN ** 0.5
    w2 = torch.randn(n_sets, KV_A, HIDDEN, device="cuda", generator=g).bfloat16() / HIDDEN ** 0.5
    nw = torch.rand(HIDDEN, device="cuda", generator=g).bfloat16() + 0.5
    rows = []
    for T in args.tokens:
        h = torch.randn(n_sets, T, HIDDEN, device="cuda", generator=g).bfloat16()
        res = torch.randn(n_sets, T, HIDDEN, device="cuda", generator=g).bfloat16()
        cases = fold_cases(h, res, w1, w2, nw, configs)
        for name, calls in cases.items():
            try:
                us = [round(time_graph(calls()), 2) for _ in range(args.repeat)]
            except Exception as exc:  # a config that does not compile or launch: say so, go on
                print(f"T={T} {name:44s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                rows.append({"T": T, "case": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
                continue
            rows.append({"T": T, "case": name, "us": us})
            print(f"T={T} {name:44s} " + " / ".join(f"{u:.2f}" for u in us) + " us", flush=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "git_commit": git_commit(),
                                          "gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
