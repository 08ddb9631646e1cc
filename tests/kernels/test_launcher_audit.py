"""Public kernel ops called with inputs their launchers mishandled (an audit of the launchers), each against its torch
reference on fresh random inputs, or for the error the launcher now raises instead of a crash or a wrong answer.

The interpreter must be on before triton is imported, so the cases run in one fresh subprocess (this file as a
script, one JSON line a case, as kernel_checks.py does), started by the module's fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _raises(fn, needle: str) -> None:
    try:
        fn()
    except AssertionError as e:
        assert needle in str(e), f"raised {e!r}, expected a message with {needle!r}"
        return
    raise AssertionError(f"did not raise (expected {needle!r})")


def check_top_threshold_rows_without_candidates() -> str:
    """Rows where no token is a candidate (lo above the row; with zmax a row of -inf or with +inf tokens: every
    weight NaN or 0) take lo, as the reference says; the kernel stored the NaN of an empty select (interpreter)."""
    import torch

    from sglang_eagle3 import kernels

    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    R, V = 5, 333  # V not a multiple of the select's chunk
    z = torch.randn(R, V, generator=g) * 2
    z[2] = float("-inf")
    z[3, torch.randperm(V, generator=g)[:4]] = float("inf")
    lo = torch.full((R,), float("-inf"))
    lo[0] = z[0].max() + 1.0  # nothing at or above lo
    lo[4] = float(z[4].kthvalue(V // 2).values)
    zmax = z.amax(1)
    for target, zm in ((torch.randint(1, V, (R,), generator=g).float(), None),
                       (torch.rand(R, generator=g) * 0.9 + 0.05, zmax)):
        out = kernels.top_threshold(z, lo, target, zm, use_triton=True)
        ref = kernels.ref_top_threshold(z, lo, target, zm)
        assert not out.isnan().any(), f"NaN thresholds {out.tolist()} (reference {ref.tolist()}, {seed=})"
        assert torch.equal(out, ref), f"{out.tolist()} != {ref.tolist()} ({seed=}, top_p={zm is not None})"
    return f"{seed=}"


def check_gemv_per_head_with_norm() -> str:
    """gemv of a per-head x [T, B, K] with norm_weight: the reference norms x, the Triton path raised (a norm
    folds into 2-D products only) with a message blaming norm_weight's shape; now the norm runs first."""
    import torch

    from sglang_eagle3 import kernels
    from sglang_eagle3.kernels.gemv import triton_gemv

    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    T, B, N, K = 3, 2, 24, 48
    x = torch.randn(T, B, K, generator=g).bfloat16()
    w = (torch.randn(B, N, K, generator=g) / K ** 0.5).bfloat16()
    nw = (torch.rand(K, generator=g) + 0.5).bfloat16()
    out = kernels.gemv(x, w, norm_weight=nw, eps=1e-6, use_triton=True)
    ref = kernels.ref_gemv(x.double(), w.double(), norm_weight=nw.double(), eps=1e-6)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert out.shape == (T, B, N) and out.dtype == x.dtype and err < 1e-2, f"rel err {err} ({seed=})"
    _raises(lambda: triton_gemv(x, w, norm_weight=nw), "per-head x")
    return f"{seed=} {err=:.2e}"


def check_gemv_integer_out() -> str:
    """An integer ``out`` took the kernel's float sums truncated (and ref_gemv computed an integer product)."""
    import torch

    from sglang_eagle3 import kernels

    x, w = torch.randn(2, 32).bfloat16(), torch.randn(16, 32).bfloat16()
    _raises(lambda: kernels.gemv(x, w, out=torch.empty(2, 16, dtype=torch.int32), use_triton=True),
            "out must be a float tensor")
    return "raised"


def check_int4_group_sizes() -> str:
    """group_size not a power of two: the tile path crashed in Triton (tl.arange), the others named BLOCK_W; 8 on
    the tile path is a tl.dot K under 16 (a GPU build fails). A valid non-default group (16) still matches."""
    import torch

    from sglang_eagle3 import kernels
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    T, E, H, I, k = 3, 5, 96, 48, 2

    def inputs(group):
        x = torch.randn(T, H, generator=g).bfloat16()
        w13, w2 = torch.randn(E, 2 * I, H, generator=g) / 10, torch.randn(E, H, I, generator=g) / 7
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).int()
        p13, s13 = kernels.quantize_int4(w13, group)
        p2, s2 = kernels.quantize_int4(w2, group)
        return [x, p13, s13.bfloat16(), p2, s2.bfloat16(), torch.rand(T, k, generator=g), ids]

    bad = inputs(48)
    for path in ("gemv", "dot", "tile"):
        _raises(lambda path=path: triton_fused_moe_int4(*bad, 48, path=path), "group_size=48")
    _raises(lambda: triton_fused_moe_int4(*inputs(8), 8, path="tile"), "group_size=8")
    args = inputs(16)
    out = triton_fused_moe_int4(*args, 16, path="tile")
    ref = kernels.ref_fused_moe_int4(*args, 16)
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err < 2e-2, f"group 16 tile path rel err {err} ({seed=})"
    return f"{seed=} {err=:.2e}"


CASES = {
    "top_threshold_rows_without_candidates": check_top_threshold_rows_without_candidates,
    "gemv_per_head_with_norm": check_gemv_per_head_with_norm,
    "gemv_integer_out": check_gemv_integer_out,
    "int4_group_sizes": check_int4_group_sizes,
}


@pytest.fixture(scope="module")
def audit_results() -> dict[str, dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, __file__, *CASES], env=env, capture_output=True, text=True, timeout=300)
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["case"]] = row
    assert rows, f"no results (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
    return rows


@pytest.mark.parametrize("case", sorted(CASES))
def test_launcher_audit_case(audit_results, case):
    row = audit_results.get(case)
    assert row is not None, f"case {case} did not report (subprocess crashed?)"
    assert row["ok"], row["detail"]


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    for name in sys.argv[1:]:
        try:
            row = {"case": name, "ok": True, "detail": CASES[name]()}
        except Exception:
            row = {"case": name, "ok": False, "detail": traceback.format_exc()[-3000:]}
        print(json.dumps(row), flush=True)
