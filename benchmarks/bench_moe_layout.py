"""Does the INT4 experts' row-major layout cost the MoE gate_up its bandwidth? A read-only probe with gate_up's
program shape, over the packed weights as checkpoints store them and as one contiguous run a program.

The INT4 GEMV gate_up (kernels/triton/fused_moe.py) reads, per (pair, N block) program, BLOCK_N gate rows and the
matching up rows of its expert in chunks of BLOCK_W int32 words: each chunk 2 x BLOCK_N segments of 4 x BLOCK_W bytes,
one a row, the rows H/8 words apart (compressed-tensors' [E, 2I, H/8] words). At a verify of 4 with a trained
router's spread (31 experts a layer) it reads 64 MB at ~77% of copy bandwidth alone, where a read-only kernel of the
same bytes in one contiguous stream reaches ~94% (fiftieth / fifty-first sessions, H100). This probe keeps gate_up's
grid, tiles, warps and its two chunks in flight, does no arithmetic but an xor of the words (so nothing is dropped),
and reads either

* ``rows``: the checkpoint's layout, as gate_up does, or
* ``tiled``: the same words re-laid so that each (expert, N block) program's chunks lie one after another, a
  program's 2 x BLOCK_N x H/8 words one contiguous run (what a load-time re-layout would give the kernel).

plus the weights' group scales in their own layout either way (bf16 [E, 2I, H/32]; ``--no-scales``: the words
alone, the bytes of the read-only kernel the probe is set beside). Each routing draws the experts of
T uniformly routed tokens over the 384-expert pool, several routings rotated so the working set exceeds the L2;
timed as graph replays (bench_kernels.time_graph). If ``tiled`` is not clearly faster than ``rows``, the layout is not
what gate_up loses to the read-only kernel. ``--split S`` gives each (pair, N block) S programs over K (one chunk each
at S = 7): whether more, shorter programs (a split-K gate_up) would read closer to the read-only kernel.

    python benchmarks/bench_moe_layout.py --out OUT.json [--tokens 1 4 8] [--block-n 32] [--warps 4] [--split 7]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import copy_bandwidth, read_ceiling_us, time_graph  # noqa: E402
from benchmarks.bench_launch_floor import (  # noqa: E402
    EXPERT_GATE_UP,  # noqa: E402
    EXPERT_GATE_UP_WORDS,
    TOP_K,
    H,
)
from benchmarks.bench_launch_floor import EXPERTS as E  # noqa: E402
from benchmarks.bench_launch_floor import MOE_I as I  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402

GROUP = 32  # the INT4 experts' scale group (a Kimi-K2.5 TP=8 rank's shapes come from bench_launch_floor)


@triton.jit
def _chunk(w_ptr, s_ptr, rows_g, rows_u, srows_g, srows_u, w0, w_idx, g_idx, TILED: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, GROUP_WORDS: tl.constexpr, SCALES: tl.constexpr = True):
    """One chunk's gate and up words and scales (rows_*: [BLOCK_N, 1] word offsets of each row's chunk 0; without
    SCALES zeros in place of the scales, nothing loaded for them)."""
    if TILED:  # the program's chunk c is [2 * BLOCK_N, BLOCK_W] words at c * 2 * BLOCK_N * BLOCK_W
        c = w0 // BLOCK_W * (2 * BLOCK_N * BLOCK_W)
        g = tl.load(w_ptr + rows_g + c + w_idx[None, :])
        u = tl.load(w_ptr + rows_u + c + w_idx[None, :])
    else:
        g = tl.load(w_ptr + rows_g + w0 + w_idx[None, :])
        u = tl.load(w_ptr + rows_u + w0 + w_idx[None, :])
    if SCALES:
        sg = tl.load(s_ptr + srows_g + w0 // GROUP_WORDS + g_idx[None, :])
        su = tl.load(s_ptr + srows_u + w0 // GROUP_WORDS + g_idx[None, :])
    else:
        sg = (srows_g * 0 + g_idx[None, :] * 0).to(tl.int16)
        su = sg
    return g, u, sg, su


@triton.jit
def layout_probe_kernel(w_ptr, s_ptr, ids_ptr, out_ptr, H_WORDS: tl.constexpr, I: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, GROUP_WORDS: tl.constexpr, TILED: tl.constexpr,
                        SPLIT: tl.constexpr = 1, SCALES: tl.constexpr = True):
    """Program (pair, N block, K part): gate_up's reads of its expert's rows nb * BLOCK_N .. + BLOCK_N (and up's) over
    the K part's H_WORDS / SPLIT words (gate_up has SPLIT 1: all of K), the next chunk's loads issued before the
    current chunk is consumed, as gate_up does; stores the xor of every word and scale bit (one int32 a program;
    without SCALES the words' alone)."""
    pair = tl.program_id(0)
    nb = tl.program_id(1)
    ks = tl.program_id(2)
    SPAN: tl.constexpr = H_WORDS // SPLIT
    start = ks * SPAN
    e = tl.load(ids_ptr + pair).to(tl.int64)
    n = tl.arange(0, BLOCK_N)
    w_idx = tl.arange(0, BLOCK_W)
    g_idx = tl.arange(0, BLOCK_W // GROUP_WORDS)
    base = e * (2 * I * H_WORDS)
    if TILED:  # block nb's run: [H_WORDS / BLOCK_W chunks, 2 * BLOCK_N rows, BLOCK_W words]
        rows_g = base + nb * (2 * BLOCK_N * H_WORDS) + n[:, None] * BLOCK_W
        rows_u = rows_g + BLOCK_N * BLOCK_W
    else:
        rows_g = base + (nb * BLOCK_N + n)[:, None].to(tl.int64) * H_WORDS
        rows_u = rows_g + I * H_WORDS
    s_base = e * (2 * I * (H_WORDS // GROUP_WORDS))
    srows_g = s_base + (nb * BLOCK_N + n)[:, None].to(tl.int64) * (H_WORDS // GROUP_WORDS)
    srows_u = srows_g + I * (H_WORDS // GROUP_WORDS)
    acc = tl.zeros([BLOCK_N, BLOCK_W], dtype=tl.int32)
    sacc = tl.zeros([BLOCK_N, BLOCK_W // GROUP_WORDS], dtype=tl.int16)
    g, u, sg, su = _chunk(w_ptr, s_ptr, rows_g, rows_u, srows_g, srows_u, start, w_idx, g_idx, TILED, BLOCK_N,
                          BLOCK_W, GROUP_WORDS, SCALES)
    for c in range(0, SPAN, BLOCK_W):
        if c + BLOCK_W < SPAN:
            g2, u2, sg2, su2 = _chunk(w_ptr, s_ptr, rows_g, rows_u, srows_g, srows_u, start + c + BLOCK_W, w_idx,
                                      g_idx, TILED, BLOCK_N, BLOCK_W, GROUP_WORDS, SCALES)
        else:
            g2, u2, sg2, su2 = g, u, sg, su
        acc ^= g ^ u
        sacc ^= sg ^ su
        g, u, sg, su = g2, u2, sg2, su2
    total = tl.xor_sum(tl.xor_sum(acc, axis=1), axis=0) ^ tl.xor_sum(tl.xor_sum(sacc, axis=1), axis=0).to(tl.int32)
    tl.store(out_ptr + (pair * tl.num_programs(1) + nb) * SPLIT + ks, total)


def tiled(w: torch.Tensor, block_n: int, block_w: int) -> torch.Tensor:
    """[E, 2I, H/8] words -> the same words, each (expert, N block)'s [chunks, gate rows then up rows, BLOCK_W] run
    contiguous (flattened [E, 2I * H/8])."""
    e, two_i, hw = w.shape
    i = two_i // 2
    gate = w[:, :i].reshape(e, i // block_n, block_n, hw // block_w, block_w)
    up = w[:, i:].reshape(e, i // block_n, block_n, hw // block_w, block_w)
    both = torch.cat([gate, up], dim=2)  # [E, blocks, 2 * BLOCK_N, chunks, BLOCK_W]
    return both.permute(0, 1, 3, 2, 4).contiguous().reshape(e, two_i * hw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--block-n", type=int, default=32)
    ap.add_argument("--block-w", type=int, default=128)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--split", type=int, default=1,
                    help="programs a (pair, N block) over K (gate_up has 1): more, shorter programs, the same bytes")
    ap.add_argument("--no-scales", action="store_true",
                    help="read the words alone, as the read-only kernel it is set beside does (else the scales too)")
    ap.add_argument("--routings", type=int, default=6, help="routings rotated in a graph (working set past the L2)")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    hw = H // 8
    if I % args.block_n or hw % (args.block_w * args.split) or args.block_w % (GROUP // 8):
        raise SystemExit(f"--block-n {args.block_n} must divide I={I}, --block-w {args.block_w} x --split "
                         f"{args.split} divide H/8={hw}, and --block-w be a multiple of {GROUP // 8}")
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    torch.manual_seed(0)
    w = torch.randint(-(1 << 31), (1 << 31) - 1, (E, 2 * I, hw), device="cuda", dtype=torch.int32)
    s = torch.randn(E, 2 * I, H // GROUP, device="cuda").to(torch.bfloat16).view(torch.int16)
    layouts = {"rows": w.reshape(E, -1), "tiled": tiled(w, args.block_n, args.block_w)}
    bw = max(copy_bandwidth().values())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_bw_gbps": bw, "block_n": args.block_n, "block_w": args.block_w, "warps": args.warps,
              "split": args.split, "scales": not args.no_scales, "cases": []}
    for T in args.tokens:
        ids = [torch.stack([torch.randperm(E, device="cuda")[:TOP_K] for _ in range(T)]).flatten().to(torch.int32)
               for _ in range(args.routings)]
        distinct = sum(len(set(x.tolist())) for x in ids) / len(ids)
        nbytes = distinct * (EXPERT_GATE_UP_WORDS if args.no_scales else EXPERT_GATE_UP)  # words (and scales)
        out = torch.empty(T * TOP_K * (I // args.block_n) * args.split, device="cuda", dtype=torch.int32)
        row = {"T": T, "distinct_experts": distinct, "mb": round(nbytes / 1e6, 2)}
        xor = {}
        for name, weights in layouts.items():
            def call(x, weights=weights, name=name, out=out, T=T):
                layout_probe_kernel[(T * TOP_K, I // args.block_n, args.split)](
                    weights, s, x, out, H_WORDS=hw, I=I, BLOCK_N=args.block_n, BLOCK_W=args.block_w,
                    GROUP_WORDS=GROUP // 8, TILED=name == "tiled", SPLIT=args.split, SCALES=not args.no_scales,
                    num_warps=args.warps)
            us = time_graph([lambda x=x: call(x) for x in ids], args.replays)
            call(ids[0])
            xor[name] = out.clone()
            row[f"{name}_us"] = round(us, 2)
            row[f"{name}_frac_of_copy_bw"] = round(nbytes / (us * 1e-6) / (bw * 1e9), 3)
        # Both layouts hold the same words, and each program xors its own rows' words and scales whichever way they
        # lie: the stores must agree, or the tiled addressing reads something else.
        row["same_words"] = bool(torch.equal(xor["rows"], xor["tiled"]))
        picked = [layouts["rows"][x.long().unique()] for x in ids]  # each routing's distinct experts' words
        row["read_only_us"] = round(read_ceiling_us(picked, sms), 2)  # in one stream (scales left out)
        del picked
        result["cases"].append(row)
        print(f"T={T} ({distinct:.1f} experts, {nbytes / 1e6:.1f} MB): rows {row['rows_us']:.2f} us "
              f"({row['rows_frac_of_copy_bw']:.0%}), tiled {row['tiled_us']:.2f} us "
              f"({row['tiled_frac_of_copy_bw']:.0%}), read-only kernel of the words alone {row['read_only_us']:.2f} "
              f"us; same words: {row['same_words']}",
              flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
