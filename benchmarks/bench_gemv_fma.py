"""An experiment for issues 4 and 5, not a shipped kernel: the decode projections as a GEMV on the CUDA cores, against
the shipped GEMV (kernels/gemv.py: tensor-core dots with the activation rows padded to 16, weights through a
shared-memory pipeline, split-K for wide K) and the read-only ceiling of the same bytes.

Why: the eighth session put the step's GEMV launches at 1.2-2x what a kernel that only reads their bytes costs in a
graph (q_a + kv_a 11.5 us against 8.7 at T=1, q_b 5.3 against 2.9, the router + shared gate/up 6.8 against 4.8;
KERNELS.md, "What 15 launches a layer allow"), and named a GEMV whose x path is not padded to a tensor-core tile
as an untried way. Here each program takes BN rows of W over the whole K (no split, no tail), its warps' lanes
along K with 8 contiguous weights a lane (16-byte loads) and per-lane partial sums for each of the M <= 4 rows of
x, reduced across lanes once at the end: at T=1 a weight costs a load share, a conversion and one FMA, what the
read-only kernel spends on it. PDL as the shipped kernels: the first weight tile is requested before the wait
(weights are never written), x after it.

NOTE: prototype only. It does not fold the norms, residual, gating or routing the shipped launches carry, and its
sums' order depends on M (the shipped GEMV's does not: decode and verify compute bit-identical products for a
token, which lossless greedy speculation relies on). It answers one question: how close to the read ceiling a
CUDA-core GEMV gets at these shapes, T = 1 and 4.

    python benchmarks/bench_gemv_fma.py --out OUT.json [--tokens 1 4]
    TRITON_INTERPRET=1 python benchmarks/bench_gemv_fma.py --check   # the kernel against torch on CPU

Also prints (first, on CUDA) whether a token's products are bit-identical alone and in a batch of 2 or 4, for this
kernel and the shipped GEMV, and (last) q_b with its q_a RMSNorm folded into both kernels, as the step launches it
(both added in the twenty-second session after its device time was spent: not yet run on a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_eagle3.kernels.triton.gemv import _rstd  # noqa: E402

# (name, N, K): a Kimi-K2.5 TP=8 rank's decode projections (the pair launches as one matrix of their bytes).
SHAPES = [("q_a+kv_a", 2112, 7168), ("q_b", 1536, 1536), ("o_proj", 7168, 1024), ("router+shared gate/up", 896, 7168),
          ("shared down", 7168, 256)]
NORMED = ("q_b", 1536, 1536)  # also timed with its q_a RMSNorm folded in, as the step launches it (NORM_PRE)


@triton.jit
def _row_rstd(x_ptr, t: tl.constexpr, s_xt, K, eps, kk, STEP: tl.constexpr, NSTEPS: tl.constexpr):
    """1 / sqrt(mean(x[t]^2) + eps) by the shipped GEMV's _rstd (its NORM_PRE: every program reads the whole row
    first), the sum of squares in this kernel's [L, VEC] layout."""
    ss = tl.zeros(kk.shape, tl.float32)
    for i in range(NSTEPS):
        k = i * STEP + kk
        x = tl.load(x_ptr + t * s_xt + k, mask=k < K, other=0.0).to(tl.float32)
        ss += x * x
    return _rstd(tl.sum(tl.sum(ss, axis=1), axis=0), K, eps)


@triton.jit
def _rows_dot(w, x_ptr, k, kmask, s_xt, t: tl.constexpr, rstd, nw_ptr, NORM: tl.constexpr):
    """[BN, L] per-lane partial sums of W's tile with row t of x over this K step; with NORM, x * rstd * the norm
    weight rounded to x's dtype first (as the separate RMSNorm kernel stores it)."""
    xr = tl.load(x_ptr + t * s_xt + k, mask=kmask, other=0.0)  # [L, VEC]
    if NORM:
        nw = tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        xr = (xr.to(tl.float32) * rstd * nw).to(x_ptr.dtype.element_ty)
    return tl.sum(w * xr.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def fma_gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, s_xt, s_ot, nw_ptr, eps, M: tl.constexpr, BN: tl.constexpr,
                    L: tl.constexpr, VEC: tl.constexpr, STEP: tl.constexpr, NSTEPS: tl.constexpr, NORM: tl.constexpr,
                    PDL: tl.constexpr):
    """out[t, n] = sum_k x[t, k] W[n, k] for t < M, BN rows n a program, W K-contiguous [N, K]; STEP = L * VEC.
    NORM: x's rows RMS-normalised first (norm weight nw, eps)."""
    pid = tl.program_id(0)
    n = pid * BN + tl.arange(0, BN)
    kk = tl.arange(0, L)[:, None] * VEC + tl.arange(0, VEC)[None, :]  # [L, VEC]: lane l's 8 weights of a step
    nmask = (n < N)[:, None, None]
    wrow = w_ptr + n[:, None, None].to(tl.int64) * K
    w = tl.load(wrow + kk[None, :, :], mask=nmask & (kk < K)[None, :, :], other=0.0).to(tl.float32)
    if PDL:  # the first tile above needs no wait: weights are never written
        gdc_wait()
        gdc_launch_dependents()
    r0 = 1.0
    r1 = 1.0
    r2 = 1.0
    r3 = 1.0
    if NORM:
        r0 = _row_rstd(x_ptr, 0, s_xt, K, eps, kk, STEP, NSTEPS)
        if M > 1:
            r1 = _row_rstd(x_ptr, 1, s_xt, K, eps, kk, STEP, NSTEPS)
        if M > 2:
            r2 = _row_rstd(x_ptr, 2, s_xt, K, eps, kk, STEP, NSTEPS)
            r3 = _row_rstd(x_ptr, 3, s_xt, K, eps, kk, STEP, NSTEPS)
    acc0 = tl.zeros([BN, L], tl.float32)
    acc1 = tl.zeros([BN, L], tl.float32)
    acc2 = tl.zeros([BN, L], tl.float32)
    acc3 = tl.zeros([BN, L], tl.float32)
    for i in range(NSTEPS):  # (a compile-time count: the interpreter refused range() up to the K argument)
        k0 = i * STEP
        k = k0 + kk
        kmask = k < K
        if i > 0:
            w = tl.load(wrow + k[None, :, :], mask=nmask & kmask[None, :, :], other=0.0).to(tl.float32)
        acc0 += _rows_dot(w, x_ptr, k, kmask, s_xt, 0, r0, nw_ptr, NORM)
        if M > 1:
            acc1 += _rows_dot(w, x_ptr, k, kmask, s_xt, 1, r1, nw_ptr, NORM)
        if M > 2:
            acc2 += _rows_dot(w, x_ptr, k, kmask, s_xt, 2, r2, nw_ptr, NORM)
            acc3 += _rows_dot(w, x_ptr, k, kmask, s_xt, 3, r3, nw_ptr, NORM)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + n, tl.sum(acc0, axis=1).to(ty), mask=n < N)
    if M > 1:
        tl.store(out_ptr + s_ot + n, tl.sum(acc1, axis=1).to(ty), mask=n < N)
    if M > 2:
        tl.store(out_ptr + 2 * s_ot + n, tl.sum(acc2, axis=1).to(ty), mask=n < N)
        tl.store(out_ptr + 3 * s_ot + n, tl.sum(acc3, axis=1).to(ty), mask=n < N)


def fma_gemv(x: torch.Tensor, w: torch.Tensor, bn: int = 8, warps: int = 8, out: torch.Tensor | None = None,
             pdl: bool = False, norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """x [T, K] (T in 1, 2, 4) @ w [N, K]^T -> [T, N] in x's dtype; with ``norm_weight`` [K], RMSNorm(x) @ w^T."""
    T, K = x.shape
    N = w.shape[0]
    assert T in (1, 2, 4) and w.shape[1] == K and w.stride(1) == 1 and x.stride(1) == 1, (x.shape, w.shape)
    out = torch.empty(T, N, dtype=x.dtype, device=x.device) if out is None else out
    interp = not x.is_cuda
    lanes = 32 * (1 if interp else warps)
    fma_gemv_kernel[(triton.cdiv(N, bn),)](x, w, out, N, K, x.stride(0), out.stride(0),
                                           w if norm_weight is None else norm_weight, float(eps), M=T, BN=bn,
                                           L=lanes, VEC=8, STEP=lanes * 8, NSTEPS=triton.cdiv(K, lanes * 8),
                                           NORM=norm_weight is not None, PDL=pdl, num_warps=1 if interp else warps,
                                           **({"launch_pdl": True} if pdl else {}))
    return out


def check() -> None:
    """The kernel against a float64 product on irregular shapes (CPU, under TRITON_INTERPRET=1)."""
    g = torch.Generator().manual_seed(0)
    for T, N, K, bn in ((1, 37, 300, 8), (2, 70, 1000, 8), (4, 33, 513, 16), (4, 8, 256, 8)):
        x = torch.randn(T, K, generator=g).to(torch.bfloat16)
        w = torch.randn(N, K, generator=g).to(torch.bfloat16)
        got = fma_gemv(x, w, bn=bn).double()
        want = x.double() @ w.double().t()
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-2, (T, N, K, err)
        print(f"check T={T} N={N} K={K} BN={bn}: rel err {err:.2e}", flush=True)
    from sglang_eagle3.kernels.ref import ref_rms_norm

    for T in (1, 4):  # with the norm folded in: against the RMSNorm reference (rounded to bf16) then the product
        x = torch.randn(T, 700, generator=g).to(torch.bfloat16)
        w = torch.randn(50, 700, generator=g).to(torch.bfloat16)
        nw = (torch.rand(700, generator=g) + 0.5).to(torch.bfloat16)
        got = fma_gemv(x, w, norm_weight=nw, eps=1e-6).double()
        want = ref_rms_norm(x, nw, 1e-6).double() @ w.double().t()
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-2, (T, err)
        print(f"check with the norm T={T}: rel err {err:.2e}", flush=True)


def identity(device: str) -> list[dict]:
    """Whether a token's products are bit-identical alone (M=1), in a pair (M=2) and in a verify of 4 (M=4), for this
    kernel and (on CUDA) the shipped GEMV: what decode and verify computing the same token needs."""
    from sglang_eagle3.kernels.gemv import triton_gemv

    g = torch.Generator().manual_seed(1)
    rows = []
    shapes = SHAPES if device == "cuda" else [("small", 40, 700)]
    for name, N, K in shapes:
        x = torch.randn(4, K, generator=g).to(torch.bfloat16).to(device)
        w = (torch.randn(N, K, generator=g) / K ** 0.5).to(torch.bfloat16).to(device)
        kinds = {"fma": lambda a, w=w: fma_gemv(a, w, bn=4)}
        if device == "cuda":
            kinds["shipped"] = lambda a, w=w: triton_gemv(a, w)
        for kind, fn in kinds.items():
            four = fn(x)
            same2 = torch.equal(fn(x[:2]), four[:2])
            same1 = all(torch.equal(fn(x[t:t + 1])[0], four[t]) for t in range(4))
            rows.append({"op": name, "kind": kind, "alone_eq_in_4": same1, "pair_eq_in_4": same2})
            print(f"identity {name:22s} {kind:8s}: alone == in a verify of 4: {same1}; pair == in 4: {same2}",
                  flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--check", action="store_true", help="only the correctness check (CPU, interpreter)")
    args = ap.parse_args()
    if args.check:
        check()
        identity("cpu")
        return
    assert torch.cuda.is_available(), "needs a CUDA GPU (or --check under TRITON_INTERPRET=1)"
    from benchmarks.bench_kernels import read_ceiling_us, time_graph
    from sglang_eagle3.bench.harness import git_commit
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.gemv import triton_gemv

    sms = tuning.sm_count(torch.device("cuda"))
    pdl = tuning.pdl(torch.device("cuda"), "gemv")
    rows = identity("cuda")
    for name, N, K in SHAPES:
        nbytes = N * K * 2
        copies = max(2, min(32, (256 << 20) // nbytes))  # rotate past the L2
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(copies)]
        read = read_ceiling_us(ws, sms)
        for T in args.tokens:
            x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
            ref = (x.float() @ ws[0].float().t())
            row = {"op": name, "N": N, "K": K, "T": T, "bytes": nbytes, "read_us": round(read, 2),
                   "shipped_us": round(time_graph([lambda w=w, x=x: triton_gemv(x, w) for w in ws]), 2)}
            for bn, warps in ((4, 8), (8, 8), (16, 8), (8, 4)):
                got = fma_gemv(x, ws[0], bn=bn, warps=warps, pdl=pdl).float()
                err = ((got - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (name, T, bn, warps, err)
                us = time_graph([lambda w=w, x=x, bn=bn, warps=warps: fma_gemv(x, w, bn=bn, warps=warps, pdl=pdl)
                                 for w in ws])
                row[f"fma_bn{bn}_w{warps}_us"] = round(us, 2)
            best = min((v, k) for k, v in row.items() if k.startswith("fma_"))
            row["fma_best"] = best[1]
            rows.append(row)
            print(f"{name:22s} T={T}: read {read:6.2f} us  shipped {row['shipped_us']:6.2f}  fma best {best[0]:6.2f} "
                  f"({best[1]})  all: " + " ".join(f"{k[4:-3]} {v}" for k, v in row.items() if k.startswith("fma_")
                                                   and k != "fma_best"), flush=True)
        del ws
    name, N, K = NORMED  # q_b with its q_a norm in the launch, both kernels
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(32)]
    nw = torch.rand(K, device="cuda", dtype=torch.bfloat16) + 0.5
    for T in args.tokens:
        x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
        row = {"op": f"{name} + q_a norm", "N": N, "K": K, "T": T, "bytes": N * K * 2,
               "shipped_us": round(time_graph([lambda w=w, x=x: triton_gemv(x, w, norm_weight=nw, eps=1e-6)
                                               for w in ws]), 2)}
        for bn, warps in ((4, 8), (8, 8)):
            row[f"fma_bn{bn}_w{warps}_us"] = round(time_graph(
                [lambda w=w, x=x, bn=bn, warps=warps: fma_gemv(x, w, bn=bn, warps=warps, pdl=pdl, norm_weight=nw,
                                                               eps=1e-6) for w in ws]), 2)
        rows.append(row)
        print(f"{row['op']:22s} T={T}: shipped {row['shipped_us']:6.2f}  " + " ".join(
            f"{k[4:-3]} {v}" for k, v in row.items() if k.startswith("fma_")), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
                                              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "triton": triton.__version__, "pdl": pdl, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
